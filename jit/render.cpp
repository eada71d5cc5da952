#include "jit/render.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "jit/embedded_templates.h"

namespace gj::jit {

namespace {

bool is_identifier(std::string_view s) {
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
}

struct Renderer {
    const KernelSpec& spec;
    const TemplateSource& templates;
    std::set<std::string> included;
    std::string out;

    void append_file(const std::string& file, const std::string& text, int depth) {
        static const std::regex include_re(R"re(^\s*#\s*include\s*"([^"]+)"\s*(//.*)?$)re");
        static const std::regex pragma_once_re(R"(^\s*#\s*pragma\s+once\s*$)");
        std::istringstream in(text);
        std::string line;
        int line_no = 0;
        while (std::getline(in, line)) {
            ++line_no;
            // Only a preprocessor line can be an include or `#pragma once`; most lines are not,
            // and std::regex is slow enough to be most of a warm start's rendering time.
            size_t first = line.find_first_not_of(" \t\n\v\f\r");
            if (first == std::string::npos || line[first] != '#') {
                out += line;
                out += '\n';
                continue;
            }
            std::smatch m;
            if (std::regex_match(line, pragma_once_re)) continue;
            if (!std::regex_match(line, m, include_re)) {
                out += line;
                out += '\n';
                continue;
            }
            std::string header = m[1].str();
            if (!included.insert(header).second) continue;  // each helper once
            if (depth > 16)
                throw RenderError(fmt::format("{}: includes nest deeper than 16 at {}:{}",
                                              spec.name, file, line_no));
            auto body = templates.find(header);
            if (!body)
                throw RenderError(fmt::format(
                    "{}: {}:{} includes \"{}\", which is not a kernel template header (not in "
                    "kernel_templates/{})",
                    spec.name, file, line_no, header,
                    templates.override_dir().empty()
                        ? ""
                        : " nor in " + templates.override_dir().string()));
            out += fmt::format("// ---- begin {} ----\n", header);
            append_file(header, *body, depth + 1);
            out += fmt::format("// ---- end {} ----\n", header);
        }
    }
};

}  // namespace

TemplateSource::TemplateSource(std::filesystem::path override_dir)
    : override_dir_(std::move(override_dir)) {}

std::optional<std::string> TemplateSource::find(std::string_view file) const {
    if (file.find('/') != std::string_view::npos || file.find("..") != std::string_view::npos)
        return std::nullopt;
    if (!override_dir_.empty()) {
        std::ifstream in(override_dir_ / std::string(file), std::ios::binary);
        if (in) {
            std::ostringstream ss;
            ss << in.rdbuf();
            return std::move(ss).str();
        }
    }
    for (const auto& t : embedded_templates())
        if (t.file == file) return std::string(t.content);
    return std::nullopt;
}

void validate_spec(const KernelSpec& spec) {
    auto name_ok = [](std::string_view s, std::string_view extra) {
        return !s.empty() && std::all_of(s.begin(), s.end(), [&](char c) {
            return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                   extra.find(c) != std::string_view::npos;
        });
    };
    if (!name_ok(spec.name, ".-") || spec.name.starts_with(".") || spec.name.size() > 160)
        throw RenderError(
            fmt::format("kernel spec name '{}' is not valid: use 1-160 characters "
                        "from [a-z0-9_.-], not starting with '.'",
                        spec.name));
    if (!name_ok(spec.family, ""))
        throw RenderError(fmt::format("kernel spec {}: family '{}' is not valid (use [a-z0-9_])",
                                      spec.name, spec.family));
    std::set<std::string> seen;
    for (const auto& [name, value] : spec.constants) {
        if (!is_identifier(name))
            throw RenderError(fmt::format(
                "kernel spec {}: constant name '{}' is not a C identifier", spec.name, name));
        if (!seen.insert(name).second)
            throw RenderError(
                fmt::format("kernel spec {}: constant {} is given twice", spec.name, name));
    }
    if (spec.entries.empty())
        throw RenderError(fmt::format("kernel spec {} lists no entry points", spec.name));
    for (const auto& e : spec.entries)
        if (!is_identifier(e))
            throw RenderError(
                fmt::format("kernel spec {}: entry '{}' is not a C identifier", spec.name, e));
}

std::string render(const KernelSpec& spec, const TemplateSource& templates) {
    validate_spec(spec);
    std::string file = spec.family + ".cu";
    auto text = templates.find(file);
    if (!text)
        throw RenderError(fmt::format("kernel spec {}: no template {} (kernel_templates/{}{})",
                                      spec.name, file, file,
                                      templates.override_dir().empty()
                                          ? ""
                                          : " or " + (templates.override_dir() / file).string()));
    Renderer r{spec, templates, {}, {}};
    r.out = fmt::format("// gemmajit kernel {} (template {})\n", spec.name, file);
    r.out += "// Specialization constants (generated prologue):\n";
    for (const auto& [name, value] : spec.constants)
        r.out += fmt::format("#define {} {}\n", name, value);
    r.out += fmt::format("// ---- begin {} ----\n", file);
    r.included.insert(file);
    r.append_file(file, *text, 0);
    r.out += fmt::format("// ---- end {} ----\n", file);
    return r.out;
}

}  // namespace gj::jit
