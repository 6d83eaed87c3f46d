#include "attn_decode.hip"
