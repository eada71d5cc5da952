#include "engine/serve/json_depth.h"

#include <nlohmann/json.hpp>

#include "engine/serve/api_error.h"

namespace gj::serve {

template <class J>
J parse_json_depth_limited(std::string_view text, const std::string& what,
                           const std::string& param) {
    // The callback sees each container open with the number of containers already open around
    // it, so throwing there stops the parse at the first level too many.
    auto limit = [&](int depth, typename J::parse_event_t event, J&) {
        const bool opens =
            event == J::parse_event_t::object_start || event == J::parse_event_t::array_start;
        if (opens && depth >= kMaxJsonDepth) {
            throw ApiError(400,
                           what + " nests objects and arrays deeper than the " +
                               std::to_string(kMaxJsonDepth) + " levels this server accepts",
                           param, "json_too_deep");
        }
        return true;
    };
    return J::parse(text, limit);
}

template nlohmann::json parse_json_depth_limited<nlohmann::json>(std::string_view,
                                                                 const std::string&,
                                                                 const std::string&);
template nlohmann::ordered_json parse_json_depth_limited<nlohmann::ordered_json>(
    std::string_view, const std::string&, const std::string&);

}  // namespace gj::serve
