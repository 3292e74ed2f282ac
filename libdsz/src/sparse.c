/* Sparse frames: the non-zeros' values as a data section (databody.c), their positions as an
 * index section (index.c, bitmap.c), and two one-pass decoders over one reader of both
 * sections: the fused one that scatters into a zero-filled dense matrix, and the one that
 * writes CSR arrays. */
#include <stdlib.h>

#include "common.h"

#define SPARSE_HEADER 88

size_t dsz_sparseBound(size_t rows, size_t cols, size_t nnz, unsigned radius)
{
    size_t db, ib;
    if (!dszi_matrix_fits(rows, cols)) return DSZI_ERROR(parameter_outOfBound);
    if (nnz > rows * cols) nnz = rows * cols;
    db = dszi_data_bound(nnz, radius ? radius : DSZ_RADIUS_DEFAULT);
    ib = dszi_index_bound(DSZ_INDEX_HUFFGAP, rows * cols, nnz);
    if (!dsz_isError(ib) && ib < rows * cols + 16) ib = rows * cols + 16; /* the bitmap's */
    if (dsz_isError(db) || dsz_isError(ib) || db > (size_t)-1 / 2 - ib) return DSZI_ERROR(parameter_outOfBound);
    return SPARSE_HEADER + db + ib;
}

/* w: the matrix as floats (float32, or values of dtype converted by the caller) */
static size_t encode_floats(uint8_t* dst, size_t cap, const float* w, unsigned dtype, size_t rows, size_t cols,
                            const dsz_params* p, unsigned codec)
{
    dsz_frameInfo f;
    dszi_quant q;
    unsigned pred;
    size_t const n = rows * cols;
    size_t nnz, i, k, ds, is;
    float* vals;
    if (cap < SPARSE_HEADER) return DSZI_ERROR(dstSize_tooSmall);
    nnz = dszi_count_nonzeros(w, n);
    vals = (float*)malloc(sizeof(float) * (nnz ? nnz : 1));
    if (!vals) return DSZI_ERROR(memory_allocation);
    for (i = 0, k = 0; i < n; i++)
        if (w[i] != 0.0f) vals[k++] = w[i];
    dszi_quant_init(&q, p->errorBound, p->radius, 1, dtype);
    pred = p->predictor;
    ds = dszi_data_encode(dst + SPARSE_HEADER, cap - SPARSE_HEADER, vals, nnz, &q, &pred);
    free(vals);
    if (dsz_isError(ds)) return ds;
    is = dszi_index_encode(dst + SPARSE_HEADER + ds, cap - SPARSE_HEADER - ds, w, rows, cols, nnz, codec);
    if (dsz_isError(is)) return is;
    memset(&f, 0, sizeof(f));
    f.kind = DSZ_KIND_SPARSE;
    f.version = dszi_dtype_version(dtype);
    f.dtype = dtype;
    f.ndim = 2;
    f.shape[0] = rows;
    f.shape[1] = cols;
    f.nnz = nnz;
    f.predictor = pred;
    f.mode = p->mode;
    f.radius = q.radius;
    f.indexCodec = codec;
    f.errorBound = p->errorBound;
    f.userBound = p->userBound;
    f.dataRawSize = f.dataStoredSize = ds;
    f.indexRawSize = f.indexStoredSize = is;
    DSZI_CHECK(dsz_writeFrameHeader(dst, SPARSE_HEADER, &f));
    return SPARSE_HEADER + ds + is;
}

size_t dsz_encodeSparse(void* dst, size_t cap, const float* w, size_t rows, size_t cols, const dsz_params* p,
                        unsigned codec)
{
    return dsz_encodeSparseTyped(dst, cap, w, DSZ_DTYPE_FLOAT32, rows, cols, p, codec);
}

