// matvec_common.cuh: the decode matvec y = W . x with fp32 accumulation. A template supplies the
// weight format as a traits struct: ggml 32-element quant blocks (Q8_0, Q4_0) against Q8_1
// activations (see quantize_q8_1_group8 in gj_ptx.cuh) with dp4a in matvec_q8_0.cu /
// matvec_q4_0.cu (entry points through GJ_MATVEC_ENTRIES), and float weights against fp32
// activations in matvec_f.cu.
//
// Constants (prologue #defines):
//   K        input width (row length in elements); a multiple of 32 (whole quant blocks). In the
//            ggml layout a row of an odd number of blocks makes every other row start 2 bytes
//            past a word boundary, which gj_load_ggml_unit handles like any odd block.
//   LAYOUT   0: ggml blocks exactly as in the GGUF (base 4-byte aligned);
//            1: "split" planes made once at load by the template's repack entry (base 16-byte
//               aligned): all rows' payload bytes [n_rows][payload bytes per row], then all rows'
//               fp16 scales [n_rows][K / 32] (Q4_K, Q5_K, Q6_K: their own planes, kquant.cuh).
//               Every payload load is a coalesced 16-byte vector.
//   THREADS  threads per block (multiple of 32); they split K between them
//   ROWS     output rows per block
//   NCOLS    activation vectors per launch (1 for single-sequence decode); the weights are read
//            once for all of them
//   UNROLL   loop iterations whose loads are issued together (bytes in flight per thread)
//   MULTI    1: also the <name>_multi entry (not where it would spill: batched split K-quants)
//   MULTI_V  1 (Q4_K / Q5_K, NCOLS 1): the module holds only <name>_multi, its third matrix read
//            as Q6_K (matvec_q6_k.cuh) in this spec's launch shape: the Q, K and V of an _M
//            mix's layers that keep V in Q6_K, in one launch
//   PLE_IN   1: also the _norm_in entry (matvec_f: _gelu_mul_norm_in), a PLE gate's single-column
//            spec; NORM_TPR: the TPR of the rmsnorm spec of width K, whose sum order it repeats.
//            2: also the _gelu_in entry, a quantized PLE projection's
//   L2_PREFETCH  sixteenths (0..16) of each weight row a single-column (NCOLS 1) block asks L2
//            for, between its first weight loads and its grid dependency wait (sm_90; below)
//   GEGLU_THREADS, GEGLU_ROWS, GEGLU_UNROLL   the _geglu entry's (default: THREADS, ROWS, UNROLL;
//            block GEGLU_THREADS, grid ceil(n_rows / GEGLU_ROWS))
//   PUSH     P > 0: the module holds only <name>_push (below), a tensor-parallel rank's
//            row-parallel decode product stored into all P ranks' windows (NCOLS 1, not MOE)
// Launch: block THREADS, grid ceil(n_rows / ROWS).
//
// Entry points (one signature for all, so the engine launches them the same way):
//   <name>(w, w_up, xq, xds, residual, y, n_rows)
//     w, w_up   weights [n_rows][K] in LAYOUT; w_up only for _geglu
//     xq, xds   Q8_1 activations: int8 [NCOLS][K] and float2 {d, d*sum(q)} [NCOLS][K / 32]
//     residual  only for _add (may alias y)
//     y         fp32 [NCOLS][n_rows]
//   <name>        y = W x
//   <name>_add    y = residual + W x
//   <name>_geglu  y = gelu_tanh(W x) * (W_up x)   (the FFN gate|up pair in one pass)
//   <name>_multi  up to three products of one input in one launch (its own signature, below)
//   <name>_gelu_in, <name>_norm_in  the input made by each block from fp32 vectors (PLE_IN; below)
// With PUSH = P the module holds only
//   <name>_push(w, xq, xds, to, n_rows)   (matvec_f: <name>_push(w, x, to, n_rows))
//     y = W x stored to every to.y[p], p < P: the P ranks' window slots of this rank's partial
//     product (peer addresses over NVLink), which their post-norms add after their LSA barrier
//     (rmsnorm LSA_PUSH)
// With MOE = 1 the module holds the grouped expert forms instead (a MoE layer's routed experts,
// stacked [E][n_rows][K]: in LAYOUT 0 the GGUF tensor as it is, in LAYOUT 1 each expert's matrix
// repacked on its own, so expert e is a whole split matrix at w + e * expert_bytes):
//   <name>_moe(w, w_up, expert_bytes, x, xds, groups, n_groups, slots, in_div, y, n_rows)
//   <name>_moe_geglu(...)                          the same signature
//     block (row block, g) multiplies expert e = groups[g].x (matrix at w + e * expert_bytes;
//     its up half at w_up + e * expert_bytes) by the groups[g].z <= NCOLS columns of that
//     group: column c is slot s = slots[groups[g].y + c], reading activation row s / in_div
//     (the token of an expert slot for gate|up, the slot itself for down) and writing y row s.
//     Blocks with g >= *n_groups exit (the grid is sized for the most groups a batch can form).
//     x: Q8_1 int8 rows (xds their scales) for quantized weights, fp32 rows for matvec_f.
// Each thread handles "units" (a fixed slice of one block, each template says which: e.g. 8
// payload bytes of a GGUF Q8_0 block, one 32-element block of the split layouts) of every row of
// the block, so a warp reads one contiguous stretch of each row per iteration; a warp-shuffle +
// shared-memory reduction ends the block.
#ifndef GJ_MATVEC_COMMON_CUH
#define GJ_MATVEC_COMMON_CUH

