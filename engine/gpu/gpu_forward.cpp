#include "engine/gpu/gpu_forward.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

#include "engine/gpu/kernels/flash_decode.h"
#include "engine/gpu/kernels/spec_util.h"
#include "engine/gpu/pinned_host.h"
#include "jit/cuda_driver.h"

namespace gj::gemma4 {

namespace {

unsigned ceil_div(uint64_t a, uint64_t b) {
    return unsigned((a + b - 1) / b);
}

int round_up(int v, int m) {
    return (v + m - 1) / m * m;
}

unsigned constant(const jit::KernelSpec& spec, std::string_view name) {
    return unsigned(spec_constant(spec, name));
}

// Step-state layout (int32 words): [0] tokens in this step, [1] position of the first, then
// positions[rows], then token ids[rows].
constexpr int kStateHeader = 4;

// Sizes of one session's buffers, shared by the allocation and the model's memory plan.
struct WorkLayout {
    int rows = 0;  // activation rows: the prefill chunk rounded up to kPrefillCols
    int d = 0, q_max = 0, kv_max = 0, ffn_max = 0, in_max = 0, ple = 0, ple_all = 0, vocab = 0;
    std::vector<int> decode_splits;  // per layer: attention splits of the decode graph
    uint64_t part_o_floats = 0, part_ml_pairs = 0;  // attention partials
    uint64_t logits_work = 0;                       // workspace of the logits kernels
    bool half_acts = false;      // cuBLAS products of f16/bf16 weights: converted activations
    bool bf16_acts = false;      // wgmma GEMMs: bf16 activations (their own buffer: a model may
                                 // mix them with cuBLAS products of f16 weights)
    bool float_gate = false;     // cuBLAS GeGLU: the gate product's own fp32 buffer
    bool gemm_q8_ffn = false;    // int8 GEMM GeGLU: its Q8_1 output, the down projection's input
    bool gemm_bf16_ffn = false;  // wgmma GEMM GeGLU: its bf16 output, the same role
    uint64_t gemm_split_floats = 0;  // split-K GEMM partial planes

    explicit WorkLayout(const GpuModel& m) {
        const Config& c = m.config();
        const KvGeometry& g = m.kv_geometry();
        const int sms = jit::Device::get().sm_count();
        rows = round_up(std::max(1, g.max_chunk), kPrefillCols);
        d = c.d_model;
        ple = c.ple_dim;
        ple_all = c.n_layers * c.ple_dim;
        vocab = c.vocab_size;
        for (int l = 0; l < c.n_layers; ++l) {
            const LayerConfig& lc = c.layers[l];
            q_max = std::max(q_max, c.q_dim(l));
            kv_max = std::max(kv_max, c.kv_dim(l));
            ffn_max = std::max(ffn_max, lc.ffn_dim);
            const jit::KernelSpec& spec = m.kernels().spec(m.layers()[l].flash_spec);
            // Splits of the decode graph (one query that may see the whole context) and of the
            // largest prefill chunk; the partials hold whichever needs more.
            const int dec = flash_decode_splits(spec, g.context, 1, sms);
            const int pre = flash_decode_splits(spec, g.context, rows, sms);
            decode_splits.push_back(dec);
            const uint64_t heads = uint64_t(c.n_heads);
            part_o_floats = std::max({part_o_floats, heads * dec * lc.head_dim,
                                      uint64_t(rows) * heads * pre * lc.head_dim});
            part_ml_pairs = std::max({part_ml_pairs, heads * dec, uint64_t(rows) * heads * pre});
        }
        in_max = std::max({d, q_max, ffn_max, ple});
        logits_work = spec_constant(m.kernels().spec(m.spec_logits()), "WORK_BYTES");
        half_acts = !m.spec_convert().empty();
        for (const GpuMatrix* mat : m.matrices()) bf16_acts = bf16_acts || mat->gemm_bf16;
        float_gate = m.blas_ffn();
        for (const GpuLayer& g : m.layers()) {
            gemm_q8_ffn = gemm_q8_ffn || (!g.gate.spec_gemm.empty() && !g.gate.gemm_bf16);
            gemm_bf16_ffn = gemm_bf16_ffn || g.gate.gemm_bf16;
        }
        for (const GpuMatrix* mat : m.matrices()) {  // the largest split-K partial planes
            if (mat->spec_gemm.empty()) continue;
            const uint64_t s = uint64_t(spec_constant(m.kernels().spec(mat->spec_gemm), "SPLITS"));
            if (s > 1) gemm_split_floats = std::max(gemm_split_floats, s * rows * mat->rows);
        }
    }

    uint64_t bytes() const {
        const uint64_t R = uint64_t(rows);
        const uint64_t floats = 3 * R * d                        // x, h, tmp
                                + 2 * R * q_max                  // q, attn
                                + 2 * R * kv_max                 // k_raw, v_raw
                                + R * ffn_max                    // gate|up product
                                + 3 * R * ple_all + 2 * R * ple  // PLE inputs; gate, product
                                + uint64_t(vocab)                // logits of one row
                                + part_o_floats + 2 * part_ml_pairs +
                                (float_gate ? R * ffn_max : 0) + gemm_split_floats;
        return floats * sizeof(float) + R * in_max + R * (in_max / 32) * 8  // Q8_1 activations
               + (half_acts ? R * in_max * 2 : 0) + (bf16_acts ? R * in_max * 2 : 0) +
               (gemm_q8_ffn ? R * ffn_max + R * (ffn_max / 32) * 8 : 0) +
               (gemm_bf16_ffn ? R * ffn_max * 2 : 0) + (kStateHeader + 2 * R) * 4 + readout_bytes();
    }
    // Argmax token (16 B), top-k ids and values, then the logits kernels' workspace.
    uint64_t readout_bytes() const { return 16 + 2 * kMaxTopK * 4 + logits_work; }
};

}  // namespace

uint64_t session_work_bytes(const GpuModel& model) {
    return WorkLayout(model).bytes();
}

// ---- Buffers --------------------------------------------------------------------------------

struct GpuSession::Work {
    WorkLayout layout;
    jit::DeviceBuffer x, h, tmp, q, attn, kraw, vraw, g, ple_tok, ple_ctx, ple, ple_gate, ple_mul,
        logits, part_o, part_ml, xq, xds, state, readout, all_logits, xhalf, xbf, fgate, gq, gds,
        gbf, gemm_split;
    PinnedHost state_host, result_host;

