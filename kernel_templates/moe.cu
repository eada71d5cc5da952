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
//     many (at most min(T * K, ceil(T * K / cols) + E)). Up to 32 slots (decode): one warp.
//     Else one block: shared-memory counts, then a
//     stable placement of THREADS slots per round (peers within a warp by __match_any_sync,
//     across warps by a per-round table of (THREADS / 32) x E counts: THREADS is at most
//     32 * 8192 / E, see moe_spec).
//     Launch: block THREADS, grid 1.
//   moe_route_group(logits, expert_scale, ids, wts, T, cols, n_groups, groups, slots)
//     both of the above in one launch for T <= 4 and T * K <= 32 (a decode step).
//     Launch: block 128, grid 1.
//   moe_ffn_out(dense [T][D], ed [T * K][D], wts [T][K], w1 [D], w2 [D], y [T][D], T, eps)
//     the FFN output of the layer: y[t] = norm(dense[t]) * w1 + norm(e) * w2 with
//     e = sum_k wts[t][k] * ed[t * K + k] (k ascending), norm(v) = v / sqrt(mean(v^2) + eps):
//     the dense MLP's post_ffw_norm_1, the experts' weighted combine and their post_ffw_norm_2
//     in one pass. Launch: block 256, grid T.
#include "gj_ptx.cuh"

static_assert(E >= 1 && E <= 1024, "moe: E must be in [1, 1024]");
static_assert(K >= 1 && K <= E && K <= 32, "moe: K must be in [1, min(E, 32)]");
static_assert(D % 4 == 0, "moe: D must be a multiple of 4");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "moe: THREADS must be a multiple of 32");

#define EPL ((E + 31) / 32)  // logits per lane

GJ_DEVICE float moe_neg_inf() {
    return __int_as_float(0xff800000);
}

// Routes token t by one warp (see moe_route). Lane 0 writes its ids and weights, and also the ids
// to sid[0..K) when sid is not null.
GJ_DEVICE void route_token(const float* __restrict__ logits, const float* __restrict__ expert_scale,
                           int* __restrict__ ids, float* __restrict__ wts, int t, int* sid) {
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
        if (sid != nullptr) sid[k] = chosen[k];
    }
}

extern "C" __global__ void __launch_bounds__(128)
    moe_route(const float* __restrict__ logits, const float* __restrict__ expert_scale,
              int* __restrict__ ids, float* __restrict__ wts, int T) {
    gj_grid_sync();
    const int t = blockIdx.x * 4 + threadIdx.x / 32;
    if (t >= T) return;
    route_token(logits, expert_scale, ids, wts, t, nullptr);
}

// moe_group for n <= 32 slots, by one warp: lane i holds slot i; its place in the grouped order
// is the count of slots of lower experts plus its earlier peers (the same expert, lower slot).
// `expert`: slot lane's expert (read only on live lanes, lane < n).
GJ_DEVICE void moe_group_warp(int expert, int n, int cols, int* __restrict__ n_groups,
                              int4* __restrict__ groups, int* __restrict__ slots) {
    const int lane = threadIdx.x % 32;
    const bool live = lane < n;
    const int e = live ? expert : 0x7fffffff;  // dead lanes after every expert
    const unsigned peers = __match_any_sync(GJ_FULL_MASK, e);
    const int cnt = __popc(peers), j = __popc(peers & ((1u << lane) - 1u));
    const int my_groups = j == 0 ? (cnt + cols - 1) / cols : 0;  // counted once per expert
    int pos = j, groups_before = 0;
#pragma unroll 4
    for (int l = 0; l < 32; ++l) {
        const int el = __shfl_sync(GJ_FULL_MASK, e, l);
        const int gl = __shfl_sync(GJ_FULL_MASK, my_groups, l);
        if (el < e) ++pos, groups_before += gl;
    }
    if (live) {
        slots[pos] = lane;
        if (j % cols == 0)
            groups[groups_before + j / cols] = make_int4(e, pos, min(cols, cnt - j), 0);
    }
    const int total = warp_sum_i32<32>(live ? my_groups : 0);
    if (lane == 0) *n_groups = total;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    moe_group(const int* __restrict__ ids, int T, int cols, int* __restrict__ n_groups,
              int4* __restrict__ groups, int* __restrict__ slots) {
    gj_grid_sync();
    constexpr int kWarps = THREADS / 32;
    // count: slots per expert, then the slots placed by the current round; base: where expert
    // e's next slot goes; wrank[w][e]: expert e's slots among warp w's 32 of the round, then
    // their exclusive sum over the warps before w.
    __shared__ int count[E], base[E], gfirst[E + 1];
    __shared__ int wrank[kWarps][E];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int n = T * K;
    if (n <= 32) {  // a decode step's few slots: one warp, no shared memory
        if (warp == 0)
            moe_group_warp(lane < n ? __ldg(ids + lane) : 0, n, cols, n_groups, groups, slots);
        return;
    }
    for (int e = threadIdx.x; e < E; e += THREADS) count[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += THREADS) atomicAdd(&count[__ldg(ids + i)], 1);
    __syncthreads();
    if (warp == 0) {  // exclusive prefix sums of the slots and groups per expert
        int s = 0, g = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane;
            const int c = e < E ? count[e] : 0, gc = (c + cols - 1) / cols;
            int cs = c, gs = gc;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const int a = __shfl_up_sync(GJ_FULL_MASK, cs, off);
                const int b = __shfl_up_sync(GJ_FULL_MASK, gs, off);
                if (lane >= off) cs += a, gs += b;
            }
            if (e < E) base[e] = s + cs - c, gfirst[e] = g + gs - gc;
            s += __shfl_sync(GJ_FULL_MASK, cs, 31);
            g += __shfl_sync(GJ_FULL_MASK, gs, 31);
        }
        if (lane == 0) gfirst[E] = g, *n_groups = g;
    }
    __syncthreads();
    // Groups: each expert's list cut into pieces of at most `cols` (count is still per expert).
    for (int e = warp; e < E; e += kWarps)
        for (int g = gfirst[e] + lane; g < gfirst[e + 1]; g += 32) {
            const int j = (g - gfirst[e]) * cols;
            groups[g] = make_int4(e, base[e] + j, min(cols, count[e] - j), 0);
        }
    // Stable placement, THREADS slots per round in order: a slot's place in its expert's list is
    // the expert's base, plus its slots in earlier warps of the round, plus its earlier peers in
    // its own warp (__match_any_sync).
    for (int r0 = 0; r0 < n; r0 += THREADS) {
        for (int j = threadIdx.x; j < kWarps * E; j += THREADS) (&wrank[0][0])[j] = 0;
        __syncthreads();  // (also: the groups above read count before it is reused)
        const int i = r0 + (int)threadIdx.x;
        const bool live = i < n;
        const int e = live ? __ldg(ids + i) : -1;
        const unsigned peers = __match_any_sync(GJ_FULL_MASK, e);
        const int rank = __popc(peers & ((1u << lane) - 1u));
        if (live && rank == 0) wrank[warp][e] = __popc(peers);
        __syncthreads();
        for (int x = threadIdx.x; x < E; x += THREADS) {
            int sum = 0;
            for (int w = 0; w < kWarps; ++w) {
                const int c = wrank[w][x];
                wrank[w][x] = sum;
                sum += c;
            }
            count[x] = sum;
        }
        __syncthreads();
        if (live) slots[base[e] + wrank[warp][e] + rank] = i;
        __syncthreads();
        for (int x = threadIdx.x; x < E; x += THREADS) base[x] += count[x];
    }
}

