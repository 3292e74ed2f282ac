/* Canonical Huffman coding of symbols: length-limited code construction, compact table
 * storage (4-bit lengths over the used symbol range) and table-driven decoding. */
#include <math.h>
#include <stdlib.h>

#include "common.h"

typedef struct {
    uint64_t w;
    uint32_t s;
} leaf_t;

static int cmp_leaf(const void* a, const void* b)
{
    const leaf_t* x = (const leaf_t*)a;
    const leaf_t* y = (const leaf_t*)b;
    if (x->w != y->w) return x->w < y->w ? -1 : 1;
    return x->s < y->s ? -1 : (x->s > y->s);
}

/* Huffman code lengths of m >= 2 sorted leaves (two-queue method); returns the max length */
static unsigned huffman_lengths(const leaf_t* leaf, uint32_t m, uint64_t* weight, uint32_t* parent, uint8_t* depth)
{
    uint32_t li = 0, ii = m, k;
    unsigned maxd = 0;
    for (k = m; k < 2 * m - 1; k++) {
        uint32_t pick[2];
        int j;
        for (j = 0; j < 2; j++) {
            if (li < m && (ii >= k || leaf[li].w <= weight[ii])) {
                weight[li] = leaf[li].w; /* leaves' weights live in the first m slots */
                pick[j] = li++;
            } else {
                pick[j] = ii++;
            }
        }
        weight[k] = weight[pick[0]] + weight[pick[1]];
        parent[pick[0]] = parent[pick[1]] = k;
    }
    depth[2 * m - 2] = 0;
    for (k = 2 * m - 2; k-- > 0;) {
        unsigned const d = depth[parent[k]] + 1u;
        depth[k] = (uint8_t)(d > 255 ? 255 : d);
        if (k < m && depth[k] > maxd) maxd = depth[k];
    }
    return maxd;
}

void dszi_huf_freeEnc(dszi_hufEnc* h)
{
    free(h->code);
    free(h->len);
    h->code = NULL;
    h->len = NULL;
}

size_t dszi_huf_build(dszi_hufEnc* h, const uint64_t* hist, uint32_t nsym)
{
    uint32_t m = 0, s, k;
    unsigned L;
    leaf_t* leaf = NULL;
    uint64_t* weight = NULL;
    uint32_t* parent = NULL;
    uint8_t* depth = NULL;
    uint32_t count[DSZI_HUF_MAXLEN + 2] = {0}, next[DSZI_HUF_MAXLEN + 2];
    h->nsym = nsym;
    h->code = (uint32_t*)calloc(nsym, sizeof(uint32_t));
    h->len = (uint8_t*)calloc(nsym, 1);
    if (!h->code || !h->len) goto oom;
    for (s = 0; s < nsym; s++) m += hist[s] != 0;
    if (m == 0) return 0;
    /* no code of lengths <= DSZI_HUF_MAXLEN has more words: flattening below would never end */
    if (m > (1u << DSZI_HUF_MAXLEN)) { dszi_huf_freeEnc(h); return DSZI_ERROR(parameter_outOfBound); }
    if (m == 1) {
        for (s = 0; s < nsym; s++)
            if (hist[s]) h->len[s] = 1;
    } else {
        leaf = (leaf_t*)malloc(sizeof(leaf_t) * m);
        weight = (uint64_t*)malloc(sizeof(uint64_t) * (2 * (size_t)m));
        parent = (uint32_t*)malloc(sizeof(uint32_t) * (2 * (size_t)m));
        depth = (uint8_t*)malloc(2 * (size_t)m);
        if (!leaf || !weight || !parent || !depth) goto oom;
        for (s = 0, k = 0; s < nsym; s++)
            if (hist[s]) { leaf[k].w = hist[s]; leaf[k].s = s; k++; }
        for (;;) {
            qsort(leaf, m, sizeof(leaf_t), cmp_leaf);
            if (huffman_lengths(leaf, m, weight, parent, depth) <= DSZI_HUF_MAXLEN) break;
            /* too deep: flatten the distribution and retry */
            for (k = 0; k < m; k++) leaf[k].w = (leaf[k].w >> 1) | 1u;
        }
        for (k = 0; k < m; k++) h->len[leaf[k].s] = depth[k];
        free(leaf); free(weight); free(parent); free(depth);
    }
    for (s = 0; s < nsym; s++) count[h->len[s]]++;
    count[0] = 0;
    next[1] = 0;
    for (L = 1; L <= DSZI_HUF_MAXLEN; L++) next[L + 1] = (next[L] + count[L]) << 1;
    for (s = 0; s < nsym; s++)
        if (h->len[s]) h->code[s] = next[h->len[s]]++;
    return 0;
oom:
    free(leaf); free(weight); free(parent); free(depth);
    dszi_huf_freeEnc(h);
    return DSZI_ERROR(memory_allocation);
}

