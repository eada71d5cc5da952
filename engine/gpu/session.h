// The sequences of a loaded GpuModel on the GPU (one for `run`, one per slot for a server): their
// KV caches, the work buffers they share and the launch sequence of the Gemma 4 forward pass
// (reference/gemma4-spec.md section 2).
//
// Decode runs one token of each of B sequences (B = 1 for `run`) as ONE CUDA graph, captured on
// first use for each batch size and readout list and replayed for every later step with no node
// patching: everything that changes per step (token ids, positions, the sequence of each row)
// lives in a small device-side step state written by one async copy before cuGraphLaunch, the
// attention kernels find each row's KV planes through the cache's plane table, and every grid is
// sized for the maximum (attention splits past the live range write neutral partials). A batch
// reads every weight once for all its rows (the batched matvecs, kPrefillCols columns per pass).
// GEMMAJIT_GRAPHS=0 launches the very same kernels eagerly.
//
// Prefill runs one sequence's prompt in chunks of up to prefill_chunk() tokens; each chunk goes
// layer by layer as one batch (tensor-core GEMMs, attention with one query per token). Only the
// chosen token, the top-k candidates or (on request) the logits reach the host.
//
// The implementation lives in engine/gpu/session/: work_layout (buffer sizes and buffers),
// session (construction, position, step state and readout), decode_step (the graph path),
// prefill (chunking), layer_pass (the launch sequence of one forward pass), launches (one
// helper per kernel kind) and profiler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/gpu/gpu_model.h"
#include "engine/gpu/kv_cache.h"

namespace gj::gemma4 {

// What a step hands back to the host.
enum class Readout {
    Logits,  // the whole softcapped row (vocab floats)
    Argmax,  // the greedy token only
    TopK,    // the kMaxTopK best candidates (ids + softcapped logits)
};

// One row of a batched decode step: a token of sequence `seq` at that sequence's next position.
struct BatchToken {
    int seq = 0;
    int32_t token = 0;
    Readout readout = Readout::Argmax;
};

struct StepOutput {
    int32_t token = -1;         // Argmax
    std::vector<int32_t> ids;   // TopK: candidate ids in ascending id order
    std::vector<float> values;  // TopK: their softcapped logits
    std::vector<float> logits;  // Logits: [vocab], softcapped
};

// Device bytes one session's work buffers take (the model's memory plan counts them).
uint64_t session_work_bytes(const GpuModel& model);

// What a launch computes, for the prefill time split.
enum class WorkKind { Gemm, Attention, Other };

// Time of one kernel kind in a profiled step (decode step or prefill).
struct KernelTime {
    std::string label;  // kernel spec and what it computes, e.g. "matvec_q8_0.k2560.split ffn"
    WorkKind kind = WorkKind::Other;
    int launches = 0;
    double microseconds = 0;
    uint64_t weight_bytes = 0;  // weights it read (matvecs, gathers)
    double flops = 0;           // multiply-adds x 2 (matrix products, attention)
};

// What one launch reads and computes (profiling only).
struct LaunchCost {
    uint64_t bytes = 0;  // weights read
    double flops = 0;
    WorkKind kind = WorkKind::Other;
};

class GpuSession {
  public:
    // Allocates the KV caches of the model's kv_geometry().sequences sequences and the work
    // buffers they share.
    explicit GpuSession(GpuModel& model);
    ~GpuSession();
    GpuSession(const GpuSession&) = delete;
    GpuSession& operator=(const GpuSession&) = delete;

    const GpuModel& model() const { return model_; }
    int sequences() const { return int(pos_.size()); }
    // Every call below that takes `seq` throws std::out_of_range for one outside [0, sequences()).
    int position(int seq = 0) const { return pos_.at(size_t(seq)); }
    int context() const;
    // Drops every position of `seq` (its cache is simply overwritten as the sequence refills).
    void reset(int seq = 0);
    // Keeps positions [0, keep) of `seq` and drops the rest. Returns false (and changes nothing)
    // when a sliding layer's ring has already overwritten a key those positions need; then
    // reset() and prefill again.
    bool rewind(int keep, int seq = 0);

