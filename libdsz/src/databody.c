/* A data section: n values through predictor + quantizer, Huffman-coded symbols and the
 * verbatim outliers in the frame's dtype.
 * Layout: nOut u64 | Huffman table | bitBytes u64 | bitstream | nOut * dtype size bytes of outliers. */
#include <stdlib.h>

#include "common.h"

size_t dszi_data_bound(size_t n, unsigned radius)
{
    /* each value: at most DSZI_HUF_MAXLEN bits plus 4 bytes if it is an outlier */
    if (!dszi_count_fits(n) || n > ((size_t)-1 - 64 - radius) / 6) return DSZI_ERROR(parameter_outOfBound);
    return 8 + 10 + (size_t)radius + 1 + 8 + (n * DSZI_HUF_MAXLEN + 7) / 8 + 4 * n;
}

#define SAMPLE_BLOCKS 16
#define SAMPLE_BLOCK 1024

/* Estimated size of each predictor's stream (entropy of the symbols + 32 bits per outlier),
 * on the whole input when small, else on SAMPLE_BLOCKS evenly spaced blocks; ties go to no
 * prediction. hist is scratch. Returns the choice, or DSZ_PRED_AUTO if out of memory. */
static unsigned choose_predictor(const dszi_quant* q, const float* src, size_t n, uint64_t* hist, uint32_t nsym)
{
    static const unsigned preds[2] = {DSZ_PRED_NONE, DSZ_PRED_LORENZO};
    double bits[2];
    int k;
    for (k = 0; k < 2; k++) {
        uint64_t total = 0;
        memset(hist, 0, sizeof(uint64_t) * nsym);
        if (n <= SAMPLE_BLOCKS * SAMPLE_BLOCK) {
            dszi_quantize_hist(q, preds[k], src, n, hist);
            total = n;
        } else {
            size_t j;
            for (j = 0; j < SAMPLE_BLOCKS; j++) {
                size_t const at = (n - SAMPLE_BLOCK) / (SAMPLE_BLOCKS - 1) * j;
                dszi_quantize_hist(q, preds[k], src + at, SAMPLE_BLOCK, hist);
            }
            total = SAMPLE_BLOCKS * SAMPLE_BLOCK;
        }
        bits[k] = dszi_huf_estimateBits(hist, nsym, total) + 32.0 * (double)hist[0];
    }
    return bits[1] < 0.99 * bits[0] ? DSZ_PRED_LORENZO : DSZ_PRED_NONE;
}

/* The largest radius whose symbols (0 for outliers, 1..2r-1) a canonical Huffman code of lengths
 * <= DSZI_HUF_MAXLEN always holds */
#define HUF_RADIUS (1u << (DSZI_HUF_MAXLEN - 1))

static uint32_t distinct(const uint64_t* hist, uint32_t nsym)
{
    uint32_t s, m = 0;
    for (s = 0; s < nsym; s++) m += hist[s] != 0;
    return m;
}

