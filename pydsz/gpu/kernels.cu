/* pydsz GPU kernels, compiled at run time through pycuda (pydsz/gpu/_cuda.py) with the options
 * in _cuda.COMPILE_OPTIONS; tests/test_gpu_compile.py compiles this file with nvcc the same way.
 *
 * Exactness. The quantizer must give the very codes libdsz's CPU quantizer gives
 * (libdsz/src/quantize.c, predictor none): the same IEEE double operations in the same order,
 * each rounded once. The _rn intrinsics are never contracted into fused multiply-adds, and the
 * module is compiled with -fmad=false on top, so no expression here is fused behind our back.
 * The matrix product uses explicit fused multiply-adds (__fmaf_rn), which -fmad=false leaves
 * alone: its results differ from numpy's only in float summation order, as promised.
 * Training steps mirror numpy's float32 expressions operation by operation.
 */

#define DSZ_FLT_MAX_D 3.4028234663852886e38
/* round_half_up's offset in quantize.c: floor(d + 0.5) by truncation of a positive number */
#define DSZ_ROUND_OFFSET 4194304

/* histogram bins kept in shared memory, centred on the zero code (symbol = radius) */
#define HIST_WINDOW 4096

/* activation codes, as pydsz/gpu/_cuda.py ACTIVATIONS numbers them */
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_RELU6 2
#define ACT_RELU_N1_TO_1 3
#define ACT_TANH 4
#define ACT_LOGISTIC 5
#define ACT_LEAKY_RELU 6

extern "C" {

/* ---------------------------------------------------------------- quantization */

/* quantize.c dequant_none: (double)qi * step, rounded once to float, 0 when beyond float range */
__device__ __forceinline__ float dsz_dequant(double step, int qi)
{
    double const r = __dmul_rn((double)qi, step);
    return (r > DSZ_FLT_MAX_D || r < -DSZ_FLT_MAX_D) ? 0.0f : __double2float_rn(r);
}

/* quantize.c quantize_impl, predictor none, for one value: returns the symbol (0 = stored
 * verbatim) and the value the decoder rebuilds in *recon */
__device__ __forceinline__ unsigned dsz_quantize_one(float xf, double eb, double step, double inv,
                                                     double rmax, int radius, int keep_nonzero,
                                                     float* recon)
{
    double const x = (double)xf;
    double const d = __dmul_rn(x, inv);
    unsigned s = 0;
    float out = xf;
    if (fabs(d) < rmax) { /* false for NaN */
        int qi = __double2int_rz(__dadd_rn(d, 0.5 + (double)DSZ_ROUND_OFFSET)) - DSZ_ROUND_OFFSET;
        float r = dsz_dequant(step, qi);
        if (keep_nonzero && r == 0.0f && xf != 0.0f) {
            qi = x > 0 ? 1 : -1;
            r = dsz_dequant(step, qi);
        }
        if (fabs(__dsub_rn(x, (double)r)) <= eb && !(keep_nonzero && r == 0.0f && xf != 0.0f)) {
            s = (unsigned)(qi + radius);
            out = r;
        }
    }
    *recon = out;
    return s;
}

/* Quantize n values for nb bounds at once (blockIdx.y = bound). hist: nb rows of 2 * radius
 * counters, added to; sym: nb rows of n symbols, or NULL for the histogram alone.
 * step[b] = min(2 * eb[b], 1e300) and inv[b] = 1 / step[b] come from the host, computed as
 * dszi_quant_init computes them. */
__global__ void dsz_quantize_many(const float* __restrict__ x, long long n, const double* __restrict__ eb,
                                  const double* __restrict__ step, const double* __restrict__ inv,
                                  unsigned radius, int keep_nonzero, unsigned* __restrict__ sym,
                                  unsigned long long* __restrict__ hist)
{
    __shared__ unsigned local[HIST_WINDOW];
    __shared__ unsigned outliers;
    int const b = blockIdx.y;
    double const e = eb[b], st = step[b], iv = inv[b];
    double const rmax = (double)radius - 1.0;
    unsigned long long* const h = hist + (unsigned long long)b * 2u * radius;
    unsigned* const s_out = sym ? sym + (unsigned long long)b * (unsigned long long)n : 0;
    /* local[i] counts symbol lo + i */
    long long const lo = (long long)radius - HIST_WINDOW / 2;
    for (int i = threadIdx.x; i < HIST_WINDOW; i += blockDim.x) local[i] = 0;
    if (threadIdx.x == 0) outliers = 0;
    __syncthreads();
    long long const stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float r;
        unsigned const s = dsz_quantize_one(x[i], e, st, iv, rmax, (int)radius, keep_nonzero, &r);
        if (s_out) s_out[i] = s;
        long long const w = (long long)s - lo;
        if (s == 0)
            atomicAdd(&outliers, 1u);
        else if (w >= 0 && w < HIST_WINDOW)
            atomicAdd(&local[w], 1u);
        else
            atomicAdd(&h[s], 1ull);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < HIST_WINDOW; i += blockDim.x) {
        long long const s = lo + i;
        if (local[i] && s > 0 && s < 2LL * radius) atomicAdd(&h[s], (unsigned long long)local[i]);
    }
    if (threadIdx.x == 0 && outliers) atomicAdd(&h[0], (unsigned long long)outliers);
}

