/* Sparse-dense products for evaluating pruned FC layers: Y = X @ W^T (+ bias) with W in CSR.
 *
 * Layout: a block of DSZI_SPMM_SAMPLES samples is transposed to [cols, samples] so that each
 * non-zero W[o, k] becomes one contiguous axpy over the block's samples (acc += w * xt[k]),
 * which the compiler vectorizes. Columns are taken in slices of DSZI_SPMM_COLS so that the
 * transposed slice (2 MiB) stays in cache while every row's non-zeros in it are applied; a cursor
 * per row remembers where its non-zeros of the next slice begin (column indices are sorted).
 *
 * Every output value is summed in the same order (the row's non-zeros in column order, then the
 * bias), whatever the block sizes, the instruction set or how a caller splits the samples, so
 * results are reproducible bit for bit. No fused multiply-add: product and sum are separate
 * statements, which C99 does not let the compiler contract.
 */
#include <stdint.h>
#include <stdlib.h>

#include "common.h"

/* measured on AlexNet/VGG fc6 shapes at 4-9% density (Zen 4, 1 MiB L2): 128 x 4096 ran 1.2-2x
 * faster than 32-64 samples or 512-1024 columns */
#define DSZI_SPMM_SAMPLES 128
#define DSZI_SPMM_COLS 4096

/* Wide vectors pay here: compile the hot loop for AVX-512 and AVX2 too and let the loader pick
 * (GCC on x86-64 Linux; elsewhere the baseline build runs). The sums are the same in every clone. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define DSZI_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DSZI_MULTIVERSION
#endif

/* Apply the non-zeros of rows [0, rows) whose columns lie in [k0, k0 + kb) to the accumulators
 * yt [rows, DSZI_SPMM_SAMPLES]; xt holds the slice's inputs, [kb, DSZI_SPMM_SAMPLES]. */
DSZI_MULTIVERSION
static void spmm_slice(float* yt, const float* xt, size_t k0, size_t kb, size_t rows, size_t* cursor,
                           const int64_t* rowPtr, const int32_t* colIndex, const float* values)
{
    size_t o;
    for (o = 0; o < rows; o++) {
        size_t p = cursor[o];
        size_t const end = (size_t)rowPtr[o + 1];
        float acc[DSZI_SPMM_SAMPLES];
        float* const y = yt + o * DSZI_SPMM_SAMPLES;
        int j;
        if (p == end || (size_t)colIndex[p] >= k0 + kb) continue;
        for (j = 0; j < DSZI_SPMM_SAMPLES; j++) acc[j] = y[j];
        for (; p < end && (size_t)colIndex[p] < k0 + kb; p++) {
            float const w = values[p];
            const float* const x = xt + ((size_t)colIndex[p] - k0) * DSZI_SPMM_SAMPLES;
            for (j = 0; j < DSZI_SPMM_SAMPLES; j++) {
                float const prod = w * x[j];
                acc[j] += prod;
            }
        }
        for (j = 0; j < DSZI_SPMM_SAMPLES; j++) y[j] = acc[j];
        cursor[o] = p;
    }
}

/* The CSR invariants the kernel relies on: row pointers from 0 to nnz, never decreasing; column
 * indices within [0, cols) and increasing along each row (the per-row cursors need the order). */
static size_t csr_check(size_t rows, size_t cols, const int64_t* rowPtr, const int32_t* colIndex, size_t nnz)
{
    size_t o, p;
    if (cols > (size_t)INT32_MAX + 1) return DSZI_ERROR(parameter_outOfBound);
    if (rowPtr[0] != 0 || (uint64_t)rowPtr[rows] != (uint64_t)nnz) return DSZI_ERROR(corruption_detected);
    for (o = 0; o < rows; o++) {
        int64_t const begin = rowPtr[o], end = rowPtr[o + 1];
        if (end < begin || (uint64_t)end > (uint64_t)nnz) return DSZI_ERROR(corruption_detected);
        for (p = (size_t)begin; p < (size_t)end; p++) {
            if (colIndex[p] < 0 || (size_t)colIndex[p] >= cols) return DSZI_ERROR(corruption_detected);
            if (p > (size_t)begin && colIndex[p] <= colIndex[p - 1]) return DSZI_ERROR(corruption_detected);
        }
    }
    return nnz;
}

