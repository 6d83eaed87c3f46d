#include "decode_mv.hip"