/* Rebuild a quantized layer: dense[index[i]] = what the decoder gives for value x[i] at bound
 * eb. dense must hold zeros elsewhere (the pruned weights). */
__global__ void dsz_reconstruct_scatter(const float* __restrict__ x, const long long* __restrict__ index,
                                        long long n, double eb, double step, double inv, unsigned radius,
                                        int keep_nonzero, float* __restrict__ dense)
{
    double const rmax = (double)radius - 1.0;
    long long const stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float r;
        (void)dsz_quantize_one(x[i], eb, step, inv, rmax, (int)radius, keep_nonzero, &r);
        dense[index[i]] = r;
    }
}

/* ---------------------------------------------------------------- forward pass */

__device__ __forceinline__ float dsz_activate(float v, int act, float alpha)
{
    switch (act) {
    case ACT_RELU: return v < 0.0f ? 0.0f : v;
    case ACT_RELU6: return v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v);
    case ACT_RELU_N1_TO_1: return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v);
    case ACT_TANH: return tanhf(v);
    case ACT_LOGISTIC: return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v)));
    case ACT_LEAKY_RELU: return v >= 0.0f ? v : __fmul_rn(v, alpha);
    default: return v;
    }
}

#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 8
#define GEMM_THREADS 256

/* C[i, j] = act(sum_k A(i, k) * B(j, k) + bias[j]) for i < rows, j < cols, C row-major with
 * leading dimension ldc; A(i, k) = A[i * sai + k * sak], B(j, k) = B[j * sbj + k * sbk].
 * A dense layer is rows = samples, A = activations [rows, K], B = weights [cols, K] (TFLite's
 * [out, in]); the strides also give the transposed products of back-propagation.
 * bias may be NULL. 128 x 128 tiles, 256 threads of 8 x 8 results each; vector loads when
 * both operands run along k contiguously in multiples of 4. */