size_t dsz_csrMatmul(float* y, size_t yCapacity, const float* x, size_t n, size_t cols,
                     const int64_t* rowPtr, const int32_t* colIndex, const float* values, size_t nnz,
                     size_t rows, const float* bias)
{
    float *xt, *yt;
    size_t* cursor;
    size_t s0, o, j, k;
    if (!dszi_matrix_fits(n, rows) || !dszi_matrix_fits(n, cols) || !dszi_matrix_fits(rows, DSZI_SPMM_SAMPLES))
        return DSZI_ERROR(parameter_outOfBound);
    if (yCapacity < n * rows) return DSZI_ERROR(dstSize_tooSmall);
    DSZI_CHECK(csr_check(rows, cols, rowPtr, colIndex, nnz));
    if (n == 0 || rows == 0) return n * rows;
    xt = (float*)malloc(sizeof(float) * DSZI_SPMM_COLS * DSZI_SPMM_SAMPLES);
    yt = (float*)malloc(sizeof(float) * rows * DSZI_SPMM_SAMPLES);
    cursor = (size_t*)malloc(sizeof(size_t) * rows);
    if (!xt || !yt || !cursor) {
        free(xt); free(yt); free(cursor);
        return DSZI_ERROR(memory_allocation);
    }
    for (s0 = 0; s0 < n; s0 += DSZI_SPMM_SAMPLES) {
        size_t const nb = n - s0 < DSZI_SPMM_SAMPLES ? n - s0 : DSZI_SPMM_SAMPLES;
        size_t k0;
        memset(yt, 0, sizeof(float) * rows * DSZI_SPMM_SAMPLES);
        for (o = 0; o < rows; o++) cursor[o] = (size_t)rowPtr[o];
        for (k0 = 0; k0 < cols; k0 += DSZI_SPMM_COLS) {
            size_t const kb = cols - k0 < DSZI_SPMM_COLS ? cols - k0 : DSZI_SPMM_COLS;
            /* a short last block computes zeros for the missing samples, which are never stored */
            for (j = 0; j < nb; j++) {
                const float* const src = x + (s0 + j) * cols + k0;
                for (k = 0; k < kb; k++) xt[k * DSZI_SPMM_SAMPLES + j] = src[k];
            }
            for (k = 0; k < kb; k++)
                for (j = nb; j < DSZI_SPMM_SAMPLES; j++) xt[k * DSZI_SPMM_SAMPLES + j] = 0.0f;
            spmm_slice(yt, xt, k0, kb, rows, cursor, rowPtr, colIndex, values);
        }
        for (j = 0; j < nb; j++) {
            float* const dst = y + (s0 + j) * rows;
            for (o = 0; o < rows; o++) dst[o] = bias ? yt[o * DSZI_SPMM_SAMPLES + j] + bias[o] : yt[o * DSZI_SPMM_SAMPLES + j];
        }
    }
    free(xt); free(yt); free(cursor);
    return n * rows;
}

size_t dsz_csrFromDense(int64_t* rowPtr, int32_t* colIndex, float* values, size_t capacity, const float* w,
                        size_t rows, size_t cols)
{
    size_t o, k, nnz = 0;
    if (!dszi_matrix_fits(rows, cols) || cols > (size_t)INT32_MAX + 1) return DSZI_ERROR(parameter_outOfBound);
    rowPtr[0] = 0;
    for (o = 0; o < rows; o++) {
        const float* const row = w + o * cols;
        if (capacity - nnz >= cols) {
            /* room for the whole row: write every value and advance past the non-zeros only,
               without a branch to mispredict at 5-30% density */
            for (k = 0; k < cols; k++) {
                colIndex[nnz] = (int32_t)k;
                values[nnz] = row[k];
                nnz += row[k] != 0.0f;
            }
        } else {
            for (k = 0; k < cols; k++) {
                if (row[k] == 0.0f) continue;
                if (nnz == capacity) return DSZI_ERROR(dstSize_tooSmall);
                colIndex[nnz] = (int32_t)k;
                values[nnz++] = row[k];
            }
        }
        rowPtr[o + 1] = (int64_t)nnz;
    }
    return nnz;
}