    // Runs `tokens` at the next positions of `seq` (chunked); the readout is of the last token.
    // Throws std::invalid_argument for an empty list, a token outside the vocabulary, or a
    // sequence longer than the context. `progress(done, total)` is called after every chunk.
    StepOutput prefill(std::span<const int32_t> tokens, Readout readout,
                       const std::function<void(int, int)>& progress = {}, int seq = 0);
    // Runs one token at the next position of `seq`.
    StepOutput decode(int32_t token, Readout readout, int seq = 0);
    // Runs one token of each of several distinct sequences in one forward pass (every weight read
    // once for the whole batch); returns one output per entry, in order. Throws
    // std::invalid_argument for an empty batch, a sequence named twice or a full sequence (the
    // batch then runs nothing).
    std::vector<StepOutput> decode_batch(std::span<const BatchToken> batch);
    // Runs `tokens` on `seq` and returns the softcapped logits of every one, [T][vocab].
    std::vector<float> prefill_logits(std::span<const int32_t> tokens, int seq = 0);

    // Tensor parallelism behind a front end that only rank 0 runs (the server): rank 0's session
    // hands each call that runs the forward pass or moves a sequence (prefill, prefill_logits,
    // decode, decode_batch, reset, a successful rewind) to `mirror`, encoded, once its arguments
    // have passed their checks and before it runs; the workers' sessions replay() the records in
    // the same order, so every rank joins the same collectives (engine/gpu/session/mirror.cpp).
    using Mirror = std::function<void(std::span<const int32_t> record)>;
    void set_mirror(Mirror mirror) { mirror_ = std::move(mirror); }
    bool mirroring() const { return bool(mirror_); }
    // Runs the calls of the records `next` hands over (their results discarded) until it returns
    // false. Throws std::invalid_argument for a record it cannot decode.
    void replay(const std::function<bool(std::vector<int32_t>& record)>& next);

