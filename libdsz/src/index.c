/* Index sections of the sparse stream: the positions of a matrix's non-zeros, coded alone.
 *
 * Index symbols (the gap codecs): the gap d = position - previous position (the first gap
 * counts from -1) in 1..255; the symbol 0 is a filler that advances by 255 without
 * consuming a value. DSZ_INDEX_GAP8 stores the symbols as bytes (to be wrapped by a
 * lossless codec), DSZ_INDEX_HUFFGAP Huffman-codes them:
 * Huffman table (256 symbols) | bitBytes u64 | bitstream.
 * DSZ_INDEX_BITMAP codes the non-zero bitmap instead (bitmap.c). */
#include <stdlib.h>

#include "common.h"

#define GAP_TABLE_MAX (10 + 128)

size_t dszi_index_bound(unsigned codec, uint64_t nElements, uint64_t nnz)
{
    uint64_t const syms = nnz + nElements / 255 + 1;
    if (nElements > DSZ_MAX_ELEMENTS || nnz > nElements) return DSZI_ERROR(parameter_outOfBound);
    if (codec == DSZ_INDEX_GAP8) return (size_t)syms;
    if (codec == DSZ_INDEX_HUFFGAP) return (size_t)(GAP_TABLE_MAX + 8 + (syms * DSZI_HUF_MAXLEN + 7) / 8);
    /* an adaptive probability never drops below 31/2048: at most ~6.1 bits per bit */
    if (codec == DSZ_INDEX_BITMAP) return (size_t)(nElements + 16);
    return DSZI_ERROR(parameter_unsupported);
}

/* gap symbols of the non-zeros of w[0..n) into g (capacity dszi_index_bound GAP8); returns count */
static size_t gap_symbols(const float* w, size_t n, uint8_t* g)
{
    size_t i, k = 0, prev1 = 0; /* prev1 = previous position + 1 */
    for (i = 0; i < n; i++) {
        if (w[i] == 0.0f) continue;
        {
            size_t d = i + 1 - prev1; /* gap from the previous position */
            while (d > 255) { g[k++] = 0; d -= 255; }
            g[k++] = (uint8_t)d;
            prev1 = i + 1;
        }
    }
    return k;
}

size_t dszi_index_encode(uint8_t* dst, size_t cap, const float* w, size_t rows, size_t cols, size_t nnz,
                           unsigned codec)
{
    size_t const n = rows * cols;
    size_t const gcap = dszi_index_bound(DSZ_INDEX_GAP8, n, nnz);
    uint8_t* g;
    size_t k, ret, i;
    if (dsz_isError(gcap)) return gcap;
    if (codec == DSZ_INDEX_BITMAP) return dszi_bitmap_encode(dst, cap, w, rows, cols);
    if (codec != DSZ_INDEX_GAP8 && codec != DSZ_INDEX_HUFFGAP) return DSZI_ERROR(parameter_unsupported);
    g = (uint8_t*)malloc(gcap);
    if (!g) return DSZI_ERROR(memory_allocation);
    k = gap_symbols(w, n, g);
    if (codec == DSZ_INDEX_GAP8) {
        if (cap < k) ret = DSZI_ERROR(dstSize_tooSmall);
        else { if (k) memcpy(dst, g, k); ret = k; }
    } else {
        uint64_t hist[256] = {0};
        dszi_hufEnc h = {NULL, NULL, 0};
        dszi_bitWriter bw;
        for (i = 0; i < k; i++) hist[g[i]]++;
        ret = dszi_huf_build(&h, hist, 256);
        if (!dsz_isError(ret)) ret = dszi_huf_writeTable(&h, dst, cap);
        if (!dsz_isError(ret)) {
            size_t const pos = ret;
            if (cap - pos < 8) ret = DSZI_ERROR(dstSize_tooSmall);
            else {
                dszi_bw_init(&bw, dst + pos + 8, cap - pos - 8);
                for (i = 0; i < k; i++) dszi_bw_put(&bw, h.code[g[i]], h.len[g[i]]);
                dszi_bw_flush(&bw);
                if (bw.overflow) ret = DSZI_ERROR(dstSize_tooSmall);
                else {
                    dszi_wr64(dst + pos, (uint64_t)(bw.p - (dst + pos + 8)));
                    ret = (size_t)(bw.p - dst);
                }
            }
        }
        dszi_huf_freeEnc(&h);
    }
    free(g);
    return ret;
}

size_t dszi_count_nonzeros(const float* w, size_t n)
{
    size_t i, c = 0;
    for (i = 0; i < n; i++) c += w[i] != 0.0f;
    return c;
}

size_t dsz_encodeSparseIndex(void* dst, size_t cap, const float* w, size_t rows, size_t cols, unsigned codec)
{
    size_t n;
    if (!dszi_matrix_fits(rows, cols)) return DSZI_ERROR(parameter_outOfBound);
    n = rows * cols;
    if (n && !w) return DSZI_ERROR(parameter_unsupported);
    return dszi_index_encode((uint8_t*)dst, cap, w, rows, cols, dszi_count_nonzeros(w, n), codec);
}

/* up to m positions from gap bytes; returns how many, or (size_t)-1 on corrupt input */
size_t dszi_index_gap8_positions(const uint8_t* index, size_t size, size_t* i, uint64_t* prev1, uint64_t n,
                             size_t* pos, size_t m)
{
    size_t j = 0, k = *i;
    uint64_t p1 = *prev1;
    while (j < m && k < size) {
        uint32_t const g = index[k++];
        if (g == 0) {
            p1 += 255;
            if (p1 > n) return (size_t)-1;
        } else {
            uint64_t const p = p1 + g - 1;
            if (p >= n) return (size_t)-1;
            pos[j++] = (size_t)p;
            p1 = p + 1;
        }
    }
    *i = k;
    *prev1 = p1;
    return j;
}

/* exactly m positions from Huffman-coded gaps; returns 0 or -1 */
int dszi_index_huff_positions(const dszi_hufDec* h, dszi_bitReader* br, uint64_t* prev1, uint64_t n, size_t* pos, size_t m)
{
    size_t j = 0;
    uint64_t p1 = *prev1;
    while (j < m) {
        int t;
        dszi_br_refill(br);
        if (br->pad > 16) return -1;
        for (t = 0; t < 3 && j < m; t++) {
            uint32_t const g = dszi_huf_decode(h, br);
            if (g == 0) {
                p1 += 255;
                if (p1 > n) return -1;
            } else {
                uint64_t const p = p1 + g - 1;
                if (g == UINT32_MAX || p >= n) return -1;
                pos[j++] = (size_t)p;
                p1 = p + 1;
            }
        }
    }
    *prev1 = p1;
    return 0;
}