#include "gj_ptx.cuh"

#ifndef LAYOUT
#define LAYOUT 0
#endif
#ifndef THREADS
#define THREADS 128
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef NCOLS
#define NCOLS 1
#endif
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef MOE
#define MOE 0
#endif
#ifndef MULTI
#define MULTI 0
#endif
#ifndef PLE_IN
#define PLE_IN 0
#endif
#ifndef NORM_TPR  // with PLE_IN 1: the threads per row of the rmsnorm spec of width K
#define NORM_TPR 32
#endif
#ifndef L2_PREFETCH
#define L2_PREFETCH 0
#endif
#ifndef MULTI_V
#define MULTI_V 0
#endif
#ifndef PUSH
#define PUSH 0
#endif
#ifndef GEGLU_THREADS  // the _geglu entry's own launch shape (default: the spec's)
#define GEGLU_THREADS THREADS
#endif
#ifndef GEGLU_ROWS
#define GEGLU_ROWS ROWS
#endif
#ifndef GEGLU_UNROLL
#define GEGLU_UNROLL UNROLL
#endif

static_assert(K % 32 == 0 && K > 0, "matvec: K must be a positive multiple of 32");
static_assert(LAYOUT == 0 || LAYOUT == 1, "matvec: LAYOUT must be 0 (ggml) or 1 (split)");
static_assert(THREADS % 32 == 0 && THREADS >= 32 && THREADS <= 1024,
              "matvec: THREADS must be a multiple of 32 in [32, 1024]");
static_assert(ROWS >= 1 && ROWS <= 8, "matvec: ROWS must be in [1, 8]");
static_assert(GEGLU_THREADS % 32 == 0 && GEGLU_THREADS >= 32 && GEGLU_THREADS <= 1024 &&
                  GEGLU_ROWS >= 1 && GEGLU_ROWS <= 8 && GEGLU_UNROLL >= 1 && GEGLU_UNROLL <= 16,
              "matvec: the GeGLU shape takes THREADS', ROWS' and UNROLL's ranges");
static_assert(NCOLS >= 1 && NCOLS <= 8, "matvec: NCOLS must be in [1, 8]");
static_assert(UNROLL >= 1 && UNROLL <= 16, "matvec: UNROLL must be in [1, 16]");
static_assert(L2_PREFETCH >= 0 && L2_PREFETCH <= 16, "matvec: L2_PREFETCH must be in [0, 16]");
static_assert(PUSH >= 0 && PUSH <= 8 && (PUSH == 0 || (NCOLS == 1 && !MOE)),
              "matvec: PUSH must be 0..8, and only for a single-column dense spec");

// gj_epi_gelu_mul: y = gelu_tanh(W x) * other, with other (the residual argument) read at
// column c, row r from other[c * other_stride + r] (the PLE gate times the token's PLE input).
// gj_epi_push: y = W x stored to each of the PUSH slots of a gj_push_to (y unused).
enum { gj_epi_store = 0, gj_epi_add = 1, gj_epi_geglu = 2, gj_epi_gelu_mul = 3, gj_epi_push = 4 };

// The PUSH destinations of a _push entry, by value: this rank's slot in every rank's window.
struct gj_push_to {
    float* y[PUSH > 0 ? PUSH : 1];
};

// Weight-format traits (matvec_q8_0.cu, matvec_q4_0.cu define them):
//   kUnits                       units per row (the work items threads split K into)
//   struct Row                   per-row pointers;  row(w, n_rows, r) -> Row
//   struct WFrag, struct XFrag   registers of one unit's weights / activations
//   load_w(Row, u) -> WFrag      issue the unit's weight loads
//   scale(WFrag, lane) -> float  the unit's weight scale (may shuffle: called by the whole warp)
//   load_x(x, xds, c, u) -> XFrag  the unit's activations of column c (x: the activation base
//                                  pointer of the entry, xds its Q8_1 scales or null)
//   dot(WFrag, XFrag) -> float   the unit's contribution before the weight scale
//   prefetch_l2(Row)             ask L2 for the leading L2_PREFETCH sixteenths of each of the
//                                row's planes (gj_prefetch_plane)

