#include "engine/serve/stop_strings.h"

#include <algorithm>

namespace gj::serve {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
    for (const auto& s : stops_) hold_ = std::max(hold_, s.size() > 0 ? s.size() - 1 : 0);
}

std::string StopStrings::push(std::string_view text) {
    if (matched_) return "";
    buf_.append(text);
    size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, buf_.find(s));
    if (first != std::string::npos) {
        matched_ = true;
        std::string out = buf_.substr(0, first);
        buf_.clear();
        return out;
    }
    if (buf_.size() <= hold_) return "";
    size_t cut = buf_.size() - hold_;
    // Never split a UTF-8 character: back up to the start of the one the cut falls in.
    while (cut > 0 && (static_cast<unsigned char>(buf_[cut]) & 0xC0) == 0x80) --cut;
    std::string out = buf_.substr(0, cut);
    buf_.erase(0, cut);
    return out;
}

std::string StopStrings::finish() {
    std::string out;
    if (!matched_) out.swap(buf_);
    buf_.clear();
    return out;
}

}  // namespace gj::serve