    // How often each prefill fast path ran (tests assert that the path they compare really ran).
    struct PathCounts {
        uint64_t mmq = 0;                 // int8 tensor-core GEMM launches (mma.sync)
        uint64_t wgmma = 0;               // bf16 warpgroup GEMM launches (sm_90)
        uint64_t blas = 0;                // cuBLAS products
        uint64_t dequant = 0;             // quantized matrices dequantized to F16 for cuBLAS
        uint64_t dequant_ahead = 0;       // ... of them, layers copied on the dequantization stream
        uint64_t blas_beside_copies = 0;  // cuBLAS products leaving SMs to those copies
        uint64_t geglu_f16 = 0;      // cuBLAS GeGLUs written as the f16 input of the down product
        uint64_t norm_f16 = 0;       // norms written as the f16 input of cuBLAS products
        uint64_t attn_f16 = 0;       // prefill attention outputs also written in f16 (the same)
        uint64_t flash_prefill = 0;  // tensor-core prefill attention launches
        uint64_t flash_wgmma = 0;    // ... of them on the warpgroup kernel (sm_90)
        uint64_t moe_grouped = 0;    // grouped expert matvec launches (MoE layers)
        uint64_t moe_gemm = 0;       // grouped expert tensor-core GEMM launches (MoE prefill)
        uint64_t moe_dense_beside = 0;  // MoE dense MLPs beside the router and experts (streams)
        uint64_t moe_route_group = 0;   // MoE routings grouped by the same launch (decode)
        uint64_t attn_q8 = 0;         // attention outputs quantized by flash_combine (no quantize)
        uint64_t qkv_fused = 0;       // Q, K and V decode matvecs as one launch (GEMMAJIT_FUSE_QKV)
        uint64_t qkv_multi_v = 0;     // ... of them, those whose V is read in its own type
        uint64_t qkv_merged = 0;      // Q, K and V prefill products as one cuBLAS product
        uint64_t gate_up_merged = 0;  // FFN gate and up prefill products as one (MERGE_GATE_UP)
        uint64_t ple_gate_fused = 0;  // PLE gates with their GeLU product (GEMMAJIT_FUSE_PLE)
        uint64_t ple_input = 0;       // PLE gates / projections making their own input (PLE_INPUT)
        uint64_t dependent = 0;       // launches as programmatic dependents (GEMMAJIT_PDL, sm_90+)
        uint64_t all_reduce = 0;      // tensor parallelism: NCCL all-reduces of partial products
        uint64_t all_reduce_bf16 = 0;       // ... of them in bf16 (prefill, GEMMAJIT_TP_BF16_ROWS)
        uint64_t all_reduce_symmetric = 0;  // ... in NCCL symmetric memory (GEMMAJIT_TP_SYMMETRIC)
        uint64_t symmetric_barrier = 0;     // ... of them behind a memset (NCCL 2.28-2.30.5)
        uint64_t all_gather = 0;            // ... and all-gathers of the ranks' readouts
        uint64_t norm_bf16_in = 0;          // post-norms reading a bf16 all-reduce sum
        uint64_t product_bf16 = 0;  // bf16 all-reduce inputs that a split-K sum rounded itself
        uint64_t norm_lsa = 0;      // decode post-norms summing the ranks' products themselves, in
                                    // place of an all-reduce (GEMMAJIT_TP_FUSED_NORM)
        uint64_t push = 0;          // ... of them reading products the ranks' matvecs pushed
                                    // into this rank's window (GEMMAJIT_TP_PUSH)
        uint64_t prefill_push = 0;  // prefill chunks' bf16 products pushed into every rank's
                                    // window, in place of an all-reduce (GEMMAJIT_TP_PREFILL_PUSH)
        uint64_t norm_bf16_planes = 0;  // post-norms summing the ranks' pushed bf16 products
        uint64_t launches = 0;          // every kernel launch of the engine's own kernels
    };
    const PathCounts& path_counts() const { return paths_; }
    // Whether a decode step's post-norms sum the ranks' products themselves: the model planned
    // them (GpuModel::tp_fused_norm) and NCCL made this session's device communicator.
    bool tp_fused_norm() const;
    // ... and the row-parallel decode matvecs push their products to every rank's window
    // (GpuModel::tp_push, GEMMAJIT_TP_PUSH): a single-sequence step's.
    bool tp_push() const;
    // ... and a prefill chunk's bf16 products are pushed into every rank's window by tp_push.cu
    // and summed by the post-norms (GpuModel::tp_prefill_push, this session's device
    // communicator and symmetric bf16 window).
    bool tp_prefill_push() const;

    // Decode graphs: whether they are used (GEMMAJIT_GRAPHS), how many were captured (one per
    // batch size and count of rows of each readout kind) and how many times one was launched.
    bool graphs_enabled() const { return graphs_; }
    uint64_t graph_captures() const { return graph_captures_; }
    uint64_t graph_launches() const { return graph_launches_; }

    // Runs one decode step of sequence 0 eagerly with an event pair around every launch and
    // returns the time per kernel kind, slowest first (the step's result is discarded: the
    // position does not advance). Timings include the event overhead (a few microseconds per
    // launch).
    std::vector<KernelTime> profile_decode_step(int32_t token);
    // Runs `tokens` like prefill() on sequence 0 (chunked, at the next positions, which it
    // advances) with an event pair around every launch and returns the time per kernel kind,
    // slowest first.
    std::vector<KernelTime> profile_prefill(std::span<const int32_t> tokens);

  private:
    struct Work;
    struct Graph;
    struct Profiler;