/* table layout: maxLen u8, len0 u8, lo u32, hi u32, then 4-bit lengths of lo..hi */
static void used_range(const dszi_hufEnc* h, uint32_t* lo, uint32_t* hi, unsigned* maxLen)
{
    uint32_t s;
    *lo = 1; *hi = 0; *maxLen = h->nsym ? h->len[0] : 0;
    for (s = 1; s < h->nsym; s++) {
        if (!h->len[s]) continue;
        if (*hi < *lo) *lo = s;
        *hi = s;
        if (h->len[s] > *maxLen) *maxLen = h->len[s];
    }
}

size_t dszi_huf_tableSize(const dszi_hufEnc* h)
{
    uint32_t lo, hi;
    unsigned maxLen;
    used_range(h, &lo, &hi, &maxLen);
    return 10 + (hi >= lo ? ((size_t)(hi - lo) + 2) / 2 : 0);
}

size_t dszi_huf_writeTable(const dszi_hufEnc* h, uint8_t* dst, size_t cap)
{
    uint32_t lo, hi, s;
    unsigned maxLen;
    size_t const size = dszi_huf_tableSize(h);
    if (cap < size) return DSZI_ERROR(dstSize_tooSmall);
    used_range(h, &lo, &hi, &maxLen);
    dst[0] = (uint8_t)maxLen;
    dst[1] = h->nsym ? h->len[0] : 0;
    dszi_wr32(dst + 2, lo);
    dszi_wr32(dst + 6, hi);
    memset(dst + 10, 0, size - 10);
    for (s = lo; s <= hi && hi >= lo; s++) {
        size_t const j = s - lo;
        dst[10 + j / 2] |= (uint8_t)(h->len[s] << ((j & 1) ? 0 : 4));
    }
    return size;
}

double dszi_huf_estimateBits(const uint64_t* hist, uint32_t nsym, uint64_t total)
{
    double bits = 0;
    uint32_t s;
    if (total == 0) return 0;
    for (s = 0; s < nsym; s++)
        if (hist[s]) bits += (double)hist[s] * log2((double)total / (double)hist[s]);
    return bits;
}

void dszi_huf_freeDec(dszi_hufDec* d)
{
    free(d->lut);
    free(d->sorted);
    d->lut = NULL;
    d->sorted = NULL;
}

