// The kernel_templates/ files, embedded at build time (see jit/embed_templates.cmake).
#pragma once

#include <string_view>
#include <vector>

namespace gj::jit {

struct EmbeddedTemplate {
    std::string_view file;     // "rmsnorm.cu", "gj_ptx.cuh"
    std::string_view content;
};

const std::vector<EmbeddedTemplate>& embedded_templates();

}  // namespace gj::jit
