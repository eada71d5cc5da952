// The GEMMAJIT_* environment-flag registry: one typed table declares every flag (name, type,
// default, allowed values, help, class). Code reads flags only through Flags, parsed once and then
// frozen. Output-changing flags are part of every kernel cache key; neutral ones never are.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gj::jit {

// A GEMMAJIT_* variable holds a value its declaration does not allow. what() names the flag, the
// value and what is allowed.
struct FlagError : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

enum class FlagType { Bool, Int, Size, String, Enum, Path };
enum class FlagClass { OutputChanging, Neutral };

struct FlagDef {
    std::string_view name;
    std::string_view
        family;  // "cache", "compile", "debug", "throughput", "device", "path", "tuning"
    FlagType type;
    FlagClass cls;
    std::string_view default_value;  // in the same syntax a user would write
    std::string_view help;
    std::vector<std::string_view> choices = {};  // Enum: the allowed spellings
    int64_t min = 0, max = 0;                    // Int: inclusive range
    std::string_view pattern = {};       // String: ECMAScript regex the whole value must match
    std::string_view pattern_help = {};  // String: what the pattern means, for error messages
};

// Every declared flag, in display order.
const std::vector<FlagDef>& flag_table();
const FlagDef* find_flag(std::string_view name);  // nullptr when undeclared

using EnvMap = std::map<std::string, std::string, std::less<>>;
EnvMap process_environment();  // the GEMMAJIT_* part of environ

// Parsed values of every declared flag: from the environment when set, else the default.
class Flags {
  public:
    // Throws FlagError for a bad value. Unknown GEMMAJIT_* names add one warning each (with the
    // closest declared name) to `warnings` when given.
    static Flags parse(const EnvMap& env, std::vector<std::string>* warnings = nullptr);
    // The process's flags, parsed on first use from environ; typo warnings go to stderr once.
    static const Flags& process();

    // Typed getters. Asking for an undeclared name, or with the wrong type, is a programming
    // error (std::logic_error).
    bool get_bool(std::string_view name) const;
    int64_t get_int(std::string_view name) const;
    uint64_t get_size(std::string_view name) const;              // bytes
    const std::string& get_string(std::string_view name) const;  // String, Enum, Path
    bool is_set(std::string_view name) const;  // given in the environment (not defaulted)
    // The text as the environment (or, when unset, the default) spells it.
    const std::string& raw(std::string_view name) const;

    // Canonical "NAME=value" of every output-changing flag, in table order: the cache key's share.
    std::vector<std::pair<std::string, std::string>> output_changing() const;
    // Canonical text of a flag's value (what `gemmajit env` prints).
    std::string canonical(std::string_view name) const;

  private:
    struct Value {
        const FlagDef* def = nullptr;
        bool set = false;
        int64_t number = 0;  // Bool (0/1), Int, Size
        std::string text;    // String, Enum, Path
        std::string raw;     // as written
    };
    const Value& value(std::string_view name, std::initializer_list<FlagType> types) const;
    std::map<std::string, Value, std::less<>> values_;
};

// "2G", "512M", "1048576", "64k" -> bytes (powers of 1024). Throws std::invalid_argument.
uint64_t parse_size(std::string_view text);
std::string format_size(uint64_t bytes);  // "2.0 GiB"

}  // namespace gj::jit
