#include "engine/gpu_forward.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

#include "engine/pinned_host.h"
#include "jit/cuda_driver.h"

namespace gj::gemma4 {

namespace {

int64_t constant_or(const jit::KernelSpec& spec, std::string_view name, int64_t fallback) {
    for (const auto& [n, v] : spec.constants)
        if (n == name) return v;
    return fallback;
}

unsigned ceil_div(uint64_t a, uint64_t b) {
    return unsigned((a + b - 1) / b);
}

int round_up(int v, int m) {
    return (v + m - 1) / m * m;
}

// Step-state layout (int32 words): [0] tokens in this step, [1] position of the first, then
// positions[rows], then token ids[rows].
constexpr int kStateHeader = 4;

// Sizes of one session's buffers, shared by the allocation and the model's memory plan.
struct WorkLayout {
    int rows = 0;  // activation rows: the prefill chunk rounded up to kPrefillCols
    int d = 0, q_max = 0, kv_max = 0, ffn_max = 0, in_max = 0, ple = 0, ple_all = 0, vocab = 0;
    uint64_t part_o_floats = 0, part_ml_pairs = 0;  // attention partials
    std::vector<int> decode_splits;                 // per layer: splits of the decode graph

    explicit WorkLayout(const GpuModel& m) {
        const Config& c = m.config();
        const KvGeometry& g = m.kv_geometry();
        rows = round_up(std::max(1, g.max_chunk), kPrefillCols);
        d = c.d_model;
        ple = c.ple_dim;
        ple_all = c.n_layers * c.ple_dim;
        vocab = c.vocab_size;
        uint64_t per_query_o = 0, per_query_ml = 0;
        for (int l = 0; l < c.n_layers; ++l) {
            const LayerConfig& lc = c.layers[l];
            q_max = std::max(q_max, c.q_dim(l));
            kv_max = std::max(kv_max, c.kv_dim(l));
            ffn_max = std::max(ffn_max, lc.ffn_dim);
            const int chunk =
                int(spec_constant(m.kernels().spec(m.layers()[l].flash_spec), "CHUNK"));
            const int span = lc.sliding ? std::min(c.sliding_window, g.context) : g.context;
            const int splits = (span + chunk - 1) / chunk;
            decode_splits.push_back(splits);
            per_query_o = std::max(per_query_o, uint64_t(c.n_heads) * splits * lc.head_dim);
            per_query_ml = std::max(per_query_ml, uint64_t(c.n_heads) * splits);
        }
        in_max = std::max({d, q_max, ffn_max, ple});
        // Prefill runs attention in query batches that fit these buffers: room for at least one
        // query (the decode graph) and up to 64 MiB beyond that.
        const uint64_t budget = (uint64_t(64) << 20) / sizeof(float);
        const uint64_t queries = std::clamp<uint64_t>(budget / per_query_o, 1, uint64_t(rows));
        part_o_floats = per_query_o * queries;
        part_ml_pairs = per_query_ml * queries;
    }

    uint64_t bytes() const {
        const uint64_t R = uint64_t(rows);
        uint64_t f = 3 * R * d                        // x, h, tmp
                     + 2 * R * q_max                  // q, attn
                     + 2 * R * kv_max                 // k_raw, v_raw
                     + R * ffn_max                    // gate|up product
                     + 3 * R * ple_all + 2 * R * ple  // PLE gather, projection, result; gate
                     + uint64_t(vocab)                // logits of one row
                     + part_o_floats + 2 * part_ml_pairs;
        return f * sizeof(float) + R * in_max + R * (in_max / 32) * 8  // Q8_1 activations
               + (kStateHeader + 2 * R) * 4 + readout_bytes();
    }
    static uint64_t readout_bytes() { return 64 * 1024; }
};

}  // namespace

uint64_t session_work_bytes(const GpuModel& model) {
    return WorkLayout(model).bytes();
}

// ---- Buffers --------------------------------------------------------------------------------

struct GpuSession::Work {
    WorkLayout layout;
    jit::DeviceBuffer x, h, tmp, q, attn, kraw, vraw, g, ple_tok, ple_ctx, ple, ple_gate, ple_mul,
        logits, part_o, part_ml, xq, xds, state, readout, all_logits;
    PinnedHost state_host, result_host, logits_host;
    int all_logits_rows = 0;

