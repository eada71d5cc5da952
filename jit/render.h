// Rendering: KernelSpec + template text -> one self-contained CUDA source. A generated prologue
// names the spec and #defines each specialization constant; every `#include "x.cuh"` is replaced by
// that helper's text, so NVRTC needs no include path and the cache key covers the helpers.
#pragma once

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "jit/kernel_spec.h"

namespace gj::jit {

// A spec or template that cannot be rendered; what() names the spec and the file or constant.
struct RenderError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Template files: the override directory (GEMMAJIT_TEMPLATE_DIR) first, then the embedded copies.
class TemplateSource {
  public:
    explicit TemplateSource(std::filesystem::path override_dir = {});
    // The file's text, or nullopt when neither place has it.
    std::optional<std::string> find(std::string_view file) const;
    const std::filesystem::path& override_dir() const { return override_dir_; }

  private:
    std::filesystem::path override_dir_;
};

// Throws RenderError for a malformed spec (bad name, constant or entry), a missing template, or an
// include of a header that does not exist.
std::string render(const KernelSpec& spec, const TemplateSource& templates);

// Checks the spec's fields (name characters, constant identifiers, entries); throws RenderError.
void validate_spec(const KernelSpec& spec);

}  // namespace gj::jit