    // The activations a matvec reads: fp32 rows, and (for int8 weights) their Q8_1 form when
    // already made; a quantized matrix with q == 0 quantizes f into the shared Q8_1 buffer first.
    // bf: their bf16 form (the wgmma GEMM's input) when already made, else converted from f.
    // h: their f16 form (the input of F16 cuBLAS products) when already made, else converted
    // from f; an input made only in f16 (the GeGLU written for the down product) has f == 0.
    struct Input {
        CUdeviceptr f = 0, q = 0, ds = 0, bf = 0, h = 0;
    };
    // `in` with its Q8_1 form: quantizes n values of in.f into xq / xds unless made.
    Input with_q8(Input in, int n);
    // `in` with its bf16 form: converts n values of in.f into the shared bf16 buffer unless made.
    Input with_bf16(Input in, int n, const std::string& what);
    // `in` with its f16 form for the F16 cuBLAS products of `m` (and of `also`, unless null):
    // converts n values of in.f into the shared half buffer unless made, or unless none of them
    // is such a product over T rows.
    Input with_f16(Input in, int n, int T, const GpuMatrix& m, const GpuMatrix* also,
                   const std::string& what);
    // Whether m's product over a T-row chunk goes through cuBLAS (float weights; a quantized
    // matrix's F16 copy only where copies_pay(T)), and whether that is an F16 product (F16
    // weights, or such a copy).
    bool blas_for(const GpuMatrix& m, int T) const;
    bool f16_product(const GpuMatrix& m, int T) const;
    // Whether a T-row chunk multiplies quantized matrix m through its F16 copy rather than its
    // GEMM: a copy costs about five reads of the matrix per chunk, so a matrix with a GEMM takes
    // it from GpuModel::copy_min_rows() rows on (one without from the chunk paths' threshold).
    bool copies_pay(const GpuMatrix& m, int T) const {
        return chunk_products(T) && (m.spec_gemm.empty() || T >= model_.copy_min_rows());
    }
    // n fp32 values at x -> f16 / bf16 at out (entry f32_to_f16 / f32_to_bf16); returns out.
    CUdeviceptr convert(CUdeviceptr x, int n, const char* entry, CUdeviceptr out,
                        const std::string& what);

    // Launch sequence pieces over T rows; tokens, positions and sequences come from the step
    // state (prefill: T tokens of sequence seq_ from pos_[seq_]; decode: one token per row).
    void record_forward(int T, bool decode);
    void record_embedding(int T);
    void record_layer(int l, int T);
    // Returns the attention output as the output projection's input: fp32 rows, with their Q8_1
    // form in xq / xds (the split-K decode path, when the projection is int8) or their f16 form
    // in the half buffer (the prefill kernel, when the projection is an F16 cuBLAS product).
    Input record_attention(int l, int T);
    // A MoE layer's FFN (engine/gpu/session/moe_pass.cpp): router, dense MLP, routed experts
    // and their combine; leaves y1 + post_ffw_norm_2(experts) in the moe_y1 buffer, the input of
    // the layer's post_ffw_norm like a dense layer's FFN output.
    void record_moe_ffn(int l, int T);
    // A MoE layer's norms after attention in one launch: x += post_attention_norm(u) (u: `parts`
    // split-K planes), then from the updated x the dense MLP's ffn_norm (h and Q8_1), the
    // router's input (moe_y1) and the experts' pre_ffw_norm_2 (moe_z for float experts, its Q8_1
    // form for int8 ones).
    void moe_post_attention_norms(int l, CUdeviceptr u, int parts, int T);
    // The grouped expert matvec over `m` (GeGLU with its up halves at `up`): slots grouped by
    // moe_group in groups of at most `cols`, activation row slot / in_div, output row slot of
    // width n_rows.
    void experts(const GpuExperts& m, CUdeviceptr up, Input in, int in_div, CUdeviceptr y,
                 int n_rows, int T, int cols, const char* what);
    // The grouped int8 tensor-core GEMM over `m` (spec_gemm; GeGLU with its up halves at `up`,
    // written as Q8_1 rows y / yds, else fp32 rows y): slots grouped by moe_group in groups of the
    // spec's BM, Q8_1 activation row slot / in_div.
    void experts_gemm(const GpuExperts& m, CUdeviceptr up, CUdeviceptr xq, CUdeviceptr xds,
                      int in_div, CUdeviceptr y, CUdeviceptr yds, int T, const char* what);
    // Whether a T-row product takes the chunk paths (tensor-core GEMMs, cuBLAS): prefill chunks
    // wider than kPrefillCols; never a decode step, whose rows are read by the batched matvecs.
    bool chunk_products(int T) const { return T > kPrefillCols && !decoding_; }
    // Multiply-adds x 2 of layer l's attention for the step's rows (profiling).
    double attention_flops(int l, int row0, int T) const;
    // The readouts of rows row0 .. row0 + n - 1 (n = readouts.size()) into result slots 0 .. n-1.
    void record_readout(int row0, std::span<const Readout> readouts);
    void record_all_logits(int T);

