// logits family: the spec of kernel_templates/logits.cu, the final softcap fused with the token
// choice (greedy argmax, or the top-k candidates for sampling on the host).
//
// Spec name: "logits.v<vocab>.k<topk>"; entries softcap_argmax, softcap_topk, softcap.
// Launch (from the spec constants): block THREADS; grid ARGMAX_BLOCKS (softcap_argmax),
// TOPK_BLOCKS (softcap_topk), ceil(n / THREADS) (softcap); workspace WORK_BYTES.
#pragma once

#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// Softcap + argmax / top-k over a vocabulary: "logits.v<vocab>.k<topk>"; topk in 1..64.
jit::KernelSpec logits_spec(int vocab, int topk = 64);

}  // namespace gj::gemma4
