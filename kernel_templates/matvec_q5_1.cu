// matvec_q5_1: decode matvec for Q5_1 weights in their GGUF blocks against Q8_1 activations, with
// dp4a (traits and units: matvec_q32.cuh; block layout: q32_blocks.cuh). Constants, launch and
// entry points: see matvec_common.cuh (K a multiple of 32, LAYOUT 0, THREADS, ROWS, NCOLS,
// UNROLL). Entries: matvec_q5_1, matvec_q5_1_add, matvec_q5_1_geglu.
#include "matvec_q32.cuh"

GJ_MATVEC_ENTRIES(matvec_q5_1, gj_q32<7>)