    explicit Work(const GpuModel& m) : layout(m) {
        const WorkLayout& L = layout;
        const uint64_t R = uint64_t(L.rows);
        // Zeroed: padded rows and never-written partials read as zeros, not NaN garbage.
        auto zeroed = [](uint64_t bytes) {
            jit::DeviceBuffer b(std::max<uint64_t>(bytes, 16));
            b.zero();
            return b;
        };
        x = zeroed(R * L.d * 4);
        h = zeroed(R * L.d * 4);
        tmp = zeroed(R * L.d * 4);
        q = zeroed(R * L.q_max * 4);
        attn = zeroed(R * L.q_max * 4);
        kraw = zeroed(R * L.kv_max * 4);
        vraw = zeroed(R * L.kv_max * 4);
        g = zeroed(R * L.ffn_max * 4);
        ple_tok = zeroed(R * L.ple_all * 4);
        ple_ctx = zeroed(R * L.ple_all * 4);
        ple = zeroed(R * L.ple_all * 4);
        ple_gate = zeroed(R * L.ple * 4);
        ple_mul = zeroed(R * L.ple * 4);
        logits = zeroed(uint64_t(L.vocab) * 4);
        part_o = zeroed(L.part_o_floats * 4);
        part_ml = zeroed(L.part_ml_pairs * 8);
        xq = zeroed(R * L.in_max);
        xds = zeroed(R * (L.in_max / 32) * 8);
        state = zeroed((kStateHeader + 2 * R) * 4);
        readout = zeroed(L.readout_bytes());  // the logits workspace must start zeroed
        if (L.half_acts) xhalf = jit::DeviceBuffer(R * L.in_max * 2);
        if (L.bf16_acts) xbf = jit::DeviceBuffer(R * L.in_max * 2);
        if (L.float_gate) fgate = jit::DeviceBuffer(R * L.ffn_max * 4);
        if (L.gemm_split_floats) gemm_split = jit::DeviceBuffer(L.gemm_split_floats * 4);
        if (L.gemm_q8_ffn) {
            gq = jit::DeviceBuffer(R * L.ffn_max);
            gds = jit::DeviceBuffer(R * (L.ffn_max / 32) * 8);
        }
        if (L.gemm_bf16_ffn) gbf = jit::DeviceBuffer(R * L.ffn_max * 2);
        state_host = PinnedHost((kStateHeader + 2 * R) * 4);
        result_host = PinnedHost(16 + 2 * kMaxTopK * 4);
    }
    CUdeviceptr positions() const { return state.ptr() + kStateHeader * 4; }
    CUdeviceptr tokens() const { return state.ptr() + (kStateHeader + layout.rows) * 4; }
    CUdeviceptr result_token() const { return readout.ptr(); }
    CUdeviceptr result_ids() const { return readout.ptr() + 16; }
    CUdeviceptr result_values() const { return readout.ptr() + 16 + kMaxTopK * 4; }
    CUdeviceptr logits_work() const { return readout.ptr() + 16 + 2 * kMaxTopK * 4; }
};

struct GpuSession::Graph {
    Readout readout;
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    ~Graph() {
        if (exec) jit::driver().cuGraphExecDestroy(exec);
        if (graph) jit::driver().cuGraphDestroy(graph);
    }
};

struct GpuSession::Profiler {
    struct Entry {
        std::string label;
        LaunchCost cost;
        CUevent start, stop;
    };
    std::vector<Entry> entries;
    ~Profiler() {
        for (auto& e : entries) {
            jit::driver().cuEventDestroy(e.start);
            jit::driver().cuEventDestroy(e.stop);
        }
    }
};

// ---- Session --------------------------------------------------------------------------------

GpuSession::GpuSession(GpuModel& model)
    : model_(model),
      cfg_(model.config()),
      kv_(model.config(), model.kv_geometry()),
      w_(std::make_unique<Work>(model)),
      graphs_(model.flags().get_bool("GEMMAJIT_GRAPHS")),
      streams_(model.flags().get_bool("GEMMAJIT_STREAMS")) {
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    const jit::DriverApi& api = jit::driver();
    stream_ = dev.stream();
    for (int i = 0; i < 2; ++i) {
        jit::check_driver(api.cuStreamCreate(&side_[i], CU_STREAM_NON_BLOCKING),
                          "cuStreamCreate(side stream)");
        jit::check_driver(api.cuEventCreate(&joined_[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    jit::check_driver(api.cuEventCreate(&forked_, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
}

GpuSession::~GpuSession() {
    const jit::DriverApi& api = jit::driver();
    for (int i = 0; i < 2; ++i) {
        if (side_[i]) api.cuStreamDestroy(side_[i]);
        if (joined_[i]) api.cuEventDestroy(joined_[i]);
    }
    if (forked_) api.cuEventDestroy(forked_);
}

void GpuSession::fork(int branches) {
    const jit::DriverApi& api = jit::driver();
    const CUstream main = jit::Device::get().stream();
    jit::check_driver(api.cuEventRecord(forked_, main), "cuEventRecord(fork)");
    for (int i = 0; i < branches; ++i)
        jit::check_driver(api.cuStreamWaitEvent(side_[i], forked_, 0), "cuStreamWaitEvent(fork)");
}

void GpuSession::join(int branches) {
    const jit::DriverApi& api = jit::driver();
    const CUstream main = jit::Device::get().stream();
    for (int i = 0; i < branches; ++i) {
        jit::check_driver(api.cuEventRecord(joined_[i], side_[i]), "cuEventRecord(join)");
        jit::check_driver(api.cuStreamWaitEvent(main, joined_[i], 0), "cuStreamWaitEvent(join)");
    }
    stream_ = main;
}

int GpuSession::context() const {
    return kv_.geometry().context;
}

bool GpuSession::rewind(int keep) {
    if (keep < 0 || keep > pos_)
        throw std::invalid_argument(
            fmt::format("rewind to {}: the sequence holds {} positions", keep, pos_));
    if (!kv_.can_rewind(pos_, keep)) return false;
    pos_ = keep;
    return true;
}

void GpuSession::check_tokens(std::span<const int32_t> tokens) const {
    if (tokens.empty()) throw std::invalid_argument("prefill needs at least one token");
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
            throw std::invalid_argument(
                fmt::format("token id {} (input position {}) is outside the vocabulary [0, {})",
                            tokens[i], i, cfg_.vocab_size));
    if (int64_t(pos_) + int64_t(tokens.size()) > context())
        throw std::invalid_argument(
            fmt::format("{} tokens at position {} do not fit the context of {} positions",
                        tokens.size(), pos_, context()));
}

void GpuSession::write_step_state(std::span<const int32_t> tokens, int pos0) {
    const int R = w_->layout.rows;
    int32_t* s = w_->state_host.as<int32_t>();
    const int T = int(tokens.size());
    s[0] = T;
    s[1] = pos0;
    s[2] = s[3] = 0;
    for (int t = 0; t < T; ++t) {
        s[kStateHeader + t] = pos0 + t;
        s[kStateHeader + R + t] = tokens[t];
    }
    jit::check_driver(
        jit::driver().cuMemcpyHtoDAsync(w_->state.ptr(), s, (kStateHeader + 2 * R) * 4,
                                        jit::Device::get().stream()),
        "cuMemcpyHtoDAsync(step state)");
}

StepOutput GpuSession::read_result(Readout readout) {
    const jit::DriverApi& api = jit::driver();
    const CUstream stream = jit::Device::get().stream();
    StepOutput out;
    uint8_t* host = w_->result_host.as<uint8_t>();
    if (readout == Readout::Argmax)
        jit::check_driver(api.cuMemcpyDtoHAsync(host, w_->result_token(), 4, stream),
                          "cuMemcpyDtoHAsync(argmax)");
    if (readout == Readout::TopK)
        jit::check_driver(api.cuMemcpyDtoHAsync(host, w_->result_ids(), 2 * kMaxTopK * 4, stream),
                          "cuMemcpyDtoHAsync(top-k)");
    jit::check_driver(api.cuStreamSynchronize(stream), "forward step");
    switch (readout) {
        case Readout::Argmax:
            out.token = *reinterpret_cast<const int32_t*>(host);
            if (out.token < 0)
                throw std::runtime_error(
                    "the forward pass produced NaN logits (argmax found no largest value)");
            break;
        case Readout::TopK: {
            const int32_t* ids = reinterpret_cast<const int32_t*>(host);
            const float* vals = reinterpret_cast<const float*>(host + kMaxTopK * 4);
            const int k = std::min(kMaxTopK, cfg_.vocab_size);
            std::vector<int> order(k);
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
            for (int i : order) out.ids.push_back(ids[i]), out.values.push_back(vals[i]);
            break;
        }
        case Readout::Logits:
            out.logits.resize(size_t(cfg_.vocab_size));
            w_->logits.download(out.logits.data(), out.logits.size() * 4);
            break;
    }
    return out;
}

// ---- Launch helpers ---------------------------------------------------------------------------

template <class F>
void GpuSession::profiled(const std::string& label, LaunchCost cost, F&& enqueue) {
    if (!profiler_) {
        enqueue();
        return;
    }
    const jit::DriverApi& api = jit::driver();
    Profiler::Entry e{label, cost, nullptr, nullptr};
    jit::check_driver(api.cuEventCreate(&e.start, CU_EVENT_DEFAULT), "cuEventCreate");
    jit::check_driver(api.cuEventCreate(&e.stop, CU_EVENT_DEFAULT), "cuEventCreate");
    profiler_->entries.push_back(e);
    jit::check_driver(api.cuEventRecord(e.start, stream_), "cuEventRecord");
    enqueue();
    jit::check_driver(api.cuEventRecord(e.stop, stream_), "cuEventRecord");
}

void GpuSession::launch(const jit::Kernel& k, jit::LaunchDims grid, jit::LaunchDims block,
                        unsigned smem, void** args, const std::string& label, LaunchCost cost) {
    profiled(label, cost, [&] { k.launch(grid, block, smem, stream_, args); });
}

GpuSession::Input GpuSession::normed(int row) const {
    const uint64_t d = uint64_t(cfg_.d_model);
    return Input{w_->h.ptr() + row * d * 4, w_->xq.ptr() + row * d,
                 w_->xds.ptr() + row * (d / 32) * 8};
}

void GpuSession::pre_norm(CUdeviceptr x, CUdeviceptr w, int T, const char* what) {
    const std::string& name = model_.spec_prenorm();
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned tpr = constant(spec, "TPR"), rpb = constant(spec, "RPB");
    CUdeviceptr residual = 0, y = w_->h.ptr(), yq = w_->xq.ptr(), yds = w_->xds.ptr();
    float eps = cfg_.rms_eps;
    void* args[] = {&x, &w, &residual, &y, &yq, &yds, &T, &eps};
    launch(model_.kernels().get(name, "rmsnorm"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
           name + " " + what);
}

void GpuSession::post_norm(const std::string& name, CUdeviceptr u, CUdeviceptr w, CUdeviceptr scale,
                           CUdeviceptr w2, int T, const char* what) {
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned tpr = constant(spec, "TPR"), rpb = constant(spec, "RPB");
    CUdeviceptr x = w_->x.ptr(), yq = w_->xq.ptr(), yds = w_->xds.ptr();
    float eps = cfg_.rms_eps;
    if (spec.entries.at(0) == "rmsnorm") {  // x += norm(u) * w, quantized
        void* args[] = {&u, &w, &x, &x, &yq, &yds, &T, &eps};
        launch(model_.kernels().get(name, "rmsnorm"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
               name + " " + what);
        return;
    }
    CUdeviceptr y2 = w_->h.ptr();
    void* args[] = {&u, &w, &x, &x, &scale, &w2, &y2, &yq, &yds, &T, &eps};
    launch(model_.kernels().get(name, "rmsnorm_ext"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
           name + " " + what);
}

void GpuSession::quantize(CUdeviceptr x, int n_values) {
    const std::string& name = model_.spec_quantize();
    const unsigned threads = constant(model_.kernels().spec(name), "THREADS");
    CUdeviceptr xq = w_->xq.ptr(), xds = w_->xds.ptr();
    int blocks = n_values / 32;
    void* args[] = {&x, &xq, &xds, &blocks};
    launch(model_.kernels().get(name, "quantize_q8_1"), {ceil_div(uint64_t(blocks) * 8, threads)},
           {threads}, 0, args, name);
}

int GpuSession::matvec(const GpuMatrix& m, const GpuMatrix* up, Input in, CUdeviceptr y, int T,
                       const char* what, bool partials_ok) {
    const bool quant = m.quantized();
    const uint64_t bytes = m.bytes + (up ? up->bytes : 0);
    const double flops_per_col = 2.0 * double(m.rows) * m.cols * (up ? 2 : 1);
    if (T > kPrefillCols && !quant && m.blas && model_.blas()) {
        blas_product(m, up, in.f, y, T, what);
        return 1;
    }
    if (T > kPrefillCols && !m.spec_gemm.empty())
        return gemm(m, up, in, up ? GemmOut::Geglu : GemmOut::Plain, y, 0, T, what, partials_ok);
    if (quant && in.q == 0) {
        quantize(in.f, T * m.cols);
        in.q = w_->xq.ptr();
        in.ds = w_->xds.ptr();
    }
    // One column: the decode specialization; more: groups of kPrefillCols columns (the buffers
    // hold whole groups, so a last partial group computes harmless padding columns).
    const std::string& spec_name = T == 1 ? m.spec_decode : m.spec_prefill;
    const jit::KernelSpec& spec = model_.kernels().spec(spec_name);
    const int cols = int(spec_constant(spec, "NCOLS"));
    const unsigned threads = constant(spec, "THREADS"), rows_per_block = constant(spec, "ROWS");
    const jit::Kernel& k = model_.kernels().get(spec_name, spec.family + (up ? "_geglu" : ""));
    const std::string label = spec_name + (up ? " geglu " : " ") + what;
    int n_rows = m.rows;
    CUdeviceptr w = m.ptr, wu = up ? up->ptr : 0, residual = 0;
    for (int c0 = 0; c0 < T; c0 += cols) {
        CUdeviceptr out = y + uint64_t(c0) * m.rows * 4;
        const LaunchCost cost{bytes, flops_per_col * std::min(cols, T - c0), WorkKind::Gemm};
        if (quant) {
            CUdeviceptr xq = in.q + uint64_t(c0) * m.cols;
            CUdeviceptr xds = in.ds + uint64_t(c0) * (m.cols / 32) * 8;
            void* args[] = {&w, &wu, &xq, &xds, &residual, &out, &n_rows};
            launch(k, {ceil_div(m.rows, rows_per_block)}, {threads}, 0, args, label, cost);
        } else {
            CUdeviceptr xf = in.f + uint64_t(c0) * m.cols * 4;
            void* args[] = {&w, &wu, &xf, &residual, &out, &n_rows};
            launch(k, {ceil_div(m.rows, rows_per_block)}, {threads}, 0, args, label, cost);
        }
    }
    return 1;
}

GpuSession::Input GpuSession::with_bf16(Input in, int n, const std::string& what) {
    if (in.bf) return in;
    in.bf = convert(in.f, n, "f32_to_bf16", w_->xbf.ptr(), what);
    return in;
}

CUdeviceptr GpuSession::convert(CUdeviceptr x, int n, const char* entry, CUdeviceptr out,
                                const std::string& what) {
    const std::string& name = model_.spec_convert();
    const unsigned threads = constant(model_.kernels().spec(name), "THREADS");
    void* args[] = {&x, &out, &n};
    launch(model_.kernels().get(name, entry), {ceil_div(n / 4, threads)}, {threads}, 0, args,
           name + " " + what);
    return out;
}

int GpuSession::gemm(const GpuMatrix& m, const GpuMatrix* up, Input in, GemmOut out_form,
                     CUdeviceptr y, CUdeviceptr yds, int T, const char* what, bool partials_ok) {
    const jit::KernelSpec& spec = model_.kernels().spec(m.spec_gemm);
    // The plain product of a split-K spec writes partial planes to the workspace, then sums them.
    const unsigned splits = up ? 1 : constant(spec, "SPLITS");
    CUdeviceptr w = m.ptr, wu = up ? up->ptr : 0;
    CUdeviceptr out = splits > 1 ? w_->gemm_split.ptr() : y;
    int n_rows = m.rows;
    const double flops = 2.0 * double(m.rows) * m.cols * T * (up ? 2 : 1);
    const LaunchCost cost{m.bytes + (up ? up->bytes : 0), flops, WorkKind::Gemm};
    const int form = int(out_form);
    std::string reduce;
    if (m.gemm_bf16) {
        // bf16 activations; the GeGLU entries take BN / 2 rows of each matrix per block.
        in = with_bf16(in, T * m.cols, what);
        static const char* const entries[] = {"gemm_wgmma", "gemm_wgmma_geglu",
                                              "gemm_wgmma_geglu_bf16"};
        const unsigned rows = constant(spec, "BN") / (up ? 2 : 1);
        void* args[] = {&w, &wu, &in.bf, &out, &T, &n_rows};
        launch(model_.kernels().get(m.spec_gemm, entries[form]),
               {ceil_div(m.rows, rows), ceil_div(T, constant(spec, "BM")), splits},
               {constant(spec, "THREADS")}, constant(spec, "SMEM"), args,
               m.spec_gemm + " " + entries[form] + " " + what, cost);
        ++paths_.wgmma;
        reduce = "gemm_wgmma_reduce";
    } else {
        if (in.q == 0) {
            quantize(in.f, T * m.cols);
            in.q = w_->xq.ptr();
            in.ds = w_->xds.ptr();
        }
        static const char* const entries[] = {"mmq", "mmq_geglu", "mmq_geglu_q8"};
        void* args[] = {&w, &wu, &in.q, &in.ds, &out, &yds, &T, &n_rows};
        launch(model_.kernels().get(m.spec_gemm, entries[form]),
               {ceil_div(m.rows, constant(spec, "BN")), ceil_div(T, constant(spec, "BM")), splits},
               {constant(spec, "THREADS")}, constant(spec, "SMEM"), args,
               m.spec_gemm + " " + entries[form] + " " + what, cost);
        ++paths_.mmq;
        reduce = "mmq_reduce";
    }
    if (splits > 1 && partials_ok) return int(splits);  // the caller's post-norm sums the planes
    if (splits > 1) {
        int n = T * m.rows;
        void* rargs[] = {&out, &y, &n};
        launch(model_.kernels().get(m.spec_gemm, reduce), {ceil_div(n, 256)}, {256}, 0, rargs,
               m.spec_gemm + " " + reduce + " " + what, LaunchCost{0, 0, WorkKind::Gemm});
    }
    return 1;
}

bool GpuSession::splits_k(const GpuMatrix& m) const {
    return !m.spec_gemm.empty() && constant(model_.kernels().spec(m.spec_gemm), "SPLITS") > 1;
}

CUdeviceptr GpuSession::product(int parts) const {
    return parts > 1 ? w_->gemm_split.ptr() : w_->tmp.ptr();
}

GpuSession::Input GpuSession::ffn_gate_up(const GpuLayer& g, int T) {
    const Work& w = *w_;
    // The GEMM writes the GeGLU product straight in the down projection's input form: bf16 for
    // the wgmma GEMM, Q8_1 for the int8 one.
    if (T > kPrefillCols && g.gate.gemm_bf16 && g.down.gemm_bf16) {
        gemm(g.gate, &g.up, normed(), GemmOut::GegluNext, w.gbf.ptr(), 0, T, "ffn_gate|up");
        return Input{0, 0, 0, w.gbf.ptr()};
    }
    if (T > kPrefillCols && !g.gate.spec_gemm.empty() && !g.gate.gemm_bf16 &&
        g.gate.rows % 32 == 0) {
        gemm(g.gate, &g.up, normed(), GemmOut::GegluNext, w.gq.ptr(), w.gds.ptr(), T,
             "ffn_gate|up");
        return Input{0, w.gq.ptr(), w.gds.ptr()};
    }
    matvec(g.gate, &g.up, normed(), w.g.ptr(), T, "ffn_gate|up");
    return Input{w.g.ptr()};
}

void GpuSession::blas_product(const GpuMatrix& m, const GpuMatrix* up, CUdeviceptr x, CUdeviceptr y,
                              int T, const char* what) {
    jit::Blas& blas = *model_.blas();
    const jit::BlasType type = m.type == ggml::Type::F32   ? jit::BlasType::F32
                               : m.type == ggml::Type::F16 ? jit::BlasType::F16
                                                           : jit::BlasType::BF16;
    if (type != jit::BlasType::F32)  // cuBLAS multiplies two matrices of one type
        x = convert(x, T * m.cols, type == jit::BlasType::F16 ? "f32_to_f16" : "f32_to_bf16",
                    w_->xhalf.ptr(), what);
    const double flops = 2.0 * double(m.rows) * m.cols * T;
    auto product = [&](const GpuMatrix& w, CUdeviceptr out, const char* label) {
        profiled(
            fmt::format("cublas.{}.k{}.n{} {}", ggml::type_name(w.type), w.cols, w.rows, label),
            LaunchCost{w.bytes, flops, WorkKind::Gemm},
            [&] { blas.gemm(stream_, type, w.rows, T, w.cols, w.ptr, x, out); });
        ++paths_.blas;
    };
    if (!up) {
        product(m, y, what);
        return;
    }
    // GeGLU from two products: gate into its own buffer, up into y, then y = gelu(gate) * y.
    CUdeviceptr gate = w_->fgate.ptr();
    product(m, gate, "ffn_gate");
    product(*up, y, "ffn_up");
    const std::string& name = m.spec_geglu;
    void* args[] = {&gate, &y, &T};
    launch(model_.kernels().get(name, "gelu_mul_inplace"), {ceil_div(uint64_t(T) * m.rows, 128)},
           {128}, 0, args, name + " inplace ffn");
}

// ---- The forward pass -------------------------------------------------------------------------

void GpuSession::record_embedding(int T) {
    const Work& w = *w_;
    auto gather = [&](const GpuTable& t, CUdeviceptr out, float scale) {
        const jit::KernelSpec& spec = model_.kernels().spec(t.spec);
        const unsigned threads = constant(spec, "THREADS");
        CUdeviceptr rows = w.tokens(), table = t.ptr;
        void* args[] = {&rows, &T, &table, &out, &scale};
        launch(model_.kernels().get(t.spec, "embed_rows"),
               {ceil_div(uint64_t(t.cols) / 4, threads), unsigned(T)}, {threads}, 0, args,
               t.spec + " " + t.name, LaunchCost{uint64_t(T) * (t.bytes / t.rows)});
    };
    gather(model_.token_embd(), w.x.ptr(), cfg_.embed_scale());
    if (!cfg_.has_ple()) return;
    // PLE inputs of every layer: ((RMSNorm(W_proj e / sqrt(d)) * g) + table[tok] * sqrt(P)) /
    // sqrt(2), with e the scaled embedding.
    gather(model_.ple_table(), w.ple_tok.ptr(), std::sqrt(float(cfg_.ple_dim)));
    matvec(model_.ple_model_proj(), nullptr, Input{w.x.ptr()}, w.ple_ctx.ptr(), T,
           "per_layer_model_proj");
    const std::string& name = model_.spec_ple_finish();
    CUdeviceptr ctx = w.ple_ctx.ptr(), tok = w.ple_tok.ptr(), norm = model_.ple_proj_norm(),
                out = w.ple.ptr();
    float inv_sqrt_d = float(1.0 / std::sqrt(double(cfg_.d_model)));
    float eps = cfg_.rms_eps;
    void* args[] = {&ctx, &tok, &norm, &out, &T, &inv_sqrt_d, &eps};
    launch(model_.kernels().get(name, "ple_finish"), {ceil_div(uint64_t(T) * cfg_.n_layers, 4)},
           {128}, 0, args, name);
}

double GpuSession::attention_flops(int l, int pos0, int T) const {
    const LayerConfig& lc = cfg_.layers[l];
    const int window = lc.sliding ? cfg_.sliding_window : 0;
    double pairs = 0;  // visible (query, key) pairs
    for (int p = pos0; p < pos0 + T; ++p) pairs += window ? std::min(p + 1, window) : p + 1;
    return 4.0 * lc.head_dim * cfg_.n_heads * pairs;  // Q K^T and P V
}

void GpuSession::record_attention(int l, int T, bool decode) {
    const Work& w = *w_;
    const LayerConfig& lc = cfg_.layers[l];
    const GpuLayer& gl = model_.layers()[l];
    const KvCache::Layer& kv = kv_.layer(l);
    const uint64_t q_dim = uint64_t(cfg_.q_dim(l));
    if (!decode && !gl.flash_prefill_spec.empty()) {
        // The whole chunk in one launch on tensor cores; K/V of this chunk are already cached.
        // SPLITS blocks (a cluster) per row block share its key range.
        const jit::KernelSpec& spec = model_.kernels().spec(gl.flash_prefill_spec);
        const unsigned rows_per_block = constant(spec, "BLOCK_ROWS");
        CUdeviceptr q = w.q.ptr(), kc = kv.k, vc = kv.v, positions = w.positions(),
                    out = w.attn.ptr();
        int slots = kv.slots;
        void* args[] = {&q, &kc, &vc, &positions, &T, &slots, &out};
        launch(model_.kernels().get(gl.flash_prefill_spec, "flash_prefill"),
               {ceil_div(uint64_t(T) * constant(spec, "GROUP"), rows_per_block) *
                    constant(spec, "SPLITS"),
                unsigned(lc.n_kv_heads)},
               {constant(spec, "THREADS")}, constant(spec, "SMEM"), args, gl.flash_prefill_spec,
               LaunchCost{0, attention_flops(l, pos_, T), WorkKind::Attention});
        ++paths_.flash_prefill;
        return;
    }
    const jit::KernelSpec& spec = model_.kernels().spec(gl.flash_spec);
    // The decode graph's split count is fixed for the whole context (any count is correct; the
    // kernel lengthens the splits as the context grows). Eager prefill sizes it for its chunk.
    int splits = w.layout.decode_splits[l];
    if (!decode) splits = flash_decode_splits(spec, pos_ + T, T, jit::Device::get().sm_count());
    const uint64_t per_query_o = uint64_t(cfg_.n_heads) * splits * lc.head_dim;
    const uint64_t per_query_ml = uint64_t(cfg_.n_heads) * splits;
    const int batch = int(std::min<uint64_t>({uint64_t(T), w.layout.part_o_floats / per_query_o,
                                              w.layout.part_ml_pairs / per_query_ml}));
    const jit::Kernel& flash = model_.kernels().get(gl.flash_spec, "flash_decode");
    const jit::Kernel& combine = model_.kernels().get(gl.flash_spec, "flash_combine");
    const unsigned threads = constant(spec, "THREADS"), smem = constant(spec, "SMEM");
    const unsigned combine_threads = constant(spec, "COMBINE_THREADS");
    const unsigned combine_blocks =
        constant(spec, "GROUP") * constant(spec, "N_KV_HEADS") * constant(spec, "HEAD_DIM") / 16;
    CUdeviceptr kc = kv.k, vc = kv.v, part_o = w.part_o.ptr(), part_ml = w.part_ml.ptr();
    int slots = kv.slots;
    for (int t0 = 0; t0 < T; t0 += batch) {
        int n = std::min(batch, T - t0);
        const LaunchCost cost{0, attention_flops(l, pos_ + t0, n), WorkKind::Attention};
        CUdeviceptr q = w.q.ptr() + t0 * q_dim * 4, out = w.attn.ptr() + t0 * q_dim * 4;
        CUdeviceptr positions = w.positions() + uint64_t(t0) * 4;
        void* fargs[] = {&q, &kc, &vc, &positions, &n, &slots, &splits, &part_o, &part_ml};
        launch(flash, {unsigned(splits), unsigned(lc.n_kv_heads), unsigned(n)}, {threads}, smem,
               fargs, gl.flash_spec + " flash_decode", cost);
        void* cargs[] = {&part_o, &part_ml, &out, &n, &splits};
        launch(combine, {combine_blocks, unsigned(n)}, {combine_threads}, 0, cargs,
               gl.flash_spec + " flash_combine", LaunchCost{0, 0, WorkKind::Attention});
    }
}

void GpuSession::record_layer(int l, int T, bool decode) {
    const Work& w = *w_;
    const LayerConfig& lc = cfg_.layers[l];
    const GpuLayer& g = model_.layers()[l];
    // The next pre-norm, chained to this layer's last residual update.
    const CUdeviceptr next_norm =
        l + 1 < cfg_.n_layers ? model_.layers()[l + 1].attn_norm : model_.output_norm();

    // Attention: h = attn_norm(x) is ready (chained); x += post_attention_norm(Wo . attention).
    // The K and V projections (same input, own outputs) run beside Q on side streams: small
    // matvecs that alone leave most of the GPU idle (in a graph: parallel branches). Not while
    // profiling, whose per-launch events time one kernel at a time.
    const int branches = lc.has_kv ? (lc.has_v_proj ? 2 : 1) : 0;
    // Split-K products share one partial-plane workspace: those run one at a time.
    const bool split_qkv = T > kPrefillCols && (splits_k(g.q) || splits_k(g.k) || splits_k(g.v));
    const bool concurrent = streams_ && branches > 0 && !profiler_ && !split_qkv;
    // The bf16 form of h for the wgmma GEMMs, made once for Q, K and V (before the fork).
    const bool bf16_qkv = g.q.gemm_bf16 || g.k.gemm_bf16 || g.v.gemm_bf16;
    const Input h = T > kPrefillCols && bf16_qkv
                        ? with_bf16(normed(), T * cfg_.d_model, "attn_norm")
                        : normed();
    if (concurrent) fork(branches);
    if (lc.has_kv) {
        if (concurrent) stream_ = side_[0];
        matvec(g.k, nullptr, h, w.kraw.ptr(), T, "attn_k");
        if (lc.has_v_proj) {
            if (concurrent) stream_ = side_[1];
            matvec(g.v, nullptr, h, w.vraw.ptr(), T, "attn_v");
        }
        stream_ = jit::Device::get().stream();
    }
    matvec(g.q, nullptr, h, w.q.ptr(), T, "attn_q");
    if (concurrent) join(branches);
    {
        const KvCache::Layer& kv = kv_.layer(l);
        const jit::KernelSpec& spec = model_.kernels().spec(g.attn_prep_spec);
        const unsigned warps = constant(spec, "WARPS");
        const int rows = cfg_.n_heads + (lc.has_kv ? 2 * lc.n_kv_heads : 0);
        CUdeviceptr q = w.q.ptr(), kraw = w.kraw.ptr(), vraw = w.vraw.ptr(), qn = g.q_norm,
                    kn = g.k_norm, kc = kv.k, vc = kv.v, positions = w.positions();
        int slots = kv.slots;
        float base = lc.rope_base, eps = cfg_.rms_eps;
        void* args[] = {&q, &kraw, &vraw, &qn, &kn, &kc, &vc, &positions, &T, &slots, &base, &eps};
        launch(model_.kernels().get(g.attn_prep_spec, "attn_prep"),
               {ceil_div(rows, warps), unsigned(T)}, {32 * warps}, 0, args, g.attn_prep_spec);
    }
    record_attention(l, T, decode);
    // Split-K products leave their partial planes for the post-norm to sum.
    int parts = matvec(g.o, nullptr, Input{w.attn.ptr()}, w.tmp.ptr(), T, "attn_output", true);
    post_norm(model_.spec_post_prenorm(parts), product(parts), g.post_attention_norm, 0, g.ffn_norm,
              T, "post_attention_norm+ffn_norm");

    // FFN: x += post_ffw_norm(down(gelu(gate h) * up h)), h = ffn_norm(x).
    parts = matvec(g.down, nullptr, ffn_gate_up(g, T), w.tmp.ptr(), T, "ffn_down", true);
    if (!cfg_.has_ple()) {
        post_norm(model_.spec_post_scale_prenorm(parts), product(parts), g.post_ffw_norm,
                  g.output_scale, next_norm, T, "post_ffw_norm*scale+next_norm");
        return;
    }
    // The updated stream is the PLE gate's input (quantized by the same launch).
    post_norm(model_.spec_post_quant(parts), product(parts), g.post_ffw_norm, 0, 0, T,
              "post_ffw_norm");

    // PLE: x = (x + post_norm(proj(gelu(inp_gate x) * ple[l]))) * layer_output_scale.
    matvec(g.inp_gate, nullptr, Input{w.x.ptr(), w.xq.ptr(), w.xds.ptr()}, w.ple_gate.ptr(), T,
           "inp_gate");
    {
        const std::string& name = model_.spec_gelu_mul();
        // The product goes straight to Q8_1 for an int8 consumer (the wgmma GEMM reads fp32).
        const bool q8 = g.proj.quantized() && !(T > kPrefillCols && g.proj.gemm_bf16);
        CUdeviceptr gate = w.ple_gate.ptr(), other = w.ple.ptr() + uint64_t(l) * cfg_.ple_dim * 4,
                    out = w.ple_mul.ptr(), yq = w.xq.ptr(), yds = w.xds.ptr();
        int stride = cfg_.n_layers * cfg_.ple_dim;
        const uint64_t n = uint64_t(T) * cfg_.ple_dim;
        if (q8) {
            void* args[] = {&gate, &other, &stride, &yq, &yds, &T};
            launch(model_.kernels().get(name, "gelu_mul_q8"), {ceil_div(n, 512)}, {128}, 0, args,
                   name + " q8");
        } else {
            void* args[] = {&gate, &other, &stride, &out, &T};
            launch(model_.kernels().get(name, "gelu_mul"), {ceil_div(n, 128)}, {128}, 0, args,
                   name);
        }
        matvec(g.proj, nullptr, q8 ? Input{0, yq, yds} : Input{out}, w.tmp.ptr(), T, "ple_proj");
    }
    post_norm(model_.spec_post_scale_prenorm(), w.tmp.ptr(), g.post_norm, g.output_scale, next_norm,
              T, "ple_post_norm*scale+next_norm");
}

void GpuSession::record_forward(int T, bool decode) {
    record_embedding(T);
    pre_norm(w_->x.ptr(), model_.layers()[0].attn_norm, T, "attn_norm");
    for (int l = 0; l < cfg_.n_layers; ++l) record_layer(l, T, decode);
    // h (and its Q8_1 form) now hold output_norm(x) of every row.
}

void GpuSession::record_readout(int row, Readout readout) {
    const Work& w = *w_;
    matvec(model_.lm_head(), nullptr, normed(row), w.logits.ptr(), 1, "lm_head");
    const std::string& name = model_.spec_logits();
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned threads = constant(spec, "THREADS");
    CUdeviceptr logits = w.logits.ptr(), work = w.logits_work();
    float cap = cfg_.final_softcap;
    if (readout == Readout::Argmax) {
        CUdeviceptr token = w.result_token();
        void* args[] = {&logits, &cap, &work, &token};
        launch(model_.kernels().get(name, "softcap_argmax"), {constant(spec, "ARGMAX_BLOCKS")},
               {threads}, 0, args, name + " softcap_argmax");
    } else if (readout == Readout::TopK) {
        CUdeviceptr ids = w.result_ids(), values = w.result_values();
        void* args[] = {&logits, &cap, &work, &ids, &values};
        launch(model_.kernels().get(name, "softcap_topk"), {constant(spec, "TOPK_BLOCKS")},
               {threads}, 0, args, name + " softcap_topk");
    } else {
        int n = cfg_.vocab_size;
        void* args[] = {&logits, &cap, &n};
        launch(model_.kernels().get(name, "softcap"), {ceil_div(n, threads)}, {threads}, 0, args,
               name + " softcap");
    }
}

void GpuSession::record_all_logits(int T) {
    const Work& w = *w_;
    matvec(model_.lm_head(), nullptr, normed(), w.all_logits.ptr(), T, "lm_head");
    const std::string& name = model_.spec_logits();
    const unsigned threads = constant(model_.kernels().spec(name), "THREADS");
    CUdeviceptr logits = w.all_logits.ptr();
    float cap = cfg_.final_softcap;
    int n = T * cfg_.vocab_size;
    void* args[] = {&logits, &cap, &n};
    launch(model_.kernels().get(name, "softcap"), {ceil_div(n, threads)}, {threads}, 0, args,
           name + " softcap");
}

// ---- Steps ------------------------------------------------------------------------------------

StepOutput GpuSession::prefill(std::span<const int32_t> tokens, Readout readout,
                               const std::function<void(int, int)>& progress) {
    check_tokens(tokens);
    const int chunk = model_.prefill_chunk();
    const int total = int(tokens.size());
    jit::Device::get().make_current();
    for (int t0 = 0; t0 < total; t0 += chunk) {
        const int T = std::min(chunk, total - t0);
        write_step_state(tokens.subspan(t0, T), pos_);
        record_forward(T, false);
        if (t0 + T == total) record_readout(T - 1, readout);
        pos_ += T;
        if (t0 + T < total) {
            // The pinned step state is rewritten by the next chunk.
            jit::check_driver(jit::driver().cuStreamSynchronize(jit::Device::get().stream()),
                              "prefill chunk");
            if (progress) progress(t0 + T, total);
        }
    }
    StepOutput out = read_result(readout);
    if (progress) progress(total, total);
    return out;
}

std::vector<float> GpuSession::prefill_logits(std::span<const int32_t> tokens) {
    check_tokens(tokens);
    const int chunk = model_.prefill_chunk();
    const int total = int(tokens.size());
    const uint64_t V = uint64_t(cfg_.vocab_size);
    jit::Device::get().make_current();
    if (w_->all_logits.size() == 0)  // [rows][V]: only for callers that want every row
        w_->all_logits = jit::DeviceBuffer(uint64_t(w_->layout.rows) * V * 4);
    std::vector<float> out(uint64_t(total) * V);
    for (int t0 = 0; t0 < total; t0 += chunk) {
        const int T = std::min(chunk, total - t0);
        write_step_state(tokens.subspan(t0, T), pos_);
        record_forward(T, false);
        record_all_logits(T);
        pos_ += T;
        jit::check_driver(jit::driver().cuStreamSynchronize(jit::Device::get().stream()),
                          "prefill chunk");
        w_->all_logits.download(out.data() + uint64_t(t0) * V, uint64_t(T) * V * 4);
    }
    return out;
}

StepOutput GpuSession::decode(int32_t token, Readout readout) {
    check_tokens({&token, 1});
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    const jit::DriverApi& api = jit::driver();
    write_step_state({&token, 1}, pos_);
    if (!graphs_) {
        record_forward(1, true);
        record_readout(0, readout);
    } else {
        Graph* graph = nullptr;
        for (auto& g : graphs_list_)
            if (g->readout == readout) graph = g.get();
        if (!graph) {
            // Captured once per readout; every kernel is already loaded with its shared-memory
            // limit set, and no launch argument depends on the token or its position.
            auto g = std::make_unique<Graph>();
            g->readout = readout;
            jit::check_driver(
                api.cuStreamBeginCapture(dev.stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture(decode step)");
            try {
                record_forward(1, true);
                record_readout(0, readout);
            } catch (...) {
                CUgraph broken = nullptr;
                api.cuStreamEndCapture(dev.stream(), &broken);
                if (broken) api.cuGraphDestroy(broken);
                throw;
            }
            jit::check_driver(api.cuStreamEndCapture(dev.stream(), &g->graph),
                              "cuStreamEndCapture(decode step)");
            jit::check_driver(api.cuGraphInstantiateWithFlags(&g->exec, g->graph, 0),
                              "cuGraphInstantiate(decode step)");
            ++graph_captures_;
            graph = g.get();
            graphs_list_.push_back(std::move(g));
        }
        jit::check_driver(api.cuGraphLaunch(graph->exec, dev.stream()),
                          "cuGraphLaunch(decode step)");
        ++graph_launches_;
    }
    StepOutput out = read_result(readout);
    ++pos_;
    return out;
}

std::vector<KernelTime> GpuSession::profile_decode_step(int32_t token) {
    check_tokens({&token, 1});
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    Profiler prof;
    write_step_state({&token, 1}, pos_);
    profiler_ = &prof;
    try {
        record_forward(1, true);
        record_readout(0, Readout::Argmax);
    } catch (...) {
        profiler_ = nullptr;
        throw;
    }
    profiler_ = nullptr;
    dev.synchronize();
    return collect_profile(prof);
}

std::vector<KernelTime> GpuSession::profile_prefill(std::span<const int32_t> tokens) {
    Profiler prof;
    profiler_ = &prof;
    try {
        prefill(tokens, Readout::Argmax);
    } catch (...) {
        profiler_ = nullptr;
        throw;
    }
    profiler_ = nullptr;
    return collect_profile(prof);
}

std::vector<KernelTime> GpuSession::collect_profile(const Profiler& prof) const {
    std::map<std::string, KernelTime> by_label;
    for (const auto& e : prof.entries) {
        float ms = 0;
        jit::check_driver(jit::driver().cuEventElapsedTime(&ms, e.start, e.stop),
                          "cuEventElapsedTime");
        KernelTime& k = by_label[e.label];
        k.label = e.label;
        k.kind = e.cost.kind;
        k.launches += 1;
        k.microseconds += double(ms) * 1000.0;
        k.weight_bytes += e.cost.bytes;
        k.flops += e.cost.flops;
    }
    std::vector<KernelTime> out;
    for (auto& [label, k] : by_label) out.push_back(k);
    std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) {
        return a.microseconds > b.microseconds;
    });
    return out;
}

}  // namespace gj::gemma4
