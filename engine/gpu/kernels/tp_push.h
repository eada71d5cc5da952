// tp_push family: the spec of kernel_templates/tp_push.cu, a tensor-parallel prefill chunk's
// row-parallel partial product converted to bf16 and stored into this rank's slot of every
// rank's NCCL window, then an LSA barrier per block; the post-norm after it sums the slots
// (rmsnorm_bf16_input_specs with planes = ranks).
//
// Spec name: "tp_push.n<d>.r<ranks>"; entries bf16_push_lsa, lsa_window_pointers.
// Launch: block THREADS (a spec constant), the same grid on every rank, no more blocks than the
// device communicator has LSA barriers nor than run at once on the GPU
// (GpuModel::tp_push_blocks: one per SM by default).
#pragma once

#include <string>

#include "jit/kernel_spec.h"

namespace gj::gemma4 {

// The push of a d-wide product among `ranks` ranks, compiled against the NCCL device headers in
// `nccl_include` (jit/nccl_device.h). Throws std::invalid_argument for ranks outside 2..8, a
// width that is not a positive multiple of 4, or no headers.
jit::KernelSpec tp_push_spec(int d, int ranks, const std::string& nccl_include);

}  // namespace gj::gemma4
