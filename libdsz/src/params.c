/* Encoder parameters: an opaque object set one parameter at a time, each value checked against
 * the bounds dsz_param_getBounds() reports, so that dsz.h freezes no struct layout. */
#include <stdlib.h>

#include "common.h"

dsz_params* dsz_createParams(void)
{
    dsz_params* const p = (dsz_params*)malloc(sizeof(dsz_params));
    if (!p) return NULL;
    p->errorBound = 0;
    p->userBound = 0;
    p->userBoundSet = 0;
    p->mode = DSZ_MODE_ABS;
    p->predictor = DSZ_PRED_AUTO;
    p->radius = DSZ_RADIUS_DEFAULT;
    return p;
}

size_t dsz_freeParams(dsz_params* p)
{
    free(p);
    return 0;
}

dsz_bounds dsz_param_getBounds(dsz_parameter param)
{
    dsz_bounds b;
    b.error = 0;
    b.lowerBound = 0;
    b.upperBound = 0;
    switch (param) {
    case dsz_p_errorBound: /* any positive double: the smallest is 2^-1074 */
        b.lowerBound = DBL_MIN * DBL_EPSILON; b.upperBound = DBL_MAX; break;
    case dsz_p_userBound: b.lowerBound = -DBL_MAX; b.upperBound = DBL_MAX; break;
    case dsz_p_mode: b.lowerBound = DSZ_MODE_ABS; b.upperBound = DSZ_MODE_REL; break;
    case dsz_p_predictor: b.lowerBound = DSZ_PRED_NONE; b.upperBound = DSZ_PRED_AUTO; break;
    case dsz_p_radius: b.lowerBound = 0; b.upperBound = DSZ_RADIUS_MAX; break;
    default: b.error = DSZI_ERROR(parameter_unsupported); break;
    }
    return b;
}

size_t dsz_params_setParameter(dsz_params* p, dsz_parameter param, double value)
{
    dsz_bounds const b = dsz_param_getBounds(param);
    if (!p) return DSZI_ERROR(parameter_unsupported);
    if (dsz_isError(b.error)) return b.error;
    /* the enumerations: a value that names no mode or predictor is unsupported, as in a frame */
    if (param == dsz_p_mode) {
        if (value != DSZ_MODE_ABS && value != DSZ_MODE_REL) return DSZI_ERROR(parameter_unsupported);
        p->mode = (unsigned)value;
        return 0;
    }
    if (param == dsz_p_predictor) {
        if (value != DSZ_PRED_NONE && value != DSZ_PRED_LORENZO && value != DSZ_PRED_AUTO)
            return DSZI_ERROR(parameter_unsupported);
        p->predictor = (unsigned)value;
        return 0;
    }
    if (!(value >= b.lowerBound && value <= b.upperBound)) return DSZI_ERROR(parameter_outOfBound); /* NaN too */
    switch (param) {
    case dsz_p_errorBound:
        p->errorBound = value;
        if (!p->userBoundSet) p->userBound = value;
        break;
    case dsz_p_userBound:
        p->userBound = value;
        p->userBoundSet = 1;
        break;
    default: /* dsz_p_radius, in range: an integer below 2^21 */
        if ((double)(unsigned)value != value) return DSZI_ERROR(parameter_outOfBound);
        p->radius = value == 0 ? DSZ_RADIUS_DEFAULT : (unsigned)value;
        break;
    }
    return 0;
}

size_t dsz_params_getParameter(const dsz_params* p, dsz_parameter param, double* value)
{
    if (!p || !value) return DSZI_ERROR(parameter_unsupported);
    switch (param) {
    case dsz_p_errorBound: *value = p->errorBound; break;
    case dsz_p_userBound: *value = p->userBound; break;
    case dsz_p_mode: *value = p->mode; break;
    case dsz_p_predictor: *value = p->predictor; break;
    case dsz_p_radius: *value = p->radius; break;
    default: return DSZI_ERROR(parameter_unsupported);
    }
    return 0;
}

size_t dszi_checkParams(const dsz_params* p)
{
    if (!p) return DSZI_ERROR(parameter_unsupported);
    if (!(p->errorBound > 0)) return DSZI_ERROR(parameter_outOfBound); /* never set */
    return 0;
}
