/* The array codec: a frame header followed by one data section. */
#include <stdlib.h>

#include "common.h"

#define ARRAY_HEADER_MAX (48 + 8 * DSZ_MAX_NDIM)

size_t dsz_compressBound(size_t n, unsigned radius)
{
    size_t const b = dszi_data_bound(n, radius ? radius : DSZ_RADIUS_DEFAULT);
    if (dsz_isError(b) || b > (size_t)-1 - ARRAY_HEADER_MAX) return DSZI_ERROR(parameter_outOfBound);
    return ARRAY_HEADER_MAX + b;
}

/* src: n floats (float32) or n values of dtype converted to floats by the caller */
static size_t compress_floats(uint8_t* dst, size_t cap, const float* src, uint64_t n, unsigned dtype,
                              const unsigned long long* shape, unsigned ndim, const dsz_params* p)
{
    dsz_frameInfo f;
    dszi_quant q;
    unsigned pred, i;
    size_t hs, ds;
    memset(&f, 0, sizeof(f));
    f.kind = DSZ_KIND_ARRAY;
    f.version = dszi_dtype_version(dtype);
    f.dtype = dtype;
    f.ndim = ndim;
    for (i = 0; i < ndim; i++) f.shape[i] = shape[i];
    f.mode = p->mode;
    f.errorBound = p->errorBound;
    f.userBound = p->userBound;
    hs = 48 + 8 * (size_t)ndim;
    if (cap < hs) return DSZI_ERROR(dstSize_tooSmall);
    dszi_quant_init(&q, p->errorBound, p->radius, 0, dtype);
    pred = p->predictor;
    ds = dszi_data_encode(dst + hs, cap - hs, src, (size_t)n, &q, &pred);
    if (dsz_isError(ds)) return ds;
    f.radius = q.radius;
    f.predictor = pred;
    f.dataRawSize = f.dataStoredSize = ds;
    DSZI_CHECK(dsz_writeFrameHeader(dst, hs, &f));
    return hs + ds;
}

/* the element count of a shape, or an error */
static size_t check_shape(const unsigned long long* shape, unsigned ndim, uint64_t* n)
{
    unsigned i;
    *n = 1;
    if (ndim > DSZ_MAX_NDIM || (ndim && !shape)) return DSZI_ERROR(parameter_outOfBound);
    for (i = 0; i < ndim; i++) {
        if (shape[i] && *n > DSZ_MAX_ELEMENTS / shape[i]) return DSZI_ERROR(parameter_outOfBound);
        *n *= shape[i];
    }
    return 0;
}

size_t dsz_compress(void* dst, size_t cap, const float* src, const unsigned long long* shape, unsigned ndim,
                    const dsz_params* p)
{
    uint64_t n;
    DSZI_CHECK(dszi_checkParams(p));
    DSZI_CHECK(check_shape(shape, ndim, &n));
    if (n && !src) return DSZI_ERROR(parameter_unsupported);
    return compress_floats((uint8_t*)dst, cap, src, n, DSZ_DTYPE_FLOAT32, shape, ndim, p);
}

size_t dsz_compressTyped(void* dst, size_t cap, const void* src, unsigned dtype, const unsigned long long* shape,
                         unsigned ndim, const dsz_params* p)
{
    uint64_t n;
    float* vals;
    size_t r;
    DSZI_CHECK(dszi_checkParams(p));
    DSZI_CHECK(check_shape(shape, ndim, &n));
    if (!dszi_dtype_size(dtype)) return DSZI_ERROR(parameter_unsupported);
    if (!dszi_dtype_bound_ok(dtype, p->errorBound)) return DSZI_ERROR(parameter_outOfBound);
    if (n && !src) return DSZI_ERROR(parameter_unsupported);
    if (dtype == DSZ_DTYPE_FLOAT32) return compress_floats((uint8_t*)dst, cap, (const float*)src, n, dtype, shape, ndim, p);
    if (n > (uint64_t)((size_t)-1 / sizeof(float))) return DSZI_ERROR(parameter_outOfBound);
    vals = (float*)malloc(sizeof(float) * (n ? (size_t)n : 1));
    if (!vals) return DSZI_ERROR(memory_allocation);
    dszi_dtype_load(vals, src, dtype, (size_t)n);
    r = compress_floats((uint8_t*)dst, cap, vals, n, dtype, shape, ndim, p);
    free(vals);
    return r;
}

