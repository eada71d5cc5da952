// logits: final-logit softcap (z -> cap * tanh(z / cap), spec section 2.6) fused with the token
// choice, so only a token id (greedy) or a short candidate list (temperature sampling on the host)
// leaves the GPU.
//
// Order: a logit's softcapped value, ties broken by the LOWER vocabulary index. Both are packed
// into one 64-bit candidate (order key of the capped float << 32 | ~index), so every reduction is
// a plain max over distinct integers and the result does not depend on the reduction order. NaN
// orders above everything (a broken forward pass surfaces instead of being skipped); -0 equals
// +0. The capped value uses the accurate tanhf and IEEE division, as the CPU reference does.
//
// Both reductions are two-stage in one launch: each block reduces its slice and publishes a
// partial result in the workspace; the last block to finish (atomic counter) reduces the partials
// in a fixed order and resets the counter to 0, so the workspace is ready for the next launch (and
// graph replay) without a memset.
//
// Constants (prologue #defines):
//   V              logits per row (vocabulary size), a multiple of 4
//   THREADS        threads per block (a multiple of 32, >= TOPK)
//   ARGMAX_BLOCKS  grid of softcap_argmax
//   TOPK           candidates returned by softcap_topk (1..64)
//   TOPK_BLOCKS    grid of softcap_topk
//   WORK_BYTES     workspace size: 16 + 8 * (ARGMAX_BLOCKS + TOPK_BLOCKS * TOPK)
// Launch: block THREADS; grids ARGMAX_BLOCKS (softcap_argmax), TOPK_BLOCKS (softcap_topk),
// ceil(n / THREADS) (softcap).
// Entries (logits: fp32 [V], 16-byte aligned; cap <= 0 disables the cap):
//   softcap_argmax(logits, cap, work, token)   *token = index of the largest capped logit, or -1
//                                              when the maximum is NaN
//   softcap_topk(logits, cap, work, ids, values)  ids[TOPK] / values[TOPK]: the TOPK largest
//                                              capped logits, largest first (ties: lower index)
//   softcap(x, cap, n)                         in place, for callers that want the whole row
// work: WORK_BYTES of device memory, zeroed once before the first launch; launches sharing a
// workspace must not run concurrently.
#include "gj_ptx.cuh"

static_assert(V % 4 == 0 && V > 0, "logits: V must be a positive multiple of 4");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "logits: THREADS must be a multiple of 32");
static_assert(TOPK >= 1 && TOPK <= 64 && TOPK <= THREADS && TOPK <= V,
              "logits: TOPK must be in [1, 64] and at most THREADS and V");
static_assert(WORK_BYTES == 16 + 8 * (ARGMAX_BLOCKS + TOPK_BLOCKS * TOPK),
              "logits: WORK_BYTES does not match the workspace layout");

#define GJ_WARPS (THREADS / 32)

// Workspace: two counters, then the argmax partials, then the top-k partials.
struct gj_logits_work {
    unsigned argmax_done, topk_done, pad[2];
    uint64 argmax[ARGMAX_BLOCKS];
    uint64 topk[TOPK_BLOCKS * TOPK];
};

GJ_DEVICE float gj_softcap(float z, float cap) {
    return cap > 0.0f ? tanhf(z / cap) * cap : z;
}

// Order-preserving map float -> uint32 (larger float, larger key). NaN -> the largest key;
// -0 -> the key of +0. The smallest key a value can get is that of -inf (0x007fffff), so 0 is
// free to mark an empty candidate.
GJ_DEVICE uint32 gj_order_key(float f) {
    if (f != f) return 0xffffffffu;
    const uint32 b = f == 0.0f ? 0u : __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
GJ_DEVICE float gj_key_value(uint32 k) {
    if (k == 0xffffffffu) return __int_as_float(0x7fc00000);
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
GJ_DEVICE uint64 gj_candidate(float capped, int index) {
    return ((uint64)gj_order_key(capped) << 32) | (uint64)(0xffffffffu - (uint32)index);
}
GJ_DEVICE int gj_candidate_index(uint64 c) {
    return (int)(0xffffffffu - (uint32)c);
}

GJ_DEVICE uint64 gj_max_u64(uint64 a, uint64 b) {
    return a > b ? a : b;
}
GJ_DEVICE uint64 gj_shfl_xor_u64(uint64 v, int o) {
    const uint32 lo = __shfl_xor_sync(GJ_FULL_MASK, (uint32)v, o);
    const uint32 hi = __shfl_xor_sync(GJ_FULL_MASK, (uint32)(v >> 32), o);
    return ((uint64)hi << 32) | lo;
}
// Maximum over the block; the result is valid in warp 0. All threads must call it.
GJ_DEVICE uint64 gj_block_max(uint64 v, uint64* scratch /*shared [GJ_WARPS]*/) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = gj_max_u64(v, gj_shfl_xor_u64(v, o));
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < GJ_WARPS ? scratch[threadIdx.x] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = gj_max_u64(v, gj_shfl_xor_u64(v, o));
    }
    return v;
}