size_t dsz_encodeSparseTyped(void* dst, size_t cap, const void* w, unsigned dtype, size_t rows, size_t cols,
                             const dsz_params* p, unsigned codec)
{
    size_t n, r;
    float* vals;
    DSZI_CHECK(dszi_checkParams(p));
    if (codec > DSZ_INDEX_BITMAP || !dszi_dtype_size(dtype)) return DSZI_ERROR(parameter_unsupported);
    if (!dszi_dtype_bound_ok(dtype, p->errorBound)) return DSZI_ERROR(parameter_outOfBound);
    if (!dszi_matrix_fits(rows, cols)) return DSZI_ERROR(parameter_outOfBound);
    n = rows * cols;
    if (n && !w) return DSZI_ERROR(parameter_unsupported);
    if (dtype == DSZ_DTYPE_FLOAT32) return encode_floats((uint8_t*)dst, cap, (const float*)w, dtype, rows, cols, p, codec);
    if (n > (size_t)-1 / sizeof(float)) return DSZI_ERROR(parameter_outOfBound);
    vals = (float*)malloc(sizeof(float) * (n ? n : 1));
    if (!vals) return DSZI_ERROR(memory_allocation);
    dszi_dtype_load(vals, w, dtype, n);
    r = encode_floats((uint8_t*)dst, cap, vals, dtype, rows, cols, p, codec);
    free(vals);
    return r;
}

#define BATCH 256

/* a symbol from a reader refilled to >= DSZI_HUF_MAXLEN bits, UINT32_MAX for an invalid code; the
 * reader is the caller's local, copied around the call of the slow path so that it stays in registers */
DSZI_INLINE uint32_t huff_symbol(const dszi_hufDec* h, const uint32_t* lut, dszi_bitReader* r)
{
    uint32_t const e = lut[dszi_br_peek(r, DSZI_HUF_LUTLOG)];
    dszi_bitReader t;
    uint32_t s;
    if (DSZI_LIKELY(e & 15u)) {
        dszi_br_skip(r, e & 15u);
        return e >> 4;
    }
    t = *r;
    s = dszi_huf_decodeLong(h, &t);
    *r = t;
    return s;
}

/* A lookup table for the values' codes that gives what to write: (value's bytes << 8) | code length,
 * 0 for a long code or the outlier symbol (the slow path). Values are at most 4 bytes and the host is
 * little-endian (common.h): the low bytes of an entry are the value's bytes. */
static uint64_t* value_lut(const dszi_dataDec* d)
{
    uint64_t* const t = (uint64_t*)malloc(sizeof(uint64_t) << DSZI_HUF_LUTLOG);
    size_t i;
    if (!t) return NULL;
    for (i = 0; i < (size_t)1 << DSZI_HUF_LUTLOG; i++) {
        uint32_t const e = d->huf.lut[i], s = e >> 4;
        uint64_t v = 0;
        if ((e & 15u) && s != 0) {
            memcpy(&v, d->deqBytes + (size_t)d->outSize * (s - d->huf.lo), d->outSize);
            t[i] = (v << 8) | (e & 15u);
        } else {
            t[i] = 0;
        }
    }
    return t;
}

/* The fused fast path for Huffman-coded gaps and values under predictor none: each non-zero's gap
 * and value decoded together and written straight into dst as the dtype's `size` bytes, with no
 * batch arrays between. It works in blocks of three gap symbols (at most 45 bits, as many values)
 * per refill of both bitstreams, while both have 8 bytes left (a refill is then one load without a
 * branch), at least three non-zeros remain and the next three positions are certainly below n (so
 * that a block checks n once); the batched path decodes the rest. Every symbol is still checked
 * against its table. The state lives in locals: dst may alias anything, and state behind pointers
 * would be reloaded after every store. Returns the number of non-zeros decoded in all (from k), or
 * (uint64_t)-1 on corrupt input. */
