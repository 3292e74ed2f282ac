/* Fuzz target: the sparse decoders dsz_decodeSparse (float32 frames), dsz_decodeSparseTyped
 * (float16, int8, uint8 frames) and dsz_decodeSparseCSR on untrusted frames, under the frame's own
 * index codec and then with the same sections read under the two others. Only frames whose
 * sections are stored raw are decoded: libdsz reads no lossless wrapper itself. Checks: a
 * decode that succeeds returns the header's nnz and writes no more than nnz values; a
 * destination one value short is exactly DSZ_error_dstSize_tooSmall; the CSR decoder returns
 * what the dense one returns (the same error, or nnz) and its entries, in order, rebuild the
 * dense matrix bit for bit. */
#include <stddef.h>
#include <stdint.h>

#include "common.h" /* dszi_dtype_load, to widen the dense matrix as the CSR holds it */
#include "fuzz_common.h"

/* Declared matrices are capped: a header may declare 2^36 elements with nnz = 0, and zeroing
 * the output is what costs; 2^20 covers the reference models' largest layer (300 x 784). */
#define MAX_VALUES (1u << 20)
/* outputs up to this size are scanned for the number of values written */
#define SCAN_VALUES (1u << 16)

/* dsz_decodeSparseCSR against the dense decoder's result r and matrix dst (the frame's dtype), into
 * arrays of exactly rows + 1 and nnz entries (ASan sees a write past them) */
