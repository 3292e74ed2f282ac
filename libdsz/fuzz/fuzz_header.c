/* Fuzz target: the frame header parsers (dsz_getFrameInfo, dsz_getFrameElementCount) on untrusted
 * bytes. The element count is the parsed header's, or DSZ_ELEMENTCOUNT_ERROR exactly where the
 * header does not parse. A header that parses must be self-consistent (shape product, counts, section sizes within their bounds),
 * must be written back byte for byte by dsz_writeFrameHeader, and must need all of its bytes:
 * one byte fewer is exactly DSZ_error_srcSize_wrong. (The .dsz model container around the
 * frames is parsed in Python: tests/fuzz_load.py.) */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"

static void check_info(const dsz_frameInfo* f, size_t hs)
{
    unsigned long long n = 1;
    size_t bound;
    unsigned i;
    FUZZ_CHECK(f->headerSize == hs, "headerSize %zu, returned %zu", f->headerSize, hs);
    /* float32 since version 1; float16, int8, uint8 since version 2 */
    FUZZ_CHECK(f->version >= 1 && f->version <= DSZ_FORMAT_VERSION && f->dtype >= DSZ_DTYPE_FLOAT32 &&
                   f->dtype <= DSZ_DTYPE_UINT8 && (f->dtype == DSZ_DTYPE_FLOAT32 || f->version >= 2),
               "version %u dtype %u", f->version, f->dtype);
    if (f->dtype == DSZ_DTYPE_INT8 || f->dtype == DSZ_DTYPE_UINT8)
        FUZZ_CHECK(f->errorBound >= 0.5 && f->errorBound <= 255.5 && (double)(long)(f->errorBound - 0.5) == f->errorBound - 0.5,
                   "integer frame with bound %g", f->errorBound);
    FUZZ_CHECK(f->predictor <= DSZ_PRED_LORENZO && f->mode <= DSZ_MODE_REL, "predictor %u mode %u", f->predictor,
               f->mode);
    FUZZ_CHECK(f->radius >= 1 && f->radius <= DSZ_RADIUS_MAX, "radius %u", f->radius);
    FUZZ_CHECK(f->errorBound > 0 && f->errorBound - f->errorBound == 0, "errorBound %g", f->errorBound);
    FUZZ_CHECK(f->userBound - f->userBound == 0, "userBound %g", f->userBound);
    FUZZ_CHECK(f->dataLossless <= DSZ_LOSSLESS_ZLIB, "dataLossless %u", f->dataLossless);
    for (i = 0; i < f->ndim; i++) n *= f->shape[i]; /* cannot wrap: checked below against the parser's */
    FUZZ_CHECK(f->nElements == n && n <= DSZ_MAX_ELEMENTS, "nElements %llu, shape product %llu", f->nElements, n);
    FUZZ_CHECK(f->nnz <= f->nElements, "nnz %llu > nElements %llu", f->nnz, f->nElements);
    FUZZ_CHECK(f->nnz / 8 <= f->dataRawSize, "nnz %llu in %llu data bytes", f->nnz, f->dataRawSize);
    if (f->dataLossless == DSZ_LOSSLESS_NONE)
        FUZZ_CHECK(f->dataStoredSize == f->dataRawSize, "raw data stored in %llu of %llu", f->dataStoredSize,
                   f->dataRawSize);
    if (f->kind == DSZ_KIND_ARRAY) {
        FUZZ_CHECK(f->ndim <= DSZ_MAX_NDIM && hs == 48 + 8 * (size_t)f->ndim, "array ndim %u header %zu", f->ndim, hs);
        FUZZ_CHECK(f->nnz == f->nElements, "array nnz %llu != %llu", f->nnz, f->nElements);
        FUZZ_CHECK(!f->indexCodec && !f->indexLossless && !f->indexRawSize && !f->indexStoredSize, "array index fields");
        bound = dsz_compressBound((size_t)f->nElements, f->radius);
        FUZZ_CHECK(!dsz_isError(bound) && f->dataRawSize <= bound - hs, "data %llu over its bound",
                   f->dataRawSize);
    } else {
        FUZZ_CHECK(f->kind == DSZ_KIND_SPARSE && f->ndim == 2 && hs == 88, "sparse kind %u ndim %u header %zu",
                   f->kind, f->ndim, hs);
        FUZZ_CHECK(f->indexCodec <= DSZ_INDEX_BITMAP && f->indexLossless <= DSZ_LOSSLESS_ZLIB, "index codec %u/%u",
                   f->indexCodec, f->indexLossless);
        if (f->indexLossless == DSZ_LOSSLESS_NONE)
            FUZZ_CHECK(f->indexStoredSize == f->indexRawSize, "raw index stored in %llu of %llu",
                       f->indexStoredSize, f->indexRawSize);
        bound = dsz_sparseBound((size_t)f->shape[0], (size_t)f->shape[1], (size_t)f->nnz, f->radius);
        FUZZ_CHECK(!dsz_isError(bound) && f->dataRawSize + f->indexRawSize <= bound - hs,
                   "sections %llu + %llu over their bound", f->dataRawSize, f->indexRawSize);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    dsz_frameInfo info, again;
    uint8_t out[48 + 8 * DSZ_MAX_NDIM];
    size_t const hs = dsz_getFrameInfo(&info, src, size);
    unsigned long long const count = dsz_getFrameElementCount(src, size);
    FUZZ_CHECK(dsz_getErrorName(hs) != NULL, "unnamed result");
    FUZZ_CHECK(count == (dsz_isError(hs) ? DSZ_ELEMENTCOUNT_ERROR : info.nElements), "element count %llu", count);
    if (dsz_isError(hs)) return 0;
    FUZZ_CHECK(hs <= size && hs <= sizeof(out), "header of %zu bytes from %zu", hs, size);
    check_info(&info, hs);
    /* the header alone parses the same; a byte less is too short */
    FUZZ_CHECK(dsz_getFrameInfo(&again, src, hs) == hs && !memcmp(&again, &info, sizeof(info)),
               "the header alone parses differently");
    FUZZ_CHECK_ERROR(dsz_getFrameInfo(&again, src, hs - 1), DSZ_error_srcSize_wrong);
    /* writing the parsed fields back gives the same bytes */
    FUZZ_CHECK(dsz_writeFrameHeader(out, sizeof(out), &info) == hs, "header not written back");
    FUZZ_CHECK(!memcmp(out, src, hs), "header written back differs");
    FUZZ_CHECK_ERROR(dsz_writeFrameHeader(out, hs - 1, &info), DSZ_error_dstSize_tooSmall);
    return 0;
}