size_t dszi_data_encode(uint8_t* dst, size_t cap, const float* src, size_t n, dszi_quant* q,
                        unsigned* predictor)
{
    uint32_t const nsym = 2 * q->radius;
    uint32_t* sym = (uint32_t*)malloc(sizeof(uint32_t) * (n ? n : 1));
    uint32_t* outl = (uint32_t*)malloc(sizeof(uint32_t) * (n ? n : 1));
    uint64_t* hist = (uint64_t*)calloc(nsym, sizeof(uint64_t));
    dszi_hufEnc h = {NULL, NULL, 0};
    size_t nOut, pos, ret, i;
    dszi_bitWriter bw;
    unsigned pred = *predictor;
    if (!sym || !outl || !hist) { ret = DSZI_ERROR(memory_allocation); goto done; }
    if (pred == DSZ_PRED_AUTO) pred = choose_predictor(q, src, n, hist, nsym);
    if (pred == DSZ_PRED_AUTO) { ret = DSZI_ERROR(memory_allocation); goto done; }
    memset(hist, 0, sizeof(uint64_t) * nsym);
    nOut = dszi_quantize(q, pred, src, n, sym, outl, hist);
    if (q->radius > HUF_RADIUS && distinct(hist, nsym) > (1u << DSZI_HUF_MAXLEN)) {
        /* a bound tiny beside the values: more symbols than the code holds. Quantized again within
           HUF_RADIUS, the values beyond it are stored verbatim; the caller writes q->radius */
        q->radius = HUF_RADIUS;
        memset(hist, 0, sizeof(uint64_t) * nsym);
        nOut = dszi_quantize(q, pred, src, n, sym, outl, hist);
    }
    ret = dszi_huf_build(&h, hist, nsym);
    if (dsz_isError(ret)) goto done;
    if (cap < 8) { ret = DSZI_ERROR(dstSize_tooSmall); goto done; }
    dszi_wr64(dst, nOut);
    pos = 8;
    ret = dszi_huf_writeTable(&h, dst + pos, cap - pos);
    if (dsz_isError(ret)) goto done;
    pos += ret;
    if (cap - pos < 8) { ret = DSZI_ERROR(dstSize_tooSmall); goto done; }
    dszi_bw_init(&bw, dst + pos + 8, cap - pos - 8);
    {
        const uint32_t* const code = h.code;
        const uint8_t* const len = h.len;
        for (i = 0; i < n; i++) dszi_bw_put(&bw, code[sym[i]], len[sym[i]]);
    }
    dszi_bw_flush(&bw);
    if (bw.overflow) { ret = DSZI_ERROR(dstSize_tooSmall); goto done; }
    dszi_wr64(dst + pos, (uint64_t)(bw.p - (dst + pos + 8)));
    pos = (size_t)(bw.p - dst);
    {
        unsigned const osz = dszi_dtype_size(q->dtype);
        if (cap - pos < osz * nOut) { ret = DSZI_ERROR(dstSize_tooSmall); goto done; }
        for (i = 0; i < nOut; i++) dszi_outlier_write(dst + pos + osz * i, outl[i], q->dtype);
        pos += osz * nOut;
    }
    *predictor = pred;
    ret = pos;
done:
    dszi_huf_freeEnc(&h);
    free(sym);
    free(outl);
    free(hist);
    return ret;
}

void dszi_data_free(dszi_dataDec* d)
{
    dszi_huf_freeDec(&d->huf);
    free(d->deq);
    free(d->deqBytes);
    d->deq = NULL;
    d->deqBytes = NULL;
}

size_t dszi_data_open(dszi_dataDec* d, const uint8_t* src, size_t size, size_t n, const dszi_quant* q,
                     unsigned predictor)
{
    size_t pos, r;
    uint64_t nOut, bitBytes;
    memset(d, 0, sizeof(*d));
    d->q = *q;
    d->predictor = predictor;
    d->outSize = dszi_dtype_size(q->dtype);
    if (!d->outSize) return DSZI_ERROR(frameParameter_unsupported);
    if (predictor != DSZ_PRED_NONE && predictor != DSZ_PRED_LORENZO) return DSZI_ERROR(frameParameter_unsupported);
    if (size < 8) return DSZI_ERROR(srcSize_wrong);
    nOut = dszi_rd64(src);
    if (nOut > n) return DSZI_ERROR(corruption_detected);
    pos = 8;
    r = dszi_huf_readTable(&d->huf, src + pos, size - pos, 2 * q->radius);
    if (dsz_isError(r)) return r;
    pos += r;
    if (size - pos < 8) { dszi_data_free(d); return DSZI_ERROR(srcSize_wrong); }
    bitBytes = dszi_rd64(src + pos);
    pos += 8;
    if (bitBytes > size - pos || (size - pos) - bitBytes != d->outSize * nOut) { dszi_data_free(d); return DSZI_ERROR(srcSize_wrong); }
    /* every symbol takes at least one bit; an empty code only codes nothing */
    if ((n > 0 && d->huf.maxLen == 0) || (n == 0 && d->huf.maxLen != 0) || n / 8 > bitBytes) {
        dszi_data_free(d);
        return DSZI_ERROR(corruption_detected);
    }
    dszi_br_init(&d->br, src + pos, (size_t)bitBytes);
    d->bitBytes = bitBytes;
    d->outl = src + pos + bitBytes;
    d->nOut = nOut;
    if (predictor == DSZ_PRED_NONE && d->huf.hi >= d->huf.lo) {
        size_t const m = (size_t)(d->huf.hi - d->huf.lo) + 1;
        uint32_t s;
        d->deq = (float*)malloc(sizeof(float) * m);
        d->deqBytes = (uint8_t*)malloc(d->outSize * m);
        if (!d->deq || !d->deqBytes) { dszi_data_free(d); return DSZI_ERROR(memory_allocation); }
        for (s = d->huf.lo; s <= d->huf.hi; s++) d->deq[s - d->huf.lo] = dszi_dequant_none(q, s);
        dszi_dtype_store(d->deqBytes, d->deq, q->dtype, m);
    }
    return 0;
}

