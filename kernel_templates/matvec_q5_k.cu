// matvec_q5_k: decode matvec for Q5_K weights in their GGUF super-blocks against Q8_1
// activations, with dp4a (traits and unit layout: matvec_kquant_min.cuh; block layout:
// kquant.cuh). Constants, launch and entry points: see matvec_common.cuh (K a multiple of 256,
// LAYOUT 0, THREADS, ROWS, NCOLS, UNROLL). Entries: matvec_q5_k, matvec_q5_k_add,
// matvec_q5_k_geglu.
#include "matvec_kquant_min.cuh"

GJ_MATVEC_ENTRIES(matvec_q5_k, gj_kq_min<true>)
