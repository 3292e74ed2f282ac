/* Fuzz target: the value-stream (array) decoders dsz_decompress, dsz_decompressArray and
 * dsz_decompressArrayTyped (float16, int8, uint8 frames) on untrusted bytes. Only frames whose
 * data section is stored raw are decoded: libdsz reads no lossless wrapper itself. Checks: a
 * decode that succeeds returns the header's element count; the whole-frame and the section entry
 * points agree (same error or the same values, bit for bit), and so does the typed one on float32
 * frames; the float32 entry points refuse other dtypes; a destination one value short is exactly
 * DSZ_error_dstSize_tooSmall. */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_common.h"

/* a header passes only if each value has at least one bit, so n <= 8 * size + 7: no cap is
 * needed for memory, this one only keeps single inputs fast */
#define MAX_VALUES (1u << 22)

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    dsz_frameInfo info;
    float *whole, *part;
    size_t n, r1, r2;
    size_t const hs = dsz_getFrameInfo(&info, src, size);
    if (dsz_isError(hs) || info.kind != DSZ_KIND_ARRAY || info.dataLossless != DSZ_LOSSLESS_NONE) return 0;
    if (info.nElements > MAX_VALUES || size - hs < info.dataRawSize) return 0;
    n = (size_t)info.nElements;
    whole = fuzz_floats(n, 0);
    part = fuzz_floats(n, 0);
    if (info.dtype != DSZ_DTYPE_FLOAT32) {
        /* typed output: exactly n values of the dtype, so that ASan sees a write past them */
        size_t const bytes = n * (info.dtype == DSZ_DTYPE_FLOAT16 ? 2 : 1);
        void* const typed = malloc(bytes ? bytes : 1);
        if (!typed) abort();
        FUZZ_CHECK_ERROR(dsz_decompressArray(part, n, &info, src + hs, (size_t)info.dataRawSize),
                         DSZ_error_frameParameter_unsupported);
        r2 = dsz_decompressArrayTyped(typed, n, &info, src + hs, (size_t)info.dataRawSize);
        if (!dsz_isError(r2)) FUZZ_CHECK(r2 == n, "decoded %zu of %zu values", r2, n);
        if (n) FUZZ_CHECK_ERROR(dsz_decompressArrayTyped(typed, n - 1, &info, src + hs, (size_t)info.dataRawSize),
                                DSZ_error_dstSize_tooSmall);
        free(typed);
        free(whole);
        free(part);
        return 0;
    }
    r1 = dsz_decompress(whole, n, src, size);
    /* the data section alone, as the Python layer passes it after unwrapping */
    r2 = dsz_decompressArray(part, n, &info, src + hs, (size_t)info.dataRawSize);
    if (!dsz_isError(r2)) FUZZ_CHECK(r2 == n, "decoded %zu of %zu values", r2, n);
    {
        float* const typed = fuzz_floats(n, 0);
        size_t const r3 = dsz_decompressArrayTyped(typed, n, &info, src + hs, (size_t)info.dataRawSize);
        FUZZ_CHECK(r3 == r2, "typed: %s, float32: %s", dsz_getErrorName(r3), dsz_getErrorName(r2));
        if (!dsz_isError(r3)) FUZZ_CHECK(!memcmp(typed, part, n * sizeof(float)), "typed and float32 decoders differ");
        free(typed);
    }
    if (size - hs == info.dataRawSize) {
        FUZZ_CHECK(r1 == r2, "whole frame: %s, section: %s", dsz_getErrorName(r1), dsz_getErrorName(r2));
        if (!dsz_isError(r1)) FUZZ_CHECK(!memcmp(whole, part, n * sizeof(float)), "the two decoders differ");
    } else {
        FUZZ_CHECK_ERROR(r1, DSZ_error_srcSize_wrong);
    }
    if (n) {
        FUZZ_CHECK_ERROR(dsz_decompressArray(part, n - 1, &info, src + hs, (size_t)info.dataRawSize),
                         DSZ_error_dstSize_tooSmall);
        if (size - hs == info.dataRawSize) FUZZ_CHECK_ERROR(dsz_decompress(whole, n - 1, src, size), DSZ_error_dstSize_tooSmall);
    }
    free(whole);
    free(part);
    return 0;
}
