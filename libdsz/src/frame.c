/* Frame headers of the array stream ("DSZA") and the sparse stream ("DSZS"):
 * little-endian fixed-width fields, reserved bytes zero, sizes checked against limits. */
#include <math.h>

#include "common.h"

#define ARRAY_FIXED 48
#define SPARSE_SIZE 88

static const uint8_t MAGIC_ARRAY[4] = {'D', 'S', 'Z', 'A'};
static const uint8_t MAGIC_SPARSE[4] = {'D', 'S', 'Z', 'S'};

static int bound_ok(double b) { return isfinite(b) && b > 0; }

/* checks shared by reading, writing and decoding; returns 0 or an error */
size_t dszi_frame_check(const dsz_frameInfo* f)
{
    size_t dataBound;
    if (!dszi_dtype_size(f->dtype)) return DSZI_ERROR(frameParameter_unsupported);
    /* a version-1 frame holds float32 only: other dtypes came with version 2 */
    if (f->version < dszi_dtype_version(f->dtype)) return DSZI_ERROR(corruption_detected);
    if (f->predictor > DSZ_PRED_LORENZO || f->mode > DSZ_MODE_REL) return DSZI_ERROR(frameParameter_unsupported);
    if (f->dataLossless > DSZ_LOSSLESS_ZLIB || f->indexLossless > DSZ_LOSSLESS_ZLIB) return DSZI_ERROR(frameParameter_unsupported);
    if (f->radius == 0 || f->radius > DSZ_RADIUS_MAX) return DSZI_ERROR(corruption_detected);
    if (!bound_ok(f->errorBound) || !dszi_dtype_bound_ok(f->dtype, f->errorBound) || !isfinite(f->userBound))
        return DSZI_ERROR(corruption_detected);
    if (f->nnz > f->nElements || f->nElements > DSZ_MAX_ELEMENTS) return DSZI_ERROR(corruption_detected);
    /* a 32-bit build can neither address nor count more float32 values than this (nor can it cast
       nnz to size_t below): such a frame is valid but cannot be decoded here */
    if (f->nElements > (uint64_t)((size_t)-1 / sizeof(float))) return DSZI_ERROR(frameParameter_unsupported);
    dataBound = dszi_data_bound((size_t)f->nnz, f->radius);
    if (dsz_isError(dataBound) || f->dataRawSize > dataBound) return DSZI_ERROR(corruption_detected);
    /* every value takes at least one bit: this bounds what a decoder allocates */
    if (f->nnz / 8 > f->dataRawSize) return DSZI_ERROR(corruption_detected);
    if (f->dataLossless == DSZ_LOSSLESS_NONE && f->dataStoredSize != f->dataRawSize) return DSZI_ERROR(corruption_detected);
    if (f->kind == DSZ_KIND_SPARSE) {
        size_t const ib = dszi_index_bound(f->indexCodec, f->nElements, f->nnz);
        if (dsz_isError(ib)) return DSZI_ERROR(frameParameter_unsupported);
        if (f->indexRawSize > ib) return DSZI_ERROR(corruption_detected);
        if (f->indexLossless == DSZ_LOSSLESS_NONE && f->indexStoredSize != f->indexRawSize) return DSZI_ERROR(corruption_detected);
    } else if (f->indexCodec || f->indexLossless || f->indexRawSize || f->indexStoredSize) {
        return DSZI_ERROR(corruption_detected);
    }
    if (f->dataStoredSize > DSZ_MAX_ELEMENTS * 8 || f->indexStoredSize > DSZ_MAX_ELEMENTS * 8) return DSZI_ERROR(corruption_detected);
    return 0;
}