static void check_csr(const dsz_frameInfo* g, const uint8_t* data, const uint8_t* index, size_t r, const uint8_t* dst)
{
    size_t const rows = (size_t)g->shape[0], cols = (size_t)g->shape[1], nnz = (size_t)g->nnz, n = rows * cols;
    int64_t* const rp = (int64_t*)malloc(sizeof(int64_t) * (rows + 1));
    int32_t* const ci = (int32_t*)malloc(nnz ? sizeof(int32_t) * nnz : 1);
    float* const va = fuzz_floats(nnz, 0);
    size_t rc, o, p;
    if (!rp || !ci) abort();
    rc = dsz_decodeSparseCSR(rp, ci, va, nnz, g, data, (size_t)g->dataRawSize, index, (size_t)g->indexRawSize);
    if (g->shape[1] > (uint64_t)INT32_MAX + 1) /* int32 columns: refused before the sections are read */
        FUZZ_CHECK(rc == r || dsz_getErrorCode(rc) == DSZ_error_parameter_outOfBound, "CSR: %s, dense: %s",
                   dsz_getErrorName(rc), dsz_getErrorName(r));
    else
        FUZZ_CHECK(rc == r, "CSR: %s, dense: %s", dsz_getErrorName(rc), dsz_getErrorName(r));
    if (!dsz_isError(rc)) {
        float* const want = fuzz_floats(n, 0);
        float* const back = fuzz_floats(n, 1);
        dszi_dtype_load(want, dst, g->dtype, n);
        FUZZ_CHECK(rp[0] == 0 && rp[rows] == (int64_t)nnz, "row pointers %lld..%lld for nnz %zu", (long long)rp[0],
                   (long long)rp[rows], nnz);
        for (o = 0; o < rows; o++) {
            FUZZ_CHECK(rp[o] <= rp[o + 1], "row %zu ends before it starts", o);
            for (p = (size_t)rp[o]; p < (size_t)rp[o + 1]; p++) {
                FUZZ_CHECK(ci[p] >= 0 && (size_t)ci[p] < cols && (p == (size_t)rp[o] || ci[p] > ci[p - 1]),
                           "column %d at %zu of row %zu", (int)ci[p], p, o);
                back[o * cols + (size_t)ci[p]] = va[p];
            }
        }
        FUZZ_CHECK(!memcmp(back, want, sizeof(float) * n), "the CSR's entries differ from the dense matrix");
        free(want);
        free(back);
    }
    if (nnz) {
        /* as the dense decoder: too small is exactly that error, unless the header was refused already */
        size_t const small = dsz_decodeSparseCSR(rp, ci, va, nnz - 1, g, data, (size_t)g->dataRawSize, index,
                                                 (size_t)g->indexRawSize);
        if (!dsz_isError(rc)) FUZZ_CHECK_ERROR(small, DSZ_error_dstSize_tooSmall);
    }
    free(rp);
    free(ci);
    free(va);
}

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    dsz_frameInfo info;
    const uint8_t *data, *index;
    size_t n, avail, ds, is;
    unsigned codec;
    size_t const hs = dsz_getFrameInfo(&info, src, size);
    if (dsz_isError(hs) || info.kind != DSZ_KIND_SPARSE) return 0;
    if (info.dataLossless != DSZ_LOSSLESS_NONE || info.indexLossless != DSZ_LOSSLESS_NONE) return 0;
    if (info.nElements > MAX_VALUES) return 0;
    avail = size - hs;
    if (avail < info.dataRawSize || avail - info.dataRawSize < info.indexRawSize) return 0;
    n = (size_t)info.nElements;
    ds = (size_t)info.dataRawSize;
    is = (size_t)info.indexRawSize;
    data = src + hs;
    index = data + ds;
    if (info.dtype != DSZ_DTYPE_FLOAT32) {
        float* const dst = fuzz_floats(n, 1);
        FUZZ_CHECK_ERROR(dsz_decodeSparse(dst, n, &info, data, ds, index, is), DSZ_error_frameParameter_unsupported);
        free(dst);
    }
    for (codec = 0; codec <= DSZ_INDEX_BITMAP; codec++) {
        dsz_frameInfo g = info;
        /* exactly n values of the frame's dtype, zero-filled: ASan sees a write past them */
        size_t const width = info.dtype == DSZ_DTYPE_FLOAT32 ? 4 : info.dtype == DSZ_DTYPE_FLOAT16 ? 2 : 1;
        uint8_t* const dst = (uint8_t*)calloc(n ? n * width : 1, 1);
        size_t r, small;
        if (!dst) abort();
        g.indexCodec = (info.indexCodec + codec) % (DSZ_INDEX_BITMAP + 1);
        r = dsz_decodeSparseTyped(dst, n, &g, data, ds, index, is);
        if (!dsz_isError(r)) {
            FUZZ_CHECK(r == info.nnz, "decoded %zu of %llu non-zeros", r, info.nnz);
            if (n <= SCAN_VALUES) {
                size_t i, j, written = 0;
                for (i = 0; i < n; i++) {
                    int any = 0;
                    for (j = 0; j < width; j++) any |= dst[i * width + j] != 0;
                    written += any;
                }
                FUZZ_CHECK(written <= info.nnz, "%zu values written, nnz %llu", written, info.nnz);
            }
        }
        if (info.dtype == DSZ_DTYPE_FLOAT32) {
            /* the float32 entry point: the same answer */
            float* const f = fuzz_floats(n, 1);
            size_t const rf = dsz_decodeSparse(f, n, &g, data, ds, index, is);
            FUZZ_CHECK(rf == r, "float32: %s, typed: %s", dsz_getErrorName(rf), dsz_getErrorName(r));
            if (!dsz_isError(r)) FUZZ_CHECK(!memcmp(f, dst, n * sizeof(float)), "typed and float32 decoders differ");
            free(f);
        }
        /* a header of no columns may declare any number of rows, and the CSR has a pointer for each */
        if (info.shape[0] <= MAX_VALUES) check_csr(&g, data, index, r, dst);
        if (n) {
            /* the destination is checked once the header is accepted, before any section is
             * read: too small is exactly that error, unless the header was refused already */
            small = dsz_decodeSparseTyped(dst, n - 1, &g, data, ds, index, is);
            if (codec == 0 || !dsz_isError(r)) FUZZ_CHECK_ERROR(small, DSZ_error_dstSize_tooSmall);
            else if (dsz_getErrorCode(small) != DSZ_error_dstSize_tooSmall)
                FUZZ_CHECK(small == r, "short destination: %s, full one: %s", dsz_getErrorName(small),
                           dsz_getErrorName(r));
        }
        free(dst);
    }
    return 0;
}
