/* payload_forge: helper of tests/integration/test_bad_requests.sh.
 *
 *   payload_forge --in P.bin --out Q.bin MODE
 *
 * Reads a valid payload (schemas/payload.md), decompresses its zstd frame,
 * changes exactly one thing in the body, recomputes the body's CRC32C (except
 * in --bad-crc mode) and writes the result as one zstd frame that declares its
 * content size. The result is a payload that strata_payload_encode would
 * never produce, to check that a decoder (strata-tool inspect, the
 * coordinator) refuses it. MODE is one of:
 *
 *   --nan                 the first float value of the first layer that
 *                         carries values (none, fp16, bf16, topk, randk)
 *                         becomes a NaN
 *   --index-out-of-range  the last index of the first topk layer becomes
 *                         numel (one past the end)
 *   --rice                the positions of the first topk layer are coded
 *                         with a Rice parameter one above the shortest (the
 *                         indices themselves are unchanged)
 *   --bad-crc             one bit of the stored CRC32C is flipped
 *   --huge-samples        the header's sample_count becomes 2^63 (beyond any
 *                         weight the coordinator takes; strata-tool cannot
 *                         write it)
 *   --metadata JSON       the metadata becomes the JSON object text JSON (a
 *                         valid payload whose metadata the coordinator may
 *                         refuse, e.g. a malformed lgreco error table);
 *                         decoded and encoded again by the library
 *
 * Exits 0 on success, 1 when the input has no layer the mode applies to or
 * is not a well-formed payload, 2 on a usage error. */
#include "strata/payload.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define MAX_FILE ((size_t)1 << 30)
#define HEADER_LEN 44
#define BLOCK_LEN 60
#define COMP_NONE 0
#define COMP_FP16 1
#define COMP_BF16 2
#define COMP_TOPK 3
#define COMP_RANDK 4

typedef enum { M_NONE, M_NAN, M_OOR, M_RICE, M_BAD_CRC, M_HUGE_SAMPLES } forge_mode;

static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("payload_forge: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static int read_all(const char *path, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap || cap >= MAX_FILE)
            break;
        uint8_t *p = realloc(buf, cap * 2);
        if (p == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = p;
        cap *= 2;
    }
    int bad = ferror(f) || n == cap;
    fclose(f);
    if (buf == NULL || bad) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int write_all(const char *path, const uint8_t *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t n = fwrite(buf, 1, len, f);
    int bad = fclose(f) != 0 || n != len;
    return bad ? -1 : 0;
}

/* Bit streams of schemas/payload.md: least significant bit first. */
static int get_bit(const uint8_t *p, uint64_t nbits, uint64_t *pos)
{
    if (*pos >= nbits)
        return -1;
    int b = (p[*pos >> 3] >> (*pos & 7)) & 1;
    (*pos)++;
    return b;
}

static void put_bit(uint8_t *p, uint64_t *pos, int b)
{
    if ((*pos & 7) == 0)
        p[*pos >> 3] = 0;
    if (b)
        p[*pos >> 3] |= (uint8_t)(1u << (*pos & 7));
    (*pos)++;
}

/* Reads the Rice-coded positions at data[0, len): count gaps into g, the
 * parameter into *r; returns the bytes they take, or 0 when malformed. */
static size_t get_positions(const uint8_t *data, uint64_t len, uint64_t count, uint64_t *g,
                            unsigned *r)
{
    if (len < 1 || data[0] > 31)
        return 0;
    *r = data[0];
    uint64_t nbits = (len - 1) * 8, pos = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t q = 0, low = 0;
        int b;
        while ((b = get_bit(data + 1, nbits, &pos)) == 1)
            q++;
        if (b < 0)
            return 0;
        for (unsigned k = 0; k < *r; k++) {
            if ((b = get_bit(data + 1, nbits, &pos)) < 0)
                return 0;
            low |= (uint64_t)b << k;
        }
        g[i] = (q << *r) | low;
    }
    return 1 + (size_t)((pos + 7) / 8);
}