// Called by all threads after this block published its partial result (any of its threads may
// have written part of it): true in the block that finished last, which then sees every block's
// partial; the counter is back at 0 for the next launch.
GJ_DEVICE bool gj_last_block(unsigned* counter, unsigned n_blocks) {
    __shared__ bool last;
    __threadfence();  // each thread's partial writes are visible before the block's count
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == n_blocks - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    return last;
}

// The 4 candidates of logits [4 * g, 4 * g + 4).
GJ_DEVICE void gj_load_candidates4(const float* logits, int g, float cap, uint64* c) {
    const float4 z = __ldg((const float4*)logits + g);
    c[0] = gj_candidate(gj_softcap(z.x, cap), 4 * g);
    c[1] = gj_candidate(gj_softcap(z.y, cap), 4 * g + 1);
    c[2] = gj_candidate(gj_softcap(z.z, cap), 4 * g + 2);
    c[3] = gj_candidate(gj_softcap(z.w, cap), 4 * g + 3);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    softcap_argmax(const float* __restrict__ logits, float cap, void* work, int* token) {
    gj_grid_sync();
    __shared__ uint64 scratch[GJ_WARPS];
    gj_logits_work* ws = (gj_logits_work*)work;
    uint64 best = 0;
    for (int g = blockIdx.x * THREADS + threadIdx.x; g < V / 4; g += ARGMAX_BLOCKS * THREADS) {
        uint64 c[4];
        gj_load_candidates4(logits, g, cap, c);
        best = gj_max_u64(gj_max_u64(best, gj_max_u64(c[0], c[1])), gj_max_u64(c[2], c[3]));
    }
    best = gj_block_max(best, scratch);
    if (threadIdx.x == 0) ws->argmax[blockIdx.x] = best;
    if (!gj_last_block(&ws->argmax_done, ARGMAX_BLOCKS)) return;
    best = 0;
    for (int b = threadIdx.x; b < ARGMAX_BLOCKS; b += THREADS)
        best = gj_max_u64(best, __ldcg(&ws->argmax[b]));
    __syncthreads();  // scratch is reused
    best = gj_block_max(best, scratch);
    if (threadIdx.x == 0)
        *token = (uint32)(best >> 32) == 0xffffffffu ? -1 : gj_candidate_index(best);
}

// ------------------------------------------------------------------------------------------------
// Top-k by radix selection over the 64-bit candidates, 8 bits per pass from the top: each pass
// histograms the next digit of the candidates that share the prefix chosen so far and keeps the
// digit in which the TOPK-th largest lies. It ends once that digit's bucket holds exactly the
// candidates still needed (real candidates are distinct, so at the latest after 8 passes), then
// the chosen candidates are gathered and rank-sorted.

#define GJ_TOPK_CHUNK (((V + TOPK_BLOCKS - 1) / TOPK_BLOCKS + 3) / 4 * 4)  // logits per block
#define GJ_TOPK_G4 ((GJ_TOPK_CHUNK / 4 + THREADS - 1) / THREADS)           // float4 per thread
#define GJ_TOPK_MERGE ((TOPK_BLOCKS * TOPK + THREADS - 1) / THREADS)       // partials per thread
#define GJ_TOPK_PER (4 * GJ_TOPK_G4 > GJ_TOPK_MERGE ? 4 * GJ_TOPK_G4 : GJ_TOPK_MERGE)
static_assert(GJ_TOPK_PER <= 32,
              "logits: too many top-k candidates per thread (raise TOPK_BLOCKS)");
static_assert(GJ_TOPK_PER * THREADS >= TOPK, "logits: fewer candidate slots than TOPK");

struct gj_select_smem {
    uint32 hist[256];
    uint64 prefix;  // digits chosen so far (top `bits` bits)
    int bits;
    int remaining;  // candidates still to take from those matching the prefix
    int done;
    int n_hi, n_eq;  // gather counters
    uint64 chosen[TOPK];
    uint64 sorted[TOPK];
};

// Lanes with equal `key` (all 32 lanes must call): the mask of the lanes sharing this lane's key.
GJ_DEVICE uint32 gj_match_any(uint32 key) {
    uint32 mask;
    asm volatile("match.any.sync.b32 %0, %1, 0xffffffff;" : "=r"(mask) : "r"(key));
    return mask;
}

// The TOPK largest of the THREADS * GJ_TOPK_PER candidates held in `e` (0 = empty slot), sorted
// largest first into sm.sorted. All threads must call it.
GJ_DEVICE void gj_select_topk(const uint64 (&e)[GJ_TOPK_PER], gj_select_smem& sm) {
    const int lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        sm.prefix = 0;
        sm.bits = 0;
        sm.remaining = TOPK;
        sm.done = 0;
        sm.n_hi = 0;
        sm.n_eq = 0;
    }
#pragma unroll 1
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += THREADS) sm.hist[i] = 0;
        __syncthreads();  // also publishes the previous pass's prefix
        const uint64 prefix = sm.prefix;
        const int bits = sm.bits;
