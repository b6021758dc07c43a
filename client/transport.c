/* The edge client's HTTP transport over libcurl (see transport.h): requests
 * with capped bodies, zstd bodies decoded strictly, retries with capped
 * exponential backoff and jitter. */
#include "transport.h"

#include "strata/buf.h"
#include "strata/log.h"
#include "strata/zframe.h"

#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

struct strata_http {
    CURL *curl;
    char *base;
    char *token;
    char *ca_cert;
    volatile sig_atomic_t *stop;
    uint64_t jitter;   /* xorshift state for backoff jitter */
    strata_zctx *zctx; /* for zstd bodies; created at the first one */
};

/* The response body being received: capped at the request's max_body. */
typedef struct sink {
    strata_buf buf;
    int too_big;
} sink;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    sink *s = ud;
    size_t n = size * nmemb;
    int rc = strata_buf_append(&s->buf, ptr, n);
    if (rc == STRATA_ETOOBIG)
        s->too_big = 1;
    return rc == STRATA_OK ? n : 0; /* 0 aborts the transfer */
}

static void copy_value(char *dst, size_t cap, const char *v, size_t n)
{
    while (n > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *ud)
{
    strata_http_response *r = ud;
    size_t n = size * nitems;
    const char *colon = memchr(buf, ':', n);
    if (colon == NULL)
        return n;
    size_t klen = (size_t)(colon - buf), vlen = n - klen - 1;
    char val[128];
    copy_value(val, sizeof(val), colon + 1, vlen);
    if (klen == 4 && strncasecmp(buf, "etag", 4) == 0)
        copy_value(r->etag, sizeof(r->etag), colon + 1, vlen);
    else if (klen == 16 && strncasecmp(buf, "content-encoding", 16) == 0)
        copy_value(r->content_encoding, sizeof(r->content_encoding), colon + 1, vlen);
    else if (klen == 11 && strncasecmp(buf, "retry-after", 11) == 0) {
        char *end;
        double s = strtod(val, &end);
        if (end != val && isfinite(s) && s >= 0 && s < 3600)
            r->retry_after = s;
    }
    return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    strata_http *h = ud;
    return (h->stop != NULL && *h->stop) ? 1 : 0;
}

int strata_http_new(const char *base_url, const char *ca_cert, volatile sig_atomic_t *stop,
                    strata_http **out, strata_diag *diag)
{
    *out = NULL;
    if (base_url == NULL ||
        (strncmp(base_url, "http://", 7) != 0 && strncmp(base_url, "https://", 8) != 0))
        return strata_diag_set(diag, STRATA_EINVAL,
                               "server URL must start with http:// or https://");
    strata_http *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return STRATA_ENOMEM;
    h->curl = curl_easy_init();
    h->base = strdup(base_url);
    h->ca_cert = ca_cert ? strdup(ca_cert) : NULL;
    if (h->curl == NULL || h->base == NULL || (ca_cert && h->ca_cert == NULL)) {
        strata_http_free(h);
        return STRATA_ENOMEM;
    }
    size_t bl = strlen(h->base);
    while (bl > 0 && h->base[bl - 1] == '/')
        h->base[--bl] = '\0';
    h->stop = stop;
    h->jitter = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)h << 17) ^ 0x9e3779b97f4a7c15ULL;
    *out = h;
    return STRATA_OK;
}

void strata_http_free(strata_http *h)
{
    if (h == NULL)
        return;
    if (h->curl)
        curl_easy_cleanup(h->curl);
    strata_zctx_free(h->zctx);
    free(h->base);
    free(h->token);
    free(h->ca_cert);
    free(h);
}

int strata_http_set_token(strata_http *h, const char *token)
{
    char *t = token ? strdup(token) : NULL;
    if (token && t == NULL)
        return STRATA_ENOMEM;
    free(h->token);
    h->token = t;
    return STRATA_OK;
}

void strata_http_response_cleanup(strata_http_response *r)
{
    if (r == NULL)
        return;
    free(r->body);
    memset(r, 0, sizeof(*r));
    r->retry_after = -1;
}

/* Replaces a zstd body by its content (at most max bytes), decoded as
 * strictly as payloads are: exactly one frame with its declared size. */
