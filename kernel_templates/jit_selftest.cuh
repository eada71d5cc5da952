// Helper header of the JIT self-test kernel (proves helper headers are inlined at render time).
#pragma once

__device__ __forceinline__ float gj_selftest_affine(float v) {
    return v * static_cast<float>(SCALE) + static_cast<float>(OFFSET);
}