    // Kernel launches (the profiler hooks in here).
    void launch(const jit::Kernel& k, jit::LaunchDims grid, jit::LaunchDims block, unsigned smem,
                void** args, const std::string& label, LaunchCost cost = {});
    // Runs `enqueue` (work on stream_), timed as one launch when profiling.
    template <class F>
    void profiled(const std::string& label, LaunchCost cost, F&& enqueue);
    std::vector<KernelTime> collect_profile(const Profiler& prof) const;
    // x' = residual + norm(x) * w [* scale]; then y2 = norm(x') * w2 with its Q8_1 form (the
    // next pre-norm), or without w2 just x' (quantized when `quantize`).
    // With `f16` (a ".h16" spec) the normed output goes to the half buffer in f16 instead of
    // Q8_1, and normed() hands it on as its f16 form.
    // `residual`: where the stream is read from when not the stream buffer (x' goes there).
    void post_norm(const std::string& spec, CUdeviceptr x, CUdeviceptr w, CUdeviceptr scale,
                   CUdeviceptr w2, int T, const char* what, bool f16 = false,
                   CUdeviceptr residual = 0);
    void pre_norm(CUdeviceptr x, CUdeviceptr w, int T, const char* what, bool f16 = false);
    // A post-norm (an rmsnorm_lsa_spec form) whose input is the sum of every rank's product at u
    // in the decode window (w_->tp_sym), added by the norm after an LSA barrier.
    void post_norm_lsa(const std::string& spec, CUdeviceptr u, CUdeviceptr w, CUdeviceptr scale,
                       CUdeviceptr w2, int T, const char* what);
    // The push form of a decode step (T = 1): `which` half's row-parallel product m x pushed to
    // every rank's window by the matvec (push_product), then summed from this rank's own slots
    // by the post-norm `spec` (an rmsnorm_lsa_push_spec form) after the LSA barrier. pushes(T):
    // whether this step's products take it.
    bool pushes(int T) const;
    void push_product(const GpuMatrix& m, Input in, int which, const char* what);
    void post_norm_push(const std::string& spec, int which, CUdeviceptr w, CUdeviceptr scale,
                        CUdeviceptr w2, const char* what);
    // Once per session: the addresses of this rank's push slots in every rank's window (a decode
    // step's, GEMMAJIT_TP_PUSH), and of each half's slots in every rank's bf16 window (a prefill
    // chunk's, GEMMAJIT_TP_PREFILL_PUSH).
    void find_push_targets();
    // out[p]: the address of byte `offset` of `window` on rank p, p < ranks, through the
    // lsa_window_pointers entry of `spec` (this rank's own: its ordinary address).
    void window_pointers(const std::string& spec, const SymmetricBuffer& window, uint64_t offset,
                         CUdeviceptr out[8]);
    // Whether every product of layer l's attention input (Q, K, V) / of a layer's FFN input
    // (gate, up) over T rows is an F16 cuBLAS product: the norm before them then writes f16.
    bool attention_input_f16(int l, int T) const;
    bool ffn_input_f16(const GpuLayer& g, int T) const;
    // y = W x over T columns (y = gelu(W x) * (up x) with `up`).
    // Returns 1, or with `partials_ok` the number of split-K partial planes left in the
    // workspace (product(parts)) instead of y.
    int matvec(const GpuMatrix& m, const GpuMatrix* up, Input in, CUdeviceptr y, int T,
               const char* what, bool partials_ok = false);
    // Whether layer g's Q, K and V products over T rows run as one launch of the `_multi` matvec
    // entry (GEMMAJIT_FUSE_QKV): all three (two without V) are matvecs of one spec, in one
    // column group, or a decode step's of a layer with spec_qkv_multi_v (V in its own type);
    // then matvec_qkv enqueues it, writing q, k_raw and v_raw.
    bool fused_qkv(const GpuLayer& g, const LayerConfig& lc, int T) const;
    void matvec_qkv(const GpuLayer& g, const LayerConfig& lc, Input in, int T);
    // Whether layer g's Q, K and V products over T rows are one cuBLAS product over their
    // adjacent F16 copies made ahead (GpuLayer::qkv_one_product); then blas_qkv enqueues it,
    // writing each token's Q|K|V row into the qkv buffer (attn_prep reads it there).
    bool merged_qkv(const GpuLayer& g, int T) const;
    void blas_qkv(const GpuLayer& g, Input in, int T);
    // Where m's F16 copy made ahead for the current layer (deq_layer_ >= 0) lies.
    CUdeviceptr copy_ahead(const GpuMatrix& m) const;
    // Whether a PLE gate over T rows runs with its GeLU product in one launch (GEMMAJIT_FUSE_PLE):
    // a float gate on the matvecs (the matvec_f _gelu_mul entry); then matvec_gelu_mul writes
    // y = gelu(gate x) * other, column c reading other + c * other_stride.
    bool fused_ple_gate(const GpuMatrix& gate, int T) const;
    void matvec_gelu_mul(const GpuMatrix& m, CUdeviceptr x, CUdeviceptr other, int other_stride,
                         CUdeviceptr y, int T);
    // Whether a decode step's PLE gate or projection m makes its own input in each block
    // through `entry` (GEMMAJIT_PLE_INPUT): a single-column matvec whose spec has it. Then
    // matvec_ple_input enqueues it. _norm_in (quantized gate) and _gelu_mul_norm_in (float gate,
    // y = gelu(W x1) * other): a = the FFN output, b = the post-FFW norm weight, c = the stream,
    // d = where its update x1 goes; _gelu_in (quantized projection): a = the gate, b = the
    // token's PLE input (c, d, other unused).
    bool ple_input(const GpuMatrix& m, const char* entry, int T) const;
    void matvec_ple_input(const GpuMatrix& m, const char* entry, CUdeviceptr a, CUdeviceptr b,
                          CUdeviceptr c, CUdeviceptr d, CUdeviceptr other, CUdeviceptr y);
    bool splits_k(const GpuMatrix& m) const;  // its prefill GEMM writes split-K partial planes
    CUdeviceptr product(int parts) const;     // where a residual product of `parts` planes is
    // Where a row-parallel product (`which`: 0 the output projection, 1 FFN down) of T rows goes
    // for its all-reduce: the symmetric window for a decode step's rows where it exists
    // (GEMMAJIT_TP_SYMMETRIC), else tmp.
    CUdeviceptr row_parallel_out(int T, int which) const;
    // A row-parallel product of T rows into row_parallel_out(T, which), for the all-reduce after
    // it: where it is and its split-K planes (1: summed). When that all-reduce moves bf16
    // (bf16_all_reduce) and the product is a split-K GEMM, its planes are summed straight into
    // bf16 in w_->tp_bf16_ptr() (the family's _reduce_bf16 entry), which all_reduce then sends
    // as it is: one conversion launch less per product.
    struct Product {
        CUdeviceptr ptr = 0;
        int parts = 1;
    };
    Product row_parallel_product(const GpuMatrix& m, Input in, int T, int which, bool bf16_ok,
                                 const char* what);
    // The sum of a split-K GEMM's planes (in gemm_split) into y: fp32, or bf16 (the family's
    // _reduce / _reduce_bf16 entry; every split-K spec of mmq and gemm_wgmma has both).
    void sum_split_k(const GpuMatrix& m, int T, CUdeviceptr y, bool bf16, const char* what);
    // The tensor-core GEMM of a quantized matrix over a prefill chunk (m.spec_gemm: mmq or
    // gemm_wgmma): y = W x (Plain), gelu(W x) * (up x) in fp32 (Geglu), or that GeGLU in the
    // down projection's input form (GegluNext: Q8_1 y + yds for mmq, bf16 y for gemm_wgmma).
    enum class GemmOut { Plain, Geglu, GegluNext };
    int gemm(const GpuMatrix& m, const GpuMatrix* up, Input in, GemmOut out, CUdeviceptr y,
             CUdeviceptr yds, int T, const char* what, bool partials_ok = false);
    // The FFN's gelu(gate x) * (up x); returns it as the down projection's input.
    Input ffn_gate_up(const GpuLayer& g, int T);
    // The matvec of a float or quantized matrix over a prefill chunk through cuBLAS (a quantized
    // one from its F16 copy). With `up` the
    // GeGLU: into y (fp32), or with y_f16 as the f16 input of an F16 down product instead.
    void blas_product(const GpuMatrix& m, const GpuMatrix* up, Input in, CUdeviceptr y, int T,
                      const char* what, CUdeviceptr y_f16 = 0);
    // Enqueues the F16 copy of quantized matrix m into scratch slot `slot` at its offset; returns
    // where it is.
    CUdeviceptr dequantized(const GpuMatrix& m, int slot = 0);
    // Prefill with cuBLAS products of quantized matrices: layer l's F16 copies (of the matrices
    // that take one at chunk length T) are made into slot
    // l % 2 on the dequantization stream while layer l - 1 computes (its GEMMs are compute-bound,
    // the copies memory-bound), once layer l - 2 has released the slot; wait_dequantized(l) makes
    // the compute stream wait for them. Without side streams (GEMMAJIT_STREAMS=0, profiling) both
    // run in order on the compute stream.
    void dequantize_layer(int l, int T);
    void wait_dequantized(int l);
    // The SM-count target of a cuBLAS product of a T-row chunk: the GPU less the SMs left to the
    // copies running beside it (GEMMAJIT_COPY_SMS), or 0 (all SMs) when none run or the cuBLAS
    // library cannot set one.
    int blas_sm_target(int T) const;
    void quantize(CUdeviceptr x, int n_values);  // into the shared Q8_1 buffer (xq, xds)
    void quantize(CUdeviceptr x, int n_values, CUdeviceptr xq, CUdeviceptr xds);
    Input normed(int row = 0) const;  // the h / Q8_1 (or f16) buffers at `row`

