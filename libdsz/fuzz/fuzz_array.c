/* Fuzz target: the array decoder entry points (dsz_getFrameInfo, dsz_decompress,
 * dsz_decompressArray) on untrusted bytes. Only frames whose data section is stored
 * raw are decoded: libdsz reads no lossless wrapper itself. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "dsz.h"

/* keep each input's output buffer small enough that the fuzzer does not run out of memory */
#define MAX_VALUES (1u << 24)

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    dsz_frameInfo info;
    float* dst;
    size_t const hs = dsz_getFrameInfo(&info, src, size);
    if (dsz_isError(hs) || info.kind != DSZ_KIND_ARRAY || info.dataLossless != DSZ_LOSSLESS_NONE) return 0;
    if (info.nElements > MAX_VALUES) return 0;
    dst = (float*)malloc(((size_t)info.nElements + 1) * sizeof(float));
    if (!dst) return 0;
    (void)dsz_decompress(dst, (size_t)info.nElements, src, size);
    /* the data section alone, as the Python layer passes it after unwrapping */
    if (size - hs >= info.dataRawSize)
        (void)dsz_decompressArray(dst, (size_t)info.nElements, &info, src + hs, (size_t)info.dataRawSize);
    /* a dst one value too small must be refused, never overrun */
    if (info.nElements && size - hs >= info.dataRawSize)
        (void)dsz_decompressArray(dst, (size_t)info.nElements - 1, &info, src + hs, (size_t)info.dataRawSize);
    free(dst);
    return 0;
}