// ggml block layout helper: the 8 payload bytes at byte `part8 * 8` of the block at `blk`, and
// the raw fp16 scale bits as seen by the block's part-0 lane (meaningless on the other lanes).
// The payload of every other block starts 2 bytes past a word boundary (34- and 18-byte blocks),
// so a lane reads the two aligned words under its 8 bytes plus the neighbour word on the side
// that needs it, and funnel-shifts. The third word is the tail of the 8 bytes when misaligned, or
// else the word just before the payload, whose upper half is the scale. All three hit the same L1
// lines as the neighbouring lanes' loads, so DRAM sees each weight byte once.
GJ_DEVICE void gj_load_ggml_unit(const uint8* blk, int part8, uint32& q0, uint32& q1,
                                 uint32& dbits) {
    const uint8* s = blk + 2 + 8 * part8;       // first payload byte of the unit
    const uint32 mis = (uint32)(uint64)s & 2u;  // 0 or 2
    const uint32* p = (const uint32*)(s - mis);
    // Loaded unconditionally (branch-free), so a whole batch of units can be in flight at once.
    const uint32 w0 = __ldg(p), w1 = __ldg(p + 1), w2 = __ldg(p + (mis ? 2 : -1));
    q0 = __funnelshift_r(w0, w1, mis * 8);
    q1 = __funnelshift_r(w1, w2, mis * 8);
    dbits = mis ? (w0 & 0xffffu) : (w2 >> 16);
}

// An activation load (the traits' load_x<kS>): through the read-only cache from global memory,
// or (kS) a plain load from the block's own shared-memory copy that an input prologue made (the
// _gelu_in / _norm_in entries below); ld.global.nc must never see a shared address.
template <bool kS, class T>
GJ_DEVICE T gj_ldx(const T* p) {
    if constexpr (kS)
        return *p;
    else
        return __ldg(p);
}

// The Q8_1 activations of the 32-element block u of column c, the unit of the split layouts
// (Q4_0, Q4_K, Q5_K, Q6_K): its 32 int8 values in two 16-byte loads and its {d, d * sum(q)}.
struct gj_x32 {
    int4 lo, hi;  // activations 0..15 and 16..31
    float2 ds;
    template <bool kS = false>
    static GJ_DEVICE gj_x32 load(const void* x, const float2* xds, int c, int u) {
        const int4* x4 = (const int4*)((const int8*)x + (size_t)c * K) + 2 * u;
        return gj_x32{gj_ldx<kS>(x4), gj_ldx<kS>(x4 + 1),
                      gj_ldx<kS>(&xds[(size_t)c * (K / 32) + u])};
    }
};

// The integer dot of a split unit with its 32 activations: 16 nibble bytes in Q4_0's order and a
// fifth-bit word in split Q5_K's order (kquant.cuh: bit t of byte i is element 4t + i's, bit 4 + t
// element 16 + 4t + i's), which is 0 for units of 4-bit values (the additions fold away).
GJ_DEVICE int32 gj_split_unit_dot5(uint4 q, uint32 qh, const gj_x32& x) {
    const uint32 ql[4] = {q.x, q.y, q.z, q.w};
    const int32 lo[4] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w};
    const int32 hi[4] = {x.hi.x, x.hi.y, x.hi.z, x.hi.w};
    int32 s = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        s = dp4a_s8((int32)((ql[t] & 0x0f0f0f0fu) | (((qh >> t) & 0x01010101u) << 4)), lo[t], s);
        s = dp4a_s8((int32)(((ql[t] >> 4) & 0x0f0f0f0fu) | (((qh >> (t + 4)) & 0x01010101u) << 4)),
                    hi[t], s);
    }
    return s;
}

// What a matvec block does right after its grid dependency wait, before its first activation
// load: nothing (the input is in global memory), or an input prologue (below) that makes the
// block's Q8_1 input in shared memory (kShared: the activation loads then read shared memory).
// Its before_wait() runs first, before the wait: the loads of inputs no recent kernel writes.
struct gj_no_prologue {
    enum : bool { kShared = false };
    GJ_DEVICE void before_wait() {}
    GJ_DEVICE void operator()() const {}
};

