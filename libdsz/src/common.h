/* libdsz internals shared by the stages: error returns, little-endian fields, bit I/O.
 * Internal names take the prefix dszi_/DSZI_, never the API's dsz_/DSZ_: a name's prefix says
 * whether it is in dsz.h, and the shared library exports only dsz.h's functions (DSZ_API). */
#ifndef DSZI_COMMON_H
#define DSZI_COMMON_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* the library implements the experimental section too */
#define DSZ_STATIC_LINKING_ONLY
#include "dsz.h"

/* The encoder checks each reconstruction against the bound and the decoder must rebuild the same
 * float bit for bit: float expressions may not be evaluated in wider precision (x87). */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "libdsz needs FLT_EVAL_METHOD == 0 (SSE2 or NEON float arithmetic); on 32-bit x86 build with -msse2 -mfpmath=sse"
#endif

/* The decoders write float32 values in host byte order straight into the caller's buffer, which for
 * a .dsz model is a little-endian .tflite: on a big-endian host the model would decode to garbage.
 * Such hosts are out of scope (doc/format.md, "Byte order and alignment"). */
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "libdsz supports little-endian hosts only (x86-64, ARM, RISC-V, ...); big-endian hosts are out of scope"
#endif

/* error codes are the last values of size_t, like zstd's */
#define DSZI_ERROR(name) ((size_t) - (ptrdiff_t)(DSZ_error_##name))
#define DSZI_CHECK(expr)                          \
    do {                                          \
        size_t const dszi_r_ = (expr);            \
        if (dsz_isError(dszi_r_)) return dszi_r_; \
    } while (0)

#if defined(__GNUC__)
#define DSZI_LIKELY(x) __builtin_expect(!!(x), 1)
#define DSZI_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define DSZI_INLINE static inline __attribute__((always_inline))
#else
#define DSZI_LIKELY(x) (x)
#define DSZI_UNLIKELY(x) (x)
#define DSZI_INLINE static inline
#endif

/* Element counts: at most DSZ_MAX_ELEMENTS, which does not fit a 32-bit size_t (armv7). Compared
 * in 64 bits through a parameter, so that a 32-bit build has no always-true test to warn about. */
DSZI_INLINE int dszi_count_fits(uint64_t n) { return n <= DSZ_MAX_ELEMENTS; }
/* a rows x cols matrix the encoder can take: a count within the limit that size_t also holds */
DSZI_INLINE int dszi_matrix_fits(size_t rows, size_t cols)
{
    return !cols || ((uint64_t)rows <= DSZ_MAX_ELEMENTS / cols && rows <= (size_t)-1 / cols);
}

