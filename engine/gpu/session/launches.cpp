// GpuSession's launch helpers: one per kernel kind the forward pass enqueues (norms, activation
// quantization and conversion, matvecs, the tensor-core GEMMs, cuBLAS products), each reading its
// launch geometry from the kernel spec's constants. Every launch goes through launch() or
// profiled(), where the profiler hooks in.
#include "engine/gpu/session/session_internal.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string_view>

namespace gj::gemma4 {

void GpuSession::launch(const jit::Kernel& k, jit::LaunchDims grid, jit::LaunchDims block,
                        unsigned smem, void** args, const std::string& label, LaunchCost cost) {
    // Not under the profiler: its events around every launch time each kernel alone.
    const bool dependent = pdl_ && !profiler_;
    profiled(label, cost, [&] { k.launch(grid, block, smem, stream_, args, dependent); });
    ++paths_.launches;
    if (dependent && k.waits_on_grid()) ++paths_.dependent;
}

GpuSession::Input GpuSession::normed(int row) const {
    const uint64_t d = uint64_t(cfg_.d_model);
    if (normed_f16_)
        return Input{.f = w_->h.ptr() + row * d * 4, .h = w_->xhalf.ptr() + row * d * 2};
    return Input{w_->h.ptr() + row * d * 4, w_->xq.ptr() + row * d,
                 w_->xds.ptr() + row * (d / 32) * 8};
}

bool GpuSession::attention_input_f16(int l, int T) const {
    const GpuLayer& g = model_.layers()[size_t(l)];
    const LayerConfig& lc = cfg_.layers[size_t(l)];
    return f16_product(g.q, T) && (!lc.has_kv || f16_product(g.k, T)) &&
           (!lc.has_kv || !lc.has_v_proj || f16_product(g.v, T));
}

bool GpuSession::ffn_input_f16(const GpuLayer& g, int T) const {
    return !g.moe && f16_product(g.gate, T) && f16_product(g.up, T);
}

void GpuSession::pre_norm(CUdeviceptr x, CUdeviceptr w, int T, const char* what, bool f16) {
    const std::string& name = model_.spec_prenorm(f16);
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned tpr = constant(spec, "TPR"), rpb = constant(spec, "RPB");
    CUdeviceptr residual = 0, y = w_->h.ptr(), yq = f16 ? w_->xhalf.ptr() : w_->xq.ptr(),
                yds = f16 ? 0 : w_->xds.ptr();
    float eps = cfg_.rms_eps;
    void* args[] = {&x, &w, &residual, &y, &yq, &yds, &T, &eps};
    launch(model_.kernels().get(name, "rmsnorm"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
           name + " " + what);
    normed_f16_ = f16;
    paths_.norm_f16 += f16;
}

void GpuSession::post_norm(const std::string& name, CUdeviceptr u, CUdeviceptr w, CUdeviceptr scale,
                           CUdeviceptr w2, int T, const char* what, bool f16,
                           CUdeviceptr residual) {
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned tpr = constant(spec, "TPR"), rpb = constant(spec, "RPB");
    CUdeviceptr x = w_->x.ptr(), yq = f16 ? w_->xhalf.ptr() : w_->xq.ptr(),
                yds = f16 ? 0 : w_->xds.ptr();
    if (residual == 0) residual = x;
    float eps = cfg_.rms_eps;
    normed_f16_ = f16;
    paths_.norm_f16 += f16;
    const unsigned bf16_planes = constant(spec, "X_BF16");
    paths_.norm_bf16_in += bf16_planes == 1;
    paths_.norm_bf16_planes += bf16_planes > 1;
    if (spec.entries.at(0) == "rmsnorm") {  // x += norm(u) * w, quantized
        void* args[] = {&u, &w, &residual, &x, &yq, &yds, &T, &eps};
        launch(model_.kernels().get(name, "rmsnorm"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
               name + " " + what);
        return;
    }
    CUdeviceptr y2 = w_->h.ptr();
    void* args[] = {&u, &w, &residual, &x, &scale, &w2, &y2, &yq, &yds, &T, &eps};
    launch(model_.kernels().get(name, "rmsnorm_ext"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
           name + " " + what);
}

void GpuSession::post_norm_lsa(const std::string& name, CUdeviceptr u, CUdeviceptr w,
                               CUdeviceptr scale, CUdeviceptr w2, int T, const char* what) {
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned tpr = constant(spec, "TPR"), rpb = constant(spec, "RPB");
    uint64_t offset = u - w_->tp_sym.ptr();  // the same in every rank's window
    jit::Nccl::Window win = w_->tp_sym.window();
    CUdeviceptr x = w_->x.ptr(), y2 = w_->h.ptr(), yq = w_->xq.ptr(), yds = w_->xds.ptr();
    float eps = cfg_.rms_eps;
    normed_f16_ = false;
    void* args[] = {&offset, &win, w_->tp_dev_comm.bytes(), &w, &x, &x, &scale, &w2, &y2, &yq, &yds,
                    &T,      &eps};
    launch(model_.kernels().get(name, "rmsnorm_ext_lsa"), {ceil_div(T, rpb)}, {tpr * rpb}, 0, args,
           name + " " + what);
}

void GpuSession::push_product(const GpuMatrix& m, Input in, int which, const char* what) {
    if (m.quantized()) in = with_q8(in, m.cols);
    const jit::KernelSpec& spec = model_.kernels().spec(m.spec_push);
    const auto [threads, rows_per_block] = matvec_launch(spec, false);
    CUdeviceptr w = m.ptr, xq = m.quantized() ? in.q : in.f, xds = in.ds;
    CUdeviceptr* to = w_->push_to[which];  // the kernel takes PUSH of them, by value
    int n_rows = m.rows;
    void* quant_args[] = {&w, &xq, &xds, to, &n_rows};
    void* float_args[] = {&w, &xq, to, &n_rows};
    launch(model_.kernels().get(m.spec_push, spec.family + "_push"),
           {ceil_div(m.rows, rows_per_block)}, {threads}, 0,
           m.quantized() ? quant_args : float_args, m.spec_push + " " + what,
           LaunchCost{m.bytes, 2.0 * double(m.rows) * m.cols, WorkKind::Gemm});
}

void GpuSession::post_norm_push(const std::string& name, int which, CUdeviceptr w,
                                CUdeviceptr scale, CUdeviceptr w2, const char* what) {
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned tpr = constant(spec, "TPR"), rpb = constant(spec, "RPB");
    CUdeviceptr slots = w_->push_slot(which, 0);  // rank p's slot follows rank p - 1's
    uint64_t slot = uint64_t(cfg_.d_model);       // (floats)
    CUdeviceptr x = w_->x.ptr(), y2 = w_->h.ptr(), yq = w_->xq.ptr(), yds = w_->xds.ptr();
    float eps = cfg_.rms_eps;
    int T = 1;
    normed_f16_ = false;
    void* args[] = {&slots, &slot, w_->tp_dev_comm.bytes(), &w, &x, &x, &scale, &w2, &y2, &yq, &yds,
                    &T,     &eps};
    launch(model_.kernels().get(name, "rmsnorm_ext_lsa_push"), {ceil_div(T, rpb)}, {tpr * rpb}, 0,
           args, name + " " + what);
    ++paths_.norm_lsa;
    ++paths_.push;
}

void GpuSession::quantize(CUdeviceptr x, int n_values) {
    quantize(x, n_values, w_->xq.ptr(), w_->xds.ptr());
}

void GpuSession::quantize(CUdeviceptr x, int n_values, CUdeviceptr xq, CUdeviceptr xds) {
    const std::string& name = model_.spec_quantize();
    const unsigned threads = constant(model_.kernels().spec(name), "THREADS");
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
    if (blas_for(m, T)) {
        blas_product(m, up, in, y, T, what);
        return 1;
    }
    if (chunk_products(T) && !m.spec_gemm.empty())
        return gemm(m, up, in, up ? GemmOut::Geglu : GemmOut::Plain, y, 0, T, what, partials_ok);
    if (quant) in = with_q8(in, T * m.cols);
    // One column: the decode specialization; more: groups of kPrefillCols columns (the buffers
    // hold whole groups, so a last partial group computes harmless padding columns).
    const std::string& spec_name = T == 1 ? m.spec_decode : m.spec_prefill;
    const jit::KernelSpec& spec = model_.kernels().spec(spec_name);
    const int cols = int(spec_constant(spec, "NCOLS"));
    const auto [threads, rows_per_block] = matvec_launch(spec, up != nullptr);
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

bool GpuSession::fused_qkv(const GpuLayer& g, const LayerConfig& lc, int T) const {
    if (!fuse_qkv_ || !lc.has_kv || chunk_products(T)) return false;
    if (T == 1 && !g.spec_qkv_multi_v.empty()) return true;
    const std::string& spec = T == 1 ? g.q.spec_decode : g.q.spec_prefill;
    for (const GpuMatrix* m : {&g.q, &g.k, lc.has_v_proj ? &g.v : nullptr}) {
        if (!m) continue;
        if (!m->quantized() || (T == 1 ? m->spec_decode : m->spec_prefill) != spec) return false;
    }
    const jit::KernelSpec& s = model_.kernels().spec(spec);
    return T <= int(spec_constant(s, "NCOLS")) && spec_has_entry(s, s.family + "_multi");
}

CUdeviceptr GpuSession::copy_ahead(const GpuMatrix& m) const {
    return w_->wdeq.ptr() + (deq_layer_ % 2) * model_.dequant_slot_bytes() + m.scratch_offset;
}

bool GpuSession::merged_qkv(const GpuLayer& g, int T) const {
    // The layer's copies are made together, ahead of it (dequantize_layer makes every copy
    // whose product is an F16 cuBLAS one); copies made on the spot (deq_layer_ < 0, before each
    // product of its own) would not all exist when the merged product runs.
    return g.qkv_one_product && deq_layer_ >= 0 && f16_product(g.q, T) && f16_product(g.k, T) &&
           (!g.v.present() || f16_product(g.v, T));
}

void GpuSession::blas_qkv(const GpuLayer& g, Input in, int T) {
    if (!in.h)
        throw std::logic_error("blas_qkv: the Q|K|V product needs the f16 form of its input");
    const int rows = g.qkv_rows(), cols = g.q.cols;
    const CUdeviceptr weights = copy_ahead(g.q);  // K's and V's copies follow Q's
    const int sm_target = blas_sm_target(T);
    profiled(fmt::format("cublas.f16.k{}.n{} attn_q|k|v", cols, rows),
             LaunchCost{uint64_t(rows) * cols * 2, 2.0 * double(rows) * cols * T, WorkKind::Gemm},
             [&] {
                 model_.blas()->gemm(stream_, jit::BlasType::F16, rows, T, cols, weights, in.h,
                                     w_->qkv.ptr(), sm_target);
             });
    ++paths_.blas;
    paths_.blas_beside_copies += sm_target > 0;
    ++paths_.qkv_merged;
}

void GpuSession::matvec_qkv(const GpuLayer& g, const LayerConfig& lc, Input in, int T) {
    const Work& w = *w_;
    in = with_q8(in, T * g.q.cols);
    const bool multi_v = T == 1 && !g.spec_qkv_multi_v.empty();
    const std::string& name = multi_v  ? g.spec_qkv_multi_v
                              : T == 1 ? g.q.spec_decode
                                       : g.q.spec_prefill;
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const auto [threads, rows] = matvec_launch(spec, false);
    const GpuMatrix* v = lc.has_v_proj ? &g.v : nullptr;
    CUdeviceptr w0 = g.q.ptr, w1 = g.k.ptr, w2 = v ? v->ptr : 0;
    CUdeviceptr y0 = w.q.ptr(), y1 = w.kraw.ptr(), y2 = w.vraw.ptr();
    int n0 = g.q.rows, n1 = g.k.rows, n2 = v ? v->rows : 0;
    const unsigned blocks = ceil_div(n0, rows) + ceil_div(n1, rows) + ceil_div(n2, rows);
    const uint64_t bytes = g.q.bytes + g.k.bytes + (v ? v->bytes : 0);
    const double flops = 2.0 * double(n0 + n1 + n2) * g.q.cols * T;
    void* args[] = {&w0, &w1, &w2, &in.q, &in.ds, &y0, &y1, &y2, &n0, &n1, &n2};
    launch(model_.kernels().get(name, spec.family + "_multi"), {blocks}, {threads}, 0, args,
           name + " multi attn_q|k|v", LaunchCost{bytes, flops, WorkKind::Gemm});
    ++paths_.qkv_fused;
    paths_.qkv_multi_v += multi_v;
}

bool GpuSession::fused_ple_gate(const GpuMatrix& gate, int T) const {
    return fuse_ple_ && !gate.quantized() && !blas_for(gate, T);
}

void GpuSession::matvec_gelu_mul(const GpuMatrix& m, CUdeviceptr x, CUdeviceptr other,
                                 int other_stride, CUdeviceptr y, int T) {
    const std::string& spec_name = T == 1 ? m.spec_decode : m.spec_prefill;
    const jit::KernelSpec& spec = model_.kernels().spec(spec_name);
    const int cols = int(spec_constant(spec, "NCOLS"));
    const auto [threads, rows_per_block] = matvec_launch(spec, false);
    const jit::Kernel& k = model_.kernels().get(spec_name, spec.family + "_gelu_mul");
    CUdeviceptr w = m.ptr;
    int n_rows = m.rows;
    for (int c0 = 0; c0 < T; c0 += cols) {
        CUdeviceptr xf = x + uint64_t(c0) * m.cols * 4, out = y + uint64_t(c0) * m.rows * 4,
                    o = other + uint64_t(c0) * other_stride * 4;
        void* args[] = {&w, &xf, &o, &other_stride, &out, &n_rows};
        launch(k, {ceil_div(m.rows, rows_per_block)}, {threads}, 0, args,
               spec_name + " gelu_mul inp_gate",
               LaunchCost{m.bytes, 2.0 * double(m.rows) * m.cols * std::min(cols, T - c0),
                          WorkKind::Gemm});
    }
    ++paths_.ple_gate_fused;
}

bool GpuSession::ple_input(const GpuMatrix& m, const char* entry, int T) const {
    if (!ple_input_ || T != 1 || blas_for(m, T) || chunk_products(T)) return false;
    const jit::KernelSpec& spec = model_.kernels().spec(m.spec_decode);
    return spec_has_entry(spec, spec.family + entry);
}

void GpuSession::matvec_ple_input(const GpuMatrix& m, const char* entry, CUdeviceptr a,
                                  CUdeviceptr b, CUdeviceptr c, CUdeviceptr d, CUdeviceptr other,
                                  CUdeviceptr y) {
    const jit::KernelSpec& spec = model_.kernels().spec(m.spec_decode);
    const auto [threads, rows_per_block] = matvec_launch(spec, false);
    const jit::Kernel& k = model_.kernels().get(m.spec_decode, spec.family + entry);
    CUdeviceptr w = m.ptr;
    int n_rows = m.rows;
    float eps = cfg_.rms_eps;
    const std::string_view e = entry;
    void* norm_args[] = {&w, &a, &b, &c, &d, &y, &n_rows, &eps};
    void* gelu_norm_args[] = {&w, &a, &b, &c, &d, &other, &y, &n_rows, &eps};
    void* gelu_args[] = {&w, &a, &b, &y, &n_rows};
    void** args = e == "_norm_in" ? norm_args : e == "_gelu_in" ? gelu_args : gelu_norm_args;
    launch(k, {ceil_div(m.rows, rows_per_block)}, {threads}, 0, args,
           m.spec_decode + " " + std::string(e.substr(1)) +
               (e == "_gelu_in" ? " ple_proj" : " inp_gate"),
           LaunchCost{m.bytes, 2.0 * double(m.rows) * m.cols, WorkKind::Gemm});
    ++paths_.ple_input;
    paths_.ple_gate_fused += e == "_gelu_mul_norm_in";
}

GpuSession::Input GpuSession::with_q8(Input in, int n) {
    if (in.q) return in;
    quantize(in.f, n);
    in.q = w_->xq.ptr();
    in.ds = w_->xds.ptr();
    return in;
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
    if (out == w_->xhalf.ptr()) normed_f16_ = false;  // the norm's f16 output is overwritten
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
    } else {
        in = with_q8(in, T * m.cols);
        static const char* const entries[] = {"mmq", "mmq_geglu", "mmq_geglu_q8"};
        void* args[] = {&w, &wu, &in.q, &in.ds, &out, &yds, &T, &n_rows};
        launch(model_.kernels().get(m.spec_gemm, entries[form]),
               {ceil_div(m.rows, constant(spec, "BN")), ceil_div(T, constant(spec, "BM")), splits},
               {constant(spec, "THREADS")}, constant(spec, "SMEM"), args,
               m.spec_gemm + " " + entries[form] + " " + what, cost);
        ++paths_.mmq;
    }
    if (splits > 1 && partials_ok) return int(splits);  // the caller's post-norm sums the planes
    if (splits > 1) sum_split_k(m, T, y, false, what);
    return 1;
}

bool GpuSession::splits_k(const GpuMatrix& m) const {
    return !m.spec_gemm.empty() && constant(model_.kernels().spec(m.spec_gemm), "SPLITS") > 1;
}

CUdeviceptr GpuSession::product(int parts) const {
    return parts > 1 ? w_->gemm_split.ptr() : w_->tmp.ptr();
}

CUdeviceptr GpuSession::row_parallel_out(int T, int which) const {
    // Up to a decode step's rows: NCCL's low-latency symmetric kernels pay for short sums, and
    // one small window serves every layer.
    const uint64_t rows = w_->layout.sym_rows();
    if (w_->tp_sym.ptr() && uint64_t(T) <= uint64_t(w_->layout.sequences))
        return w_->tp_sym.ptr() + uint64_t(which) * rows * cfg_.d_model * 4;
    return w_->tmp.ptr();
}

void GpuSession::sum_split_k(const GpuMatrix& m, int T, CUdeviceptr y, bool bf16,
                             const char* what) {
    const jit::KernelSpec& spec = model_.kernels().spec(m.spec_gemm);
    const std::string entry = spec.family + (bf16 ? "_reduce_bf16" : "_reduce");
    CUdeviceptr planes = w_->gemm_split.ptr();
    int n = T * m.rows;
    void* args[] = {&planes, &y, &n};
    launch(model_.kernels().get(m.spec_gemm, entry), {ceil_div(n, 256)}, {256}, 0, args,
           m.spec_gemm + " " + entry + " " + what, LaunchCost{0, 0, WorkKind::Gemm});
}

GpuSession::Product GpuSession::row_parallel_product(const GpuMatrix& m, Input in, int T, int which,
                                                     bool bf16_ok, const char* what) {
    // One GPU's post-norm sums split-K planes itself (rmsnorm PARTS); a tensor-parallel rank
    // sums them before its all-reduce, which then moves T x d values whatever each rank's split.
    const bool tp = model_.tensor_parallel().active();
    // (Not where the chunk's products are pushed: the push converts an fp32 product.)
    const bool round = bf16_all_reduce(T, bf16_ok) && !prefill_pushes(T, bf16_ok) &&
                       chunk_products(T) && !blas_for(m, T) && splits_k(m);
    const CUdeviceptr y = row_parallel_out(T, which);
    const int parts = matvec(m, nullptr, in, y, T, what, !tp || round);
    if (!round || parts == 1) return {parts > 1 ? product(parts) : y, parts};
    sum_split_k(m, T, w_->tp_bf16_ptr(), true, what);
    ++paths_.product_bf16;
    return {w_->tp_bf16_ptr(), 1};
}

GpuSession::Input GpuSession::ffn_gate_up(const GpuLayer& g, int T) {
    const Work& w = *w_;
    // cuBLAS gate and up products whose GeGLU feeds an F16 down product: written in f16 at once.
    if (blas_for(g.gate, T) && f16_product(g.down, T)) {
        blas_product(g.gate, &g.up, with_f16(normed(), T * g.gate.cols, T, g.gate, &g.up, "ffn"),
                     w.g.ptr(), T, "ffn_gate|up", w.xhalf.ptr());
        return Input{.h = w.xhalf.ptr()};
    }
    // The GEMM writes the GeGLU product straight in the down projection's input form: bf16 for
    // the wgmma GEMM, Q8_1 for the int8 one (neither when a product takes cuBLAS at this length).
    const bool gate_gemm = chunk_products(T) && !g.gate.spec_gemm.empty() && !blas_for(g.gate, T);
    if (gate_gemm && g.gate.gemm_bf16 && g.down.gemm_bf16 && !blas_for(g.down, T)) {
        gemm(g.gate, &g.up, normed(), GemmOut::GegluNext, w.gbf.ptr(), 0, T, "ffn_gate|up");
        return Input{0, 0, 0, w.gbf.ptr()};
    }
    // (Q8_1 suits a down product on the int8 GEMM or the dp4a matvecs, not cuBLAS or wgmma.)
    const bool down_reads_q8 = g.down.quantized() && !g.down.gemm_bf16 && !blas_for(g.down, T);
    if (gate_gemm && !g.gate.gemm_bf16 && g.gate.rows % 32 == 0 && down_reads_q8) {
        gemm(g.gate, &g.up, normed(), GemmOut::GegluNext, w.gq.ptr(), w.gds.ptr(), T,
             "ffn_gate|up");
        return Input{0, w.gq.ptr(), w.gds.ptr()};
    }
    matvec(g.gate, &g.up, normed(), w.g.ptr(), T, "ffn_gate|up");
    return Input{w.g.ptr()};
}

CUdeviceptr GpuSession::dequantized(const GpuMatrix& m, int slot) {
    const std::string& name = m.spec_dequant;
    const jit::KernelSpec& spec = model_.kernels().spec(name);
    const unsigned threads = constant(spec, "THREADS"), elems = constant(spec, "ELEMS");
    CUdeviceptr src = m.ptr,
                dst = w_->wdeq.ptr() + slot * model_.dequant_slot_bytes() + m.scratch_offset;
    int rows = m.rows;
    void* args[] = {&src, &dst, &rows};
    launch(model_.kernels().get(name, "dequant_f16"),
           {ceil_div(uint64_t(m.rows) * m.cols / elems, threads)}, {threads}, 0, args,
           name + " " + m.name, LaunchCost{m.bytes + uint64_t(m.rows) * m.cols * 2});
    ++paths_.dequant;
    return dst;
}

bool GpuSession::blas_for(const GpuMatrix& m, int T) const {
    return chunk_products(T) && m.blas && model_.blas() &&
           (m.spec_dequant.empty() || copies_pay(m, T));
}

bool GpuSession::f16_product(const GpuMatrix& m, int T) const {
    return blas_for(m, T) && (!m.spec_dequant.empty() || m.type == ggml::Type::F16);
}

GpuSession::Input GpuSession::with_f16(Input in, int n, int T, const GpuMatrix& m,
                                       const GpuMatrix* also, const std::string& what) {
    if (in.h || !(f16_product(m, T) || (also && f16_product(*also, T)))) return in;
    in.h = convert(in.f, n, "f32_to_f16", w_->xhalf.ptr(), what);
    return in;
}

void GpuSession::blas_product(const GpuMatrix& m, const GpuMatrix* up, Input in, CUdeviceptr y,
                              int T, const char* what, CUdeviceptr y_f16) {
    jit::Blas& blas = *model_.blas();
    // Quantized weights are multiplied as the F16 copy dequantized ahead.
    const bool kquant = !m.spec_dequant.empty();
    const jit::BlasType type = kquant || m.type == ggml::Type::F16 ? jit::BlasType::F16
                               : m.type == ggml::Type::F32         ? jit::BlasType::F32
                                                                   : jit::BlasType::BF16;
    // cuBLAS multiplies two matrices of one type: the f16 form made before, or a conversion.
    CUdeviceptr x = in.f;
    if (type == jit::BlasType::F16 && in.h)
        x = in.h;
    else if (type != jit::BlasType::F32)
        x = convert(x, T * m.cols, type == jit::BlasType::F16 ? "f32_to_f16" : "f32_to_bf16",
                    w_->xhalf.ptr(), what);
    const int sm_target = blas_sm_target(T);
    // `rows` rows of weights (each m.cols wide, `bytes` in all) times the T input rows.
    auto gemm_rows = [&](CUdeviceptr weights, int rows, uint64_t bytes, ggml::Type wtype,
                         CUdeviceptr out, const char* label) {
        profiled(fmt::format("cublas.{}.k{}.n{} {}", ggml::type_name(wtype), m.cols, rows, label),
                 LaunchCost{bytes, 2.0 * double(rows) * m.cols * T, WorkKind::Gemm},
                 [&] { blas.gemm(stream_, type, rows, T, m.cols, weights, x, out, sm_target); });
        ++paths_.blas;
        paths_.blas_beside_copies += sm_target > 0;
    };
    auto product = [&](const GpuMatrix& w, CUdeviceptr out, const char* label) {
        // A layer's copies were made ahead (dequantize_layer); others (the PLE projection) now.
        const CUdeviceptr weights = !kquant           ? w.ptr
                                    : deq_layer_ >= 0 ? copy_ahead(w)
                                                      : dequantized(w);
        gemm_rows(weights, w.rows, kquant ? uint64_t(w.rows) * w.cols * 2 : w.bytes,
                  kquant ? ggml::Type::F16 : w.type, out, label);
    };
    if (!up) {
        product(m, y, what);
        return;
    }
    const std::string& name = m.spec_geglu;
    // One product over the gate and up copies side by side (made together, ahead of the layer),
    // each token's gate|up row into the gate buffer; the GeGLU reads its two halves.
    if (m.up_follows && deq_layer_ >= 0 && blas_for(*up, T)) {
        CUdeviceptr gu = w_->fgate.ptr();
        const int rows = m.rows + up->rows;
        gemm_rows(copy_ahead(m), rows, uint64_t(rows) * m.cols * 2, ggml::Type::F16, gu,
                  "ffn_gate|up");
        ++paths_.gate_up_merged;
        if (y_f16 == w_->xhalf.ptr()) normed_f16_ = false;
        const bool f16 = y_f16 != 0;
        CUdeviceptr out = f16 ? y_f16 : y;
        void* args[] = {&gu, &out, &T};
        launch(model_.kernels().get(name, f16 ? "gelu_mul_f16_pair" : "gelu_mul_pair"),
               {ceil_div(uint64_t(T) * m.rows, 512)}, {128}, 0, args,
               name + (f16 ? " f16 pair ffn" : " pair ffn"));
        paths_.geglu_f16 += f16;
        return;
    }
    // GeGLU from two products: gate into its own buffer, up into y, then y = gelu(gate) * y.
    CUdeviceptr gate = w_->fgate.ptr();
    product(m, gate, "ffn_gate");
    product(*up, y, "ffn_up");
    if (y_f16) {
        if (y_f16 == w_->xhalf.ptr()) normed_f16_ = false;
        void* args[] = {&gate, &y, &y_f16, &T};
        launch(model_.kernels().get(name, "gelu_mul_f16"), {ceil_div(uint64_t(T) * m.rows, 512)},
               {128}, 0, args, name + " f16 ffn");
        ++paths_.geglu_f16;
        return;
    }
    void* args[] = {&gate, &y, &T};
    launch(model_.kernels().get(name, "gelu_mul_inplace"), {ceil_div(uint64_t(T) * m.rows, 128)},
           {128}, 0, args, name + " inplace ffn");
}

}  // namespace gj::gemma4