// moe_route_group: moe_route then moe_group in one launch, for a decode step's few slots (T <= 4,
// T * K <= 32): warp t routes token t, then warp 0 groups the T * K slots from the ids the warps
// left in shared memory. The same ids, weights and groups as the two launches.
extern "C" __global__ void __launch_bounds__(128)
    moe_route_group(const float* __restrict__ logits, const float* __restrict__ expert_scale,
                    int* __restrict__ ids, float* __restrict__ wts, int T, int cols,
                    int* __restrict__ n_groups, int4* __restrict__ groups,
                    int* __restrict__ slots) {
    gj_grid_sync();
    __shared__ int sid[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (T > 4 || T * K > 32) __trap();  // the caller's contract (moe_route + moe_group beyond)
    if (warp < T) route_token(logits, expert_scale, ids, wts, warp, sid + warp * K);
    __syncthreads();
    const int n = T * K;
    if (warp == 0) moe_group_warp(lane < n ? sid[lane] : 0, n, cols, n_groups, groups, slots);
}

#define FFN_OUT_VPT ((D / 4 + 255) / 256)  // float4 per thread of moe_ffn_out

extern "C" __global__ void __launch_bounds__(256)
    moe_ffn_out(const float* __restrict__ dense, const float* __restrict__ ed,
                const float* __restrict__ wts, const float* __restrict__ w1,
                const float* __restrict__ w2, float* __restrict__ y, int T, float eps) {
    gj_grid_sync();
    __shared__ float partial[8][2];
    const int t = blockIdx.x;
    if (t >= T) return;  // (uniform per block)
    const float4* dr = (const float4*)(dense + (size_t)t * D);
    float wk[K];
#pragma unroll
    for (int k = 0; k < K; ++k) wk[k] = __ldg(wts + (size_t)t * K + k);
    float4 a[FFN_OUT_VPT], b[FFN_OUT_VPT];
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int j = 0; j < FFN_OUT_VPT; ++j) {
        const int i = j * 256 + (int)threadIdx.x;
        a[j] = b[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < D / 4) {
            a[j] = dr[i];
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const float4 v = *((const float4*)(ed + ((size_t)t * K + k) * D) + i);
                b[j].x = fmaf(wk[k], v.x, b[j].x);
                b[j].y = fmaf(wk[k], v.y, b[j].y);
                b[j].z = fmaf(wk[k], v.z, b[j].z);
                b[j].w = fmaf(wk[k], v.w, b[j].w);
            }
        }
        sa += f4_sum_sq(a[j]);
        sb += f4_sum_sq(b[j]);
    }
    sa = warp_sum(sa);
    sb = warp_sum(sb);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32][0] = sa, partial[threadIdx.x / 32][1] = sb;
    __syncthreads();
    sa = sb = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) sa += partial[w][0], sb += partial[w][1];
    const float ra = rsqrt_refined(sa * (1.0f / D) + eps),
                rb = rsqrt_refined(sb * (1.0f / D) + eps);
#pragma unroll
    for (int j = 0; j < FFN_OUT_VPT; ++j) {
        const int i = j * 256 + (int)threadIdx.x;
        if (i >= D / 4) continue;
        const float4 g1 = __ldg((const float4*)w1 + i), g2 = __ldg((const float4*)w2 + i);
        float4 o;
        o.x = fmaf(b[j].x * rb, g2.x, a[j].x * ra * g1.x);
        o.y = fmaf(b[j].y * rb, g2.y, a[j].y * ra * g1.y);
        o.z = fmaf(b[j].z * rb, g2.z, a[j].z * ra * g1.z);
        o.w = fmaf(b[j].w * rb, g2.w, a[j].w * ra * g1.w);
        ((float4*)(y + (size_t)t * D))[i] = o;
    }
}