// Which activation row each of the NCOLS columns reads and which output row it writes.
struct gj_cols_dense {  // column c: row c of x and of y
    GJ_DEVICE int in(int c) const { return c; }
    GJ_DEVICE int out(int c) const { return c; }
    GJ_DEVICE bool live(int) const { return true; }
};
struct gj_cols_gather {  // an expert group's slots (the MOE entries)
    int in_[NCOLS], out_[NCOLS];
    int n;  // live columns; the others repeat the last live one's input and store nothing
    GJ_DEVICE int in(int c) const { return in_[c]; }  // c a compile-time index (unrolled loops)
    GJ_DEVICE int out(int c) const {                  // c may be a run-time index: a select
        int o = out_[0];                              // chain keeps the array in registers
#pragma unroll
        for (int j = 1; j < NCOLS; ++j) o = j == c ? out_[j] : o;
        return o;
    }
    GJ_DEVICE bool live(int c) const {
        return c < n;
    }
};

// The leading L2_PREFETCH sixteenths of one row's plane of `bytes` bytes at p, asked of L2.
GJ_DEVICE void gj_prefetch_plane(const void* p, int bytes) {
    prefetch_l2_range(p, (uint32)bytes * L2_PREFETCH / 16);
}

template <class F, int kEpi, class Cols = gj_cols_dense, int kThreads = THREADS, int kRows = ROWS,
          int kUnroll = UNROLL, class Pro = gj_no_prologue>
GJ_DEVICE void gj_matvec(const uint8* __restrict__ w, const uint8* __restrict__ w_up,
                         const void* __restrict__ x, const float2* __restrict__ xds,
                         const float* residual, float* y, int n_rows, const Cols& cols = Cols(),
                         int block = -1, int other_stride = 0, Pro prologue = Pro(),
                         const gj_push_to& push = gj_push_to()) {
    constexpr int kVr = kEpi == gj_epi_geglu ? 2 * kRows : kRows;  // rows read per block
    constexpr int kUnits = F::kUnits;
    constexpr int kIters = (kUnits + kThreads - 1) / kThreads;
    constexpr int kWarps = kThreads / 32;
    const int lane = threadIdx.x % 32;
    const int row0 = (block < 0 ? (int)blockIdx.x : block) * kRows;

    // Rows past n_rows read the last row (valid memory) and are not written.
    typename F::Row rows[kVr];
#pragma unroll
    for (int v = 0; v < kVr; ++v)
        rows[v] = F::row(v < kRows ? w : w_up, n_rows, min(row0 + v % kRows, n_rows - 1));

    float acc[kVr][NCOLS];
#pragma unroll
    for (int v = 0; v < kVr; ++v)
#pragma unroll
        for (int c = 0; c < NCOLS; ++c) acc[v][c] = 0.0f;

    // Batches of kUnroll iterations: all loads of a batch are issued before any of its math, so
    // each thread keeps kUnroll * kVr units of weights in flight (the kernel is bound by memory
    // latency x bytes in flight). Single-column matvecs (decode) load a batch's weights at the
    // end of the batch before it, and the first batch's before the grid dependency wait:
    // launched as a programmatic dependent, the block streams its first weights while the kernel
    // before it finishes. (Multi-column ones keep the loads together: carrying the next weights
    // across the loop would spill their larger register sets.)
    constexpr int kBatch = kUnroll < kIters ? kUnroll : kIters;
    constexpr bool kEarlyWeights = NCOLS == 1;
    // Lanes past the row end (last iteration only, or a batch overhanging kIters) reread unit 0
    // and add nothing; they still join any warp shuffle in F::scale.
    auto unit = [](int it, bool& live) {
        const int u_raw = it * kThreads + (int)threadIdx.x;
        live = (kUnits % kThreads == 0 && kIters % kBatch == 0) || u_raw < kUnits;
        return live ? u_raw : 0;
    };
    typename F::WFrag wf[kBatch][kVr];
    auto load_weights = [&](int it0) {
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            bool live;
            const int u = unit(it0 + b, live);
#pragma unroll
            for (int v = 0; v < kVr; ++v) wf[b][v] = F::load_w(rows[v], u);
        }
    };
    if (kEarlyWeights) load_weights(0);
#if __CUDA_ARCH__ >= 900
    // Then the block asks L2 for the leading part of each of its rows (GEMMAJIT_MATVEC_PREFETCH).
    // The bulk prefetch is also what keeps the loads above early: without an instruction of the
    // kind between them, ptxas schedules the grid wait (ACQBULK) ahead of them, so the block
    // loaded nothing before the kernel before had finished (docs/PERFORMANCE.md, 2026-11-27).
    if (kEarlyWeights && L2_PREFETCH > 0 && threadIdx.x == 0)
#pragma unroll
        for (int v = 0; v < kVr; ++v) F::prefetch_l2(rows[v]);
#endif
    prologue.before_wait();
    gj_grid_sync();
    prologue();  // with the first weights in flight
