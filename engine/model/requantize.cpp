#include "engine/model/requantize.h"

#include <fmt/format.h>

#include <stdexcept>
#include <system_error>
#include <vector>

#include "engine/base/thread_pool.h"
#include "engine/gguf/dequant.h"
#include "engine/gguf/quantize.h"
#include "engine/gguf/reader.h"
#include "engine/gguf/writer.h"
#include "engine/model/gemma4_config.h"
#include "engine/model/quant_mix.h"

namespace gj::gemma4 {

namespace {

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
    std::error_code ec;
    if (std::filesystem::equivalent(a, b, ec)) return true;
    return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
}

}  // namespace

RequantizeResult requantize(const std::filesystem::path& in, const std::filesystem::path& out,
                            const std::string& mix_name, const RequantizeOptions& opts) {
    const auto mix = quant_mix_from_name(mix_name);
    if (!mix)
        throw std::invalid_argument(fmt::format("unknown quantization type '{}' (use {})", mix_name,
                                                quant_mix_names_text()));
    if (same_file(in, out))
        throw std::invalid_argument(
            fmt::format("output {} is the input file; refusing to overwrite it", out.string()));
    const auto file = gguf::File::open(in);
    const Config cfg = Config::from_gguf(*file);  // a Gemma 4 model: the mix rules are Gemma's

    std::vector<MixTensor> tensors;
    for (const auto& t : file->tensors()) {
        if (ggml::type_info(t.type).block_elems > 1)
            throw std::invalid_argument(fmt::format(
                "{} is already quantized (tensor {} is {}); quantize needs an F32, F16 or BF16 "
                "model",
                in.string(), t.name, ggml::type_name(t.type)));
        tensors.push_back({t.name, t.dims, t.type});
    }
    const std::vector<ggml::Type> types = mix_types(*mix, tensors, cfg.n_layers);

    gguf::Writer w(file->alignment());
    for (const auto& [key, value] : file->metadata())
        if (key != "general.alignment") w.set(key, value);
    w.set_u32("general.file_type", mix->file_type);
    w.set_u32("general.quantization_version", 2);
    RequantizeResult result;
    uint64_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        total += w.add_tensor(tensors[i].name, types[i], tensors[i].dims);
        result.tensors_by_type[ggml::type_name(types[i])] += 1;
    }
    result.bytes_out = total;
    ThreadPool pool(opts.threads);  // before begin(): a bad thread count creates no file
    w.begin(out);

    const bool verbose = opts.progress && total > (uint64_t(256) << 20);
    uint64_t done = 0, next_report = total / 10;
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
        const gguf::TensorInfo& t = file->tensors()[ti];
        result.bytes_in += t.n_bytes;
        const uint64_t cols = t.dims.empty() ? 1 : t.dims[0];
        const uint64_t rows = t.rows();
        const uint64_t row_bytes = *ggml::row_bytes(types[ti], cols);
        // Chunks of ~256K elements, each dequantized, quantized and written by one worker.
        const uint64_t chunk_rows = std::max<uint64_t>(1, (uint64_t(1) << 18) / cols);
        const uint64_t n_chunks = (rows + chunk_rows - 1) / chunk_rows;
        pool.parallel_for(n_chunks, [&](size_t chunk) {
            const uint64_t r0 = chunk * chunk_rows;
            const uint64_t nr = std::min(chunk_rows, rows - r0);
            thread_local std::vector<float> vals;
            thread_local std::vector<uint8_t> bytes;
            vals.resize(nr * cols);
            bytes.resize(nr * row_bytes);
            ggml::dequantize_rows(t, r0, nr, vals.data());
            try {
                ggml::quantize_row(types[ti], vals.data(), bytes.data(), int64_t(nr * cols));
            } catch (const std::invalid_argument& e) {
                throw std::invalid_argument(fmt::format("tensor {}: {}", t.name, e.what()));
            }
            w.write_tensor_chunk(t.name, r0 * row_bytes, bytes);
        });
        done += rows * row_bytes;
        if (verbose && done >= next_report) {
            opts.progress(fmt::format("quantize: {:.0f}%", 100.0 * double(done) / double(total)));
            next_report = done + total / 10;
        }
    }
    w.finish();
    return result;
}

}  // namespace gj::gemma4