DSZI_INLINE uint64_t fused_huff(uint8_t* dst, unsigned size, const dszi_hufDec* h, dszi_bitReader* br,
                               dszi_dataDec* d, const uint64_t* vlut, uint64_t* prev1, uint64_t n, uint64_t k,
                               uint64_t nnz)
{
    const uint32_t* const glut = h->lut;
    const uint8_t* const outl = d->outl;
    uint64_t const nOut = d->nOut;
    uint64_t kOut = d->kOut, p1 = *prev1;
    dszi_bitReader gb = *br, vb = d->br;
    while (nnz - k >= 3 && n - p1 > 3 * 255 && dszi_br_far(&gb) && dszi_br_far(&vb)) {
        int t;
        dszi_br_refillFast(&gb);
        dszi_br_refillFast(&vb);
        for (t = 0; t < 3; t++) {
            uint32_t const g = huff_symbol(h, glut, &gb);
            uint64_t const e = vlut[dszi_br_peek(&vb, DSZI_HUF_LUTLOG)];
            uint64_t v;
            if (DSZI_UNLIKELY(g == 0)) { /* a filler: no value */
                p1 += 255;
                continue;
            }
            if (g == UINT32_MAX) return (uint64_t)-1;
            p1 += g; /* the position p1 - 1 < n */
            if (DSZI_LIKELY(e)) {
                dszi_br_skip(&vb, (unsigned)e & 15u);
                v = e >> 8;
            } else {
                uint32_t const s = huff_symbol(&d->huf, d->huf.lut, &vb);
                v = 0;
                if (s != 0 && s != UINT32_MAX) {
                    memcpy(&v, d->deqBytes + (size_t)size * (s - d->huf.lo), size);
                } else {
                    if (s == UINT32_MAX || kOut >= nOut) return (uint64_t)-1;
                    memcpy(&v, outl + (size_t)size * kOut++, size);
                }
            }
            memcpy(dst + (size_t)size * (size_t)(p1 - 1), &v, size);
            k++;
        }
    }
    *br = gb;
    d->br = vb;
    d->kOut = kOut;
    *prev1 = p1;
    return k;
}

/* A sparse frame's raw sections opened for decoding: the index reader of the frame's codec and the
 * data section's decoder, advanced together. Both decoders (dense and CSR) read the non-zeros
 * through it, so that they validate the same bytes the same way and differ only in where a
 * non-zero goes. */
typedef struct {
    const dsz_frameInfo* f;
    const uint8_t* index;
    size_t indexSize;
    size_t at;         /* gap8: the next byte */
    uint64_t bitBytes; /* huffgap: bytes of the bitstream */
    uint64_t prev1;    /* the previous position + 1 */
    uint64_t k;        /* non-zeros read so far */
    dszi_hufDec h;      /* huffgap */
    dszi_bitReader br;  /* huffgap */
    dszi_bitmapDec bm;  /* bitmap */
    dszi_dataDec d;
} sparse_reader;

/* What a sparse frame's header and section sizes must satisfy before any section is read
 * (checked before the caller's capacity, which depends on the header). Returns 0 or an error. */
static size_t sparse_check(const dsz_frameInfo* f, size_t dataSize, size_t indexSize)
{
    if (!f || f->kind != DSZ_KIND_SPARSE) return DSZI_ERROR(parameter_unsupported);
    DSZI_CHECK(dszi_frame_check(f));
    if (f->shape[1] && f->shape[0] > DSZ_MAX_ELEMENTS / f->shape[1]) return DSZI_ERROR(corruption_detected);
    if (f->shape[0] * f->shape[1] != f->nElements) return DSZI_ERROR(corruption_detected);
    if (f->indexCodec > DSZ_INDEX_BITMAP) return DSZI_ERROR(frameParameter_unsupported);
    if (dataSize != f->dataRawSize || indexSize != f->indexRawSize) return DSZI_ERROR(srcSize_wrong);
    return 0;
}

static void sparse_free(sparse_reader* s)
{
    dszi_bitmap_free(&s->bm);
    dszi_huf_freeDec(&s->h);
    dszi_data_free(&s->d);
}

/* Open both sections (after sparse_check). Mallocs the decoding tables; on success the caller
 * frees them with sparse_free, on an error nothing is left allocated. Returns 0 or an error. */