size_t dsz_getFrameInfo(dsz_frameInfo* f, const void* srcv, size_t srcSize)
{
    const uint8_t* const src = (const uint8_t*)srcv;
    unsigned i;
    memset(f, 0, sizeof(*f));
    if (srcSize < 8) return DSZI_ERROR(srcSize_wrong);
    if (!memcmp(src, MAGIC_ARRAY, 4)) f->kind = DSZ_KIND_ARRAY;
    else if (!memcmp(src, MAGIC_SPARSE, 4)) f->kind = DSZ_KIND_SPARSE;
    else return DSZI_ERROR(prefix_unknown);
    f->version = src[4];
    if (f->version == 0 || f->version > DSZ_FORMAT_VERSION) return DSZI_ERROR(version_unsupported);
    f->dtype = src[5];
    if (f->kind == DSZ_KIND_ARRAY) {
        f->ndim = src[6];
        if (f->ndim > DSZ_MAX_NDIM) return DSZI_ERROR(corruption_detected);
        f->headerSize = ARRAY_FIXED + 8 * (size_t)f->ndim;
        if (srcSize < f->headerSize) return DSZI_ERROR(srcSize_wrong);
        f->predictor = src[7];
        f->mode = src[8];
        f->dataLossless = src[9];
        if (dszi_rd16(src + 10)) return DSZI_ERROR(corruption_detected);
    } else {
        f->ndim = 2;
        f->headerSize = SPARSE_SIZE;
        if (srcSize < f->headerSize) return DSZI_ERROR(srcSize_wrong);
        f->indexCodec = src[6];
        f->predictor = src[7];
        f->mode = src[8];
        f->dataLossless = src[9];
        f->indexLossless = src[10];
        if (src[11]) return DSZI_ERROR(corruption_detected);
    }
    f->radius = dszi_rd32(src + 12);
    f->errorBound = dszi_rdf64(src + 16);
    f->userBound = dszi_rdf64(src + 24);
    f->dataRawSize = dszi_rd64(src + 32);
    f->dataStoredSize = dszi_rd64(src + 40);
    if (f->kind == DSZ_KIND_ARRAY) {
        f->nElements = 1;
        for (i = 0; i < f->ndim; i++) {
            uint64_t const e = dszi_rd64(src + ARRAY_FIXED + 8 * i);
            f->shape[i] = e;
            if (e && f->nElements > DSZ_MAX_ELEMENTS / e) return DSZI_ERROR(corruption_detected);
            f->nElements *= e;
        }
        f->nnz = f->nElements;
    } else {
        f->shape[0] = dszi_rd64(src + 48);
        f->shape[1] = dszi_rd64(src + 56);
        if (f->shape[1] && f->shape[0] > DSZ_MAX_ELEMENTS / f->shape[1]) return DSZI_ERROR(corruption_detected);
        f->nElements = f->shape[0] * f->shape[1];
        f->nnz = dszi_rd64(src + 64);
        f->indexRawSize = dszi_rd64(src + 72);
        f->indexStoredSize = dszi_rd64(src + 80);
    }
    DSZI_CHECK(dszi_frame_check(f));
    return f->headerSize;
}

size_t dsz_writeFrameHeader(void* dstv, size_t cap, const dsz_frameInfo* f)
{
    uint8_t* const dst = (uint8_t*)dstv;
    size_t hs;
    unsigned i;
    uint64_t n = 1;
    dsz_frameInfo g = *f;
    if (f->kind == DSZ_KIND_ARRAY) {
        if (f->ndim > DSZ_MAX_NDIM) return DSZI_ERROR(parameter_outOfBound);
        for (i = 0; i < f->ndim; i++) {
            if (f->shape[i] && n > DSZ_MAX_ELEMENTS / f->shape[i]) return DSZI_ERROR(parameter_outOfBound);
            n *= f->shape[i];
        }
        g.nnz = n;
        hs = ARRAY_FIXED + 8 * (size_t)f->ndim;
    } else if (f->kind == DSZ_KIND_SPARSE) {
        if (f->shape[1] && f->shape[0] > DSZ_MAX_ELEMENTS / f->shape[1]) return DSZI_ERROR(parameter_outOfBound);
        n = f->shape[0] * f->shape[1];
        hs = SPARSE_SIZE;
    } else {
        return DSZI_ERROR(parameter_unsupported);
    }
    g.nElements = n;
    /* a version that holds the dtype (the encoders write the oldest one, so that older readers
       keep reading float32 frames) */
    if (f->version < dszi_dtype_version(f->dtype) || f->version > DSZ_FORMAT_VERSION) return DSZI_ERROR(version_unsupported);
    if (dsz_isError(dszi_frame_check(&g))) return DSZI_ERROR(parameter_outOfBound);
    if (cap < hs) return DSZI_ERROR(dstSize_tooSmall);
    memset(dst, 0, hs);
    memcpy(dst, f->kind == DSZ_KIND_ARRAY ? MAGIC_ARRAY : MAGIC_SPARSE, 4);
    dst[4] = (uint8_t)f->version;
    dst[5] = (uint8_t)f->dtype;
    dst[7] = (uint8_t)f->predictor;
    dst[8] = (uint8_t)f->mode;
    dst[9] = (uint8_t)f->dataLossless;
    dszi_wr32(dst + 12, f->radius);
    dszi_wrf64(dst + 16, f->errorBound);
    dszi_wrf64(dst + 24, f->userBound);
    dszi_wr64(dst + 32, f->dataRawSize);
    dszi_wr64(dst + 40, f->dataStoredSize);
    if (f->kind == DSZ_KIND_ARRAY) {
        dst[6] = (uint8_t)f->ndim;
        for (i = 0; i < f->ndim; i++) dszi_wr64(dst + ARRAY_FIXED + 8 * i, f->shape[i]);
    } else {
        dst[6] = (uint8_t)f->indexCodec;
        dst[10] = (uint8_t)f->indexLossless;
        dszi_wr64(dst + 48, f->shape[0]);
        dszi_wr64(dst + 56, f->shape[1]);
        dszi_wr64(dst + 64, f->nnz);
        dszi_wr64(dst + 72, f->indexRawSize);
        dszi_wr64(dst + 80, f->indexStoredSize);
    }
    return hs;
}

unsigned long long dsz_getFrameElementCount(const void* src, size_t srcSize)
{
    dsz_frameInfo f;
    if (!src || dsz_isError(dsz_getFrameInfo(&f, src, srcSize))) return DSZ_ELEMENTCOUNT_ERROR;
    return f.nElements;
}
