// matvec_q5_0: decode matvec for Q5_0 weights against Q8_1 activations, with dp4a, in their GGUF
// blocks or (LAYOUT 1) their split planes (traits and units: matvec_q32.cuh; layouts:
// q32_blocks.cuh). Constants, launch and entry points: see matvec_common.cuh (K a multiple of
// 32, LAYOUT, THREADS, ROWS, NCOLS, UNROLL). Entries: matvec_q5_0, matvec_q5_0_add,
// matvec_q5_0_geglu, and with LAYOUT=1 also repack_q5_0.
#include "matvec_q32.cuh"

GJ_Q32_REPACK_ENTRY(repack_q5_0, 6)
GJ_MATVEC_ENTRIES(matvec_q5_0, gj_q32<6>)
