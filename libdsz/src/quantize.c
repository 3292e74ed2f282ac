/* Predictor + linear-scaling quantizer. Both sides compute reconstructions with the same
 * double-precision expressions rounded once to float, so the decoder reproduces the
 * encoder's values bit for bit; the encoder checks every value against the bound and
 * stores it verbatim (symbol 0) when the check fails. */
#include <math.h>

#include "common.h"

/* a quantization step beyond this is as good as infinite and keeps q * step finite */
#define STEP_MAX 1e300

void dszi_quant_init(dszi_quant* q, double eb, unsigned radius, int keepNonzero, unsigned dtype)
{
    q->dtype = dtype;
    q->eb = eb;
    q->step = 2.0 * eb > STEP_MAX ? STEP_MAX : 2.0 * eb;
    q->inv = 1.0 / q->step; /* inf when step is tiny: then every value is an outlier, still exact */
    q->radius = radius;
    q->keepNonzero = keepNonzero;
}

DSZI_INLINE float dequant_none(double step, int32_t qi, unsigned dtype)
{
    return dszi_recon((double)qi * step, dtype);
}

float dszi_dequant_none(const dszi_quant* q, uint32_t s)
{
    return dequant_none(q->step, (int32_t)s - (int32_t)q->radius, q->dtype);
}

DSZI_INLINE uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* floor(d + 0.5) for |d| < 2^21 without a libm call */
DSZI_INLINE int32_t round_half_up(double d)
{
    return (int32_t)(d + (0.5 + 4194304.0)) - 4194304;
}

DSZI_INLINE size_t quantize_impl(const dszi_quant* q, unsigned predictor, const float* src, size_t n,
                                uint32_t* sym, uint32_t* outl, uint64_t* hist, int store)
{
    unsigned const dtype = q->dtype;
    double const eb = q->eb, step = q->step, inv = q->inv;
    double const rmax = (double)q->radius - 1.0; /* |q| <= radius - 1 */
    int32_t const R = (int32_t)q->radius;
    int const keepNZ = q->keepNonzero;
    size_t nout = 0, i;
    if (predictor == DSZ_PRED_NONE) {
        for (i = 0; i < n; i++) {
            float const xf = src[i];
            double const x = xf;
            double const d = x * inv;
            uint32_t s = 0;
            if (fabs(d) < rmax) { /* false for NaN */
                int32_t qi = round_half_up(d);
                float r = dequant_none(step, qi, dtype);
                if (keepNZ && r == 0.0f && xf != 0.0f) {
                    qi = x > 0 ? 1 : -1;
                    r = dequant_none(step, qi, dtype);
                }
                if (fabs(x - (double)r) <= eb && !(keepNZ && r == 0.0f && xf != 0.0f)) s = (uint32_t)(qi + R);
            }
            if (s == 0 && store) outl[nout] = bits_of(xf);
            nout += (s == 0);
            if (store) sym[i] = s;
            hist[s]++;
        }
    } else {
        float pred = 0.0f;
        for (i = 0; i < n; i++) {
            float const xf = src[i];
            double const x = xf;
            double const d = (x - (double)pred) * inv;
            uint32_t s = 0;
            float r = xf;
            if (fabs(d) < rmax) {
                int32_t const qi = round_half_up(d);
                float const rq = dszi_dequant_lorenzo(step, pred, qi, dtype);
                if (fabs(x - (double)rq) <= eb && !(keepNZ && rq == 0.0f && xf != 0.0f)) {
                    s = (uint32_t)(qi + R);
                    r = rq;
                }
            }
            if (s == 0 && store) outl[nout] = bits_of(xf);
            nout += (s == 0);
            if (store) sym[i] = s;
            hist[s]++;
            pred = isfinite(r) ? r : 0.0f;
        }
    }
    return nout;
}

size_t dszi_quantize(const dszi_quant* q, unsigned predictor, const float* src, size_t n,
                    uint32_t* sym, uint32_t* outl, uint64_t* hist)
{
    return quantize_impl(q, predictor, src, n, sym, outl, hist, 1);
}

void dszi_quantize_hist(const dszi_quant* q, unsigned predictor, const float* src, size_t n, uint64_t* hist)
{
    (void)quantize_impl(q, predictor, src, n, NULL, NULL, hist, 0);
}
