/* Error codes: size_t returns whose top values are errors, like zstd's. */
#include "common.h"

unsigned dsz_isError(size_t code) { return code > (size_t) - (ptrdiff_t)DSZ_error_maxCode; }

dsz_ErrorCode dsz_getErrorCode(size_t code)
{
    if (!dsz_isError(code)) return DSZ_error_no_error;
    return (dsz_ErrorCode)(0 - code);
}

static const char* error_name(dsz_ErrorCode c)
{
    switch (c) {
    case DSZ_error_no_error: return "No error";
    case DSZ_error_GENERIC: return "DSZ_error_GENERIC";
    case DSZ_error_prefix_unknown: return "DSZ_error_prefix_unknown";
    case DSZ_error_version_unsupported: return "DSZ_error_version_unsupported";
    case DSZ_error_frameParameter_unsupported: return "DSZ_error_frameParameter_unsupported";
    case DSZ_error_corruption_detected: return "DSZ_error_corruption_detected";
    case DSZ_error_parameter_unsupported: return "DSZ_error_parameter_unsupported";
    case DSZ_error_parameter_outOfBound: return "DSZ_error_parameter_outOfBound";
    case DSZ_error_memory_allocation: return "DSZ_error_memory_allocation";
    case DSZ_error_dstSize_tooSmall: return "DSZ_error_dstSize_tooSmall";
    case DSZ_error_srcSize_wrong: return "DSZ_error_srcSize_wrong";
    default: return "DSZ_error_unknown";
    }
}

const char* dsz_getErrorName(size_t code) { return error_name(dsz_getErrorCode(code)); }

const char* dsz_getErrorString(dsz_ErrorCode c)
{
    switch (c) {
    case DSZ_error_no_error: return "no error";
    case DSZ_error_GENERIC: return "error (generic)";
    case DSZ_error_prefix_unknown: return "unknown magic: not a dsz stream";
    case DSZ_error_version_unsupported: return "format version newer than this library";
    case DSZ_error_frameParameter_unsupported: return "unsupported frame parameter";
    case DSZ_error_corruption_detected: return "corrupted data";
    case DSZ_error_parameter_unsupported: return "unsupported parameter";
    case DSZ_error_parameter_outOfBound: return "parameter out of bound";
    case DSZ_error_memory_allocation: return "memory allocation failed";
    case DSZ_error_dstSize_tooSmall: return "destination buffer too small";
    case DSZ_error_srcSize_wrong: return "source size wrong (truncated or trailing bytes)";
    default: return "unknown error code";
    }
}

unsigned dsz_versionNumber(void) { return DSZ_VERSION_NUMBER; }
