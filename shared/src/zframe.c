/* zstd frames (see strata/zframe.h): the only file that includes zstd.h. */
#include "strata/zframe.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define FRAME_MAGIC 0xFD2FB528u
#define SKIPPABLE_MASK 0xFFFFFFF0u
#define SKIPPABLE_MAGIC 0x184D2A50u

struct strata_zctx {
    ZSTD_CCtx *c;
    ZSTD_DCtx *d;
};

int strata_zctx_new(strata_zctx **out)
{
    *out = NULL;
    strata_zctx *z = calloc(1, sizeof(*z));
    if (z == NULL)
        return STRATA_ENOMEM;
    z->c = ZSTD_createCCtx();
    z->d = ZSTD_createDCtx();
    if (z->c == NULL || z->d == NULL) {
        strata_zctx_free(z);
        return STRATA_ENOMEM;
    }
    *out = z;
    return STRATA_OK;
}

void strata_zctx_free(strata_zctx *z)
{
    if (z == NULL)
        return;
    ZSTD_freeCCtx(z->c);
    ZSTD_freeDCtx(z->d);
    free(z);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int strata_zframe_compress(strata_zctx *z, const void *in, size_t len, int level, uint8_t **out,
                           size_t *out_len, strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (out == NULL || out_len == NULL || (in == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "zstd: NULL argument");
    if (level < 1 || level > STRATA_ZFRAME_MAX_LEVEL)
        return strata_diag_set(diag, STRATA_EINVAL, "zstd level %d outside [1, %d]", level,
                               STRATA_ZFRAME_MAX_LEVEL);
    size_t bound = ZSTD_compressBound(len);
    if (ZSTD_isError(bound) || bound == 0)
        return strata_diag_set(diag, STRATA_ETOOBIG, "%zu bytes are too large for zstd", len);
    int rc = STRATA_OK;
    ZSTD_CCtx *own = NULL, *c = z != NULL ? z->c : (own = ZSTD_createCCtx());
    uint8_t *frame = malloc(bound);
    if (frame == NULL || c == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory (zstd)");
        goto out;
    }
    size_t zr = ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
    if (!ZSTD_isError(zr))
        zr = ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
    if (!ZSTD_isError(zr))
        zr = ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
    if (!ZSTD_isError(zr))
        zr = ZSTD_compress2(c, frame, bound, in, len);
    if (ZSTD_isError(zr)) {
        rc =
            strata_diag_set(diag, STRATA_EIO, "zstd compression failed: %s", ZSTD_getErrorName(zr));
        goto out;
    }
    uint8_t *shrunk = realloc(frame, zr);
    *out = shrunk != NULL ? shrunk : frame;
    *out_len = zr;
    frame = NULL;
out:
    free(frame);
    ZSTD_freeCCtx(own);
    return rc;
}

int strata_zframe_decompress(strata_zctx *z, const uint8_t *in, size_t len, size_t min_len,
                             size_t max_len, uint8_t **out, size_t *out_len, strata_diag *diag)
{
    if (out != NULL)
        *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (out == NULL || out_len == NULL || (in == NULL && len > 0))
        return strata_diag_set(diag, STRATA_EINVAL, "zstd: NULL argument");
    if (len < 4)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "input of %zu bytes is too short for a zstd frame", len);
    uint32_t magic = get_u32(in);
    if ((magic & SKIPPABLE_MASK) == SKIPPABLE_MAGIC)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "input starts with a skippable zstd frame, not a data frame");
    if (magic != FRAME_MAGIC)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "not a zstd frame (first bytes %02x %02x %02x %02x)", in[0], in[1],
                               in[2], in[3]);
    unsigned long long fcs = ZSTD_getFrameContentSize(in, len);
    if (fcs == ZSTD_CONTENTSIZE_ERROR)
        return strata_diag_set(diag, STRATA_EPROTO, "zstd frame header is invalid or truncated");
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN)
        return strata_diag_set(diag, STRATA_EPROTO, "zstd frame does not declare its content size");
    if (fcs > max_len || fcs >= SIZE_MAX)
        return strata_diag_set(diag, STRATA_ETOOBIG,
                               "zstd frame declares %llu decoded bytes, above the limit of %zu",
                               fcs, max_len);
    if (fcs < min_len)
        return strata_diag_set(diag, STRATA_EPROTO,
                               "zstd frame declares %llu decoded bytes, below the %zu-byte minimum",
                               fcs, min_len);
    size_t flen = ZSTD_findFrameCompressedSize(in, len);
    if (ZSTD_isError(flen))
        return strata_diag_set(diag, STRATA_EPROTO, "zstd frame is truncated or corrupt: %s",
                               ZSTD_getErrorName(flen));
    if (flen < len) {
        int second = len - flen >= 4 && (get_u32(in + flen) == FRAME_MAGIC ||
                                         (get_u32(in + flen) & SKIPPABLE_MASK) == SKIPPABLE_MAGIC);
        return strata_diag_set(
            diag, STRATA_EPROTO, "%zu bytes after the zstd frame (%s)", len - flen,
            second ? "a second frame: exactly one is allowed" : "trailing garbage");
    }
    int rc = STRATA_OK;
    ZSTD_DCtx *own = NULL, *d = z != NULL ? z->d : (own = ZSTD_createDCtx());
    uint8_t *dst = malloc(fcs > 0 ? (size_t)fcs : 1);
    if (dst == NULL || d == NULL) {
        rc = strata_diag_set(diag, STRATA_ENOMEM, "out of memory (%llu-byte frame content)", fcs);
        goto out;
    }
    size_t got = ZSTD_decompressDCtx(d, dst, (size_t)fcs, in, flen);
    if (ZSTD_isError(got)) {
        rc = strata_diag_set(diag, STRATA_EPROTO, "zstd decompression failed: %s",
                             ZSTD_getErrorName(got));
        goto out;
    }
    if (got != fcs) {
        rc = strata_diag_set(diag, STRATA_EPROTO,
                             "zstd frame decoded to %zu bytes but declared %llu", got, fcs);
        goto out;
    }
    *out = dst;
    *out_len = (size_t)fcs;
    dst = NULL;
out:
    free(dst);
    ZSTD_freeDCtx(own);
    return rc;
}
