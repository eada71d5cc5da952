// The source layout keeps its promises (docs/ARCHITECTURE.md): dependencies point one way,
// tools -> engine -> jit -> cache, and inside engine/ serve -> generate -> {cpu, gpu} -> model ->
// {text, gguf} -> base; no source file grows past the size a reader can hold in mind.
// Read from the source tree, so a change that breaks either fails here, in CI.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_env.h"

namespace {

namespace fs = std::filesystem;

// The part a file belongs to: "cache", "jit", "tools", or "engine/<folder>".
std::string part_of(const std::string& rel) {
    const auto slash = rel.find('/');
    if (slash == std::string::npos) return "";
    const std::string top = rel.substr(0, slash);
    if (top != "engine") return top;
    const auto second = rel.find('/', slash + 1);
    return second == std::string::npos ? "engine" : rel.substr(0, second);
}

// What each part may include besides itself. Anything not listed is a dependency in the wrong
// direction (or a new part that needs a line here and in docs/ARCHITECTURE.md).
const std::map<std::string, std::set<std::string>>& allowed() {
    static const std::map<std::string, std::set<std::string>> table = {
        {"cache", {}},
        {"jit", {"cache"}},
        {"engine/base", {}},
        {"engine/gguf", {"engine/base"}},
        {"engine/text", {"engine/base", "engine/gguf"}},
        {"engine/model", {"engine/base", "engine/gguf", "engine/text"}},
        {"engine/cpu", {"engine/base", "engine/gguf", "engine/model", "jit"}},
        {"engine/gpu", {"engine/base", "engine/gguf", "engine/model", "jit"}},
        {"engine/generate",
         {"engine/base", "engine/gguf", "engine/text", "engine/model", "engine/cpu", "engine/gpu",
          "jit"}},
        {"engine/serve",
         {"engine/base", "engine/gguf", "engine/text", "engine/model", "engine/cpu", "engine/gpu",
          "engine/generate", "jit"}},
        {"tools",
         {"engine/base", "engine/gguf", "engine/text", "engine/model", "engine/cpu", "engine/gpu",
          "engine/generate", "engine/serve", "jit", "cache"}},
    };
    return table;
}

struct Source {
    std::string rel;  // path from the repository root
    std::string text;
};

std::vector<Source> sources(const std::vector<std::string>& roots) {
    const fs::path root = gj::test::source_dir();
    std::vector<Source> out;
    for (const std::string& top : roots) {
        for (const auto& e : fs::recursive_directory_iterator(root / top)) {
            if (!e.is_regular_file()) continue;
            const std::string ext = e.path().extension().string();
            if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
            std::ifstream f(e.path(), std::ios::binary);
            std::stringstream ss;
            ss << f.rdbuf();
            out.push_back({fs::relative(e.path(), root).generic_string(), ss.str()});
        }
    }
    std::sort(out.begin(), out.end(),
              [](const Source& a, const Source& b) { return a.rel < b.rel; });
    return out;
}

TEST(Layering, EveryIncludePointsDownTheDependencyOrder) {
    const std::regex include_re(R"re(#include\s+"((?:cache|jit|engine|tools)/[^"]+)")re");
    std::vector<std::string> violations;
    size_t checked = 0;
    for (const Source& s : sources({"cache", "jit", "engine", "tools"})) {
        const std::string from = part_of(s.rel);
        ASSERT_TRUE(allowed().count(from))
            << s.rel << " is in a part (" << from
            << ") the layering table does not know; add it there and to docs/ARCHITECTURE.md";
        for (std::sregex_iterator it(s.text.begin(), s.text.end(), include_re), end; it != end;
             ++it) {
            const std::string to = part_of((*it)[1].str());
            ++checked;
            if (to == from || allowed().at(from).count(to)) continue;
            violations.push_back(s.rel + " includes " + (*it)[1].str() + " (" + from + " -> " + to +
                                 ")");
        }
    }
    EXPECT_GT(checked, 100u) << "the scan found too few includes to mean anything";
    for (const std::string& v : violations) ADD_FAILURE() << v;
}

TEST(Layering, EngineFilesLiveInAPartFolder) {
    for (const Source& s : sources({"engine"})) {
        EXPECT_NE(part_of(s.rel), "engine")
            << s.rel << " sits directly in engine/: put it in the folder of its concept";
    }
}

// Past ~800 lines a file holds more than one concept; split it by concept instead.
TEST(Layering, NoSourceFileIsLongerThan800Lines) {
    constexpr size_t kMaxLines = 800;
    size_t files = 0;
    for (const Source& s :
         sources({"cache", "jit", "engine", "tools", "tests", "kernel_templates"})) {
        ++files;
        const size_t lines = size_t(std::count(s.text.begin(), s.text.end(), '\n'));
        EXPECT_LE(lines, kMaxLines) << s.rel << " has " << lines << " lines";
    }
    EXPECT_GT(files, 50u);
}

}  // namespace