    explicit Work(const GpuModel& m) : layout(m) {
        const WorkLayout& L = layout;
        const uint64_t R = uint64_t(L.rows);
        auto f32 = [](uint64_t n) {
            jit::DeviceBuffer b(std::max<uint64_t>(n, 1) * sizeof(float));
            b.zero();  // padded rows and unused partials read as zeros, never as NaN garbage
            return b;
        };
        x = f32(R * L.d);
        h = f32(R * L.d);
        tmp = f32(R * L.d);
        q = f32(R * L.q_max);
        attn = f32(R * L.q_max);
        kraw = f32(R * L.kv_max);
        vraw = f32(R * L.kv_max);
        g = f32(R * L.ffn_max);
        ple_tok = f32(R * L.ple_all);
        ple_ctx = f32(R * L.ple_all);
        ple = f32(R * L.ple_all);
        ple_gate = f32(R * L.ple);
        ple_mul = f32(R * L.ple);
        logits = f32(L.vocab);
        part_o = f32(L.part_o_floats);
        part_ml = f32(2 * L.part_ml_pairs);
        xq = jit::DeviceBuffer(R * L.in_max);
        xq.zero();
        xds = jit::DeviceBuffer(R * (L.in_max / 32) * 8);
        xds.zero();
        state = jit::DeviceBuffer((kStateHeader + 2 * R) * 4);
        state.zero();
        readout = jit::DeviceBuffer(WorkLayout::readout_bytes());
        readout.zero();
        state_host = PinnedHost((kStateHeader + 2 * R) * 4);
        result_host = PinnedHost(2 * kMaxTopK * 4 + 64);
        logits_host = PinnedHost(uint64_t(L.vocab) * 4);
    }
    CUdeviceptr positions() const { return state.ptr() + kStateHeader * 4; }
    CUdeviceptr tokens() const { return state.ptr() + (kStateHeader + layout.rows) * 4; }
    // The readout area: [0] argmax token, [64 B] top-k ids, then values, then kernel scratch.
    CUdeviceptr result_token() const { return readout.ptr(); }
    CUdeviceptr result_ids() const { return readout.ptr() + 64; }
    CUdeviceptr result_values() const { return readout.ptr() + 64 + kMaxTopK * 4; }
    CUdeviceptr readout_scratch() const { return readout.ptr() + 64 + 2 * kMaxTopK * 4; }
    uint64_t readout_scratch_bytes() const {
        return WorkLayout::readout_bytes() - (64 + 2 * kMaxTopK * 4);
    }
};

struct GpuSession::Graph {
    Readout readout;
    int top_k;
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
        uint64_t bytes;
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
      graphs_(model.flags().get_bool("GEMMAJIT_GRAPHS")) {}

GpuSession::~GpuSession() = default;

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

void GpuSession::check_tokens(std::span<const int32_t> tokens, int extra) const {
    if (tokens.empty()) throw std::invalid_argument("prefill needs at least one token");
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
            throw std::invalid_argument(
                fmt::format("token id {} (input position {}) is outside the vocabulary [0, {})",
                            tokens[i], i, cfg_.vocab_size));
    const int64_t end = int64_t(pos_) + int64_t(tokens.size()) + extra;
    if (end > context())
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
    const CUstream stream = jit::Device::get().stream();
    jit::check_driver(
        jit::driver().cuMemcpyHtoDAsync(w_->state.ptr(), s, (kStateHeader + 2 * R) * 4, stream),
        "cuMemcpyHtoDAsync(step state)");
}

StepOutput GpuSession::read_result(Readout readout, int top_k) {
    const jit::DriverApi& api = jit::driver();
    const CUstream stream = jit::Device::get().stream();
    StepOutput out;
    uint8_t* host = w_->result_host.as<uint8_t>();
    switch (readout) {
        case Readout::Argmax:
            jit::check_driver(api.cuMemcpyDtoHAsync(host, w_->result_token(), 4, stream),
                              "cuMemcpyDtoHAsync(argmax)");
            break;
        case Readout::TopK:
            jit::check_driver(
                api.cuMemcpyDtoHAsync(host, w_->result_ids(), 2 * kMaxTopK * 4, stream),
                "cuMemcpyDtoHAsync(top-k)");
            break;
        case Readout::Logits:
            jit::check_driver(api.cuMemcpyDtoHAsync(w_->logits_host.data(), w_->logits.ptr(),
                                                    uint64_t(cfg_.vocab_size) * 4, stream),
                              "cuMemcpyDtoHAsync(logits)");
            break;
    }
    jit::check_driver(api.cuStreamSynchronize(stream), "forward step");
    switch (readout) {
        case Readout::Argmax:
            out.token = *reinterpret_cast<int32_t*>(host);
            break;
        case Readout::TopK: {
            const int32_t* ids = reinterpret_cast<int32_t*>(host);
            const float* vals = reinterpret_cast<float*>(host + kMaxTopK * 4);
            std::vector<int> order(top_k);
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
            for (int i : order) out.ids.push_back(ids[i]), out.values.push_back(vals[i]);
            break;
        }
        case Readout::Logits: {
            const float* raw = w_->logits_host.as<float>();
            const float cap = cfg_.final_softcap;
            out.logits.assign(raw, raw + cfg_.vocab_size);
            if (cap > 0)
                for (float& v : out.logits) v = std::tanh(v / cap) * cap;
            break;
        }
    }
    return out;
}

// ---- Launch helpers ---------------------------------------------------------------------------

void GpuSession::launch(const jit::Kernel& k, jit::LaunchDims grid, jit::LaunchDims block,
                        unsigned smem, void** args, const std::string& label, uint64_t bytes) {
    const CUstream stream = jit::Device::get().stream();
    if (!profiler_) {
        k.launch(grid, block, smem, stream, args);
        return;
    }
    const jit::DriverApi& api = jit::driver();
    Profiler::Entry e{label, bytes, nullptr, nullptr};
    jit::check_driver(api.cuEventCreate(&e.start, CU_EVENT_DEFAULT), "cuEventCreate");
    jit::check_driver(api.cuEventCreate(&e.stop, CU_EVENT_DEFAULT), "cuEventCreate");
    profiler_->entries.push_back(e);
    jit::check_driver(api.cuEventRecord(e.start, stream), "cuEventRecord");
    k.launch(grid, block, smem, stream, args);
    jit::check_driver(api.cuEventRecord(e.stop, stream), "cuEventRecord");
}

void GpuSession::rmsnorm(const std::string& spec_name, CUdeviceptr x, CUdeviceptr w,
                         CUdeviceptr residual, CUdeviceptr y, CUdeviceptr yq, CUdeviceptr yds,
                         CUdeviceptr scale, int rows, const char* what) {
    const jit::KernelSpec& spec = model_.kernels().spec(spec_name);
    const unsigned tpr = unsigned(spec_constant(spec, "TPR")),
                   rpb = unsigned(spec_constant(spec, "RPB"));
    float eps = cfg_.rms_eps;
    void* args[] = {&x, &w, &residual, &y, &yq, &yds, &scale, &rows, &eps};
    launch(model_.kernels().get(spec_name, "rmsnorm"), {ceil_div(rows, rpb)}, {tpr * rpb}, 0, args,
           spec_name + " " + what);
}

void GpuSession::quantize(CUdeviceptr x, int n_values) {
    const std::string& name = model_.spec_quantize();
    const unsigned threads = unsigned(spec_constant(model_.kernels().spec(name), "THREADS"));
    CUdeviceptr xq = w_->xq.ptr(), xds = w_->xds.ptr();
    int blocks = n_values / 32;
    void* args[] = {&x, &xq, &xds, &blocks};
    launch(model_.kernels().get(name, "quantize_q8_1"), {ceil_div(uint64_t(blocks) * 8, threads)},
           {threads}, 0, args, name);
}

void GpuSession::matvec(const GpuMatrix& m, const GpuMatrix* up, CUdeviceptr x, bool x_is_quantized,
                        CUdeviceptr y, int T, const char* what) {
    const bool quant = m.quantized();
    if (quant && !x_is_quantized) quantize(x, T * m.cols);
    const std::string& spec_name = T == 1 ? m.spec_decode : m.spec_prefill;
    const jit::KernelSpec& spec = model_.kernels().spec(spec_name);
    const int cols = int(spec_constant(spec, "NCOLS"));
    const unsigned threads = unsigned(spec_constant(spec, "THREADS"));
    const unsigned rows_per_block = unsigned(constant_or(spec, "ROWS", 1));
    const std::string entry = spec.family + (up ? "_geglu" : "");
    const jit::Kernel& k = model_.kernels().get(spec_name, entry);
    const uint64_t bytes = m.bytes + (up ? up->bytes : 0);
    const std::string label = spec_name + (up ? " geglu " : " ") + what;
    int n_rows = m.rows;
    CUdeviceptr w = m.ptr, wu = up ? up->ptr : 0, residual = 0;
    for (int c0 = 0; c0 < T; c0 += cols) {
        CUdeviceptr out = y + uint64_t(c0) * m.rows * 4;
        if (quant) {
            CUdeviceptr xq = w_->xq.ptr() + uint64_t(c0) * m.cols;
            CUdeviceptr xds = w_->xds.ptr() + uint64_t(c0) * (m.cols / 32) * 8;
            void* args[] = {&w, &wu, &xq, &xds, &residual, &out, &n_rows};
            launch(k, {ceil_div(m.rows, rows_per_block)}, {threads}, 0, args, label, bytes);
        } else {
            CUdeviceptr xf = x + uint64_t(c0) * m.cols * 4;
            void* args[] = {&w, &wu, &xf, &residual, &out, &n_rows};
            launch(k, {ceil_div(m.rows, rows_per_block)}, {threads}, 0, args, label, bytes);
        }
    }
}

// ---- The forward pass -------------------------------------------------------------------------

void GpuSession::record_embedding(int T) {
    const Work& w = *w_;
    CUdeviceptr tokens = w.tokens();
    {
        const GpuTable& t = model_.token_embd();
        const jit::KernelSpec& spec = model_.kernels().spec(t.spec);
        const unsigned threads = unsigned(constant_or(spec, "THREADS", 256));
        CUdeviceptr table = t.ptr, out = w.x.ptr();
        float scale = cfg_.embed_scale();
        void* args[] = {&tokens, &T, &table, &out, &scale};
        launch(model_.kernels().get(t.spec, "embed_rows"), {unsigned(T)}, {threads}, 0, args,
               t.spec + " token_embd", uint64_t(T) * t.bytes / t.rows);
    }
    if (!cfg_.has_ple()) return;
    // PLE inputs of every layer: ((RMSNorm(W_proj e / sqrt(d)) * g) + table[tok] * sqrt(P)) /
    // sqrt(2).
    {
        const GpuTable& t = model_.ple_table();
        const jit::KernelSpec& spec = model_.kernels().spec(t.spec);
        const unsigned threads = unsigned(constant_or(spec, "THREADS", 256));
        CUdeviceptr table = t.ptr, out = w.ple_tok.ptr();
        float scale = std::sqrt(float(cfg_.ple_dim));
        void* args[] = {&tokens, &T, &table, &out, &scale};
        launch(model_.kernels().get(t.spec, "embed_rows"), {unsigned(T)}, {threads}, 0, args,
               t.spec + " per_layer_token_embd", uint64_t(T) * t.bytes / t.rows);
    }
    matvec(model_.ple_model_proj(), nullptr, w.x.ptr(), false, w.ple_ctx.ptr(), T,
           "per_layer_model_proj");
    {
        const std::string& name = model_.spec_ple_finish();
        const jit::KernelSpec& spec = model_.kernels().spec(name);
        const unsigned threads = unsigned(constant_or(spec, "THREADS", 128));
        CUdeviceptr ctx = w.ple_ctx.ptr(), tok = w.ple_tok.ptr(), norm = model_.ple_proj_norm(),
                    out = w.ple.ptr();
        float inv_sqrt_d = float(1.0 / std::sqrt(double(cfg_.d_model)));
        float eps = cfg_.rms_eps;
        void* args[] = {&ctx, &tok, &norm, &out, &T, &inv_sqrt_d, &eps};
        launch(model_.kernels().get(name, "ple_finish"), {unsigned(cfg_.n_layers), unsigned(T)},
               {threads}, 0, args, name);
    }
}

void GpuSession::record_attention(int l, int T, bool decode) {
    const Work& w = *w_;
    const LayerConfig& lc = cfg_.layers[l];
    const GpuLayer& gl = model_.layers()[l];
    const KvCache::Layer& kv = kv_.layer(l);
    const jit::KernelSpec& spec = model_.kernels().spec(gl.flash_spec);
    const int chunk = int(spec_constant(spec, "CHUNK"));
    const unsigned threads = unsigned(constant_or(spec, "THREADS", 128));
    const unsigned combine_threads = unsigned(constant_or(spec, "COMBINE_THREADS", 128));
    // The decode graph's split count is fixed for the whole context; eager prefill launches only
    // the splits its last position can use.
    int splits = w.layout.decode_splits[l];
    if (!decode) {
        const int end = pos_ + T;
        const int span = lc.sliding ? std::min(cfg_.sliding_window, end) : end;
        splits = std::min(splits, (span + chunk - 1) / chunk);
    }
    const uint64_t per_query_o = uint64_t(cfg_.n_heads) * splits * lc.head_dim;
    const uint64_t per_query_ml = uint64_t(cfg_.n_heads) * splits;
    const int batch = int(std::min<uint64_t>({uint64_t(T), w.layout.part_o_floats / per_query_o,
                                              w.layout.part_ml_pairs / per_query_ml}));
    const jit::Kernel& flash = model_.kernels().get(gl.flash_spec, "flash_decode");
    const jit::Kernel& combine = model_.kernels().get(gl.flash_spec, "flash_combine");
    const unsigned smem =
        unsigned(flash.max_dynamic_smem() > 48 * 1024 ? constant_or(spec, "SMEM", 0) : 0);
    const uint64_t q_dim = uint64_t(cfg_.q_dim(l));
    CUdeviceptr kc = kv.k, vc = kv.v, part_o = w.part_o.ptr(), part_ml = w.part_ml.ptr();
    int slots = kv.slots;
    for (int t0 = 0; t0 < T; t0 += batch) {
        int n = std::min(batch, T - t0);
        CUdeviceptr q = w.q.ptr() + t0 * q_dim * 4, out = w.attn.ptr() + t0 * q_dim * 4;
        CUdeviceptr positions = w.positions() + uint64_t(t0) * 4;
        void* fargs[] = {&q, &kc, &vc, &positions, &n, &slots, &splits, &part_o, &part_ml};
        launch(flash, {unsigned(lc.n_kv_heads), unsigned(splits), unsigned(n)}, {threads}, smem,
               fargs, gl.flash_spec + " flash_decode");
        void* cargs[] = {&part_o, &part_ml, &out, &n, &splits};
        launch(combine, {unsigned(cfg_.n_heads), unsigned(n)}, {combine_threads}, 0, cargs,
               gl.flash_spec + " flash_combine");
    }
}

void GpuSession::record_layer(int l, int T, bool decode) {
    const Work& w = *w_;
    const LayerConfig& lc = cfg_.layers[l];
    const GpuLayer& g = model_.layers()[l];
    const CUdeviceptr x = w.x.ptr(), h = w.h.ptr(), tmp = w.tmp.ptr(), xq = w.xq.ptr(),
                      xds = w.xds.ptr();

    // Attention block: x += post_attention_norm(Wo . attn(RoPE(norm(Wq h)), cache)).
    rmsnorm(model_.spec_prenorm(), x, g.attn_norm, 0, h, xq, xds, 0, T, "attn_norm");
    matvec(g.q, nullptr, h, true, w.q.ptr(), T, "attn_q");
    if (lc.has_kv) {
        matvec(g.k, nullptr, h, true, w.kraw.ptr(), T, "attn_k");
        if (lc.has_v_proj) matvec(g.v, nullptr, h, true, w.vraw.ptr(), T, "attn_v");
    }
    {
        const KvCache::Layer& kv = kv_.layer(l);
        const jit::KernelSpec& spec = model_.kernels().spec(g.attn_prep_spec);
        const unsigned threads = unsigned(constant_or(spec, "THREADS", 128));
        CUdeviceptr q = w.q.ptr(), kraw = w.kraw.ptr(), vraw = w.vraw.ptr(), qn = g.q_norm,
                    kn = g.k_norm, kc = kv.k, vc = kv.v, positions = w.positions();
        int slots = kv.slots;
        float base = lc.rope_base, eps = cfg_.rms_eps;
        void* args[] = {&q, &kraw, &vraw, &qn, &kn, &kc, &vc, &positions, &T, &slots, &base, &eps};
        launch(model_.kernels().get(g.attn_prep_spec, "attn_prep"), {unsigned(T)}, {threads}, 0,
               args, g.attn_prep_spec);
    }
    record_attention(l, T, decode);
    matvec(g.o, nullptr, w.attn.ptr(), false, tmp, T, "attn_output");
    rmsnorm(model_.spec_postnorm(), tmp, g.post_attention_norm, x, x, 0, 0, 0, T,
            "post_attention_norm");

    // FFN: x += post_ffw_norm(down(gelu(gate z) * up z)), z = ffn_norm(x).
    rmsnorm(model_.spec_prenorm(), x, g.ffn_norm, 0, h, xq, xds, 0, T, "ffn_norm");
    matvec(g.gate, &g.up, h, true, w.g.ptr(), T, "ffn_gate|up");
    matvec(g.down, nullptr, w.g.ptr(), false, tmp, T, "ffn_down");
    if (!cfg_.has_ple()) {
        // The layer output scale is fused into the last residual add of the layer.
        rmsnorm(model_.spec_postnorm_scaled(), tmp, g.post_ffw_norm, x, x, 0, 0, g.output_scale, T,
                "post_ffw_norm*layer_scale");
        return;
    }
    rmsnorm(model_.spec_postnorm(), tmp, g.post_ffw_norm, x, x, 0, 0, 0, T, "post_ffw_norm");

    // PLE injection: x = (x + post_norm(proj(gelu(inp_gate x) * ple[l]))) * layer_scale.
    matvec(g.inp_gate, nullptr, x, false, w.ple_gate.ptr(), T, "inp_gate");
    {
        const std::string& name = model_.spec_gelu_mul();
        const jit::KernelSpec& spec = model_.kernels().spec(name);
        const unsigned threads = unsigned(constant_or(spec, "THREADS", 256));
        CUdeviceptr gate = w.ple_gate.ptr(), out = w.ple_mul.ptr();
        CUdeviceptr other = w.ple.ptr() + uint64_t(l) * cfg_.ple_dim * 4;
        int stride = cfg_.n_layers * cfg_.ple_dim;
        void* args[] = {&gate, &other, &stride, &out, &T};
        launch(model_.kernels().get(name, "gelu_mul"),
               {ceil_div(uint64_t(T) * cfg_.ple_dim, threads)}, {threads}, 0, args, name);
    }
    matvec(g.proj, nullptr, w.ple_mul.ptr(), false, tmp, T, "ple_proj");
    rmsnorm(model_.spec_postnorm_scaled(), tmp, g.post_norm, x, x, 0, 0, g.output_scale, T,
            "ple_post_norm*layer_scale");
}

void GpuSession::record_forward(int T, bool decode) {
    record_embedding(T);
    for (int l = 0; l < cfg_.n_layers; ++l) record_layer(l, T, decode);
}

void GpuSession::record_readout(int row, Readout readout, int top_k) {
    const Work& w = *w_;
    const uint64_t d = uint64_t(cfg_.d_model);
    rmsnorm(model_.spec_prenorm(), w.x.ptr() + row * d * 4, model_.output_norm(), 0, w.h.ptr(),
            w.xq.ptr(), w.xds.ptr(), 0, 1, "output_norm");
    matvec(model_.lm_head(), nullptr, w.h.ptr(), true, w.logits.ptr(), 1, "lm_head");
    CUdeviceptr logits = w.logits.ptr(), scratch = w.readout_scratch();
    int vocab = cfg_.vocab_size;
    if (readout == Readout::Argmax) {
        const std::string& name = model_.spec_argmax();
        const jit::KernelSpec& spec = model_.kernels().spec(name);
        const unsigned threads = unsigned(constant_or(spec, "THREADS", 1024));
        const unsigned blocks = unsigned(constant_or(spec, "BLOCKS", 1));
        CUdeviceptr out = w.result_token();
        void* args[] = {&logits, &vocab, &scratch, &out};
        launch(model_.kernels().get(name, "softcap_argmax"), {blocks}, {threads}, 0, args, name);
    } else if (readout == Readout::TopK) {
        const std::string& name = model_.spec_topk();
        const jit::KernelSpec& spec = model_.kernels().spec(name);
        const unsigned threads = unsigned(constant_or(spec, "THREADS", 1024));
        const unsigned blocks = unsigned(constant_or(spec, "BLOCKS", 1));
        CUdeviceptr ids = w.result_ids(), values = w.result_values();
        int k = top_k;
        void* args[] = {&logits, &vocab, &k, &scratch, &ids, &values};
        launch(model_.kernels().get(name, "topk"), {blocks}, {threads}, 0, args, name);
    }
}

void GpuSession::record_all_logits(int T) {
    const Work& w = *w_;
    rmsnorm(model_.spec_prenorm(), w.x.ptr(), model_.output_norm(), 0, w.h.ptr(), w.xq.ptr(),
            w.xds.ptr(), 0, T, "output_norm");
    matvec(model_.lm_head(), nullptr, w.h.ptr(), true, w.all_logits.ptr(), T, "lm_head");
}

// ---- Steps ------------------------------------------------------------------------------------

StepOutput GpuSession::prefill(std::span<const int32_t> tokens, Readout readout, int top_k,
                               const std::function<void(int, int)>& progress) {
    check_tokens(tokens, 0);
    if (readout == Readout::TopK && (top_k < 1 || top_k > kMaxTopK))
        throw std::invalid_argument(
            fmt::format("top-k readout of {} candidates (1..{} supported)", top_k, kMaxTopK));
    const int chunk = model_.prefill_chunk();
    const int total = int(tokens.size());
    jit::Device::get().make_current();
    for (int t0 = 0; t0 < total; t0 += chunk) {
        const int T = std::min(chunk, total - t0);
        write_step_state(tokens.subspan(t0, T), pos_);
        record_forward(T, false);
        if (t0 + T == total) record_readout(T - 1, readout, top_k);
        pos_ += T;
        if (t0 + T < total) {
            // The pinned step state is rewritten by the next chunk.
            jit::check_driver(jit::driver().cuStreamSynchronize(jit::Device::get().stream()),
                              "prefill chunk");
            if (progress) progress(t0 + T, total);
        }
    }
    StepOutput out = read_result(readout, top_k);
    if (progress) progress(total, total);
    return out;
}

std::vector<float> GpuSession::prefill_logits(std::span<const int32_t> tokens) {
    check_tokens(tokens, 0);
    const int chunk = model_.prefill_chunk();
    const int total = int(tokens.size());
    const uint64_t V = uint64_t(cfg_.vocab_size);
    jit::Device::get().make_current();
    if (w_->all_logits_rows == 0) {
        w_->all_logits = jit::DeviceBuffer(uint64_t(w_->layout.rows) * V * 4);
        w_->all_logits_rows = w_->layout.rows;
    }
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
    const float cap = cfg_.final_softcap;
    if (cap > 0)
        for (float& v : out) v = std::tanh(v / cap) * cap;
    return out;
}

StepOutput GpuSession::decode(int32_t token, Readout readout, int top_k) {
    check_tokens({&token, 1}, 0);
    if (readout == Readout::TopK && (top_k < 1 || top_k > kMaxTopK))
        throw std::invalid_argument(
            fmt::format("top-k readout of {} candidates (1..{} supported)", top_k, kMaxTopK));
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    const jit::DriverApi& api = jit::driver();
    write_step_state({&token, 1}, pos_);
    if (!graphs_) {
        record_forward(1, true);
        record_readout(0, readout, top_k);
    } else {
        Graph* graph = nullptr;
        for (auto& g : graphs_list_)
            if (g->readout == readout && g->top_k == top_k) graph = g.get();
        if (!graph) {
            auto g = std::make_unique<Graph>();
            g->readout = readout;
            g->top_k = top_k;
            jit::check_driver(
                api.cuStreamBeginCapture(dev.stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                "cuStreamBeginCapture(decode step)");
            try {
                record_forward(1, true);
                record_readout(0, readout, top_k);
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
    StepOutput out = read_result(readout, top_k);
    ++pos_;
    return out;
}

std::vector<KernelTime> GpuSession::profile_decode_step(int32_t token) {
    check_tokens({&token, 1}, 0);
    jit::Device& dev = jit::Device::get();
    dev.make_current();
    Profiler prof;
    write_step_state({&token, 1}, pos_);
    profiler_ = &prof;
    try {
        record_forward(1, true);
        record_readout(0, Readout::Argmax, 0);
    } catch (...) {
        profiler_ = nullptr;
        throw;
    }
    profiler_ = nullptr;
    dev.synchronize();
    std::map<std::string, KernelTime> by_label;
    for (const auto& e : prof.entries) {
        float ms = 0;
        jit::check_driver(jit::driver().cuEventElapsedTime(&ms, e.start, e.stop),
                          "cuEventElapsedTime");
        KernelTime& k = by_label[e.label];
        k.label = e.label;
        k.launches += 1;
        k.microseconds += double(ms) * 1000.0;
        k.weight_bytes += e.bytes;
    }
    std::vector<KernelTime> out;
    for (auto& [label, k] : by_label) out.push_back(k);
    std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) {
        return a.microseconds > b.microseconds;
    });
    return out;
}

}  // namespace gj::gemma4