#pragma unroll 1
    for (int it0 = 0; it0 < kIters; it0 += kBatch) {
        typename F::XFrag xf[kBatch][NCOLS];
        bool live[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int u = unit(it0 + b, live[b]);
#pragma unroll
            for (int c = 0; c < NCOLS; ++c)
                xf[b][c] = F::template load_x<Pro::kShared>(x, xds, cols.in(c), u);
            if (!kEarlyWeights)
#pragma unroll
                for (int v = 0; v < kVr; ++v) wf[b][v] = F::load_w(rows[v], u);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
#pragma unroll
            for (int v = 0; v < kVr; ++v) {
                const float dw = F::scale(wf[b][v], lane);
#pragma unroll
                for (int c = 0; c < NCOLS; ++c) {
                    const float part = F::dot(wf[b][v], xf[b][c]);
                    acc[v][c] = live[b] ? fmaf(dw, part, acc[v][c]) : acc[v][c];
                }
            }
        if (kEarlyWeights && it0 + kBatch < kIters) load_weights(it0 + kBatch);
    }

    // Block reduction: warp shuffles, then one partial per warp through shared memory.
    __shared__ float partial[kWarps][kVr * NCOLS];
#pragma unroll
    for (int v = 0; v < kVr; ++v)
#pragma unroll
        for (int c = 0; c < NCOLS; ++c) {
            const float s = warp_sum<32>(acc[v][c]);
            if (lane == 0) partial[threadIdx.x / 32][v * NCOLS + c] = s;
        }
    __syncthreads();
    if ((int)threadIdx.x >= kRows * NCOLS) return;
    const int r = threadIdx.x / NCOLS, c = threadIdx.x % NCOLS;
    const int row = row0 + r;
    if (row >= n_rows || !cols.live(c)) return;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) s += partial[k][r * NCOLS + c];
    const size_t out = (size_t)cols.out(c) * n_rows + row;
    if (kEpi == gj_epi_add) {
        y[out] = residual[out] + s;
    } else if (kEpi == gj_epi_geglu) {
        float up = 0.0f;
#pragma unroll
        for (int k = 0; k < kWarps; ++k) up += partial[k][(r + kRows) * NCOLS + c];
        y[out] = gelu_tanh(s) * up;
    } else if (kEpi == gj_epi_gelu_mul) {
        y[out] = gelu_tanh(s) * residual[(size_t)cols.out(c) * other_stride + row];
    } else if (kEpi == gj_epi_push) {
#pragma unroll
        for (int p = 0; p < PUSH; ++p) push.y[p][out] = s;
    } else {
        y[out] = s;
    }
}

// The column map of expert group blockIdx.y, and its weights; false: no such group.
GJ_DEVICE bool gj_moe_group(const int4* groups, const int* n_groups, const int* slots, int in_div,
                            gj_cols_gather& cols, int& expert) {
    const int g = blockIdx.y;
    if (g >= __ldg(n_groups)) return false;
    const int4 grp = __ldg(groups + g);  // {expert, first slot, count, 0}
    expert = grp.x;
    cols.n = grp.z;
#pragma unroll
    for (int c = 0; c < NCOLS; ++c) {
        const int s = __ldg(slots + grp.y + min(c, grp.z - 1));
        cols.in_[c] = s / in_div;
        cols.out_[c] = s;
    }
    return true;
}

#define GJ_MATVEC_MOE_ENTRY(NAME, F, EPI, XT)                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS)                                         \
        NAME(const void* w, const void* w_up, long long expert_bytes, const XT* x,                \
             const float2* xds, const int4* groups, const int* n_groups, const int* slots,        \
             int in_div, float* y, int n_rows) {                                                  \
        gj_grid_sync(); /* the groups come from moe_group (gj_matvec's wait then passes) */       \
        gj_cols_gather cols;                                                                      \
        int e;                                                                                    \
        if (!gj_moe_group(groups, n_groups, slots, in_div, cols, e)) return;                      \
        gj_matvec<F, EPI>((const uint8*)w + e * expert_bytes,                                     \
                          (const uint8*)w_up + (w_up ? e * expert_bytes : 0), x, xds, nullptr, y, \
                          n_rows, cols);                                                          \
    }

// Defines the three entry points <name>, <name>_add, <name>_geglu for traits F (with MOE = 1
// the two grouped expert entries <name>_moe, <name>_moe_geglu instead).
#define GJ_MATVEC_ENTRY(NAME, F, EPI)                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS)                                     \
        NAME(const void* w, const void* w_up, const int8* xq, const float2* xds,              \
             const float* residual, float* y, int n_rows) {                                   \
        gj_matvec<F, EPI>((const uint8*)w, (const uint8*)w_up, xq, xds, residual, y, n_rows); \
    }