/* Writes r and count Rice-coded gaps at out; returns the bytes written. */
static size_t put_positions(uint8_t *out, const uint64_t *g, uint64_t count, unsigned r)
{
    out[0] = (uint8_t)r;
    uint64_t pos = 0;
    for (uint64_t i = 0; i < count; i++) {
        for (uint64_t q = g[i] >> r; q > 0; q--)
            put_bit(out + 1, &pos, 1);
        put_bit(out + 1, &pos, 0);
        for (unsigned k = 0; k < r; k++)
            put_bit(out + 1, &pos, (int)((g[i] >> k) & 1));
    }
    return 1 + (size_t)((pos + 7) / 8);
}

/* Rewrites the count float values at v (len bytes, format vf: smallest
 * exponent, bit planes of the offsets, sign-and-mantissa fields) into out
 * with value 0 a quiet NaN (largest exponent, top mantissa bit set);
 * returns the new length, or 0 when v is malformed. */
static size_t set_nan(const uint8_t *v, uint64_t len, uint64_t count, uint8_t vf, uint8_t *out)
{
    const unsigned emax = vf == 1 ? 31 : 255;
    const size_t pb = (size_t)((count + 7) / 8);
    if (count == 0 || len < 2 || v[1] > 8 || 2 + (size_t)v[1] * pb > len)
        return 0;
    unsigned base = v[0], planes = v[1];
    unsigned *e = calloc((size_t)count, sizeof(*e));
    if (e == NULL)
        return 0;
    unsigned lo = emax;
    for (uint64_t i = 0; i < count; i++) {
        for (unsigned j = 0; j < planes; j++)
            e[i] |= (unsigned)((v[2 + j * pb + i / 8] >> (i % 8)) & 1u) << j;
        e[i] += base;
        if (i > 0 && e[i] < lo)
            lo = e[i];
    }
    e[0] = emax;
    unsigned np = 0;
    while (np < 8 && (emax - lo) >> np)
        np++;
    out[0] = (uint8_t)lo;
    out[1] = (uint8_t)np;
    for (unsigned j = 0; j < np; j++) {
        uint64_t pos = 0;
        for (uint64_t i = 0; i < count; i++)
            put_bit(out + 2 + j * pb, &pos, (int)(((e[i] - lo) >> j) & 1u));
    }
    free(e);
    size_t fields = (size_t)len - 2 - planes * pb, at = 2 + np * pb;
    memcpy(out + at, v + 2 + planes * pb, fields);
    if (vf == 0)
        out[at + 2] |= 0x40; /* mantissa bit 22 */
    else if (vf == 1)
        out[at + 1] |= 0x02; /* mantissa bit 9 */
    else
        out[at] |= 0x40; /* mantissa bit 6 */
    return at + fields;
}

/* Rewrites the positions of a topk block (data, data_len) for mode; returns
 * the new data in *out (malloc'd) and its length. */
static int forge_indices(const uint8_t *data, uint64_t data_len, uint64_t numel, uint64_t count,
                         forge_mode mode, uint8_t **out, size_t *out_len)
{
    if (count < 2 || count > 8 * data_len)
        return die(1, "the topk layer needs at least 2 kept elements");
    uint64_t *g = calloc((size_t)count, sizeof(*g));
    /* One more parameter bit per gap, and an out-of-range last gap of at
     * most numel >> r + 1 + r bits. */
    uint8_t *buf = malloc((size_t)data_len + (size_t)count / 8 + (size_t)(numel / 8) + 64);
    unsigned r = 0;
    size_t used = g == NULL || buf == NULL ? 0 : get_positions(data, data_len, count, g, &r);
    if (used == 0) {
        free(g);
        free(buf);
        return die(1, "malformed positions or out of memory");
    }
    if (mode == M_OOR) {
        uint64_t last = 0;
        for (uint64_t i = 0; i + 1 < count; i++)
            last += g[i] + (i > 0);
        g[count - 1] = numel - last - 1; /* the last index becomes numel */
    } else {
        r = r < 31 ? r + 1 : r - 1;
    }
    size_t n = put_positions(buf, g, count, r);
    memcpy(buf + n, data + used, (size_t)(data_len - used));
    free(g);
    *out = buf;
    *out_len = n + (size_t)(data_len - used);
    return 0;
}