static size_t sparse_open(sparse_reader* s, const dsz_frameInfo* f, const void* data, size_t dataSize,
                          const void* index, size_t indexSize)
{
    dszi_quant q;
    size_t r;
    memset(s, 0, sizeof(*s));
    s->f = f;
    s->index = (const uint8_t*)index;
    s->indexSize = indexSize;
    dszi_quant_init(&q, f->errorBound, f->radius, 1, f->dtype);
    r = dszi_data_open(&s->d, (const uint8_t*)data, dataSize, (size_t)f->nnz, &q, f->predictor);
    if (dsz_isError(r)) return r;
    if (f->indexCodec == DSZ_INDEX_HUFFGAP) {
        size_t const ts = dszi_huf_readTable(&s->h, s->index, indexSize, 256);
        if (dsz_isError(ts)) { r = ts; goto fail; }
        r = DSZI_ERROR(corruption_detected);
        if (indexSize - ts < 8) goto fail;
        s->bitBytes = dszi_rd64(s->index + ts);
        if (s->bitBytes != indexSize - ts - 8 || (f->nnz && !s->h.maxLen)) goto fail;
        dszi_br_init(&s->br, s->index + ts + 8, (size_t)s->bitBytes);
    } else if (f->indexCodec == DSZ_INDEX_BITMAP) {
        r = dszi_bitmap_open(&s->bm, s->index, indexSize, (size_t)f->shape[0], (size_t)f->shape[1]);
        if (dsz_isError(r)) goto fail;
        r = DSZI_ERROR(corruption_detected);
        if ((f->nnz == 0) != (indexSize == 0)) goto fail;
    }
    return 0;
fail:
    sparse_free(s);
    return r;
}

/* The next m non-zeros (m <= nnz - k): their positions, strictly increasing and below n, into
 * pos[] and their values as floats into val[]. Returns 0, or -1 on corrupt input. */
DSZI_INLINE int sparse_next(sparse_reader* s, size_t* pos, float* val, size_t m)
{
    uint64_t const n = s->f->nElements;
    if (s->f->indexCodec == DSZ_INDEX_GAP8) {
        if (dszi_index_gap8_positions(s->index, s->indexSize, &s->at, &s->prev1, n, pos, m) != m) return -1;
    } else if (s->f->indexCodec == DSZ_INDEX_HUFFGAP) {
        if (dszi_index_huff_positions(&s->h, &s->br, &s->prev1, n, pos, m)) return -1;
    } else if (dszi_bitmap_positions(&s->bm, n, pos, m) != m) {
        return -1;
    }
    if (dszi_data_decode(&s->d, val, m)) return -1;
    s->k += m;
    return 0;
}

/* Once all nnz non-zeros are read: the index section is consumed exactly (a bitstream to its
 * last byte) and the data section closes. Returns nnz, or an error. */
static size_t sparse_close(sparse_reader* s)
{
    size_t r;
    if (s->f->indexCodec == DSZ_INDEX_GAP8) {
        if (s->at != s->indexSize) return DSZI_ERROR(corruption_detected);
    } else if (s->f->indexCodec == DSZ_INDEX_BITMAP) {
        /* the coder's flush is read to its last byte */
        if (s->bm.p != s->bm.end) return DSZI_ERROR(corruption_detected);
    } else if (s->f->nnz) {
        uint64_t const used = dszi_br_consumed(&s->br);
        if (used > 8 * s->bitBytes || used + 8 <= 8 * s->bitBytes) return DSZI_ERROR(corruption_detected);
    } else if (s->bitBytes) {
        return DSZI_ERROR(corruption_detected);
    }
    r = dszi_data_close(&s->d);
    return dsz_isError(r) ? r : (size_t)s->f->nnz;
}

size_t dsz_decodeSparse(float* dst, size_t dstCapacity, const dsz_frameInfo* f, const void* data, size_t dataSize,
                        const void* index, size_t indexSize)
{
    if (f && f->dtype != DSZ_DTYPE_FLOAT32) return DSZI_ERROR(frameParameter_unsupported);
    return dsz_decodeSparseTyped(dst, dstCapacity, f, data, dataSize, index, indexSize);
}

