/* Element types of a frame: float32, float16 (IEEE binary16), int8 and uint8.
 *
 * The quantizer and the entropy coder work on float values whatever the stored type: every
 * float16, int8 and uint8 value is exactly a float. What depends on the type is how a
 * reconstruction is rounded (once, from double, to the stored type), how a verbatim value is
 * stored (2 or 1 bytes instead of 4) and how decoded values are written out. float16 is
 * converted bit by bit, so that no compiler support for _Float16 is needed and NaN payloads,
 * infinities and subnormals survive. */
#include <math.h>

#include "common.h"

#define F16_MAX 65504.0
#define F16_MIN_NORMAL 6.103515625e-05 /* 2^-14 */
#define F16_SUBNORMAL_STEP 5.9604644775390625e-08 /* 2^-24, the spacing of the subnormals */
/* adding and subtracting 1.5 * 2^52 rounds a double of magnitude < 2^51 to an integer,
   nearest even (FLT_EVAL_METHOD 0 is required by common.h) */
#define RNE_MAGIC 6755399441055744.0

unsigned dszi_dtype_size(unsigned dtype)
{
    switch (dtype) {
    case DSZ_DTYPE_FLOAT32: return 4;
    case DSZ_DTYPE_FLOAT16: return 2;
    case DSZ_DTYPE_INT8:
    case DSZ_DTYPE_UINT8: return 1;
    default: return 0;
    }
}

unsigned dszi_dtype_version(unsigned dtype)
{
    return dtype == DSZ_DTYPE_FLOAT32 ? 1u : 2u;
}

int dszi_dtype_bound_ok(unsigned dtype, double eb)
{
    if (!(isfinite(eb) && eb > 0)) return 0;
    if (dtype == DSZ_DTYPE_INT8 || dtype == DSZ_DTYPE_UINT8) {
        /* k steps are coded as the bound k + 1/2: the step 2k + 1 is then an odd integer and
           every reconstruction an integer */
        double const k = eb - 0.5;
        return k >= 0 && k <= 255 && k == floor(k);
    }
    return 1;
}

float dszi_f16_to_f32(uint32_t h)
{
    uint32_t const sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    float f;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        f = (float)m * (float)F16_SUBNORMAL_STEP; /* exact: m < 2^10 */
        return sign ? -f : f;
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

uint32_t dszi_f32_to_f16(float f)
{
    uint32_t u, sign, e, m;
    memcpy(&u, &f, 4);
    sign = (u >> 16) & 0x8000u;
    e = (u >> 23) & 0xffu;
    m = u & 0x7fffffu;
    if (DSZI_LIKELY(e - 113u < 30u)) return sign | ((e - 112u) << 10) | (m >> 13); /* normal: the usual case */
    if (e == 0xff) return sign | 0x7c00u | (m >> 13) | (m && !(m >> 13)); /* a NaN stays a NaN */
    if (e < 103) return sign; /* zero (no float16 value is smaller than 2^-24) */
    return sign | ((0x800000u | m) >> (126u - e));
}

float dszi_f16_round(double r)
{
    double const a = fabs(r);
    double quantum, n, v;
    int e;
    if (!(a <= 65520.0)) return 0.0f; /* rounds to infinity (or NaN): out of range */
    if (a < F16_MIN_NORMAL) {
        quantum = F16_SUBNORMAL_STEP;
    } else {
        (void)frexp(a, &e); /* a = m * 2^e, 0.5 <= m < 1: 11 significant bits below 2^e */
        quantum = ldexp(1.0, e - 11);
    }
    n = (r / quantum + RNE_MAGIC) - RNE_MAGIC;
    v = n * quantum;
    return fabs(v) > F16_MAX ? 0.0f : (float)v;
}

void dszi_dtype_load(float* dst, const void* srcv, unsigned dtype, size_t n)
{
    size_t i;
    if (dtype == DSZ_DTYPE_FLOAT16) {
        const uint8_t* const src = (const uint8_t*)srcv;
        for (i = 0; i < n; i++) dst[i] = dszi_f16_to_f32(dszi_rd16(src + 2 * i));
    } else if (dtype == DSZ_DTYPE_INT8) {
        const int8_t* const src = (const int8_t*)srcv;
        for (i = 0; i < n; i++) dst[i] = (float)src[i];
    } else if (dtype == DSZ_DTYPE_UINT8) {
        const uint8_t* const src = (const uint8_t*)srcv;
        for (i = 0; i < n; i++) dst[i] = (float)src[i];
    } else {
        memcpy(dst, srcv, 4 * n);
    }
}

void dszi_dtype_store(void* dstv, const float* src, unsigned dtype, size_t n)
{
    size_t i;
    if (dtype == DSZ_DTYPE_FLOAT16) {
        uint16_t* const dst = (uint16_t*)dstv;
        for (i = 0; i < n; i++) dst[i] = (uint16_t)dszi_f32_to_f16(src[i]);
    } else if (dtype == DSZ_DTYPE_INT8) {
        int8_t* const dst = (int8_t*)dstv;
        for (i = 0; i < n; i++) dst[i] = (int8_t)src[i];
    } else if (dtype == DSZ_DTYPE_UINT8) {
        uint8_t* const dst = (uint8_t*)dstv;
        for (i = 0; i < n; i++) dst[i] = (uint8_t)src[i];
    } else {
        memcpy(dstv, src, 4 * n);
    }
}

void dszi_dtype_scatter(void* dstv, const size_t* pos, const float* val, size_t m, unsigned dtype)
{
    size_t j;
    if (dtype == DSZ_DTYPE_FLOAT16) {
        uint16_t* const dst = (uint16_t*)dstv;
        for (j = 0; j < m; j++) dst[pos[j]] = (uint16_t)dszi_f32_to_f16(val[j]);
    } else if (dtype == DSZ_DTYPE_INT8) {
        int8_t* const dst = (int8_t*)dstv;
        for (j = 0; j < m; j++) dst[pos[j]] = (int8_t)val[j];
    } else if (dtype == DSZ_DTYPE_UINT8) {
        uint8_t* const dst = (uint8_t*)dstv;
        for (j = 0; j < m; j++) dst[pos[j]] = (uint8_t)val[j];
    } else {
        float* const dst = (float*)dstv;
        for (j = 0; j < m; j++) dst[pos[j]] = val[j];
    }
}

float dszi_outlier_read(const uint8_t* p, unsigned dtype)
{
    uint32_t u;
    float f;
    switch (dtype) {
    case DSZ_DTYPE_FLOAT16: return dszi_f16_to_f32(dszi_rd16(p));
    case DSZ_DTYPE_INT8: return (float)(int8_t)p[0];
    case DSZ_DTYPE_UINT8: return (float)p[0];
    default:
        u = dszi_rd32(p);
        memcpy(&f, &u, 4);
        return f;
    }
}

void dszi_outlier_write(uint8_t* p, uint32_t bits, unsigned dtype)
{
    float x;
    memcpy(&x, &bits, 4);
    switch (dtype) {
    case DSZ_DTYPE_FLOAT16: dszi_wr16(p, dszi_f32_to_f16(x)); break;
    case DSZ_DTYPE_INT8: p[0] = (uint8_t)(int8_t)x; break;
    case DSZ_DTYPE_UINT8: p[0] = (uint8_t)x; break;
    default: dszi_wr32(p, bits);
    }
}
