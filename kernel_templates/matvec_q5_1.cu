// matvec_q5_1: decode matvec for Q5_1 weights against Q8_1 activations, with dp4a, in their GGUF
// blocks or (LAYOUT 1) their split planes (traits and units: matvec_q32.cuh; layouts:
// q32_blocks.cuh). Constants, launch and entry points: see matvec_common.cuh (K a multiple of
// 32, LAYOUT, THREADS, ROWS, NCOLS, UNROLL). Entries: matvec_q5_1, matvec_q5_1_add,
// matvec_q5_1_geglu, and with LAYOUT=1 also repack_q5_1.
#include "matvec_q32.cuh"

GJ_Q32_REPACK_ENTRY(repack_q5_1, 7)
GJ_MATVEC_ENTRIES(matvec_q5_1, gj_q32<7>)
