// The block-dot and dequantize kernels of types 16-24, the grid types and FP4 (gemv.h's templates).
#include "gemv.h"

#define CASES(CALL) \
  case 16: return CALL(IQ2_XXS); \
  case 17: return CALL(IQ2_XS); \
  case 18: return CALL(IQ2_S); \
  case 19: return CALL(IQ3_XXS); \
  case 20: return CALL(IQ3_S); \
  case 21: return CALL(IQ1_S); \
  case 22: return CALL(IQ1_M); \
  case 23: return CALL(MXFP4); \
  case 24: return CALL(NVFP4);
TYPE_GROUP(grids, CASES)
