/* Fuzz target: the index decoders (gap8, huffgap, bitmap). libdsz has no index-only decode
 * entry point, so this drives dsz_decodeSparse with a fuzzer-chosen index section and matrix
 * shape next to a fixed valid data section holding the values 1, 2, ..., nnz (Lorenzo-coded,
 * so that a small radius and table suffice and a section of any nnz is cheap to make).
 * Input: codec (1 byte), rows - 1 (1 byte), cols - 1 (2 bytes, LE), nnz (2 bytes, LE), then
 * the index section. Checks on success: the return is nnz; the matrix holds exactly nnz
 * non-zeros, the k-th in row-major order being k; encoding those positions again
 * (dsz_encodeSparseIndex) gives the same bytes for gap8, whose symbols are unique, and bytes
 * that decode to the same matrix for the entropy-coded codecs. A destination one value short
 * is exactly DSZ_error_dstSize_tooSmall. dsz_decodeSparseCSR on the same sections returns the
 * same, and on success its k-th entry is k at the k-th non-zero's row and column. */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"

/* small matrices keep the decoder's and the checks' O(rows * cols) work cheap; a row of 640
 * still holds gaps that need filler symbols */
#define MAX_ROWS 32
#define MAX_COLS 640
#define MAX_NNZ 4096
#define RADIUS 4

/* the data section coding 1..nnz (exact under the bound 0.25: steps of 0.5), made once per nnz */
static uint8_t* data_sections[MAX_NNZ + 1];
static size_t data_sizes[MAX_NNZ + 1];

static const uint8_t* data_section(size_t nnz, size_t* size)
{
    if (!data_sections[nnz]) {
        dsz_params* const p = fuzz_params(0.25, DSZ_MODE_ABS, DSZ_PRED_LORENZO, RADIUS);
        unsigned long long const shape[1] = {nnz};
        size_t const cap = dsz_compressBound(nnz, RADIUS);
        float* const v = fuzz_floats(nnz, 0);
        uint8_t* const frame = (uint8_t*)malloc(cap);
        dsz_frameInfo f;
        size_t i, r, hs;
        FUZZ_CHECK(frame != NULL, "out of memory");
        for (i = 0; i < nnz; i++) v[i] = (float)(i + 1);
        r = dsz_compress(frame, cap, v, shape, 1, p);
        FUZZ_CHECK(!dsz_isError(r), "%s", dsz_getErrorName(r));
        hs = dsz_getFrameInfo(&f, frame, r);
        FUZZ_CHECK(!dsz_isError(hs), "%s", dsz_getErrorName(hs));
        data_sizes[nnz] = r - hs;
        data_sections[nnz] = (uint8_t*)malloc(r - hs + 1);
        FUZZ_CHECK(data_sections[nnz] != NULL, "out of memory");
        memcpy(data_sections[nnz], frame + hs, r - hs);
        free(frame);
        free(v);
        dsz_freeParams(p);
    }
    *size = data_sizes[nnz];
    return data_sections[nnz];
}