// The GeGLU entry in its own launch shape (GEGLU_THREADS / GEGLU_ROWS / GEGLU_UNROLL).
#define GJ_MATVEC_GEGLU_ENTRY(NAME, F)                                                      \
    extern "C" __global__ void __launch_bounds__(GEGLU_THREADS)                             \
        NAME(const void* w, const void* w_up, const int8* xq, const float2* xds,            \
             const float* residual, float* y, int n_rows) {                                 \
        gj_matvec<F, gj_epi_geglu, gj_cols_dense, GEGLU_THREADS, GEGLU_ROWS, GEGLU_UNROLL>( \
            (const uint8*)w, (const uint8*)w_up, xq, xds, residual, y, n_rows);             \
    }
// <name>_multi(w0, w1, w2, xq, xds, y0, y1, y2, n0, n1, n2): y_i = W_i x for up to three
// matrices of this spec (same K, layout and type) sharing one input, in one launch: the first
// ceil(n0 / ROWS) blocks take W0, the next ceil(n1 / ROWS) W1, the rest W2 (n2 may be 0). A
// layer's Q, K and V projections: one grid deep enough to fill the GPU, one dependent launch.
// FV: the traits of the third matrix (F, or with MULTI_V the Q6_K of an _M mix's V), read in
// this spec's launch shape.
template <class A, class B>
struct gj_same_traits {
    static constexpr bool value = false;
};
template <class A>
struct gj_same_traits<A, A> {
    static constexpr bool value = true;
};
#define GJ_MATVEC_MULTI_ENTRY(NAME, F, FV)                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS)                                       \
        NAME(const void* w0, const void* w1, const void* w2, const int8* xq, const float2* xds, \
             float* y0, float* y1, float* y2, int n0, int n1, int n2) {                         \
        const int b0 = (n0 + ROWS - 1) / ROWS, b1 = (n1 + ROWS - 1) / ROWS;                     \
        int b = blockIdx.x;                                                                     \
        if (!gj_same_traits<F, FV>::value && b >= b0 + b1) {                                    \
            gj_matvec<FV, gj_epi_store>((const uint8*)w2, nullptr, xq, xds, nullptr, y2, n2,    \
                                        gj_cols_dense(), b - b0 - b1);                          \
            return;                                                                             \
        }                                                                                       \
        const void* w = w0;                                                                     \
        float* y = y0;                                                                          \
        int n = n0;                                                                             \
        if (b >= b0 + b1) {                                                                     \
            b -= b0 + b1, w = w2, y = y2, n = n2;                                               \
        } else if (b >= b0) {                                                                   \
            b -= b0, w = w1, y = y1, n = n1;                                                    \
        }                                                                                       \
        gj_matvec<F, gj_epi_store>((const uint8*)w, nullptr, xq, xds, nullptr, y, n,            \
                                   gj_cols_dense(), b);                                         \
    }
// Input prologues of the PLE entries: each block makes the whole Q8_1 input (K values) in its
// shared memory, so the launch that made it in global memory is gone from the decode chain. Both
// run after the grid dependency wait, with the block's first weights in flight. Values of 8
// consecutive lanes form one 32-block (THREADS % 32 == 0, K % 32 == 0): every lane runs the same
// trip count, as quantize_q8_1_group8's shuffles need.
#define GJ_PRO_VEC (K / 4)  // float4 of the input
#define GJ_PRO_ITERS ((GJ_PRO_VEC + THREADS - 1) / THREADS)

// Stores float4 i's Q8_1 form (its 8-lane group's scale by the group's first lane) when live;
// every lane calls it (the group shuffles).
GJ_DEVICE void gj_pro_store_q8(float4 v, bool live, int i, uint32* xq, float2* xds) {
    float2 ds;
    const uint32 packed = quantize_q8_1_group8(v, &ds);
    if (live) {
        xq[i] = packed;
        if (i % 8 == 0) xds[i / 8] = ds;
    }
}

// q8(gelu_tanh(gate) * other): bit-identical to ple.cu's gelu_mul_q8 for one token (other 16-byte
// aligned: a layer's P-slice of the PLE inputs, made at the start of the step, so read before
// the grid dependency wait). All loads after it are issued before any math: the prologue is on
// the step's critical path, so it costs one memory round trip.
struct gj_pro_gelu_mul {
    enum : bool { kShared = true };
    const float* gate;
    const float* other;
    uint32* xq;
    float2* xds;
    float4 o[GJ_PRO_ITERS];
    GJ_DEVICE void before_wait() {
#pragma unroll
        for (int k = 0; k < GJ_PRO_ITERS; ++k) {
            const int i = k * THREADS + (int)threadIdx.x;
            if (GJ_PRO_VEC % THREADS == 0 || i < GJ_PRO_VEC) o[k] = __ldg((const float4*)other + i);
        }
    }
    GJ_DEVICE void operator()() const {
        float4 g[GJ_PRO_ITERS];
#pragma unroll
        for (int k = 0; k < GJ_PRO_ITERS; ++k) {
            const int i = k * THREADS + (int)threadIdx.x;
            if (GJ_PRO_VEC % THREADS == 0 || i < GJ_PRO_VEC) g[k] = __ldg((const float4*)gate + i);
        }
#pragma unroll
        for (int k = 0; k < GJ_PRO_ITERS; ++k) {
            const int i = k * THREADS + (int)threadIdx.x;
            const bool live = GJ_PRO_VEC % THREADS == 0 || i < GJ_PRO_VEC;
            const float4 v = live ? gelu_mul4(g[k], o[k]) : make_float4(0.f, 0.f, 0.f, 0.f);
            gj_pro_store_q8(v, live, i, xq, xds);
        }
        __syncthreads();
    }
};

