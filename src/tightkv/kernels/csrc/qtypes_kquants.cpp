// The block-dot and dequantize kernels of types 5-9, the K-quants (gemv.h's templates).
#include "gemv.h"

#define CASES(CALL) \
  case 5: return CALL(Q2_K); \
  case 6: return CALL(Q3_K); \
  case 7: return CALL(Q4_K); \
  case 8: return CALL(Q5_K); \
  case 9: return CALL(Q6_K);
TYPE_GROUP(kquants, CASES)
