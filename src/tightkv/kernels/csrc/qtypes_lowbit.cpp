// The block-dot and dequantize kernels of types 10-15, the 4-bit table types and the ternary and 1-2 bit ones (gemv.h's templates).
#include "gemv.h"

#define CASES(CALL) \
  case 10: return CALL(IQ4_NL); \
  case 11: return CALL(IQ4_XS); \
  case 12: return CALL(Q1_0); \
  case 13: return CALL(Q2_0); \
  case 14: return CALL(TQ1_0); \
  case 15: return CALL(TQ2_0);
TYPE_GROUP(lowbit, CASES)