// x1 = x_in + rmsnorm(u) * w1, quantized (kQ8) or as fp32 (block 0 also stores x1): bit for bit
// what rmsnorm.cu computes with ADD = 1 for one row of K. Thread t plays the norm kernel's
// thread t (the spec gives the block at least NORM_TPR threads) with that kernel's mapping and
// order: it sums float4 t, t + NORM_TPR, ... in turn, then the butterfly of each warp and the
// warps' partials in order. Each thread loads all its u, x_in and w1 at once, so the prologue
// costs one memory round trip; x_in (the stream, which the kernel right before never writes) and
// w1 are read before the grid dependency wait. Eight consecutive threads hold one 32-block
// (NORM_TPR % 8 == 0), as the Q8_1 store needs.
template <bool kQ8>
struct gj_pro_norm_add {
    enum : bool { kShared = true };
    const float* u;
    const float* w1;
    const float* x_in;
    float* x_out;
    void* xs;     // kQ8: uint32 [K / 4] (int8 values); else float [K]
    float2* xds;  // kQ8: the Q8_1 scales
    float eps;
    static constexpr int kTpr = NORM_TPR, kVpt = (GJ_PRO_VEC + kTpr - 1) / kTpr;
    float4 r[kVpt], g[kVpt];  // x_in and w1, loaded before the wait
    // Whole warps past the norm's threads sit out (NORM_TPR is < 32 or a multiple of 32); lanes
    // past it within a live warp (NORM_TPR < 32) hold zeros.
    static GJ_DEVICE bool norm_thread() { return ((int)threadIdx.x & ~31) < kTpr; }
    static GJ_DEVICE int at(int k, bool& live) {
        const int t = (int)threadIdx.x, i = k * kTpr + t;
        live = t < kTpr && (GJ_PRO_VEC % kTpr == 0 || i < GJ_PRO_VEC);
        return i;
    }
    GJ_DEVICE void before_wait() {
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int k = 0; k < kVpt; ++k) {
            bool live;
            const int i = at(k, live);
            r[k] = live && norm_thread() ? ((const float4*)x_in)[i] : zero;
            g[k] = live && norm_thread() ? __ldg((const float4*)w1 + i) : zero;
        }
    }
    GJ_DEVICE void operator()() const {
        constexpr int kWidth = kTpr < 32 ? kTpr : 32, kParts = kTpr < 32 ? 1 : kTpr / 32;
        static_assert(THREADS >= kTpr, "gj_pro_norm_add: the block plays every norm thread");
        static_assert(kTpr % 8 == 0 && (kTpr < 32 || kTpr % 32 == 0), "NORM_TPR: whole warps");
        __shared__ float partial[kParts];
        const int t = (int)threadIdx.x;
        const bool on = norm_thread();
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        float4 v[kVpt];
#pragma unroll
        for (int k = 0; k < kVpt; ++k) {
            bool live;
            const int i = at(k, live);
            v[k] = live && on ? ((const float4*)u)[i] : zero;
        }
        if (on) {
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < kVpt; ++k) ss += f4_sum_sq(v[k]);
            ss = warp_sum<kWidth>(ss);
            if (t % 32 == 0 && t < kTpr) partial[t / 32] = ss;
        }
        __syncthreads();
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < kParts; ++k) ss += partial[k];
        const float s1 = rsqrt_refined(ss * (1.0f / K) + eps);
#pragma unroll
        for (int k = 0; k < kVpt && on; ++k) {
            bool live;
            const int i = at(k, live);
            float4 o = zero;
            if (live) {
                const float4 x = v[k], w = g[k], q = r[k];
                o = make_float4(__fmul_rn(x.x * s1, w.x) + q.x, __fmul_rn(x.y * s1, w.y) + q.y,
                                __fmul_rn(x.z * s1, w.z) + q.z, __fmul_rn(x.w * s1, w.w) + q.w);
                if (blockIdx.x == 0) ((float4*)x_out)[i] = o;
                if (!kQ8) ((float4*)xs)[i] = o;
            }
            if (kQ8) gj_pro_store_q8(o, live, i, (uint32*)xs, xds);
        }
        __syncthreads();
    }
};