    // The step state of T rows: token, position and sequence of each (host copies kept in
    // row_pos_ / row_seq_ for the launch costs).
    void write_step_state(std::span<const int32_t> tokens, std::span<const int> positions,
                          std::span<const int> seqs);
    // Prefill chunk: `tokens` of sequence seq_ at pos_[seq_] onwards.
    void write_chunk_state(std::span<const int32_t> tokens);
    std::vector<StepOutput> read_results(std::span<const Readout> readouts);

    // Tensor parallelism (engine/gpu/session/collectives.cpp; nothing when the model is whole):
    // the sum over the ranks of a row-parallel product's partial output (`floats` values at
    // buf), and the all-gather of every rank's readout results (and, with `logits`, its logits
    // rows) after the readout of n_rows rows. `which`: 0 the attention output's product, 1 FFN
    // down's. The sum is made in place, or, where a prefill chunk's all-reduce moves bf16 and
    // `bf16_ok`, left as bf16 in w_->tp_bf16_ptr() for the post-norm to read: the returned
    // pointer, with `bf16` set (and `planes` 1). Or, where such a chunk's products are pushed
    // (tp_prefill_push), every rank's bf16 product is left in this rank's window for the
    // post-norm to sum: the returned pointer, w_->tp_bf16_slots(which), with `bf16` set and
    // `planes` the ranks. Or, in a decode step whose post-norm has the form that sums the ranks'
    // products itself (`lsa_ok`, and the model and session have it: GpuModel::tp_fused_norm),
    // nothing is launched and `lsa` is set: that norm (post_norm_lsa) must read buf next.
    struct Reduced {
        CUdeviceptr ptr = 0;
        bool bf16 = false;
        bool lsa = false;
        int planes = 1;
        int bf16_in() const { return bf16 ? planes : 0; }  // the post-norm's rmsnorm_spec bf16_in
    };
    Reduced all_reduce(CUdeviceptr buf, uint64_t floats, const char* what, int which, bool bf16_ok,
                       bool lsa_ok = false);
    // Whether a T-row chunk's bf16 products are pushed (tp_prefill_push and bf16_all_reduce).
    bool prefill_pushes(int T, bool bf16_ok) const;
    // Whether the all-reduce of a T-row product moves bf16 (a prefill chunk of at least
    // GEMMAJIT_TP_BF16_ROWS rows under tensor parallelism, and `bf16_ok`).
    bool bf16_all_reduce(int T, bool bf16_ok) const;
    void gather_readouts(int n_rows, bool logits);
    // The readouts merged from the gathered results of every rank: the token with the largest
    // logit of all ranks' candidates, the best kMaxTopK of them, the whole logits row.
    std::vector<StepOutput> merge_readouts(std::span<const Readout> readouts);
    // Every rank's all-prefill-logits rows [T][its vocabulary slice], gathered into `out` as
    // whole rows [T][vocab].
    void gather_all_logits(int T, float* out);
    void check_tokens(std::span<const int32_t> tokens, int seq) const;
    void select(int seq);  // seq_ = seq, after checking it