/* the checks dsz_decompressArrayTyped makes of a frame before reading its section */
static size_t array_check(const dsz_frameInfo* f, size_t dataSize)
{
    uint64_t prod = 1;
    unsigned i;
    if (!f || f->kind != DSZ_KIND_ARRAY) return DSZI_ERROR(parameter_unsupported);
    DSZI_CHECK(dszi_frame_check(f));
    if (f->nnz != f->nElements || f->ndim > DSZ_MAX_NDIM) return DSZI_ERROR(corruption_detected);
    for (i = 0; i < f->ndim; i++) {
        if (f->shape[i] && prod > DSZ_MAX_ELEMENTS / f->shape[i]) return DSZI_ERROR(corruption_detected);
        prod *= f->shape[i];
    }
    if (prod != f->nElements) return DSZI_ERROR(corruption_detected);
    if (dataSize != f->dataRawSize) return DSZI_ERROR(srcSize_wrong);
    return 0;
}

size_t dsz_decompressArrayTyped(void* dst, size_t dstCapacity, const dsz_frameInfo* f, const void* data,
                                size_t dataSize)
{
    dszi_dataDec d;
    dszi_quant q;
    size_t r;
    DSZI_CHECK(array_check(f, dataSize));
    if (dstCapacity < f->nElements) return DSZI_ERROR(dstSize_tooSmall);
    dszi_quant_init(&q, f->errorBound, f->radius, 0, f->dtype);
    r = dszi_data_open(&d, (const uint8_t*)data, dataSize, (size_t)f->nElements, &q, f->predictor);
    if (dsz_isError(r)) return r;
    r = dszi_data_decodeAllTyped(&d, dst, (size_t)f->nElements);
    dszi_data_free(&d);
    return dsz_isError(r) ? r : (size_t)f->nElements;
}

size_t dsz_decodeArrayDelta(float* dst, size_t dstCapacity, const float* base, const dsz_frameInfo* f,
                            const void* data, size_t dataSize)
{
    dszi_dataDec d;
    dszi_quant q;
    float vals[256];
    size_t r, k, i;
    DSZI_CHECK(array_check(f, dataSize));
    if (f->dtype != DSZ_DTYPE_FLOAT32) return DSZI_ERROR(frameParameter_unsupported);
    if (dstCapacity < f->nElements) return DSZI_ERROR(dstSize_tooSmall);
    if (f->nElements && (!dst || !base)) return DSZI_ERROR(parameter_unsupported);
    dszi_quant_init(&q, f->errorBound, f->radius, 0, f->dtype);
    r = dszi_data_open(&d, (const uint8_t*)data, dataSize, (size_t)f->nElements, &q, f->predictor);
    if (dsz_isError(r)) return r;
    /* one pass: each value decoded into a small buffer that stays in cache, added to the base's */
    for (k = 0; k < (size_t)f->nElements; k += 256) {
        size_t const m = (size_t)f->nElements - k < 256 ? (size_t)f->nElements - k : 256;
        if (dszi_data_decode(&d, vals, m)) {
            dszi_data_free(&d);
            return DSZI_ERROR(corruption_detected);
        }
        for (i = 0; i < m; i++) dst[k + i] = base[k + i] + vals[i];
    }
    r = dszi_data_close(&d);
    dszi_data_free(&d);
    return dsz_isError(r) ? r : (size_t)f->nElements;
}

size_t dsz_decompressArray(float* dst, size_t dstCapacity, const dsz_frameInfo* f, const void* data, size_t dataSize)
{
    if (f && f->dtype != DSZ_DTYPE_FLOAT32) return DSZI_ERROR(frameParameter_unsupported);
    return dsz_decompressArrayTyped(dst, dstCapacity, f, data, dataSize);
}

size_t dsz_decompress(float* dst, size_t dstCapacity, const void* src, size_t srcSize)
{
    dsz_frameInfo f;
    size_t const hs = dsz_getFrameInfo(&f, src, srcSize);
    if (dsz_isError(hs)) return hs;
    if (f.kind != DSZ_KIND_ARRAY) return DSZI_ERROR(prefix_unknown);
    if (f.dataLossless != DSZ_LOSSLESS_NONE) return DSZI_ERROR(frameParameter_unsupported);
    if (srcSize - hs != f.dataStoredSize) return DSZI_ERROR(srcSize_wrong);
    return dsz_decompressArray(dst, dstCapacity, &f, (const uint8_t*)src + hs, srcSize - hs);
}
