// The block-dot and dequantize kernels of types 0-4, the 32-weight blocks (gemv.h's templates).
#include "gemv.h"

#define CASES(CALL) \
  case 0: return CALL(Q4_0); \
  case 1: return CALL(Q4_1); \
  case 2: return CALL(Q5_0); \
  case 3: return CALL(Q5_1); \
  case 4: return CALL(Q8_0);
TYPE_GROUP(legacy, CASES)