/* ---- little-endian fields ---- */
static inline void dszi_wr16(uint8_t* p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void dszi_wr32(uint8_t* p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void dszi_wr64(uint8_t* p, uint64_t v) { dszi_wr32(p, (uint32_t)v); dszi_wr32(p + 4, (uint32_t)(v >> 32)); }
static inline uint32_t dszi_rd16(const uint8_t* p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
static inline uint32_t dszi_rd32(const uint8_t* p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t dszi_rd64(const uint8_t* p) { return (uint64_t)dszi_rd32(p) | ((uint64_t)dszi_rd32(p + 4) << 32); }
static inline void dszi_wrf64(uint8_t* p, double d) { uint64_t v; memcpy(&v, &d, 8); dszi_wr64(p, v); }
static inline double dszi_rdf64(const uint8_t* p) { uint64_t v = dszi_rd64(p); double d; memcpy(&d, &v, 8); return d; }
static inline uint64_t dszi_rdbe64(const uint8_t* p)
{
#if defined(__GNUC__)
    uint64_t v; /* one load and a byte swap: the bit readers' refill is on every decoder's hot path */
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
#else
    uint64_t v = 0;
    int i;
    for (i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
#endif
}

/* ---- MSB-first bit writer ---- */
typedef struct {
    uint8_t* p;
    uint8_t* end;
    uint64_t acc;  /* pending bits in the low `n` bits */
    unsigned n;
    int overflow;
} dszi_bitWriter;

DSZI_INLINE void dszi_bw_init(dszi_bitWriter* w, uint8_t* p, size_t cap)
{
    w->p = p; w->end = p + cap; w->acc = 0; w->n = 0; w->overflow = 0;
}
/* code has at most 24 bits */
DSZI_INLINE void dszi_bw_put(dszi_bitWriter* w, uint32_t code, unsigned len)
{
    w->acc = (w->acc << len) | code;
    w->n += len;
    if (w->n >= 32) {
        uint32_t const v = (uint32_t)(w->acc >> (w->n - 32));
        w->n -= 32;
        if (DSZI_LIKELY(w->end - w->p >= 4)) {
            w->p[0] = (uint8_t)(v >> 24); w->p[1] = (uint8_t)(v >> 16);
            w->p[2] = (uint8_t)(v >> 8); w->p[3] = (uint8_t)v;
            w->p += 4;
        } else {
            w->overflow = 1;
        }
    }
}
/* flush the remaining bits (zero-padded to a byte); returns bytes written in total from base */
DSZI_INLINE void dszi_bw_flush(dszi_bitWriter* w)
{
    while (w->n > 0) {
        unsigned const take = w->n >= 8 ? 8 : w->n;
        uint8_t const b = (uint8_t)((w->acc >> (w->n - take)) << (8 - take));
        w->n -= take;
        if (w->p < w->end) *w->p++ = b; else w->overflow = 1;
    }
}

/* ---- MSB-first bit reader: reads past the end as zeros and counts them ---- */
typedef struct {
    const uint8_t* p;
    const uint8_t* end;
    const uint8_t* start;
    uint64_t buf;  /* next bits, left-aligned; bits below `cnt` may hold later bits too */
    unsigned cnt;  /* valid bits in buf */
    size_t pad;    /* zero bytes appended past the end */
} dszi_bitReader;

DSZI_INLINE void dszi_br_init(dszi_bitReader* r, const uint8_t* p, size_t size)
{
    r->p = p; r->start = p; r->end = p + size; r->buf = 0; r->cnt = 0; r->pad = 0;
}
/* whether dszi_br_refillFast may be used: 8 bytes left to read */
DSZI_INLINE int dszi_br_far(const dszi_bitReader* r) { return r->end - r->p >= 8; }
/* refill without a branch where dszi_br_far holds; afterwards cnt >= 56 */
DSZI_INLINE void dszi_br_refillFast(dszi_bitReader* r)
{
    r->buf |= dszi_rdbe64(r->p) >> r->cnt;
    r->p += (63 - r->cnt) >> 3;
    r->cnt |= 56;
}
/* afterwards cnt >= 56 */
DSZI_INLINE void dszi_br_refill(dszi_bitReader* r)
{
    if (DSZI_LIKELY(dszi_br_far(r))) {
        dszi_br_refillFast(r);
    } else {
        while (r->cnt <= 56) {
            uint64_t byte = 0;
            if (r->p < r->end) byte = *r->p++; else r->pad++;
            r->buf |= byte << (56 - r->cnt);
            r->cnt += 8;
        }
    }
}
DSZI_INLINE uint32_t dszi_br_peek(const dszi_bitReader* r, unsigned nbits) { return (uint32_t)(r->buf >> (64 - nbits)); }
DSZI_INLINE void dszi_br_skip(dszi_bitReader* r, unsigned nbits) { r->buf <<= nbits; r->cnt -= nbits; }
/* bits consumed so far */
DSZI_INLINE uint64_t dszi_br_consumed(const dszi_bitReader* r)
{
    return (uint64_t)((size_t)(r->p - r->start) + r->pad) * 8u - r->cnt;
}

/* ---- stage interfaces ---- */

/* dtype.c: the stored element types */
/* bytes of one value, 0 for an unknown dtype */
unsigned dszi_dtype_size(unsigned dtype);
/* the format version a frame of this dtype is written with (doc/format.md) */
unsigned dszi_dtype_version(unsigned dtype);
/* whether eb is a valid absolute bound for the dtype (integer types: k + 1/2, k in 0..255) */
int dszi_dtype_bound_ok(unsigned dtype, double eb);
/* float16 bit pattern -> float, exact (NaN payloads kept) */
float dszi_f16_to_f32(uint32_t h);
/* float -> float16 bit pattern, exact for every value float16 holds (what the decoders write) */
uint32_t dszi_f32_to_f16(float f);
/* r rounded once to float16, nearest even, as a float; 0 where it would round to infinity */
float dszi_f16_round(double r);
/* n values of the dtype (little-endian) as floats */
void dszi_dtype_load(float* dst, const void* src, unsigned dtype, size_t n);
/* n floats that the dtype holds exactly, written as the dtype */
void dszi_dtype_store(void* dst, const float* src, unsigned dtype, size_t n);
/* dst[pos[j]] = val[j] in the dtype */
void dszi_dtype_scatter(void* dst, const size_t* pos, const float* val, size_t m, unsigned dtype);
/* a verbatim value (dszi_dtype_size bytes) */
float dszi_outlier_read(const uint8_t* p, unsigned dtype);
/* a verbatim value given as its float's bit pattern, written as the dtype */
void dszi_outlier_write(uint8_t* p, uint32_t bits, unsigned dtype);
/* quantize.c: the predictor + linear-scaling quantizer */
typedef struct {
    double eb, step, inv;
    unsigned radius;
    int keepNonzero; /* sparse data: a non-zero must not reconstruct to 0 */
    unsigned dtype;  /* DSZ_DTYPE_*: what reconstructions are rounded to */
} dszi_quant;
void dszi_quant_init(dszi_quant* q, double eb, unsigned radius, int keepNonzero, unsigned dtype);
/* symbols (0 = outlier) into sym[], outliers' float bit patterns into out[]; returns outlier count */
size_t dszi_quantize(const dszi_quant* q, unsigned predictor, const float* src, size_t n,
                    uint32_t* sym, uint32_t* outl, uint64_t* hist);
/* histogram only (for predictor choice) */
void dszi_quantize_hist(const dszi_quant* q, unsigned predictor, const float* src, size_t n, uint64_t* hist);
/* reconstruction of symbol s (1..2r-1) with zero prediction, as both sides compute it */
float dszi_dequant_none(const dszi_quant* q, uint32_t s);
/* a reconstruction computed in double, rounded once to the stored type; 0 outside its range */
DSZI_INLINE float dszi_recon(double r, unsigned dtype)
{
    if (DSZI_LIKELY(dtype == DSZ_DTYPE_FLOAT32))
        return (r > 3.4028234663852886e38 || r < -3.4028234663852886e38) ? 0.0f : (float)r;
    if (dtype == DSZ_DTYPE_FLOAT16) return dszi_f16_round(r);
    /* integer types: the step and every prediction are integers (dszi_dtype_bound_ok), so is r */
    if (dtype == DSZ_DTYPE_INT8) return (r >= -128.0 && r <= 127.0) ? (float)r : 0.0f;
    return (r >= 0.0 && r <= 255.0) ? (float)r : 0.0f;
}
/* Lorenzo reconstruction from a prediction, overflow-safe; as both sides compute it */
DSZI_INLINE float dszi_dequant_lorenzo(double step, float pred, int32_t qi, unsigned dtype)
{
    return dszi_recon((double)pred + (double)qi * step, dtype);
}

/* huffman.c: canonical Huffman, lengths <= DSZI_HUF_MAXLEN */
#define DSZI_HUF_MAXLEN 15
#define DSZI_HUF_LUTLOG 11
typedef struct {
    uint32_t* code;  /* per symbol (alphabet-sized) */
    uint8_t* len;    /* per symbol, 0 = unused */
    uint32_t nsym;   /* alphabet size */
} dszi_hufEnc;
/* build a code from a histogram; mallocs code/len; returns 0 or an error */
size_t dszi_huf_build(dszi_hufEnc* h, const uint64_t* hist, uint32_t nsym);
void dszi_huf_freeEnc(dszi_hufEnc* h);
/* bytes of the stored table */
size_t dszi_huf_tableSize(const dszi_hufEnc* h);
/* write table; returns bytes or error */
size_t dszi_huf_writeTable(const dszi_hufEnc* h, uint8_t* dst, size_t cap);
/* estimated bits for a histogram (entropy), used for choices */
double dszi_huf_estimateBits(const uint64_t* hist, uint32_t nsym, uint64_t total);

typedef struct {
    uint32_t* lut;      /* (symbol << 4) | length; length 0 = long code or invalid */
    uint32_t* sorted;   /* symbols in canonical order */
    uint32_t first[DSZI_HUF_MAXLEN + 2]; /* first left-aligned code of each length */
    uint32_t count[DSZI_HUF_MAXLEN + 2];
    uint32_t base[DSZI_HUF_MAXLEN + 2];  /* index in sorted[] of the first code of each length */
    unsigned maxLen;
    uint32_t nsym;
    uint32_t lo, hi;    /* range of used symbols, besides symbol 0 */
    int single;         /* exactly one symbol, coded with the 1-bit code 0 */
} dszi_hufDec;
/* read and validate a table; mallocs; returns bytes read or error */
size_t dszi_huf_readTable(dszi_hufDec* d, const uint8_t* src, size_t size, uint32_t nsym);
void dszi_huf_freeDec(dszi_hufDec* d);
/* slow path: codes longer than the lookup table; returns symbol or UINT32_MAX */
uint32_t dszi_huf_decodeLong(const dszi_hufDec* d, dszi_bitReader* r);

/* decode one symbol; refill must have left >= DSZI_HUF_MAXLEN bits */
DSZI_INLINE uint32_t dszi_huf_decode(const dszi_hufDec* d, dszi_bitReader* r)
{
    uint32_t const e = d->lut[dszi_br_peek(r, DSZI_HUF_LUTLOG)];
    if (DSZI_LIKELY(e & 15u)) {
        dszi_br_skip(r, e & 15u);
        return e >> 4;
    }
    return dszi_huf_decodeLong(d, r);
}

/* databody.c: a data section = n values through quantizer + Huffman + outliers */
size_t dszi_data_bound(size_t n, unsigned radius);
/* encode; chooses predictor if *predictor == DSZ_PRED_AUTO and writes the choice back; lowers
 * q->radius where its symbols would be more than the Huffman code holds (the frame records q->radius) */
size_t dszi_data_encode(uint8_t* dst, size_t cap, const float* src, size_t n, dszi_quant* q,
                        unsigned* predictor);

/* a data section opened for streaming decode */
typedef struct {
    dszi_hufDec huf;
    dszi_bitReader br;
    const uint8_t* outl;  /* outlier bit patterns */
    uint64_t nOut, kOut;
    unsigned outSize;     /* bytes of one outlier: dszi_dtype_size(q.dtype) */
    uint64_t bitBytes;
    float* deq;           /* predictor none: value of each symbol huf.lo..huf.hi */
    uint8_t* deqBytes;    /* the same values as the dtype's bytes (outSize each), what decoders write */
    dszi_quant q;
    unsigned predictor;
    float pred;           /* Lorenzo: previous reconstruction */
} dszi_dataDec;
size_t dszi_data_open(dszi_dataDec* d, const uint8_t* src, size_t size, size_t n, const dszi_quant* q,
                     unsigned predictor);
/* final checks: all outliers used, bitstream consumed */
size_t dszi_data_close(dszi_dataDec* d);
void dszi_data_free(dszi_dataDec* d);
/* decode the next value under the Lorenzo predictor (dszi_data_decode reads predictor none in
   bulk); returns 0, or -1 on corrupt input */
DSZI_INLINE int dszi_data_next(dszi_dataDec* d, float* v)
{
    uint32_t s;
    float r;
    dszi_br_refill(&d->br);
    s = dszi_huf_decode(&d->huf, &d->br);
    if (DSZI_LIKELY(s != 0 && s != UINT32_MAX)) {
        r = dszi_dequant_lorenzo(d->q.step, d->pred, (int32_t)s - (int32_t)d->q.radius, d->q.dtype);
    } else {
        if (s == UINT32_MAX || d->kOut >= d->nOut || d->br.pad > 16) return -1;
        r = dszi_outlier_read(d->outl + d->outSize * d->kOut, d->q.dtype);
        d->kOut++;
    }
    *v = r;
    d->pred = (r - r == 0.0f) ? r : 0.0f; /* finite check without libm */
    return 0;
}
/* decode the next value under predictor none as the dtype's `size` (= outSize) bytes at out, from a
   reader refilled to >= DSZI_HUF_MAXLEN bits: a symbol's value from deqBytes, an outlier's bytes as
   stored (every dtype's outliers are its values' bytes); returns 0, or -1 on corrupt input */
DSZI_INLINE int dszi_data_nextBytes(dszi_dataDec* d, uint8_t* out, unsigned size)
{
    uint32_t const s = dszi_huf_decode(&d->huf, &d->br);
    const uint8_t* v;
    if (DSZI_LIKELY(s != 0 && s != UINT32_MAX)) {
        v = d->deqBytes + (size_t)size * (s - d->huf.lo);
    } else {
        if (s == UINT32_MAX || d->kOut >= d->nOut) return -1;
        v = d->outl + (size_t)size * d->kOut++;
    }
    memcpy(out, v, size);
    return 0;
}
/* decode the next n values; returns 0, or -1 on corrupt input */
int dszi_data_decode(dszi_dataDec* d, float* dst, size_t n);
/* plain decode of all n values, then the final checks */
size_t dszi_data_decodeAll(dszi_dataDec* d, float* dst, size_t n);
/* the same, written as the stored dtype (under Lorenzo through a small float buffer) */
size_t dszi_data_decodeAllTyped(dszi_dataDec* d, void* dst, size_t n);

/* bitmap.c: the non-zero bitmap under context-adaptive binary arithmetic coding */
#define DSZI_BITMAP_MAX_COLS ((size_t)1 << 24)
typedef struct {
    const uint8_t* p;
    const uint8_t* end;
    uint8_t* ring;       /* the two previous rows' bits, or NULL */
    uint64_t i, r;       /* next position and its row */
    size_t c, cols;      /* its column, matrix width */
    size_t pad;          /* bytes read past the end (as zeros) */
    uint32_t range, code;
    unsigned left2;      /* the two previous bits of the row */
    uint16_t prob[16];
} dszi_bitmapDec;
/* encode bits up to the last non-zero; returns bytes (0 if there is none) or an error */
size_t dszi_bitmap_encode(uint8_t* dst, size_t cap, const float* w, size_t rows, size_t cols);
/* mallocs a ring of 2 rows; returns 0 or an error */
size_t dszi_bitmap_open(dszi_bitmapDec* b, const uint8_t* src, size_t size, size_t rows, size_t cols);
void dszi_bitmap_free(dszi_bitmapDec* b);
/* the next m non-zero positions (< n); returns m, or (size_t)-1 on corrupt input */
size_t dszi_bitmap_positions(dszi_bitmapDec* b, uint64_t n, size_t* pos, size_t m);

/* frame.c: consistency of a frame description (limits, ids, sizes); returns 0 or an error */
size_t dszi_frame_check(const dsz_frameInfo* f);

/* params.c: the encoder parameters behind dsz.h's opaque dsz_params, each checked as it is set */
struct dsz_params_s {
    double errorBound; /* 0 until set */
    double userBound;  /* what the frame stores as the user's bound: errorBound until set */
    int userBoundSet;
    unsigned mode, predictor;
    unsigned radius;   /* 1..DSZ_RADIUS_MAX */
};
/* whether an encoder can take the parameters (not NULL, the error bound set); returns 0 or an error */
size_t dszi_checkParams(const dsz_params* p);

/* index.c: the index section of a sparse frame. Its worst-case size (an error for an unknown codec) */
size_t dszi_index_bound(unsigned codec, uint64_t nElements, uint64_t nnz);
/* the non-zeros of w[0..n) */
size_t dszi_count_nonzeros(const float* w, size_t n);
/* the positions of w's nnz non-zeros coded by `codec`; returns bytes or an error */
size_t dszi_index_encode(uint8_t* dst, size_t cap, const float* w, size_t rows, size_t cols, size_t nnz,
                         unsigned codec);
/* up to m positions (< n) from gap bytes, from byte *i on (both advanced); returns how many, or
 * (size_t)-1 on corrupt input */
size_t dszi_index_gap8_positions(const uint8_t* index, size_t size, size_t* i, uint64_t* prev1, uint64_t n,
                                 size_t* pos, size_t m);
/* exactly m positions (< n) from Huffman-coded gaps; returns 0, or -1 on corrupt input */
int dszi_index_huff_positions(const dszi_hufDec* h, dszi_bitReader* br, uint64_t* prev1, uint64_t n, size_t* pos,
                              size_t m);

#endif /* DSZI_COMMON_H */