/* the dense decoder's body: the fused path where it applies, then batches scattered into dst */
static size_t decode_dense(sparse_reader* s, void* dst)
{
    const dsz_frameInfo* const f = s->f;
    size_t pos[BATCH];
    float val[BATCH];
    size_t j;
    if (f->indexCodec == DSZ_INDEX_HUFFGAP && f->predictor == DSZ_PRED_NONE && f->nnz >= 3) {
        uint64_t* const vlut = value_lut(&s->d);
        uint64_t const n = f->nElements, nnz = f->nnz;
        uint8_t* const out = (uint8_t*)dst;
        if (!vlut) return DSZI_ERROR(memory_allocation);
        /* a constant size for each, so that every value is one store */
        if (s->d.outSize == 4) s->k = fused_huff(out, 4, &s->h, &s->br, &s->d, vlut, &s->prev1, n, 0, nnz);
        else if (s->d.outSize == 2) s->k = fused_huff(out, 2, &s->h, &s->br, &s->d, vlut, &s->prev1, n, 0, nnz);
        else s->k = fused_huff(out, 1, &s->h, &s->br, &s->d, vlut, &s->prev1, n, 0, nnz);
        free(vlut);
        if (s->k == (uint64_t)-1) return DSZI_ERROR(corruption_detected);
    }
    while (s->k < f->nnz) {
        size_t const m = f->nnz - s->k < BATCH ? (size_t)(f->nnz - s->k) : BATCH;
        if (sparse_next(s, pos, val, m)) return DSZI_ERROR(corruption_detected);
        if (f->dtype == DSZ_DTYPE_FLOAT32) {
            float* const out = (float*)dst;
            for (j = 0; j < m; j++) out[pos[j]] = val[j];
        } else {
            dszi_dtype_scatter(dst, pos, val, m, f->dtype);
        }
    }
    return sparse_close(s);
}

size_t dsz_decodeSparseTyped(void* dst, size_t dstCapacity, const dsz_frameInfo* f, const void* data,
                             size_t dataSize, const void* index, size_t indexSize)
{
    sparse_reader s;
    size_t r;
    DSZI_CHECK(sparse_check(f, dataSize, indexSize));
    if (dstCapacity < f->nElements) return DSZI_ERROR(dstSize_tooSmall);
    DSZI_CHECK(sparse_open(&s, f, data, dataSize, index, indexSize));
    r = decode_dense(&s, dst);
    sparse_free(&s);
    return r;
}

/* the CSR decoder's body: values decoded straight into place, positions split into rows and columns */
static size_t decode_csr(sparse_reader* s, int64_t* rowPtr, int32_t* colIndex, float* values)
{
    uint64_t const rows = s->f->shape[0], cols = s->f->shape[1];
    uint64_t row = 0, rowStart = 0; /* the row being filled and its first position */
    size_t pos[BATCH];
    size_t j, r;
    rowPtr[0] = 0;
    while (s->k < s->f->nnz) {
        size_t const m = s->f->nnz - s->k < BATCH ? (size_t)(s->f->nnz - s->k) : BATCH;
        size_t const k0 = (size_t)s->k;
        if (sparse_next(s, pos, values + k0, m)) return DSZI_ERROR(corruption_detected);
        for (j = 0; j < m; j++) {
            /* positions increase: rows are closed in order, the empty ones included */
            while (pos[j] - rowStart >= cols) {
                rowPtr[++row] = (int64_t)(k0 + j);
                rowStart += cols;
            }
            colIndex[k0 + j] = (int32_t)(pos[j] - rowStart);
        }
    }
    /* the rows after the last non-zero once the sections are whole: a corrupt stream that declares
     * many rows fails before their pointers are written */
    r = sparse_close(s);
    if (dsz_isError(r)) return r;
    while (row < rows) rowPtr[++row] = (int64_t)s->f->nnz;
    return r;
}

size_t dsz_decodeSparseCSR(int64_t* rowPtr, int32_t* colIndex, float* values, size_t nnzCapacity,
                           const dsz_frameInfo* f, const void* data, size_t dataSize, const void* index,
                           size_t indexSize)
{
    sparse_reader s;
    size_t r;
    DSZI_CHECK(sparse_check(f, dataSize, indexSize));
    /* column indices are int32; rows + 1 pointers must be addressable */
    if (f->shape[1] > (uint64_t)INT32_MAX + 1 || f->shape[0] >= (size_t)-1 / sizeof(int64_t))
        return DSZI_ERROR(parameter_outOfBound);
    if (nnzCapacity < f->nnz) return DSZI_ERROR(dstSize_tooSmall);
    DSZI_CHECK(sparse_open(&s, f, data, dataSize, index, indexSize));
    r = decode_csr(&s, rowPtr, colIndex, values);
    sparse_free(&s);
    return r;
}
