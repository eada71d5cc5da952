// attn_prep: everything between the Q/K/V projections and the attention itself, in one launch.
// Per token t at position pos = positions[t]:
//   q head  i: q = RoPE(RMSNorm(q) * q_norm_w)            (in place, fp32)
//   kv head j: K = RoPE(RMSNorm(k_raw) * k_norm_w)        -> k_cache[pos % slots][j]
//              V = RMSNorm_noweight(HAS_V ? v_raw : k_raw) -> v_cache[pos % slots][j]
// On k_eq_v layers (HAS_V = 0) V is taken from the raw K projection, before k_norm and RoPE.
// On KV-shared layers (HAS_KV = 0) only Q is prepared; the layer reads its donor's cache.
// RoPE is NeoX (rotate-half): dims j and j + HEAD_DIM/2 rotate together by
// theta = pos * base^(-2j/HEAD_DIM) for j < ROPE_PAIRS; the other pairs pass through
// (proportional RoPE of the global layers rotates 64 of 256 pairs).
//
// Constants (prologue #defines):
//   HEAD_DIM    row width; a multiple of 8
//   N_HEADS     query heads          N_KV_HEADS  KV heads
//   ROPE_PAIRS  rotated pairs, 0 .. HEAD_DIM/2
//   HAS_KV      0: shared layer (Q only)      HAS_V  0: V from k_raw (k_eq_v)
//   KV_TYPE     cache element type (attn_kv.cuh); q8_0 rows are quantized by their warp, one
//               32-block at a time (amax by shuffles), exactly like ggml's Q8_0 reference
//   WARPS       head rows per block (one warp per row)
// Launch: block 32 * WARPS, grid (ceil(rows / WARPS), max_T) with rows = N_HEADS
// (+ 2 * N_KV_HEADS when HAS_KV); blocks with blockIdx.y >= T exit, so a grid sized for the
// largest batch serves every T (CUDA graphs).
// Entry: attn_prep(q, k_raw, v_raw, q_norm_w, k_norm_w, kv, seqs, positions, T, slots,
//                  rope_base, eps, qkv, qkv_stride). q [T][N_HEADS * HEAD_DIM], k_raw / v_raw
// [T][N_KV_HEADS * HEAD_DIM] (v_raw ignored when HAS_V = 0; both, the norm weight of K and the
// caches ignored when HAS_KV = 0). qkv non-null: the raw rows come from one merged product
// instead, token t's row at qkv + t * qkv_stride holding its Q, K (and V) projections side by
// side (one cuBLAS product over adjacent weight copies); k_raw / v_raw are then ignored and q is
// written, not read. kv: the layer's cache planes of every sequence, [n_seqs][2]
// addresses (K, V); token t appends to sequence seqs[t] (seqs null: sequence 0), so one launch
// serves the tokens of several sequences (batched decode).
//
// Numerics follow the CPU reference forward: the norm scale is 1 / sqrtf(mean(x^2) + eps) in
// fp32; the frequency is the fp32 value of base^(-2j/HEAD_DIM) (computed in double, so it equals
// the correctly rounded powf the CPU gets), the angle is float(pos) * freq in fp32 as HF computes
// it, and sincosf is the accurate one (no fast math).
#include "attn_kv.cuh"
#include "gj_ptx.cuh"

#ifndef HAS_KV
#define HAS_KV 1
#endif
#ifndef HAS_V
#define HAS_V 1
#endif
#ifndef WARPS
#define WARPS 4
#endif

static_assert(HEAD_DIM % 8 == 0, "attn_prep: HEAD_DIM must be a multiple of 8");
static_assert(ROPE_PAIRS >= 0 && ROPE_PAIRS <= HEAD_DIM / 2, "attn_prep: ROPE_PAIRS out of range");
static_assert(N_HEADS > 0 && N_KV_HEADS > 0, "attn_prep: head counts must be positive");

#define HALF_DIM (HEAD_DIM / 2)
#define HALF_VEC (HALF_DIM / 4)                // float4 per half row
#define PAIRS_PER_LANE ((HALF_VEC + 31) / 32)  // float4 pairs (low half, high half) per lane
#define ROWS_PER_TOKEN (N_HEADS + (HAS_KV ? 2 * N_KV_HEADS : 0))

