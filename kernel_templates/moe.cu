// moe: the routing and combining steps of a Gemma 4 MoE layer (26B-A4B) on the GPU, around the
// grouped expert matvecs (matvec_*.moe, see matvec_common.cuh), so a layer's experts run with no
// host round trip and no per-expert launch (reference/gemma4-spec.md section 2.5).
//
// Constants (prologue #defines):
//   E      experts (1..1024)                  K  experts per token (1..min(E, 32))
//   D      model width (a multiple of 4)      THREADS  block size of moe_group (a multiple of 32)
// Entries:
//   moe_route(logits [T][E], expert_scale [E], ids [T][K], wts [T][K], T)
//     one warp per token: p = softmax(logits) in fp32; the K largest p (ties: the lower expert
//     index), renormalized to sum 1 (summed largest first) and times expert_scale[e]; written in
//     ascending expert order (the order the CPU reference sums them in).
//     Launch: block 128, grid ceil(T / 4).
//   moe_group(ids [T][K], T, cols, n_groups, groups [..][4], slots [T * K])
//     the slots s = t * K + k grouped by expert: slots[] lists expert 0's slots in ascending s,
//     then expert 1's, ...; groups[] cuts each expert's list into pieces of at most `cols` slots,
//     {expert, first index into slots[], count, 0}, experts in ascending order; *n_groups is how
//     many (at most min(T * K, ceil(T * K / cols) + E)). One block: warp w takes experts w,
//     w + warps, ... and compacts their slots with ballots, so the order is stable.
//     Launch: block THREADS, grid 1.
//   moe_combine(ed [T * K][D], wts [T][K], y [T][D], T)
//     y[t] = sum_k wts[t][k] * ed[t * K + k], k ascending. Launch: block 256, grid
//     (ceil(D / 4 / 256), T).
#include "gj_ptx.cuh"

static_assert(E >= 1 && E <= 1024, "moe: E must be in [1, 1024]");
static_assert(K >= 1 && K <= E && K <= 32, "moe: K must be in [1, min(E, 32)]");
static_assert(D % 4 == 0, "moe: D must be a multiple of 4");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "moe: THREADS must be a multiple of 32");

#define EPL ((E + 31) / 32)  // logits per lane

GJ_DEVICE float moe_neg_inf() {
    return __int_as_float(0xff800000);
}

extern "C" __global__ void __launch_bounds__(128)
    moe_route(const float* __restrict__ logits, const float* __restrict__ expert_scale,
              int* __restrict__ ids, float* __restrict__ wts, int T) {
    const int t = blockIdx.x * 4 + threadIdx.x / 32;
    if (t >= T) return;
    const int lane = threadIdx.x % 32;
    const float* row = logits + (size_t)t * E;
    float v[EPL];
    float mx = moe_neg_inf();
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        const int e = i * 32 + lane;
        v[i] = e < E ? row[e] : moe_neg_inf();
        mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
        v[i] = i * 32 + lane < E ? expf(v[i] - mx) : -1.0f;  // -1: never chosen
        sum += v[i] > 0.0f ? v[i] : 0.0f;
    }
    sum = warp_sum(sum);
    // K rounds of a warp argmax over (p, lower index first).
    int chosen[K];
    float p[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float best = -2.0f;
        int at = E;
#pragma unroll
        for (int i = 0; i < EPL; ++i)
            if (v[i] > best) best = v[i], at = i * 32 + lane;  // ascending e: first wins a tie
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ob = __shfl_xor_sync(GJ_FULL_MASK, best, off);
            const int oa = __shfl_xor_sync(GJ_FULL_MASK, at, off);
            if (ob > best || (ob == best && oa < at)) best = ob, at = oa;
        }
        chosen[k] = at;
        p[k] = best / sum;
#pragma unroll
        for (int i = 0; i < EPL; ++i)  // (no dynamic index: v stays in registers)
            if (i * 32 + lane == at) v[i] = -1.0f;
    }
    if (lane != 0) return;
    float top = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) top += p[k];
        // Ascending expert order: a bubble-sort network, fully unrolled (registers only).
#pragma unroll
    for (int a = 0; a < K; ++a)
#pragma unroll
        for (int b = 0; b + 1 < K - a; ++b)
            if (chosen[b] > chosen[b + 1]) {
                const int ce = chosen[b];
                chosen[b] = chosen[b + 1], chosen[b + 1] = ce;
                const float cp = p[b];
                p[b] = p[b + 1], p[b + 1] = cp;
            }
#pragma unroll
    for (int k = 0; k < K; ++k) {
        ids[(size_t)t * K + k] = chosen[k];
        wts[(size_t)t * K + k] = p[k] / top * expert_scale[chosen[k]];
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    moe_group(const int* __restrict__ ids, int T, int cols, int* __restrict__ n_groups,
              int4* __restrict__ groups, int* __restrict__ slots) {
    constexpr int kWarps = THREADS / 32;
    __shared__ int count[E], first[E + 1], gfirst[E + 1];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int n = T * K;
    // Pass 1: slots per expert.
    for (int e = warp; e < E; e += kWarps) {
        int c = 0;
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            c += __popc(__ballot_sync(GJ_FULL_MASK, i < n && __ldg(ids + i) == e));
        }
        if (lane == 0) count[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, g = 0;
        for (int e = 0; e < E; ++e) {
            first[e] = s, gfirst[e] = g;
            s += count[e];
            g += (count[e] + cols - 1) / cols;
        }
        first[E] = s, gfirst[E] = g;
        *n_groups = g;
    }
    __syncthreads();
    // Pass 2: each expert's slots in ascending order, and its groups.
    for (int e = warp; e < E; e += kWarps) {
        int at = first[e];
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            const bool mine = i < n && __ldg(ids + i) == e;
            const unsigned m = __ballot_sync(GJ_FULL_MASK, mine);
            if (mine) slots[at + __popc(m & ((1u << lane) - 1u))] = i;
            at += __popc(m);
        }
        for (int g = gfirst[e] + lane; g < gfirst[e + 1]; g += 32) {
            const int j = (g - gfirst[e]) * cols;
            groups[g] = make_int4(e, first[e] + j, min(cols, count[e] - j), 0);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_combine(const float* __restrict__ ed, const float* __restrict__ wts, float* __restrict__ y,
                int T) {
    const int t = blockIdx.y;
    const int i = (blockIdx.x * 256 + threadIdx.x) * 4;
    if (t >= T || i >= D) return;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const float w = wts[(size_t)t * K + k];
        const float4 v = *(const float4*)(ed + ((size_t)t * K + k) * D + i);
        acc.x = fmaf(w, v.x, acc.x);
        acc.y = fmaf(w, v.y, acc.y);
        acc.z = fmaf(w, v.z, acc.z);
        acc.w = fmaf(w, v.w, acc.w);
    }
    *(float4*)(y + (size_t)t * D + i) = acc;
}
