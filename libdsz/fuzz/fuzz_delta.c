/* Fuzz target: dsz_decodeArrayDelta, which applies a model update's difference to the weights a
 * device holds, on untrusted frames (raw data sections, as the Python layer passes them). Checks:
 * it fails exactly where dsz_decompressArray fails on the same section (float32 frames) and
 * refuses every other dtype; where it succeeds, each value is the base's plus the decoded
 * difference, bit for bit (NaN for NaN); applied in place (dst = base) it gives the same values; a
 * destination one value short is exactly DSZ_error_dstSize_tooSmall. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"

/* as fuzz_array: a header passes only if each value has a bit, this cap keeps inputs fast */
#define MAX_VALUES (1u << 22)

static int same_value(float a, float b)
{
    return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof(float));
}

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    dsz_frameInfo info;
    float *base, *values, *out, *inplace;
    size_t n, i, r_values, r_delta, r_inplace;
    size_t const hs = dsz_getFrameInfo(&info, src, size);
    if (dsz_isError(hs) || info.kind != DSZ_KIND_ARRAY || info.dataLossless != DSZ_LOSSLESS_NONE) return 0;
    if (info.nElements > MAX_VALUES || size - hs < info.dataRawSize) return 0;
    n = (size_t)info.nElements;
    base = fuzz_floats(n, 0);
    /* held weights of every sign and scale, with an infinity to meet the difference's own */
    for (i = 0; i < n; i++) base[i] = (float)((double)((i * 2654435761u) % 2001) - 1000.0) * 1e-3f;
    if (n > 1) base[1] = INFINITY;
    out = fuzz_floats(n, 0);
    r_delta = dsz_decodeArrayDelta(out, n, base, &info, src + hs, (size_t)info.dataRawSize);
    if (info.dtype != DSZ_DTYPE_FLOAT32) {
        FUZZ_CHECK(dsz_isError(r_delta), "a %u-dtype frame applied as a float32 difference", info.dtype);
        free(base);
        free(out);
        return 0;
    }
    values = fuzz_floats(n, 0);
    r_values = dsz_decompressArray(values, n, &info, src + hs, (size_t)info.dataRawSize);
    FUZZ_CHECK(r_delta == r_values, "delta: %s, values: %s", dsz_getErrorName(r_delta), dsz_getErrorName(r_values));
    inplace = fuzz_floats(n, 0);
    if (n) memcpy(inplace, base, n * sizeof(float));
    r_inplace = dsz_decodeArrayDelta(inplace, n, inplace, &info, src + hs, (size_t)info.dataRawSize);
    FUZZ_CHECK(r_inplace == r_delta, "in place: %s, apart: %s", dsz_getErrorName(r_inplace), dsz_getErrorName(r_delta));
    if (!dsz_isError(r_delta)) {
        for (i = 0; i < n; i++) {
            FUZZ_CHECK(same_value(out[i], base[i] + values[i]), "value %zu: %g, expected %g + %g", i, (double)out[i],
                       (double)base[i], (double)values[i]);
            FUZZ_CHECK(same_value(inplace[i], out[i]), "value %zu in place: %g, apart: %g", i, (double)inplace[i],
                       (double)out[i]);
        }
    }
    if (n) FUZZ_CHECK_ERROR(dsz_decodeArrayDelta(out, n - 1, base, &info, src + hs, (size_t)info.dataRawSize),
                            DSZ_error_dstSize_tooSmall);
    free(base);
    free(values);
    free(out);
    free(inplace);
    return 0;
}