__global__ void __launch_bounds__(GEMM_THREADS)
dsz_gemm(const float* __restrict__ A, long long sai, long long sak, const float* __restrict__ B, long long sbj,
         long long sbk, const float* __restrict__ bias, float* __restrict__ C, long long ldc, int rows, int cols,
         int K, int act, float alpha)
{
    __shared__ __align__(16) float As[GEMM_BK][GEMM_BM + 4];
    __shared__ __align__(16) float Bs[GEMM_BK][GEMM_BN + 4];
    int const tid = threadIdx.x;
    int const tx = tid & 15, ty = tid >> 4;
    int const i0 = blockIdx.y * GEMM_BM, j0 = blockIdx.x * GEMM_BN;
    /* the loader: each thread fetches 4 consecutive k of one row of each tile */
    int const lr = tid >> 1, lk = (tid & 1) * 4;
    long long const ga = i0 + lr, gb = j0 + lr;
    int const vec = sak == 1 && sbk == 1 && (K & 3) == 0 && (sai & 3) == 0 && (sbj & 3) == 0 &&
                    ((unsigned long long)A & 15) == 0 && ((unsigned long long)B & 15) == 0;
    float pa[4], pb[4];
    float acc[8][8];
    float a[8], b[8];
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

#define DSZ_GEMM_FETCH(k0)                                                                      \
    do {                                                                                        \
        int const kk = (k0) + lk;                                                               \
        if (vec) {                                                                              \
            float4 va = make_float4(0.f, 0.f, 0.f, 0.f), vb = va;                               \
            if (ga < rows && kk < K) va = *reinterpret_cast<const float4*>(A + ga * sai + kk);  \
            if (gb < cols && kk < K) vb = *reinterpret_cast<const float4*>(B + gb * sbj + kk);  \
            pa[0] = va.x; pa[1] = va.y; pa[2] = va.z; pa[3] = va.w;                             \
            pb[0] = vb.x; pb[1] = vb.y; pb[2] = vb.z; pb[3] = vb.w;                             \
        } else {                                                                                \
            for (int q = 0; q < 4; q++) {                                                       \
                pa[q] = (ga < rows && kk + q < K) ? A[ga * sai + (long long)(kk + q) * sak] : 0.f; \
                pb[q] = (gb < cols && kk + q < K) ? B[gb * sbj + (long long)(kk + q) * sbk] : 0.f; \
            }                                                                                   \
        }                                                                                       \
    } while (0)

    DSZ_GEMM_FETCH(0);
    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        for (int q = 0; q < 4; q++) {
            As[lk + q][lr] = pa[q];
            Bs[lk + q][lr] = pb[q];
        }
        __syncthreads();
        if (k0 + GEMM_BK < K) DSZ_GEMM_FETCH(k0 + GEMM_BK); /* in flight while we compute */
#pragma unroll
        for (int k = 0; k < GEMM_BK; k++) {
            float4 const a0 = *reinterpret_cast<const float4*>(&As[k][ty * 8]);
            float4 const a1 = *reinterpret_cast<const float4*>(&As[k][ty * 8 + 4]);
            float4 const b0 = *reinterpret_cast<const float4*>(&Bs[k][tx * 8]);
            float4 const b1 = *reinterpret_cast<const float4*>(&Bs[k][tx * 8 + 4]);
            a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
            a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
            b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w;
            b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#undef DSZ_GEMM_FETCH

    for (int i = 0; i < 8; i++) {
        long long const r = i0 + ty * 8 + i;
        if (r >= rows) break;
        for (int j = 0; j < 8; j++) {
            int const c = j0 + tx * 8 + j;
            if (c >= cols) break;
            float v = acc[i][j];
            if (bias) v = __fadd_rn(v, bias[c]);
            C[r * ldc + c] = dsz_activate(v, act, alpha);
        }
    }
}

/* v[i] = act(v[i]) in place (a standalone activation op of the tail) */
__global__ void dsz_activation(float* __restrict__ v, long long n, int act, float alpha)
{
    long long const stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        v[i] = dsz_activate(v[i], act, alpha);
}

/* numpy.argmax's order: NaN beats everything, then larger values, then the lower index */
__device__ __forceinline__ int dsz_better(float v, int i, float bv, int bi)
{
    int const vn = v != v, bn = bv != bv;
    if (vn != bn) return vn;
    if (vn) return i < bi;
    return v > bv || (v == bv && i < bi);
}

/* count[0] += number of rows r of scores [rows, cols] whose argmax is label[r]; one warp a row.
 * hit, unless NULL, receives each row's outcome (1 = right): the assessment counts the samples
 * a layer's error flips either way, not only the net change. */
__global__ void dsz_top1_count(const float* __restrict__ scores, int rows, int cols, const int* __restrict__ label,
                               unsigned long long* __restrict__ count, unsigned char* __restrict__ hit)
{
    int const lane = threadIdx.x & 31;
    int const warps = (gridDim.x * blockDim.x) >> 5;
    unsigned hits = 0;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const float* const row = scores + (long long)r * cols;
        float best = -INFINITY;
        int bi = cols; /* loses to any real entry; cols >= 1 */
        for (int c = lane; c < cols; c += 32)
            if (dsz_better(row[c], c, best, bi)) { best = row[c]; bi = c; }
        for (int off = 16; off > 0; off >>= 1) {
            float const ov = __shfl_down_sync(0xffffffffu, best, off);
            int const oi = __shfl_down_sync(0xffffffffu, bi, off);
            if (dsz_better(ov, oi, best, bi)) { best = ov; bi = oi; }
        }
        if (lane == 0) {
            int const right = bi == label[r];
            hits += right;
            if (hit) hit[r] = (unsigned char)right;
        }
    }
    if (lane == 0 && hits) atomicAdd(count, (unsigned long long)hits);
}