size_t dszi_huf_readTable(dszi_hufDec* d, const uint8_t* src, size_t size, uint32_t nsym)
{
    unsigned maxLen, len0, L, maxSeen = 0;
    uint32_t lo, hi, s, m = 0, rank[DSZI_HUF_MAXLEN + 2];
    size_t tsize, i;
    uint64_t kraft = 0;
    memset(d, 0, sizeof(*d));
    if (size < 10) return DSZI_ERROR(srcSize_wrong);
    maxLen = src[0];
    len0 = src[1];
    lo = dszi_rd32(src + 2);
    hi = dszi_rd32(src + 6);
    if (maxLen > DSZI_HUF_MAXLEN || len0 > maxLen) return DSZI_ERROR(corruption_detected);
    if (hi >= lo) {
        if (lo == 0 || hi >= nsym) return DSZI_ERROR(corruption_detected);
        tsize = 10 + ((size_t)(hi - lo) + 2) / 2;
    } else {
        if (lo != 1 || hi != 0) return DSZI_ERROR(corruption_detected);
        tsize = 10;
    }
    if (size < tsize) return DSZI_ERROR(srcSize_wrong);
    d->nsym = nsym; d->maxLen = maxLen; d->lo = lo; d->hi = hi;
    /* count lengths */
    if (len0) { d->count[len0]++; m++; maxSeen = len0; }
    for (i = 0; hi >= lo && i <= (size_t)(hi - lo); i++) {
        unsigned const l = (src[10 + i / 2] >> ((i & 1) ? 0 : 4)) & 15u;
        if (l > maxLen) return DSZI_ERROR(corruption_detected);
        if (l) { d->count[l]++; m++; if (l > maxSeen) maxSeen = l; }
    }
    /* the padding nibble must be zero */
    if (hi >= lo && ((hi - lo) & 1u) == 0 && (src[tsize - 1] & 15u)) return DSZI_ERROR(corruption_detected);
    if (maxSeen != maxLen) return DSZI_ERROR(corruption_detected);
    if (m == 0) return tsize; /* empty code: only valid for zero symbols */
    for (L = 1; L <= maxLen; L++) kraft += (uint64_t)d->count[L] << (maxLen - L);
    if (m == 1 && maxLen == 1) d->single = 1;
    else if (kraft != (1ull << maxLen)) return DSZI_ERROR(corruption_detected); /* over-subscribed or incomplete */
    d->lut = (uint32_t*)calloc((size_t)1 << DSZI_HUF_LUTLOG, sizeof(uint32_t));
    d->sorted = (uint32_t*)malloc(sizeof(uint32_t) * m);
    if (!d->lut || !d->sorted) { dszi_huf_freeDec(d); return DSZI_ERROR(memory_allocation); }
    {
        uint32_t code = 0, b = 0;
        for (L = 1; L <= maxLen; L++) {
            d->first[L] = code;
            d->base[L] = b;
            rank[L] = 0;
            b += d->count[L];
            code = (code + d->count[L]) << 1;
        }
    }
    /* canonical order: by length, then symbol */
    for (s = 0; s < nsym; s++) {
        unsigned l;
        if (s == 0) l = len0;
        else if (s < lo || s > hi) { if (s < lo) { s = lo - 1; continue; } break; }
        else { size_t const j = s - lo; l = (src[10 + j / 2] >> ((j & 1) ? 0 : 4)) & 15u; }
        if (!l) continue;
        {
            uint32_t const code = d->first[l] + rank[l];
            d->sorted[d->base[l] + rank[l]] = s;
            rank[l]++;
            if (l <= DSZI_HUF_LUTLOG) {
                uint32_t const lo2 = code << (DSZI_HUF_LUTLOG - l);
                uint32_t const n2 = 1u << (DSZI_HUF_LUTLOG - l);
                uint32_t const e = (s << 4) | l;
                uint32_t k;
                for (k = 0; k < n2; k++) d->lut[lo2 + k] = e;
            }
        }
    }
    return tsize;
}

uint32_t dszi_huf_decodeLong(const dszi_hufDec* d, dszi_bitReader* r)
{
    unsigned L;
    for (L = DSZI_HUF_LUTLOG + 1; L <= d->maxLen; L++) {
        uint32_t const c = dszi_br_peek(r, L) - d->first[L];
        if (c < d->count[L]) {
            dszi_br_skip(r, L);
            return d->sorted[d->base[L] + c];
        }
    }
    return UINT32_MAX;
}