#if KV_Q8
// The warp quantizes a finished row (fp32 in shared memory, written by all lanes) to q8_0, one
// 32-block per step with lane j on element j (attn_kv.cuh has the format).
GJ_DEVICE void store_q8_row(const float* row, int8* payload, f16_bits* scales, int lane) {
    __syncwarp();
#pragma unroll 4
    for (int blk = 0; blk < HEAD_DIM / 32; ++blk) {
        const float x = row[32 * blk + lane];
        const bool bad = __any_sync(GJ_FULL_MASK, !(fabsf(x) <= 3.40282347e38f));  // NaN or inf
        const float amax = warp_max(fabsf(x));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        payload[32 * blk + lane] = (int8)(int32)roundf(x * id);  // round half away from zero
        if (lane == 0) scales[blk] = bad ? (f16_bits)0x7e00 : f32_to_f16(d);
    }
}
#else
// Four consecutive fp32 values -> four KV elements (8 bytes) at dst.
GJ_DEVICE void store_kv4(void* dst, float4 v) {
    *(uint2*)dst = make_uint2(kv_pack2(v.x, v.y), kv_pack2(v.z, v.w));
}
#endif

GJ_DEVICE float4 scale4(float4 v, float s) {
    return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}
GJ_DEVICE float4 mul4(float4 a, float4 b) {
    return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

// Rotates the pair (lo, hi) = (x_j, x_{j + HEAD_DIM/2}) when j < ROPE_PAIRS; rot[j] holds the
// sine and cosine of its angle.
GJ_DEVICE void rope_pair(float& lo, float& hi, int j, const float2* rot) {
    if (j < ROPE_PAIRS) {
        const float s = rot[j].x, c = rot[j].y;
        const float x0 = lo, x1 = hi;
        lo = x0 * c - x1 * s;
        hi = x1 * c + x0 * s;
    }
}

extern "C" __global__ void __launch_bounds__(32 * WARPS)
    attn_prep(float* __restrict__ q, const float* __restrict__ k_raw,
              const float* __restrict__ v_raw, const float* __restrict__ q_norm_w,
              const float* __restrict__ k_norm_w, const unsigned long long* __restrict__ kv,
              const int* __restrict__ seqs, const int* __restrict__ positions, int T, int slots,
              float rope_base, float eps, const float* __restrict__ qkv, int qkv_stride) {
    const int t = blockIdx.y;
    if (t >= T) return;

    // The rotation of each pair depends only on the position (from the step's state copy,
    // before any kernel of the step): made before the grid dependency wait, while the Q/K/V
    // projection still runs, so the double pow and the accurate sincosf are off the step's
    // critical path. Once per block and pair, shared by the block's rows.
    const int pos = positions[t];
    __shared__ float2 rot[ROPE_PAIRS > 0 ? ROPE_PAIRS : 1];  // (sin, cos)
    for (int j = threadIdx.x; j < ROPE_PAIRS; j += 32 * WARPS)
        rot[j] = rope_sin_cos(j, pos, rope_base);
    __syncthreads();

    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= ROWS_PER_TOKEN) return;
    const int lane = threadIdx.x % 32;

    // What this row is: a query head (in place), a K head or a V head (into the cache). Also
    // before the wait: no kernel writes the norm weights, the cache table or the step state.
    const float* src;
    const bool is_q = !HAS_KV || row < N_HEADS;  // else a K or V row, into the cache
    float* q_row = nullptr;                      // where a query row goes
    const float* w = nullptr;
    bool rotate = true;
    char* cache_row = nullptr;
#if KV_Q8
    f16_bits* scale_row = nullptr;
    // The finished row, so that each 32-block can be quantized by the whole warp.
    __shared__ __align__(16) float q8_rows[WARPS][HEAD_DIM];
    float* q8_row = q8_rows[threadIdx.x / 32];
#endif
    if (is_q) {
        q_row = q + ((size_t)t * N_HEADS + row) * HEAD_DIM;
        src = qkv != nullptr ? qkv + (size_t)t * qkv_stride + row * HEAD_DIM : q_row;
        w = q_norm_w;
    } else {
        const bool is_k = row < N_HEADS + N_KV_HEADS;
        const int kvh = is_k ? row - N_HEADS : row - N_HEADS - N_KV_HEADS;
        // The merged rows hold Q, then K, then V (none on k_eq_v layers: V reads K's).
        if (qkv != nullptr)
            src = qkv + (size_t)t * qkv_stride +
                  (N_HEADS + (is_k || !HAS_V ? 0 : N_KV_HEADS) + kvh) * HEAD_DIM;
        else
            src = (is_k || !HAS_V ? k_raw : v_raw) + ((size_t)t * N_KV_HEADS + kvh) * HEAD_DIM;
        w = is_k ? k_norm_w : nullptr;
        rotate = is_k;
        const size_t cache_idx = (size_t)(pos % slots) * N_KV_HEADS + kvh;
        const int seq = seqs != nullptr ? seqs[t] : 0;
        void* plane = (void*)kv[2 * seq + (is_k ? 0 : 1)];
        cache_row = (char*)plane + cache_idx * KV_ROW_BYTES;
#if KV_Q8
        scale_row = (f16_bits*)(kv_scale_plane(plane, slots) + cache_idx * KV_SCALE_ROW_BYTES);
#endif
    }

    float4 w_lo[PAIRS_PER_LANE], w_hi[PAIRS_PER_LANE];  // the norm weight under lo, hi
#pragma unroll
    for (int k = 0; k < PAIRS_PER_LANE; ++k) {
        const int i = k * 32 + lane;
        const bool in_row = HALF_VEC % 32 == 0 || i < HALF_VEC;
        w_lo[k] = w_hi[k] = make_float4(1.f, 1.f, 1.f, 1.f);
        if (w != nullptr && in_row) {
            w_lo[k] = __ldg((const float4*)w + i);
            w_hi[k] = __ldg((const float4*)w + HALF_VEC + i);
        }
    }
    // A bulk L2 prefetch (of the row the Q/K/V projection is storing: harmless) keeps ptxas from
    // scheduling the wait ahead of the weight loads above, as it did without it.
    if (lane == 0) prefetch_l2_range(src, HEAD_DIM * 4);
    gj_grid_sync();

    // Lane holds float4 i of the low half and its RoPE partner, float4 i of the high half.
    const float4* src4 = (const float4*)src;
    float4 lo[PAIRS_PER_LANE], hi[PAIRS_PER_LANE];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < PAIRS_PER_LANE; ++k) {
        const int i = k * 32 + lane;
        const bool in_row = HALF_VEC % 32 == 0 || i < HALF_VEC;
        lo[k] = in_row ? src4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        hi[k] = in_row ? src4[HALF_VEC + i] : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += f4_sum_sq(lo[k]);
        ss += f4_sum_sq(hi[k]);
    }
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss * (1.0f / HEAD_DIM) + eps);