#pragma unroll
        for (int k = 0; k < GJ_TOPK_PER; ++k) {
            const bool in = bits == 0 || (e[k] >> (64 - bits)) == (prefix >> (64 - bits));
            const uint32 digit = in ? (uint32)(e[k] >> shift) & 255u : 256u;
            // One shared atomic per distinct digit in the warp (logits crowd a few buckets).
            const uint32 peers = gj_match_any(digit);
            if (digit < 256u && lane == __ffs(peers) - 1) atomicAdd(&sm.hist[digit], __popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l scans bins 255 - 8l down to 248 - 8l: a suffix sum from the top across lanes.
            uint32 c[8], local = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) local += c[j] = sm.hist[255 - 8 * lane - j];
            uint32 incl = local;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const uint32 v = __shfl_up_sync(GJ_FULL_MASK, incl, o);
                if (lane >= o) incl += v;
            }
            const uint32 need = (uint32)sm.remaining;
            uint32 above = incl - local;
            if (above < need && need <= incl) {  // exactly one lane
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (above + c[j] >= need) {
                        sm.prefix |= (uint64)(255 - 8 * lane - j) << shift;
                        sm.bits += 8;
                        sm.remaining = (int)(need - above);
                        sm.done = c[j] == need - above;
                        break;
                    }
                    above += c[j];
                }
            }
        }
        __syncthreads();
        if (sm.done) break;
    }
    // Gather: candidates above the prefix are all in; of those equal to it, `remaining` are
    // (all of them when the search ended early; identical empty slots otherwise).
    const uint64 prefix = sm.prefix;
    const int drop = 64 - sm.bits, remaining = sm.remaining;
#pragma unroll
    for (int k = 0; k < GJ_TOPK_PER; ++k) {
        const uint64 top = e[k] >> drop, want = prefix >> drop;
        if (top > want) {
            sm.chosen[atomicAdd(&sm.n_hi, 1)] = e[k];
        } else if (top == want) {
            const int pos = atomicAdd(&sm.n_eq, 1);
            if (pos < remaining) sm.chosen[TOPK - remaining + pos] = e[k];
        }
    }
    __syncthreads();
    if (threadIdx.x < TOPK) {
        const uint64 v = sm.chosen[threadIdx.x];
        int rank = 0;
        for (int j = 0; j < TOPK; ++j) {
            const uint64 o = sm.chosen[j];
            rank += o > v || (o == v && j < (int)threadIdx.x);
        }
        sm.sorted[rank] = v;
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(THREADS)
    softcap_topk(const float* __restrict__ logits, float cap, void* work, int* ids, float* values) {
    gj_grid_sync();
    __shared__ gj_select_smem sm;
    gj_logits_work* ws = (gj_logits_work*)work;
    uint64 e[GJ_TOPK_PER];
    const int base = blockIdx.x * GJ_TOPK_CHUNK;  // first logit of this block's slice
#pragma unroll
    for (int k = 0; k < GJ_TOPK_G4; ++k) {
        const int off = 4 * (k * THREADS + (int)threadIdx.x);
        if (off < GJ_TOPK_CHUNK && base + off < V) {
            gj_load_candidates4(logits, (base + off) / 4, cap, &e[4 * k]);
        } else {
            e[4 * k] = e[4 * k + 1] = e[4 * k + 2] = e[4 * k + 3] = 0;
        }
    }
#pragma unroll
    for (int k = 4 * GJ_TOPK_G4; k < GJ_TOPK_PER; ++k) e[k] = 0;
    gj_select_topk(e, sm);
    if (threadIdx.x < TOPK) ws->topk[blockIdx.x * TOPK + threadIdx.x] = sm.sorted[threadIdx.x];
    if (!gj_last_block(&ws->topk_done, TOPK_BLOCKS)) return;
#pragma unroll
    for (int k = 0; k < GJ_TOPK_PER; ++k) {
        const int i = k * THREADS + (int)threadIdx.x;
        e[k] = i < TOPK_BLOCKS * TOPK ? __ldcg(&ws->topk[i]) : 0;
    }
    gj_select_topk(e, sm);
    if (threadIdx.x < TOPK) {
        const uint64 c = sm.sorted[threadIdx.x];
        ids[threadIdx.x] = gj_candidate_index(c);
        values[threadIdx.x] = gj_key_value((uint32)(c >> 32));
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) softcap(float* x, float cap, int n) {
    gj_grid_sync();
    const int i = blockIdx.x * THREADS + threadIdx.x;
    if (i < n) x[i] = gj_softcap(x[i], cap);
}