    // Forks to the side streams (K, V projections) and joins back to the compute stream.
    void fork(int branches);
    void join(int branches);

    // Runs the one call a mirror record encodes (std::invalid_argument: not a valid record).
    void replay_one(const std::vector<int32_t>& record);
    // Hands the call encoded in `record` to the mirror, when one is set.
    void mirror(std::initializer_list<int32_t> head, std::span<const int32_t> tail = {});

    GpuModel& model_;
    const Config& cfg_;
    Mirror mirror_;
    KvCache kv_;
    std::unique_ptr<Work> w_;
    std::vector<std::unique_ptr<Graph>> graphs_list_;
    Profiler* profiler_ = nullptr;
    CUstream stream_ = nullptr;  // where launch() enqueues: the device stream or a side one
    CUstream side_[2] = {};      // K and V projections, concurrent with Q, and a MoE layer's
                                 // dense MLP beside its experts (GEMMAJIT_STREAMS)
    CUevent forked_ = nullptr, joined_[2] = {};
    CUstream deq_stream_ = nullptr;  // F16 copies of the next layer during prefill (lowest
                                     // priority)
    CUevent slot_free_ = nullptr, deq_ready_[2] = {};
    int deq_layer_ = -1;  // the layer whose copies the cuBLAS products read; -1: copy inline
    bool copies_beside_ = false;  // the next layer's copies run on the dequantization stream
                                  // (in order while profiling): products leave them SMs
    bool normed_f16_ = false;     // the half buffer holds the last norm's output (f16 norms)
    std::vector<int> pos_;        // next position of each sequence
    int seq_ = 0;                 // the sequence a prefill chunk runs on
    bool decoding_ = false;       // the forward being recorded is a decode step
    std::vector<int> row_pos_, row_seq_;  // the step's rows (host side)
    bool graphs_ = true;
    bool streams_ = true;
    bool pdl_ = true;        // GEMMAJIT_PDL: kernels launched as programmatic dependents
    bool fuse_qkv_ = true;   // GEMMAJIT_FUSE_QKV
    bool fuse_ple_ = true;   // GEMMAJIT_FUSE_PLE
    bool ple_input_ = true;  // GEMMAJIT_PLE_INPUT
    int tp_bf16_rows_ = 64;  // GEMMAJIT_TP_BF16_ROWS (0: never)
    int copy_sms_ = -1;      // GEMMAJIT_COPY_SMS (-1: by chunk length)
    uint64_t graph_captures_ = 0, graph_launches_ = 0;
    PathCounts paths_;
};

}  // namespace gj::gemma4