static int unzstd(strata_http *h, strata_http_response *r, size_t max, strata_diag *diag)
{
    int rc;
    if (h->zctx == NULL && (rc = strata_zctx_new(&h->zctx)) < 0)
        return rc;
    uint8_t *out = NULL;
    size_t n = 0;
    if ((rc = strata_zframe_decompress(h->zctx, r->body, r->len, 0, max, &out, &n, diag)) < 0)
        return rc;
    /* Room for the NUL the response contract promises. */
    uint8_t *grown = realloc(out, n + 1);
    if (grown == NULL) {
        free(out);
        return STRATA_ENOMEM;
    }
    grown[n] = '\0';
    free(r->body);
    r->body = grown;
    r->len = n;
    return STRATA_OK;
}

/* Sets one curl option, turning a refusal into an error with its name. */
#define SETOPT(c, opt, val)                                                                        \
    do {                                                                                           \
        CURLcode e_ = curl_easy_setopt((c), (opt), (val));                                         \
        if (e_ != CURLE_OK)                                                                        \
            return strata_diag_set(diag,                                                           \
                                   e_ == CURLE_OUT_OF_MEMORY ? STRATA_ENOMEM : STRATA_EINVAL,      \
                                   "curl option %s: %s", #opt, curl_easy_strerror(e_));            \
    } while (0)

/* Configures the reset handle c for one request. */
static int configure(strata_http *h, CURL *c, const char *method, const char *url,
                     struct curl_slist *hdr, const uint8_t *body, size_t len, sink *s,
                     strata_http_response *resp, strata_diag *diag)
{
    SETOPT(c, CURLOPT_URL, url);
    SETOPT(c, CURLOPT_NOSIGNAL, 1L);
    SETOPT(c, CURLOPT_CONNECTTIMEOUT, 10L);
    SETOPT(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    SETOPT(c, CURLOPT_LOW_SPEED_TIME, 60L);
    SETOPT(c, CURLOPT_HTTPHEADER, hdr);
    SETOPT(c, CURLOPT_WRITEFUNCTION, on_body);
    SETOPT(c, CURLOPT_WRITEDATA, s);
    SETOPT(c, CURLOPT_HEADERFUNCTION, on_header);
    SETOPT(c, CURLOPT_HEADERDATA, resp);
    SETOPT(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    SETOPT(c, CURLOPT_XFERINFODATA, h);
    SETOPT(c, CURLOPT_NOPROGRESS, 0L);
    SETOPT(c, CURLOPT_SSL_VERIFYPEER, 1L);
    SETOPT(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (h->ca_cert != NULL)
        SETOPT(c, CURLOPT_CAINFO, h->ca_cert);
    if (strcmp(method, "GET") == 0) {
        SETOPT(c, CURLOPT_HTTPGET, 1L);
    } else {
        SETOPT(c, CURLOPT_CUSTOMREQUEST, method);
        SETOPT(c, CURLOPT_POST, 1L);
        SETOPT(c, CURLOPT_POSTFIELDS, body ? (const char *)body : "");
        SETOPT(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    return STRATA_OK;
}

/* Appends one header line; on failure the list stays as it was. */
static int add_header(struct curl_slist **hdr, const char *line)
{
    struct curl_slist *n = curl_slist_append(*hdr, line);
    if (n == NULL)
        return STRATA_ENOMEM;
    *hdr = n;
    return STRATA_OK;
}

int strata_http_request(strata_http *h, const char *method, const char *path,
                        const char *content_type, const uint8_t *body, size_t len,
                        const char *if_none_match, int accept_zstd, size_t max_body,
                        strata_http_response *resp, strata_diag *diag)
{
    memset(resp, 0, sizeof(*resp));
    resp->retry_after = -1;
    if (h->stop != NULL && *h->stop)
        return STRATA_ESTATE;
    size_t ulen = strlen(h->base) + strlen(path) + 1;
    char *url = malloc(ulen);
    if (url == NULL)
        return STRATA_ENOMEM;
    snprintf(url, ulen, "%s%s", h->base, path);
    struct curl_slist *hdr = NULL;
    sink s = {.too_big = 0};
    strata_buf_init(&s.buf, max_body);
    char line[256];
    int rc = STRATA_OK;
    if (h->token != NULL) {
        snprintf(line, sizeof(line), "Authorization: Bearer %s", h->token);
        rc = add_header(&hdr, line);
    }
    if (rc == STRATA_OK && content_type != NULL) {
        snprintf(line, sizeof(line), "Content-Type: %s", content_type);
        rc = add_header(&hdr, line);
    }
    if (rc == STRATA_OK && if_none_match != NULL && if_none_match[0] != '\0') {
        snprintf(line, sizeof(line), "If-None-Match: %s", if_none_match);
        rc = add_header(&hdr, line);
    }
    if (rc == STRATA_OK && accept_zstd)
        rc = add_header(&hdr, "Accept-Encoding: zstd");
    if (rc == STRATA_OK)
        rc = add_header(&hdr, "Expect:"); /* no 100-continue round trip */
    if (rc < 0)
        goto out;

    CURL *c = h->curl;
    curl_easy_reset(c);
    if ((rc = configure(h, c, method, url, hdr, body, len, &s, resp, diag)) < 0)
        goto out;
    CURLcode cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
        if (s.too_big)
            rc = strata_diag_set(diag, STRATA_ETOOBIG, "%s %s: response larger than %zu bytes",
                                 method, path, max_body);
        else if (h->stop != NULL && *h->stop)
            rc = STRATA_ESTATE;
        else if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE ||
                 cc == CURLE_SSL_CERTPROBLEM || cc == CURLE_SSL_ISSUER_ERROR)
            /* Not transient: retrying cannot make an untrusted peer trusted. */
            rc = strata_diag_set(diag, STRATA_EINVAL, "%s %s: %s (is --ca-cert the server's CA?)",
                                 method, url, curl_easy_strerror(cc));
        else
            rc =
                strata_diag_set(diag, STRATA_EIO, "%s %s: %s", method, url, curl_easy_strerror(cc));
        goto out;
    }
    CURLcode ic = curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp->status);
    if (ic != CURLE_OK) {
        rc = strata_diag_set(diag, STRATA_EIO, "%s %s: no status: %s", method, url,
                             curl_easy_strerror(ic));
        goto out;
    }
    resp->body = s.buf.data ? strata_buf_take(&s.buf, &resp->len) : calloc(1, 1);
    if (resp->body == NULL) {
        rc = STRATA_ENOMEM;
        goto out;
    }
    if (strcasecmp(resp->content_encoding, "zstd") == 0)
        rc = unzstd(h, resp, max_body, diag);
out:
    strata_buf_cleanup(&s.buf);
    curl_slist_free_all(hdr);
    free(url);
    if (rc < 0 && rc != STRATA_EIO) {
        long st = resp->status;
        strata_http_response_cleanup(resp);
        resp->status = st;
    }
    return rc;
}

int strata_http_sleep(strata_http *h, double seconds)
{
    while (seconds > 0) {
        if (h->stop != NULL && *h->stop)
            return STRATA_ESTATE;
        double step = seconds < 0.1 ? seconds : 0.1;
        struct timespec ts = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
        nanosleep(&ts, NULL);
        seconds -= step;
    }
    return (h->stop != NULL && *h->stop) ? STRATA_ESTATE : STRATA_OK;
}

static double jitter01(strata_http *h)
{
    uint64_t x = h->jitter;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    h->jitter = x;
    return (double)(x >> 11) * 0x1.0p-53;
}

static int transient(int rc, long status)
{
    if (rc == STRATA_EIO)
        return 1;
    return rc == STRATA_OK && (status == 408 || status == 429 || status >= 500);
}

int strata_http_request_retry(strata_http *h, const char *method, const char *path,
                              const char *content_type, const uint8_t *body, size_t len,
                              const char *if_none_match, int accept_zstd, size_t max_body,
                              int max_attempts, double max_delay, strata_http_response *resp,
                              strata_diag *diag)
{
    for (int attempt = 1;; attempt++) {
        int rc = strata_http_request(h, method, path, content_type, body, len, if_none_match,
                                     accept_zstd, max_body, resp, diag);
        if (!transient(rc, resp->status) || (max_attempts > 0 && attempt >= max_attempts))
            return rc;
        /* Full jitter: uniform in [0, min(cap, base * 2^attempt)]. */
        double ceiling = 0.5 * pow(2.0, attempt < 20 ? attempt : 20);
        if (ceiling > max_delay)
            ceiling = max_delay;
        double wait = jitter01(h) * ceiling;
        if (rc == STRATA_OK && resp->retry_after >= 0 && resp->retry_after > wait)
            wait = resp->retry_after;
        strata_log_warn("%s %s: %s; retrying in %.1f s (attempt %d)", method, path,
                        rc == STRATA_OK ? "server busy or failing" : strata_diag_msg(diag, rc),
                        wait, attempt);
        strata_http_response_cleanup(resp);
        if (strata_http_sleep(h, wait) < 0)
            return STRATA_ESTATE;
    }
}