size_t dszi_data_close(dszi_dataDec* d)
{
    uint64_t const used = dszi_br_consumed(&d->br);
    if (d->kOut != d->nOut) return DSZI_ERROR(corruption_detected);
    if (used > 8 * d->bitBytes || (d->bitBytes > 0 && used + 8 <= 8 * d->bitBytes)) return DSZI_ERROR(corruption_detected);
    return 0;
}

int dszi_data_decode(dszi_dataDec* d, float* dst, size_t n)
{
    size_t i = 0;
    if (d->predictor == DSZ_PRED_NONE) {
        /* after a refill at least 56 bits are buffered: three codes of <= 15 bits */
        const float* const deq = d->deq;
        uint32_t const lo = d->huf.lo;
        while (i < n) {
            size_t const stop = n - i >= 3 ? i + 3 : n;
            dszi_br_refill(&d->br);
            for (; i < stop; i++) {
                uint32_t const s = dszi_huf_decode(&d->huf, &d->br);
                if (DSZI_LIKELY(s != 0 && s != UINT32_MAX)) {
                    dst[i] = deq[s - lo];
                } else {
                    if (s == UINT32_MAX || d->kOut >= d->nOut) return -1;
                    if (d->q.dtype == DSZ_DTYPE_FLOAT32) { /* the bit pattern, NaN payloads and all */
                        uint32_t const u = dszi_rd32(d->outl + 4 * d->kOut);
                        memcpy(dst + i, &u, 4);
                    } else {
                        dst[i] = dszi_outlier_read(d->outl + d->outSize * d->kOut, d->q.dtype);
                    }
                    d->kOut++;
                }
            }
        }
        return d->br.pad > 16 ? -1 : 0;
    }
    for (i = 0; i < n; i++)
        if (dszi_data_next(d, dst + i)) return -1;
    return 0;
}

size_t dszi_data_decodeAll(dszi_dataDec* d, float* dst, size_t n)
{
    if (dszi_data_decode(d, dst, n)) return DSZI_ERROR(corruption_detected);
    return dszi_data_close(d);
}

/* predictor none, values written as the dtype's `size` bytes straight from the symbols' table */
DSZI_INLINE size_t decode_bytes(dszi_dataDec* d, uint8_t* dst, size_t n, unsigned size)
{
    size_t i = 0;
    while (i < n) {
        if (DSZI_LIKELY(dszi_br_far(&d->br))) {
            /* at least 56 bits buffered: three codes of <= 15 bits */
            size_t const stop = n - i >= 3 ? i + 3 : n;
            dszi_br_refillFast(&d->br);
            for (; i < stop; i++)
                if (dszi_data_nextBytes(d, dst + size * i, size)) return DSZI_ERROR(corruption_detected);
        } else {
            dszi_br_refill(&d->br);
            if (d->br.pad > 16 || dszi_data_nextBytes(d, dst + size * i, size)) return DSZI_ERROR(corruption_detected);
            i++;
        }
    }
    return dszi_data_close(d);
}

size_t dszi_data_decodeAllTyped(dszi_dataDec* d, void* dst, size_t n)
{
    /* under the Lorenzo predictor, a float buffer small enough for the cache, the values then written
       as the dtype: the decoded tensor never exists as float32 as a whole */
    float buf[256];
    size_t const size = d->outSize;
    size_t i;
    if (d->predictor == DSZ_PRED_NONE) {
        /* a constant size for each, so that every value is one load and one store */
        if (size == 4) return decode_bytes(d, (uint8_t*)dst, n, 4);
        if (size == 2) return decode_bytes(d, (uint8_t*)dst, n, 2);
        return decode_bytes(d, (uint8_t*)dst, n, 1);
    }
    if (d->q.dtype == DSZ_DTYPE_FLOAT32) return dszi_data_decodeAll(d, (float*)dst, n);
    for (i = 0; i < n; i += 256) {
        size_t const m = n - i < 256 ? n - i : 256;
        if (dszi_data_decode(d, buf, m)) return DSZI_ERROR(corruption_detected);
        dszi_dtype_store((uint8_t*)dst + size * i, buf, d->q.dtype, m);
    }
    return dszi_data_close(d);
}
