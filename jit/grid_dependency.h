// Which entry points of a compiled module wait on their grid dependency (griddepcontrol.wait, the
// instruction behind gj_grid_wait in kernel_templates/gj_ptx.cuh). Only such an entry may be
// launched as a programmatic dependent of the kernel before it (Kernel::launch): an entry without
// the wait would then run concurrently with the kernel whose output it reads.
#pragma once

#include <string_view>

namespace gj::jit {

// True when the body of `.entry <entry>` in `ptx` contains griddepcontrol.wait. The instruction
// comes from an inlined helper, so it appears in the entry's own body; an entry that reaches it
// only through a called .func is reported false (the safe answer). False when there is no such
// entry.
bool ptx_entry_waits_on_grid(std::string_view ptx, std::string_view entry);

}  // namespace gj::jit