/* ---------------------------------------------------------------- training */

/* delta[r, :] = (softmax(logits[r, :]) - target[r, :]) / rows, as prune._gradients computes it
 * (target: class probabilities, the labels' one-hot mixed with a teacher's softmax); one warp a
 * row; logits and delta may alias, since each lane reads and writes only its own columns */
__global__ void dsz_softmax_xent_grad(const float* logits, int rows, int cols, const float* __restrict__ target,
                                      float* delta)
{
    int const lane = threadIdx.x & 31;
    int const warps = (gridDim.x * blockDim.x) >> 5;
    float const n_rows = (float)rows;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const float* const z = logits + (long long)r * cols;
        const float* const t = target + (long long)r * cols;
        float* const d = delta + (long long)r * cols;
        float m = -INFINITY;
        for (int c = lane; c < cols; c += 32) m = fmaxf(m, z[c]);
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        float s = 0.0f;
        for (int c = lane; c < cols; c += 32) s = __fadd_rn(s, expf(__fsub_rn(z[c], m)));
        for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
        for (int c = lane; c < cols; c += 32) {
            float const p = __fdiv_rn(expf(__fsub_rn(z[c], m)), s);
            d[c] = __fdiv_rn(__fsub_rn(p, t[c]), n_rows);
        }
    }
}

/* delta *= act'(z) with a = act(z): the derivatives prune.ACTIVATIONS gives */
__global__ void dsz_activation_grad(float* __restrict__ delta, const float* __restrict__ z,
                                    const float* __restrict__ a, long long n, int act)
{
    long long const stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float g = 1.0f;
        switch (act) {
        case ACT_RELU: g = z[i] > 0.0f ? 1.0f : 0.0f; break;
        case ACT_RELU6: g = (z[i] > 0.0f && z[i] < 6.0f) ? 1.0f : 0.0f; break;
        case ACT_TANH: g = __fsub_rn(1.0f, __fmul_rn(a[i], a[i])); break;
        case ACT_LOGISTIC: g = __fmul_rn(a[i], __fsub_rn(1.0f, a[i])); break;
        default: break;
        }
        delta[i] = __fmul_rn(delta[i], g);
    }
}

/* out[c] = sum over rows of m[r, c] (the bias gradient) */
__global__ void dsz_column_sum(const float* __restrict__ m, int rows, int cols, float* __restrict__ out)
{
    int const c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int r = 0; r < rows; r++) s = __fadd_rn(s, m[(long long)r * cols + c]);
    out[c] = s;
}

/* One masked Adam step, operation for operation prune._Adam.step in float32:
 *   g = grad * mask; m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g;
 *   p = (p - lr * (m / c1) / (sqrt(v / c2) + eps)) * mask
 * with c1 = 1 - b1^t, c2 = 1 - b2^t computed on the host in double and rounded to float, as
 * numpy rounds Python scalars. mask may be NULL (biases); a masked weight stays exactly 0. */
__global__ void dsz_masked_adam(float* __restrict__ p, float* __restrict__ grad, float* __restrict__ m,
                                float* __restrict__ v, const float* __restrict__ mask, long long n, float lr,
                                float b1, float one_minus_b1, float b2, float one_minus_b2, float c1, float c2,
                                float eps)
{
    long long const stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float g = grad[i];
        if (mask) g = __fmul_rn(g, mask[i]);
        grad[i] = g;
        float const mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(one_minus_b1, g));
        float const vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
        m[i] = mi;
        v[i] = vi;
        float const step = __fdiv_rn(__fmul_rn(lr, __fdiv_rn(mi, c1)), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, c2)), eps));
        float pi = __fsub_rn(p[i], step);
        if (mask) pi = __fmul_rn(pi, mask[i]);
        p[i] = pi;
    }
}

/* a[i] += (p[i] - a[i]) / k: the k-th term of retraining's running mean of the weights, as
 * prune.NumpySteps.average computes it in float32 */
__global__ void dsz_running_mean(float* __restrict__ a, const float* __restrict__ p, long long n, float k)
{
    long long const stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        a[i] = __fadd_rn(a[i], __fdiv_rn(__fsub_rn(p[i], a[i]), k));
}

} /* extern "C" */