/* Builds the forged body from body[0, len) into *out. */
static int forge(const uint8_t *body, size_t len, forge_mode mode, uint8_t **out, size_t *out_len)
{
    if (len < HEADER_LEN + 8 || memcmp(body, "STRP", 4) != 0)
        return die(1, "not a payload body");
    uint32_t nlayers = get32(body + 40);
    /* The forged body is at most one bit per kept index longer than the
     * original, plus a last gap of up to numel bits (--index-out-of-range),
     * or up to 8 exponent planes longer, less than a byte per value
     * (--nan): room for the whole body again and more. */
    size_t cap = len * 2 + ((size_t)1 << 24);
    uint8_t *nb = malloc(cap);
    if (nb == NULL)
        return die(1, "out of memory");
    memcpy(nb, body, HEADER_LEN);
    if (mode == M_HUGE_SAMPLES)
        for (int b = 0; b < 8; b++) /* sample_count: u64 LE at offset 32 */
            nb[32 + b] = b == 7 ? 0x80 : 0;
    size_t at = HEADER_LEN, n = HEADER_LEN;
    int done = mode == M_BAD_CRC || mode == M_HUGE_SAMPLES;
    for (uint32_t i = 0; i < nlayers; i++) {
        if (len - at < BLOCK_LEN + 8)
            goto bad;
        const uint8_t *blk = body + at;
        uint8_t comp = blk[4], vf = blk[5];
        uint64_t numel = get64(blk + 8), count = get64(blk + 16), dlen = get64(blk + 52);
        if (dlen > len - at - BLOCK_LEN || vf > 4)
            goto bad;
        const uint8_t *data = blk + BLOCK_LEN;
        memcpy(nb + n, blk, BLOCK_LEN);
        uint8_t *nblk = nb + n;
        n += BLOCK_LEN;
        int has_values = comp == COMP_NONE || comp == COMP_FP16 || comp == COMP_BF16 ||
                         comp == COMP_TOPK || comp == COMP_RANDK;
        size_t skip = 0; /* topk: the positions before the values */
        uint64_t *g = comp == COMP_TOPK && count > 0 && count <= 8 * dlen
                          ? calloc((size_t)count, sizeof(*g))
                          : NULL;
        unsigned r = 0;
        if (g != NULL)
            skip = get_positions(data, dlen, count, g, &r);
        free(g);
        if (!done && mode == M_NAN && has_values && count > 0 && (comp != COMP_TOPK || skip > 0) &&
            vf <= 2) {
            memcpy(nb + n, data, skip);
            size_t nv = set_nan(data + skip, dlen - skip, count, vf, nb + n + skip);
            if (nv == 0)
                goto bad;
            put64(nblk + 52, skip + nv);
            n += skip + nv;
            done = 1;
        } else if (!done && (mode == M_OOR || mode == M_RICE) && comp == COMP_TOPK) {
            uint8_t *nd = NULL;
            size_t ndl = 0;
            int rc = forge_indices(data, dlen, numel, count, mode, &nd, &ndl);
            if (rc != 0) {
                free(nb);
                return rc;
            }
            memcpy(nb + n, nd, ndl);
            free(nd);
            put64(nblk + 52, ndl);
            n += ndl;
            done = 1;
        } else {
            memcpy(nb + n, data, (size_t)dlen);
            n += (size_t)dlen;
        }
        at += BLOCK_LEN + (size_t)dlen;
    }
    if (len - at < 8)
        goto bad;
    uint32_t mlen = get32(body + at);
    if (mlen != len - at - 8)
        goto bad;
    memcpy(nb + n, body + at, 4 + (size_t)mlen);
    n += 4 + mlen;
    uint32_t crc = strata_crc32c(0, nb, n);
    put32(nb + n, mode == M_BAD_CRC ? crc ^ 1u : crc);
    n += 4;
    if (!done) {
        free(nb);
        return die(1, "no layer that this mode applies to");
    }
    *out = nb;
    *out_len = n;
    return 0;
bad:
    free(nb);
    return die(1, "malformed payload body");
}

/* --metadata: the payload at in with its metadata replaced by meta, through
 * the library's codec. */
