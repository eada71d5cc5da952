// README.md's command table (section "## Commands") against `gemmajit <command> --help`: every
// option a row names exists on its command, every option of a command is named in its row, and
// every command has a row. A renamed, removed or added option fails here until the README follows.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/test_env.h"

namespace {

struct Row {
    std::vector<std::string> commands;  // "show|src|ptx|sass" names four
    std::set<std::string> flags;        // every --long and -x the row names (both columns)
    std::string text;                   // for messages
};

std::string read_file(const std::filesystem::path& path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot read " + path.string());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Options named in free text: "--word-word" and a lone "-x", not the dashes inside words
// ("top-64", "kernel-time") or numbers.
std::set<std::string> flags_in(const std::string& text) {
    static const std::regex flag(
        R"((?:^|[^A-Za-z0-9_-])(--[A-Za-z][A-Za-z0-9-]*|-[A-Za-z](?![A-Za-z0-9-])))");
    std::set<std::string> out;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), flag);
         it != std::sregex_iterator(); ++it)
        out.insert((*it)[1].str());
    return out;
}

// The rows of the table under "## Commands" (up to the next "## " heading). Cells are split on
// '|' not escaped as "\|"; the command names are the first word of the first cell.
std::vector<Row> command_rows(const std::string& readme) {
    const size_t start = readme.find("\n## Commands\n");
    if (start == std::string::npos) throw std::runtime_error("README.md has no \"## Commands\"");
    const size_t end = readme.find("\n## ", start + 1);
    std::istringstream section(readme.substr(start, end - start));
    std::vector<Row> rows;
    std::string line;
    while (std::getline(section, line)) {
        if (!line.starts_with("| `")) continue;  // the header and the |---| line start otherwise
        std::string unescaped;
        for (size_t i = 0; i < line.size(); ++i) {
            if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') continue;
            unescaped += line[i];
        }
        const size_t open = line.find('`'), close = line.find('`', open + 1);
        std::string first = line.substr(open + 1, close - open - 1);
        std::string names = first.substr(0, first.find(' '));
        std::erase(names, '\\');
        Row row;
        std::stringstream ns(names);
        for (std::string c; std::getline(ns, c, '|');) row.commands.push_back(c);
        row.flags = flags_in(unescaped);
        row.text = line;
        rows.push_back(std::move(row));
    }
    return rows;
}

// The options `--help` lists, one entry per option with all its names ("-p,--prompt" -> both).
std::vector<std::vector<std::string>> help_options(const std::string& help) {
    std::vector<std::vector<std::string>> out;
    std::istringstream in(help);
    for (std::string line; std::getline(in, line);) {
        const size_t at = line.find_first_not_of(' ');
        if (at == std::string::npos || line[at] != '-') continue;
        std::string names = line.substr(at, line.find(' ', at) - at);
        std::vector<std::string> option;
        std::stringstream ns(names);
        for (std::string n; std::getline(ns, n, ',');) option.push_back(n);
        out.push_back(std::move(option));
    }
    return out;
}

// What does not match between a row and one command's help; empty when they agree.
std::vector<std::string> mismatches(const Row& row, const std::string& command,
                                    const std::string& help) {
    std::vector<std::string> out;
    std::set<std::string> known;
    for (const auto& option : help_options(help)) {
        known.insert(option.begin(), option.end());
        if (option.front() == "-h") continue;  // every command has --help
        bool named = false;
        for (const auto& n : option) named = named || row.flags.contains(n);
        if (!named) out.push_back("`" + command + "` has " + option.back() + ", the README not");
    }
    for (const auto& f : row.flags)
        if (!known.contains(f))
            out.push_back("the README names " + f + ", `" + command + " --help` not");
    return out;
}

std::string help_of(const std::string& command) {
    auto r = gj::test::run_command(gj::test::gemmajit_exe() + " " + command + " --help");
    if (r.exit_code != 0) throw std::runtime_error(command + " --help failed: " + r.out);
    return r.out;
}

}  // namespace

TEST(ReadmeCommands, EveryOptionInTheTableMatchesHelp) {
    const auto rows = command_rows(read_file(gj::test::source_dir() / "README.md"));
    ASSERT_GE(rows.size(), 10u) << "the command table was not found or parsed";
    for (const Row& row : rows) {
        ASSERT_FALSE(row.commands.empty()) << row.text;
        for (const std::string& command : row.commands) {
            for (const auto& m : mismatches(row, command, help_of(command)))
                ADD_FAILURE() << m << "\n  row: " << row.text;
        }
    }
}

TEST(ReadmeCommands, EveryCommandHasARow) {
    const auto rows = command_rows(read_file(gj::test::source_dir() / "README.md"));
    std::set<std::string> documented;
    for (const Row& row : rows) documented.insert(row.commands.begin(), row.commands.end());
    // The "Subcommands:" block of the top-level help: "  name   description".
    const std::string help = help_of("");
    const size_t at = help.find("Subcommands:");
    ASSERT_NE(at, std::string::npos) << help;
    std::istringstream in(help.substr(at));
    std::string line;
    std::getline(in, line);
    int listed = 0;
    while (std::getline(in, line)) {
        std::istringstream words(line);
        std::string name;
        if (!(words >> name)) continue;
        ++listed;
        EXPECT_TRUE(documented.contains(name)) << "`" << name << "` has no row in README.md";
    }
    EXPECT_GE(listed, 10) << help;
}

// The check itself: a renamed option and an undocumented one are both caught.
TEST(ReadmeCommands, TheCheckCatchesARenameAndAMissingOption) {
    const std::string help =
        "Options:\n"
        "  -h,--help                   Print this help message and exit\n"
        "  -m,--model TEXT REQUIRED    GGUF model file\n"
        "  -p,--prompt TEXT            the user message\n"
        "  --top-k INT=64              top-k (0 = off)\n";
    const auto ok =
        command_rows("\n## Commands\n| `run --model F -p TEXT [--top-k K]` | top-64 |\n");
    ASSERT_EQ(ok.size(), 1u);
    EXPECT_EQ(ok[0].commands, std::vector<std::string>{"run"});
    EXPECT_TRUE(mismatches(ok[0], "run", help).empty());

    const auto renamed =
        command_rows("\n## Commands\n| `run --model F -p TEXT [--topk K]` | x |\n## Next\n");
    const auto m = mismatches(renamed[0], "run", help);
    ASSERT_EQ(m.size(), 2u);
    EXPECT_NE(m[0].find("--top-k"), std::string::npos) << m[0];  // undocumented
    EXPECT_NE(m[1].find("--topk"), std::string::npos) << m[1];   // names no option

    const auto escaped = command_rows("\n## Commands\n| `show\\|src SPEC [--arch A]` | y |\n");
    EXPECT_EQ(escaped[0].commands, (std::vector<std::string>{"show", "src"}));
    EXPECT_EQ(escaped[0].flags, std::set<std::string>{"--arch"});
}
