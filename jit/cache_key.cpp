#include "jit/cache_key.h"

#include <fmt/format.h>

#include "cache/sha256.h"

namespace gj::jit {

namespace {
void field(std::string& out, std::string_view name, std::string_view value) {
    out += fmt::format("{} {}\n", name, value.size());
    out += value;
    out += '\n';
}
}  // namespace

std::string KeyRecord::serialize() const {
    std::string out = "gemmajit-key-v1\n";
    field(out, "abi", std::to_string(abi));
    field(out, "arch", arch);
    field(out, "nvrtc", nvrtc);
    field(out, "options.count", std::to_string(options.size()));
    for (const auto& o : options) field(out, "option", o);
    field(out, "entries.count", std::to_string(entries.size()));
    for (const auto& e : entries) field(out, "entry", e);
    field(out, "flags.count", std::to_string(flags.size()));
    for (const auto& [name, value] : flags) {
        field(out, "flag.name", name);
        field(out, "flag.value", value);
    }
    field(out, "source", source);
    return out;
}

std::string KeyRecord::hash() const {
    return cache::sha256_hex(serialize());
}

nlohmann::json KeyRecord::to_json() const {
    nlohmann::json flag_json = nlohmann::json::object();
    for (const auto& [name, value] : flags) flag_json[name] = value;
    return {{"abi", abi},
            {"arch", arch},
            {"nvrtc", nvrtc},
            {"options", options},
            {"entries", entries},
            {"flags", flag_json},
            {"source_sha256", cache::sha256_hex(source)},
            {"source_bytes", source.size()}};
}

}  // namespace gj::jit