// <name>_gelu_in(w, gate, other, y, n_rows): y = W q8(gelu_tanh(gate) * other), gate and other
//   K floats (a decode step's PLE projection: no gelu_mul_q8 launch before it).
// <name>_norm_in(w, u, w1, x_in, x_out, y, n_rows, eps): x1 = x_in + rmsnorm(u) * w1 (the
//   post-FFW residual update of a decode step), y = W q8(x1) (the PLE gate: no norm launch before
//   it); block 0 stores x1 to x_out, which must not alias x_in (the other blocks still read it).
#define GJ_MATVEC_GELU_IN_ENTRY(NAME, F)                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME##_gelu_in(                  \
        const void* w, const float* gate, const float* other, float* y, int n_rows) {      \
        __shared__ __align__(16) uint32 xq[K / 4];                                         \
        __shared__ float2 xds[K / 32];                                                     \
        gj_matvec<F, gj_epi_store, gj_cols_dense, THREADS, ROWS, UNROLL, gj_pro_gelu_mul>( \
            (const uint8*)w, nullptr, xq, xds, nullptr, y, n_rows, gj_cols_dense(), -1, 0, \
            gj_pro_gelu_mul{gate, other, xq, xds});                                        \
    }
#define GJ_MATVEC_NORM_IN_ENTRY(NAME, F)                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS)                                        \
        NAME##_norm_in(const void* w, const float* u, const float* __restrict__ w1,              \
                       const float* x_in, float* x_out, float* y, int n_rows, float eps) {       \
        __shared__ __align__(16) uint32 xq[K / 4];                                               \
        __shared__ float2 xds[K / 32];                                                           \
        gj_matvec<F, gj_epi_store, gj_cols_dense, THREADS, ROWS, UNROLL, gj_pro_norm_add<true>>( \
            (const uint8*)w, nullptr, xq, xds, nullptr, y, n_rows, gj_cols_dense(), -1, 0,       \
            gj_pro_norm_add<true>{u, w1, x_in, x_out, xq, xds, eps});                            \
    }
static_assert(PLE_IN >= 0 && PLE_IN <= 2, "matvec: PLE_IN must be 0, 1 (gate) or 2 (projection)");
static_assert(PLE_IN == 0 || NCOLS == 1, "matvec: the PLE_IN entries take one column");
#if PLE_IN == 1
#define GJ_MATVEC_PLE_IN_IF(NAME, F) GJ_MATVEC_NORM_IN_ENTRY(NAME, F)
#elif PLE_IN == 2
#define GJ_MATVEC_PLE_IN_IF(NAME, F) GJ_MATVEC_GELU_IN_ENTRY(NAME, F)
#else
#define GJ_MATVEC_PLE_IN_IF(NAME, F)
#endif

// <name>_push (PUSH > 0): the product stored into the ranks' windows; nothing else.
#define GJ_MATVEC_PUSH_ENTRY(NAME, F)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                      \
        NAME(const void* w, const int8* xq, const float2* xds, gj_push_to to, int n_rows) {    \
        gj_matvec<F, gj_epi_push>((const uint8*)w, nullptr, xq, xds, nullptr, nullptr, n_rows, \
                                  gj_cols_dense(), -1, 0, gj_no_prologue(), to);               \
    }

#if PUSH
#define GJ_MATVEC_ENTRIES(NAME, F) GJ_MATVEC_PUSH_ENTRY(NAME##_push, F)
#elif MULTI_V
#define GJ_MATVEC_ENTRIES(NAME, F) GJ_MATVEC_MULTI_ENTRY(NAME##_multi, F, gj_q6_k)
#elif MOE
#define GJ_MATVEC_ENTRIES(NAME, F)                         \
    GJ_MATVEC_MOE_ENTRY(NAME##_moe, F, gj_epi_store, int8) \
    GJ_MATVEC_MOE_ENTRY(NAME##_moe_geglu, F, gj_epi_geglu, int8)
#else
#if MULTI
#define GJ_MATVEC_MULTI_IF(NAME, F) GJ_MATVEC_MULTI_ENTRY(NAME, F, F)
#else
#define GJ_MATVEC_MULTI_IF(NAME, F)
#endif
#define GJ_MATVEC_ENTRIES(NAME, F)             \
    GJ_MATVEC_ENTRY(NAME, F, gj_epi_store)     \
    GJ_MATVEC_ENTRY(NAME##_add, F, gj_epi_add) \
    GJ_MATVEC_GEGLU_ENTRY(NAME##_geglu, F)     \
    GJ_MATVEC_MULTI_IF(NAME##_multi, F)        \
    GJ_MATVEC_PLE_IN_IF(NAME, F)
#endif

#endif  // GJ_MATVEC_COMMON_CUH