static dsz_frameInfo sparse_info(unsigned codec, size_t rows, size_t cols, size_t nnz, size_t ds, size_t is)
{
    dsz_frameInfo f;
    memset(&f, 0, sizeof(f));
    f.kind = DSZ_KIND_SPARSE;
    f.version = DSZ_FORMAT_VERSION;
    f.dtype = 1;
    f.ndim = 2;
    f.predictor = DSZ_PRED_LORENZO;
    f.radius = RADIUS;
    f.indexCodec = codec;
    f.errorBound = f.userBound = 0.25;
    f.shape[0] = rows;
    f.shape[1] = cols;
    f.nElements = (unsigned long long)rows * cols;
    f.nnz = nnz;
    f.dataRawSize = f.dataStoredSize = ds;
    f.indexRawSize = f.indexStoredSize = is;
    f.headerSize = 88;
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    unsigned codec;
    size_t rows, cols, n, nnz, ds, is, r, i, k;
    const uint8_t *data, *index;
    dsz_frameInfo f;
    float* dst;
    if (size < 6) return 0;
    codec = src[0] % (DSZ_INDEX_BITMAP + 1);
    rows = (size_t)src[1] % MAX_ROWS + 1;
    cols = ((size_t)src[2] | (size_t)src[3] << 8) % MAX_COLS + 1;
    n = rows * cols;
    nnz = ((size_t)src[4] | (size_t)src[5] << 8) % (MAX_NNZ + 1);
    if (nnz > n) nnz = n;
    index = src + 6;
    is = size - 6;
    data = data_section(nnz, &ds);
    f = sparse_info(codec, rows, cols, nnz, ds, is);
    dst = fuzz_floats(n, 1);
    r = dsz_decodeSparse(dst, n, &f, data, ds, index, is);
    if (!dsz_isError(r)) {
        uint8_t* again;
        size_t cap, got;
        FUZZ_CHECK(r == nnz, "decoded %zu of %zu non-zeros", r, nnz);
        for (i = 0, k = 0; i < n; i++) {
            if (dst[i] == 0.0f) continue;
            k++;
            FUZZ_CHECK(dst[i] == (float)k, "non-zero %zu at %zu is %g", k, i, dst[i]);
        }
        FUZZ_CHECK(k == nnz, "%zu non-zeros in the matrix, nnz %zu", k, nnz);
        cap = dsz_sparseBound(rows, cols, nnz, 1);
        again = (uint8_t*)malloc(cap);
        FUZZ_CHECK(again != NULL, "out of memory");
        got = dsz_encodeSparseIndex(again, cap, dst, rows, cols, codec);
        FUZZ_CHECK(!dsz_isError(got), "%s", dsz_getErrorName(got));
        if (codec == DSZ_INDEX_GAP8) {
            FUZZ_CHECK(got == is && !memcmp(again, index, is), "gap8 symbols are not unique");
        } else {
            dsz_frameInfo const g = sparse_info(codec, rows, cols, nnz, ds, got);
            float* const dst2 = fuzz_floats(n, 1);
            size_t const r2 = dsz_decodeSparse(dst2, n, &g, data, ds, again, got);
            FUZZ_CHECK(r2 == nnz, "re-encoded index: %s", dsz_getErrorName(r2));
            FUZZ_CHECK(!memcmp(dst, dst2, n * sizeof(float)), "re-encoded index decodes differently");
            free(dst2);
        }
        free(again);
    }
    { /* the CSR decoder reads the same index the same way */
        int64_t rp[MAX_ROWS + 1];
        int32_t* const ci = (int32_t*)malloc(nnz ? sizeof(int32_t) * nnz : 1);
        float* const va = fuzz_floats(nnz, 0);
        size_t const rc = dsz_decodeSparseCSR(rp, ci, va, nnz, &f, data, ds, index, is);
        FUZZ_CHECK(ci != NULL, "out of memory");
        FUZZ_CHECK(rc == r, "CSR: %s, dense: %s", dsz_getErrorName(rc), dsz_getErrorName(r));
        if (!dsz_isError(rc)) {
            size_t o;
            FUZZ_CHECK(rp[0] == 0, "the first row starts at %lld", (long long)rp[0]);
            for (o = 0, k = 0; o < rows; o++) {
                for (i = 0; i < cols; i++) {
                    if (dst[o * cols + i] == 0.0f) continue;
                    FUZZ_CHECK(ci[k] == (int32_t)i && va[k] == (float)(k + 1), "entry %zu: column %d value %g, dense: "
                               "column %zu", k, (int)ci[k], va[k], i);
                    k++;
                }
                FUZZ_CHECK(rp[o + 1] == (int64_t)k, "row %zu ends at %lld, dense: %zu", o, (long long)rp[o + 1], k);
            }
        }
        free(ci);
        free(va);
    }
    /* the destination is checked before any section is read: unless the declared sizes were
     * refused already, a short one is exactly that error */
    {
        size_t const small = dsz_decodeSparse(dst, n - 1, &f, data, ds, index, is);
        if (!dsz_isError(r)) FUZZ_CHECK_ERROR(small, DSZ_error_dstSize_tooSmall);
        else if (dsz_getErrorCode(small) != DSZ_error_dstSize_tooSmall)
            FUZZ_CHECK(small == r, "short destination: %s, full one: %s", dsz_getErrorName(small),
                       dsz_getErrorName(r));
    }
    free(dst);
    return 0;
}
