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
 *   --unsorted            the second index of the first topk layer becomes
 *                         equal to the first (a gap of 0: the indices are no
 *                         longer strictly ascending; descending order cannot
 *                         be expressed in the gap encoding)
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

typedef enum { M_NONE, M_NAN, M_OOR, M_UNSORTED, M_BAD_CRC, M_HUGE_SAMPLES } forge_mode;

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

/* Reads one LEB128 varint at p[*at, end); -1 when it runs off the end or is
 * longer than 5 bytes. */
static int get_varint(const uint8_t *p, size_t end, size_t *at, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 35; shift += 7) {
        if (*at >= end)
            return -1;
        uint8_t b = p[(*at)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0)
            return 0;
    }
    return -1;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p[n++] = (uint8_t)(b | (v ? 0x80 : 0));
    } while (v);
    return n;
}

/* Bytes per value of a values_format (0 fp32, 1 fp16, 2 bf16). */
static size_t value_width(uint8_t vf)
{
    return vf == 0 ? 4 : 2;
}

/* Sets value 0 of count byte-shuffled values at v to a quiet NaN of format vf. */
static void set_nan(uint8_t *v, uint64_t count, uint8_t vf)
{
    uint32_t bits = vf == 0 ? 0x7fc00000u : vf == 1 ? 0x7e00u : 0x7fc0u;
    for (size_t j = 0; j < value_width(vf); j++)
        v[j * count] = (uint8_t)(bits >> (8 * j));
}

/* Rewrites the index varints of a topk block (data, data_len) for mode;
 * returns the new data in *out (malloc'd) and its length. */
static int forge_indices(const uint8_t *data, uint64_t data_len, uint64_t numel, uint64_t count,
                         uint8_t vf, forge_mode mode, uint8_t **out, size_t *out_len)
{
    size_t vbytes = (size_t)count * value_width(vf);
    if (count < 2 || vbytes > data_len)
        return die(1, "the topk layer needs at least 2 kept elements");
    size_t idx_end = (size_t)data_len - vbytes;
    uint64_t *idx = calloc((size_t)count, sizeof(*idx));
    uint8_t *buf = malloc((size_t)count * 5 + vbytes);
    if (idx == NULL || buf == NULL) {
        free(idx);
        free(buf);
        return die(1, "out of memory");
    }
    size_t at = 0;
    uint64_t run = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t gap;
        if (get_varint(data, idx_end, &at, &gap) < 0) {
            free(idx);
            free(buf);
            return die(1, "malformed index varints");
        }
        run += gap;
        idx[i] = run;
    }
    if (mode == M_OOR)
        idx[count - 1] = numel;
    else
        idx[1] = idx[0];
    size_t n = 0;
    for (uint64_t i = 0; i < count; i++)
        n += put_varint(buf + n, i == 0 ? idx[0] : idx[i] - idx[i - 1]);
    memcpy(buf + n, data + idx_end, vbytes);
    free(idx);
    *out = buf;
    *out_len = n + vbytes;
    return 0;
}

/* Builds the forged body from body[0, len) into *out. */
static int forge(const uint8_t *body, size_t len, forge_mode mode, uint8_t **out, size_t *out_len)
{
    if (len < HEADER_LEN + 8 || memcmp(body, "STRP", 4) != 0)
        return die(1, "not a payload body");
    uint32_t nlayers = get32(body + 40);
    /* The forged body is at most 4 bytes per kept index longer than the
     * original (a 1-byte varint that becomes a 5-byte one). */
    size_t cap = len * 5 + 64;
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
        if (dlen > len - at - BLOCK_LEN || vf > 2)
            goto bad;
        const uint8_t *data = blk + BLOCK_LEN;
        memcpy(nb + n, blk, BLOCK_LEN);
        uint8_t *nblk = nb + n;
        n += BLOCK_LEN;
        int has_values = comp == COMP_NONE || comp == COMP_FP16 || comp == COMP_BF16 ||
                         comp == COMP_TOPK || comp == COMP_RANDK;
        if (!done && mode == M_NAN && has_values && count > 0 && count * value_width(vf) <= dlen) {
            memcpy(nb + n, data, (size_t)dlen);
            set_nan(nb + n + (dlen - count * value_width(vf)), count, vf);
            n += (size_t)dlen;
            done = 1;
        } else if (!done && (mode == M_OOR || mode == M_UNSORTED) && comp == COMP_TOPK) {
            uint8_t *nd = NULL;
            size_t ndl = 0;
            int rc = forge_indices(data, dlen, numel, count, vf, mode, &nd, &ndl);
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
        {"unsorted", no_argument, NULL, 'u'},
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
                   : c == 'u' ? M_UNSORTED
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
                      "--nan|--index-out-of-range|--unsorted|--bad-crc|--huge-samples|"
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
