/* The non-zero bitmap under adaptive binary arithmetic coding (a carry-propagating range
 * coder with 11-bit probabilities). Each bit's context is the bits at the same column in the
 * two rows above and the two previous bits of its row: magnitude pruning leaves whole columns
 * (dead inputs) empty, which the column context learns. Bits are coded in row-major order up
 * to the last non-zero only. Matrices wider than BITMAP_MAX_COLS use the row context only. */
#include <stdlib.h>

#include "common.h"

#define PROB_BITS 11
#define PROB_ONE (1u << PROB_BITS)
#define ADAPT 5
#define TOP (1u << 24)

DSZI_INLINE unsigned context(const uint8_t* ring, size_t cols, uint64_t r, size_t c, unsigned left2)
{
    unsigned a1 = 0, a2 = 0;
    if (ring) {
        if (r >= 1) a1 = ring[((r - 1) & 1) * cols + c];
        if (r >= 2) a2 = ring[(r & 1) * cols + c];
    }
    return (a1 << 3) | (a2 << 2) | left2;
}

typedef struct {
    uint8_t* p;
    uint8_t* end;
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t cacheSize;
    int overflow;
} rc_enc;

static void rc_out(rc_enc* e, uint8_t b)
{
    if (e->p < e->end) *e->p++ = b; else e->overflow = 1;
}

static void rc_shiftLow(rc_enc* e)
{
    if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
        uint8_t const carry = (uint8_t)(e->low >> 32);
        uint8_t temp = e->cache;
        do {
            rc_out(e, (uint8_t)(temp + carry));
            temp = 0xFF;
        } while (--e->cacheSize != 0);
        e->cache = (uint8_t)(e->low >> 24);
    }
    e->cacheSize++;
    e->low = (e->low & 0x00FFFFFFu) << 8;
}

DSZI_INLINE void rc_encodeBit(rc_enc* e, uint16_t* prob, unsigned bit)
{
    uint32_t const bound = (e->range >> PROB_BITS) * *prob;
    if (!bit) {
        e->range = bound;
        *prob = (uint16_t)(*prob + ((PROB_ONE - *prob) >> ADAPT));
    } else {
        e->low += bound;
        e->range -= bound;
        *prob = (uint16_t)(*prob - (*prob >> ADAPT));
    }
    while (e->range < TOP) {
        e->range <<= 8;
        rc_shiftLow(e);
    }
}

size_t dszi_bitmap_encode(uint8_t* dst, size_t cap, const float* w, size_t rows, size_t cols)
{
    uint64_t const n = (uint64_t)rows * cols;
    uint64_t last = 0, i;
    uint16_t prob[16];
    uint8_t* ring = NULL;
    rc_enc e;
    size_t c = 0;
    uint64_t r = 0;
    unsigned left2 = 0, k;
    int any = 0;
    for (i = n; i-- > 0;)
        if (w[i] != 0.0f) { last = i; any = 1; break; }
    if (!any) return 0; /* nothing to code: an empty section */
    if (cols <= DSZI_BITMAP_MAX_COLS) {
        ring = (uint8_t*)calloc(2 * cols, 1);
        if (!ring) return DSZI_ERROR(memory_allocation);
    }
    for (k = 0; k < 16; k++) prob[k] = PROB_ONE / 2;
    e.p = dst; e.end = dst + cap; e.low = 0; e.range = 0xFFFFFFFFu; e.cache = 0; e.cacheSize = 1; e.overflow = 0;
    for (i = 0; i <= last; i++) {
        unsigned const bit = w[i] != 0.0f;
        rc_encodeBit(&e, &prob[context(ring, cols, r, c, left2)], bit);
        if (ring) ring[(r & 1) * cols + c] = (uint8_t)bit;
        left2 = ((left2 << 1) | bit) & 3u;
        if (++c == cols) { c = 0; r++; left2 = 0; }
    }
    for (k = 0; k < 5; k++) rc_shiftLow(&e);
    free(ring);
    if (e.overflow) return DSZI_ERROR(dstSize_tooSmall);
    return (size_t)(e.p - dst);
}

size_t dszi_bitmap_open(dszi_bitmapDec* b, const uint8_t* src, size_t size, size_t rows, size_t cols)
{
    unsigned k;
    memset(b, 0, sizeof(*b));
    b->p = src;
    b->end = src + size;
    b->cols = cols;
    b->range = 0xFFFFFFFFu;
    for (k = 0; k < 16; k++) b->prob[k] = PROB_ONE / 2;
    if (size == 0) return 0;
    if (size < 5 || src[0] != 0) return DSZI_ERROR(corruption_detected);
    for (k = 0; k < 5; k++) b->code = (b->code << 8) | *b->p++;
    if (cols <= DSZI_BITMAP_MAX_COLS && rows > 1) {
        b->ring = (uint8_t*)calloc(2 * cols, 1);
        if (!b->ring) return DSZI_ERROR(memory_allocation);
    }
    return 0;
}

void dszi_bitmap_free(dszi_bitmapDec* b)
{
    free(b->ring);
    b->ring = NULL;
}

size_t dszi_bitmap_positions(dszi_bitmapDec* b, uint64_t n, size_t* pos, size_t m)
{
    size_t j = 0;
    uint64_t i = b->i;
    size_t c = b->c;
    uint64_t r = b->r;
    unsigned left2 = b->left2;
    uint32_t range = b->range, code = b->code;
    uint8_t* const ring = b->ring;
    size_t const cols = b->cols;
    while (j < m) {
        uint16_t* prob;
        uint32_t bound;
        unsigned bit;
        if (i >= n) return (size_t)-1;
        prob = &b->prob[context(ring, cols, r, c, left2)];
        bound = (range >> PROB_BITS) * *prob;
        if (code < bound) {
            range = bound;
            *prob = (uint16_t)(*prob + ((PROB_ONE - *prob) >> ADAPT));
            bit = 0;
        } else {
            code -= bound;
            range -= bound;
            *prob = (uint16_t)(*prob - (*prob >> ADAPT));
            bit = 1;
            pos[j++] = (size_t)i;
        }
        if (range < TOP) {
            range <<= 8;
            code <<= 8;
            if (b->p < b->end) code |= *b->p++;
            else if (++b->pad > 4) return (size_t)-1;
        }
        if (ring) ring[(r & 1) * cols + c] = (uint8_t)bit;
        left2 = ((left2 << 1) | bit) & 3u;
        i++;
        if (++c == cols) { c = 0; r++; left2 = 0; }
    }
    b->i = i; b->c = c; b->r = r; b->left2 = left2; b->range = range; b->code = code;
    return j;
}