static int set_metadata(const char *in, const char *outp, const char *meta)
{
    uint8_t *frame = NULL, *enc = NULL;
    size_t flen = 0, elen = 0;
    strata_payload *p = NULL;
    strata_diag d = {{0}};
    int code = 1;
    if (read_all(in, &frame, &flen) != 0) {
        code = die(1, "cannot read %s", in);
        goto out;
    }
    if (strata_payload_decode(frame, flen, NULL, &p, &d) < 0) {
        code = die(1, "%s: %s", in, d.msg);
        goto out;
    }
    free(p->metadata_json);
    p->metadata_json = strdup(meta);
    if (p->metadata_json == NULL || strata_payload_encode(p, 1, &enc, &elen, &d) < 0) {
        code = die(1, "encode: %s", d.msg);
        goto out;
    }
    FILE *f = fopen(outp, "wb");
    if (f == NULL || fwrite(enc, 1, elen, f) != elen || fclose(f) != 0) {
        code = die(1, "cannot write %s", outp);
        goto out;
    }
    code = 0;
out:
    strata_payload_free(p);
    free(frame);
    free(enc);
    return code;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"in", required_argument, NULL, 'i'},
        {"out", required_argument, NULL, 'o'},
        {"nan", no_argument, NULL, 'n'},
        {"index-out-of-range", no_argument, NULL, 'r'},
        {"rice", no_argument, NULL, 'u'},
        {"bad-crc", no_argument, NULL, 'c'},
        {"huge-samples", no_argument, NULL, 's'},
        {"metadata", required_argument, NULL, 'm'},
        {NULL, 0, NULL, 0},
    };
    const char *in = NULL, *outp = NULL, *meta = NULL;
    forge_mode mode = M_NONE;
    int c, modes = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'i':
            in = optarg;
            break;
        case 'o':
            outp = optarg;
            break;
        case 'n':
        case 'r':
        case 'u':
        case 'c':
        case 's':
            mode = c == 'n'   ? M_NAN
                   : c == 'r' ? M_OOR
                   : c == 'u' ? M_RICE
                   : c == 'c' ? M_BAD_CRC
                              : M_HUGE_SAMPLES;
            modes++;
            break;
        case 'm':
            meta = optarg;
            modes++;
            break;
        default:
            return 2;
        }
    }
    if (meta != NULL && in != NULL && outp != NULL && modes == 1 && optind == argc)
        return set_metadata(in, outp, meta);
    if (in == NULL || outp == NULL || modes != 1 || optind != argc)
        return die(2, "usage: payload_forge --in P.bin --out Q.bin "
                      "--nan|--index-out-of-range|--rice|--bad-crc|--huge-samples|"
                      "--metadata JSON");
    uint8_t *frame = NULL, *body = NULL, *forged = NULL, *z = NULL;
    size_t flen = 0, flen2 = 0;
    int code = 1;
    if (read_all(in, &frame, &flen) != 0) {
        code = die(1, "cannot read %s", in);
        goto out;
    }
    unsigned long long blen = ZSTD_getFrameContentSize(frame, flen);
    if (blen == ZSTD_CONTENTSIZE_ERROR || blen == ZSTD_CONTENTSIZE_UNKNOWN || blen > MAX_FILE ||
        (body = malloc(blen ? (size_t)blen : 1)) == NULL) {
        code = die(1, "%s: not a zstd frame with a content size", in);
        goto out;
    }
    size_t got = ZSTD_decompress(body, (size_t)blen, frame, flen);
    if (ZSTD_isError(got) || got != blen) {
        code = die(1, "%s: zstd: %s", in, ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
        goto out;
    }
    size_t nlen = 0;
    if ((code = forge(body, got, mode, &forged, &nlen)) != 0)
        goto out;
    size_t zcap = ZSTD_compressBound(nlen);
    if ((z = malloc(zcap)) == NULL) {
        code = die(1, "out of memory");
        goto out;
    }
    flen2 = ZSTD_compress(z, zcap, forged, nlen, 1);
    if (ZSTD_isError(flen2)) {
        code = die(1, "zstd: %s", ZSTD_getErrorName(flen2));
        goto out;
    }
    if (write_all(outp, z, flen2) != 0) {
        code = die(1, "cannot write %s", outp);
        goto out;
    }
    code = 0;
out:
    free(frame);
    free(body);
    free(forged);
    free(z);
    return code;
}
