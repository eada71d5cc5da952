// `gemmajit bench --model FILE -p 512 -n 128 -d 0,4096 -r 5`: prompt processing (pp) and token
// generation (tg) speed of the GPU forward, printed like llama-bench, as the median over the
// repetitions with (min..max). For tg also the weight bytes read per token as GB/s and as a share
// of the device's copy bandwidth, measured once here with a device-to-device copy (bytes read +
// written, like DEVICE.md). Each test first runs once unmeasured (kernel caches, graph capture,
// clocks). --profile adds the kernel-time breakdown of each prompt (with TFLOP/s and the split
// into matrix products, attention and the rest) and of one decode step, at each depth. -b B runs
// tg as B sequences decoding together (a server's continuous batching): one forward pass per
// step for all B, tokens/s counted over all of them, GB/s from the steps per second.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/gpu/gpu_model.h"
#include "engine/gpu/session.h"
#include "engine/gpu/tensor_parallel.h"
#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "tools/cmd_options.h"
#include "tools/commands.h"

namespace gj::tools {

namespace {

struct BenchArgs {
    std::string model;
    std::vector<int> prompt = {512};
    std::vector<int> gen = {128};
    std::vector<int> depth = {0};
    std::vector<int> batch = {1};
    int reps = 5;
    bool profile = false;
    uint64_t seed = 42;
    int tp = 0;  // --tp (0: GEMMAJIT_TP)
};

struct Stats {
    double median = 0, min = 0, max = 0;
};
Stats stats(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The weight type a row is labelled with: the one holding most of the layer matrices' bytes, so
// a Q4_K_M file reads as q4_k rather than as its Q6_K LM head.
std::string main_weight_type(const gemma4::GpuModel& m) {
    const std::map<ggml::Type, uint64_t> bytes = m.layer_bytes_by_type();
    if (bytes.empty()) return ggml::type_name(m.lm_head().type);
    return ggml::type_name(
        std::max_element(bytes.begin(), bytes.end(), [](const auto& a, const auto& b) {
            return a.second < b.second;
        })->first);
}

// Device-to-device copy bandwidth in bytes/s (read + written), median of 10 copies of 1 GiB.
double copy_bandwidth() {
    jit::Device& dev = jit::Device::get();
    const jit::DriverApi& api = jit::driver();
    const size_t bytes = size_t(1) << 30;
    jit::DeviceBuffer a(bytes), b(bytes);
    a.zero();
    CUevent e0, e1;
    jit::check_driver(api.cuEventCreate(&e0, CU_EVENT_DEFAULT), "cuEventCreate");
    jit::check_driver(api.cuEventCreate(&e1, CU_EVENT_DEFAULT), "cuEventCreate");
    std::vector<double> rates;
    for (int i = 0; i < 12; ++i) {
        jit::check_driver(api.cuEventRecord(e0, dev.stream()), "cuEventRecord");
        jit::check_driver(api.cuMemcpyDtoDAsync(b.ptr(), a.ptr(), bytes, dev.stream()),
                          "cuMemcpyDtoDAsync");
        jit::check_driver(api.cuEventRecord(e1, dev.stream()), "cuEventRecord");
        jit::check_driver(api.cuEventSynchronize(e1), "cuEventSynchronize");
        float ms = 0;
        jit::check_driver(api.cuEventElapsedTime(&ms, e0, e1), "cuEventElapsedTime");
        if (i >= 2) rates.push_back(2.0 * double(bytes) / (double(ms) * 1e-3));
    }
    api.cuEventDestroy(e0);
    api.cuEventDestroy(e1);
    return stats(rates).median;
}

std::vector<int32_t> random_tokens(int n, int vocab, std::mt19937_64& rng) {
    std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
    std::vector<int32_t> t(size_t(std::max(n, 0)));
    for (auto& v : t) v = pick(rng);
    return t;
}

std::string fmt_stats(const Stats& s) {
    return fmt::format("{:.2f} ({:.2f}..{:.2f})", s.median, s.min, s.max);
}

// Per-kernel table of a profiled step: time, share, and GB/s of weights read (decode) or
// TFLOP/s (prefill); for prefill also the split into matrix products, attention and the rest.
void print_profile(const std::string& title, const std::vector<gemma4::KernelTime>& times,
                   double copy_bw, bool prefill) {
    double total = 0, by_kind[3] = {0, 0, 0}, flops_by_kind[3] = {0, 0, 0};
    for (const auto& k : times) {
        total += k.microseconds;
        by_kind[int(k.kind)] += k.microseconds;
        flops_by_kind[int(k.kind)] += k.flops;
    }
    fmt::print("\n{} (eager, events around each launch; sum {:.0f} us):\n", title, total);
    if (prefill)
        fmt::print("  {:<64} {:>5} {:>9} {:>6} {:>8}\n", "kernel", "calls", "us", "%", "TFLOP/s");
    else
        fmt::print("  {:<64} {:>5} {:>9} {:>6} {:>8} {:>7}\n", "kernel", "calls", "us", "%", "GB/s",
                   "% copy");
    for (const auto& k : times) {
        const double share = 100.0 * k.microseconds / total;
        if (prefill) {
            const double tf = k.flops > 0 ? k.flops / (k.microseconds * 1e6) : 0;
            fmt::print("  {:<64} {:>5} {:>9.1f} {:>5.1f}% {:>8}\n", k.label, k.launches,
                       k.microseconds, share, tf > 0 ? fmt::format("{:.1f}", tf) : "");
            continue;
        }
        const double gb = k.weight_bytes ? double(k.weight_bytes) / (k.microseconds * 1e3) : 0;
        fmt::print("  {:<64} {:>5} {:>9.1f} {:>5.1f}% {:>8} {:>7}\n", k.label, k.launches,
                   k.microseconds, share, gb > 0 ? fmt::format("{:.0f}", gb) : "",
                   gb > 0 ? fmt::format("{:.1f}%", 100.0 * gb * 1e9 / copy_bw) : "");
    }
    // MoE models: the time of the router, the routed experts and the dense MLP (by label).
    double router = 0, experts = 0, dense = 0;
    for (const auto& k : times) {
        if (k.label.find("router") != std::string::npos)
            router += k.microseconds;
        else if (k.label.find("experts") != std::string::npos)
            experts += k.microseconds;
        else if (k.label.find(" ffn_") != std::string::npos)
            dense += k.microseconds;
    }
    if (experts > 0)
        fmt::print(
            "  MoE split: router {:.1f} us ({:.1f}%), routed experts {:.1f} us ({:.1f}%), "
            "dense MLP {:.1f} us ({:.1f}%)\n",
            router, 100.0 * router / total, experts, 100.0 * experts / total, dense,
            100.0 * dense / total);
    if (prefill) {
        const char* names[3] = {"matrix products", "attention", "the rest"};
        fmt::print("  split:");
        for (int i = 0; i < 3; ++i)
            fmt::print(" {} {:.2f} ms ({:.1f}%{}){}", names[i], by_kind[i] / 1e3,
                       100.0 * by_kind[i] / total,
                       flops_by_kind[i] > 0
                           ? fmt::format(", {:.1f} TFLOP/s", flops_by_kind[i] / (by_kind[i] * 1e6))
                           : "",
                       i < 2 ? ";" : "");
        fmt::print("\n");
    }
    fmt::print("\n");
}

void run_bench(const BenchArgs& a) {
    const int tp = tp_ranks(a.tp);
    if (a.reps < 1) throw std::invalid_argument("-r must be at least 1");
    for (int v : a.prompt)
        if (v < 0) throw std::invalid_argument("-p values must be >= 0");
    for (int v : a.gen)
        if (v < 0) throw std::invalid_argument("-n values must be >= 0");
    for (int v : a.depth)
        if (v < 0) throw std::invalid_argument("-d values must be >= 0");
    for (int v : a.batch)
        if (v < 1 || v > gemma4::kMaxSequences)
            throw std::invalid_argument(
                fmt::format("-b values must be in [1, {}]", gemma4::kMaxSequences));
    const int max_p = *std::max_element(a.prompt.begin(), a.prompt.end());
    const int max_n = *std::max_element(a.gen.begin(), a.gen.end());
    const int max_d = *std::max_element(a.depth.begin(), a.depth.end());
    const int max_b = *std::max_element(a.batch.begin(), a.batch.end());
    // Tensor parallelism: the worker processes are forked before anything touches the GPU; every
    // rank runs this same benchmark (same seed, same tokens) and rank 0 reports it.
    gemma4::RankGroup group(tp);
    set_process_rank(group.rank());
    std::string why;
    if (!jit::device_available(&why))
        throw std::runtime_error("bench measures the GPU forward, and there is no usable GPU: " +
                                 why);

    gemma4::GpuModelOptions mo;
    mo.context = (max_d + std::max(max_p, max_n + 1) + 255) / 256 * 256;
    mo.progress = status_line;
    mo.sequences = max_b;
    mo.tp = group.connect(jit::Flags::process());
    auto model = gemma4::GpuModel::load(a.model, mo);
    gemma4::GpuSession session(*model);
    const gemma4::Config& cfg = model->config();
    jit::Device& dev = jit::Device::get();
    // Over N GPUs: the bytes all ranks read (rank 0's times N) against N devices' bandwidth.
    const int ranks = group.ranks();
    const double copy_bw = copy_bandwidth() * ranks;
    const double weight_gb = double(model->decode_weight_bytes()) * ranks / 1e9;
    fmt::print("device: {}{} ({}), copy bandwidth {:.0f} GB/s (D2D, read + write){}\n",
               ranks > 1 ? fmt::format("{} x ", ranks) : "", dev.name(), dev.arch(), copy_bw / 1e9,
               ranks > 1 ? fmt::format(", tensor parallel over {} GPUs (NCCL {})", ranks,
                                       model->tensor_parallel().nccl->version())
                         : "");
    fmt::print("model: {}\n", model->summary());
    if (ranks > 1)
        fmt::print(
            "decode all-reduces: {}\n",
            session.tp_push() ? "summed by the post-norms from products the matvecs pushed (NCCL "
                                "device API, GEMMAJIT_TP_FUSED_NORM, GEMMAJIT_TP_PUSH)"
            : session.tp_fused_norm()
                ? "summed by the post-norms (NCCL device API, GEMMAJIT_TP_FUSED_NORM)"
            : model->tp_fused_norm() ? "NCCL all-reduce (NCCL made no device communicator)"
                                     : "NCCL all-reduce (" + model->tp_fused_norm_note() + ")");
    if (ranks > 1)
        fmt::print("prefill all-reduces (bf16 from {} rows): {}\n",
                   model->flags().get_int("GEMMAJIT_TP_BF16_ROWS"),
                   session.tp_prefill_push()
                       ? fmt::format("pushed into every rank's window ({} blocks), summed by "
                                     "the post-norms (NCCL device API, GEMMAJIT_TP_PREFILL_PUSH)",
                                     model->tp_push_blocks())
                       : std::string("NCCL all-reduce"));
    fmt::print("graphs: {}, prefill chunk {}, context {}\n\n",
               session.graphs_enabled() ? "on" : "off (GEMMAJIT_GRAPHS=0)", model->prefill_chunk(),
               session.context());
    fmt::print("| {:<28} | {:>14} | {:<38} | {:>9} | {:>7} |\n", "model", "test",
               "t/s (median (min..max))", "GB/s", "% copy");
    fmt::print("|{:-<30}|{:->16}|{:-<40}|{:->11}|{:->9}|\n", "", "", "", "", "");
    const std::string label = fmt::format("{} {}", cfg.name, main_weight_type(*model));

    std::mt19937_64 rng(a.seed);
    auto go_to_depth = [&](int d, int sequences = 1) {
        for (int s = 0; s < sequences; ++s) {
            session.reset(s);
            if (d > 0)
                session.prefill(random_tokens(d, cfg.vocab_size, rng), gemma4::Readout::Argmax, {},
                                s);
        }
    };
    for (int d : a.depth) {
        const std::string at = d > 0 ? fmt::format(" @ d{}", d) : std::string();
        for (int p : a.prompt) {
            if (p == 0) continue;
            std::vector<double> rates;
            for (int r = 0; r <= a.reps; ++r) {
                go_to_depth(d);
                const auto tokens = random_tokens(p, cfg.vocab_size, rng);
                const double t0 = now_s();
                session.prefill(tokens, gemma4::Readout::Argmax);
                const double s = now_s() - t0;
                if (r > 0) rates.push_back(p / s);  // the first run warms up
            }
            fmt::print("| {:<28} | {:>14} | {:<38} | {:>9} | {:>7} |\n", label,
                       fmt::format("pp{}{}", p, at), fmt_stats(stats(rates)), "", "");
            std::fflush(stdout);
            if (a.profile) {
                go_to_depth(d);
                print_profile(fmt::format("kernel time of a {}-token prompt at depth {}", p, d),
                              session.profile_prefill(random_tokens(p, cfg.vocab_size, rng)),
                              copy_bw, true);
            }
        }
        for (int n : a.gen) {
            if (n == 0) continue;
            for (int B : a.batch) {
                std::vector<double> rates;
                for (int r = 0; r <= a.reps; ++r) {
                    go_to_depth(d, B);
                    std::vector<gemma4::BatchToken> step;
                    for (int s = 0; s < B; ++s)
                        step.push_back(
                            {s, random_tokens(1, cfg.vocab_size, rng)[0], gemma4::Readout::Argmax});
                    const double t0 = now_s();
                    for (int i = 0; i < n; ++i) {
                        const auto out = session.decode_batch(step);
                        for (int s = 0; s < B; ++s) step[s].token = out[s].token;
                    }
                    const double s = now_s() - t0;
                    if (r > 0) rates.push_back(double(B) * n / s);
                }
                const Stats st = stats(rates);
                const double gbs = st.median / B * weight_gb;  // the weights are read once a step
                fmt::print("| {:<28} | {:>14} | {:<38} | {:>9.0f} | {:>6.1f}% |\n", label,
                           fmt::format("tg{}{}{}", n, at, B > 1 ? fmt::format(" x{}", B) : ""),
                           fmt_stats(st), gbs, 100.0 * gbs * 1e9 / copy_bw);
                std::fflush(stdout);
            }
            if (a.profile)
                print_profile(fmt::format("kernel time of one decode step at position {}",
                                          session.position()),
                              session.profile_decode_step(0), copy_bw, false);
        }
    }
    if (session.graphs_enabled())
        fmt::print("\n{} decode graph launches ({} captured)\n", session.graph_launches(),
                   session.graph_captures());
    group.finish();
}

std::vector<int> parse_int_list(const std::string& text, const char* flag) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t used = 0;
        int v = 0;
        try {
            v = std::stoi(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (item.empty() || used != item.size())
            throw std::invalid_argument(
                fmt::format("{}: '{}' is not a number (expected e.g. 0,4096)", flag, item));
        out.push_back(v);
    }
    if (out.empty()) throw std::invalid_argument(fmt::format("{}: empty list", flag));
    return out;
}

}  // namespace

void add_bench_command(CLI::App& app) {
    auto a = std::make_shared<BenchArgs>();
    auto p = std::make_shared<std::string>("512");
    auto n = std::make_shared<std::string>("128");
    auto d = std::make_shared<std::string>("0");
    auto b = std::make_shared<std::string>("1");
    auto* cmd = app.add_subcommand(
        "bench", "prompt (pp) and generation (tg) speed on the GPU, llama-bench style");
    cmd->add_option("--model,-m", a->model, "GGUF model file")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("-p,--n-prompt", *p, "prompt lengths, comma-separated")->capture_default_str();
    cmd->add_option("-n,--n-gen", *n, "generated tokens, comma-separated")->capture_default_str();
    cmd->add_option("-d,--depth", *d, "tokens already in the context, comma-separated")
        ->capture_default_str();
    cmd->add_option("-b,--batch", *b,
                    "sequences decoding together in tg (continuous batching; t/s over all of "
                    "them), comma-separated")
        ->capture_default_str();
    cmd->add_option("-r,--repetitions", a->reps, "measured runs per test")->capture_default_str();
    cmd->add_flag("--profile", a->profile,
                  "kernel-time breakdown of each prompt and of one decode step per depth");
    cmd->add_option("--seed", a->seed, "seed of the random token ids")
        ->capture_default_str()
        ->check(seed_check());
    add_tp_option(cmd, a->tp);
    cmd->callback([a, p, n, d, b] {
        BenchArgs args = *a;
        args.prompt = parse_int_list(*p, "-p");
        args.gen = parse_int_list(*n, "-n");
        args.depth = parse_int_list(*d, "-d");
        args.batch = parse_int_list(*b, "-b");
        run_bench(args);
    });
}

}  // namespace gj::tools