#pragma unroll
    for (int k = 0; k < PAIRS_PER_LANE; ++k) {
        const int i = k * 32 + lane;
        if (!(HALF_VEC % 32 == 0 || i < HALF_VEC)) continue;
        float4 a = scale4(lo[k], scale), b = scale4(hi[k], scale);
        if (w != nullptr) {
            a = mul4(a, w_lo[k]);
            b = mul4(b, w_hi[k]);
        }
        if (rotate) {
            const int j = 4 * i;
            rope_pair(a.x, b.x, j + 0, rot);
            rope_pair(a.y, b.y, j + 1, rot);
            rope_pair(a.z, b.z, j + 2, rot);
            rope_pair(a.w, b.w, j + 3, rot);
        }
        if (is_q) {
            float4* dst = (float4*)q_row;  // in place unless read from the merged rows
            dst[i] = a;
            dst[HALF_VEC + i] = b;
        } else {
#if KV_Q8
            ((float4*)q8_row)[i] = a;
            ((float4*)q8_row)[HALF_VEC + i] = b;
#else
            store_kv4(cache_row + (size_t)i * 8, a);
            store_kv4(cache_row + (size_t)(HALF_VEC + i) * 8, b);
#endif
        }
    }
#if KV_Q8
    if (cache_row != nullptr) store_q8_row(q8_row, (int8*)cache_row, scale_row, lane);
#endif
}
