// Stop strings over streamed text: text is handed on as soon as it cannot be the start of a stop
// string, so a stream never shows a prefix of a stop string that then matches, and never waits
// longer than the longest stop string needs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gj::serve {

class StopStrings {
  public:
    explicit StopStrings(std::vector<std::string> stops);

    // Text that is now safe to emit. Once a stop string matched, matched() is true and push()
    // returns the text before it, then nothing more.
    std::string push(std::string_view text);
    std::string finish();  // the held-back tail at the end of the reply
    bool matched() const { return matched_; }

  private:
    std::vector<std::string> stops_;
    size_t hold_ = 0;  // longest stop string - 1: how much tail may be a stop string's start
    std::string buf_;
    bool matched_ = false;
};

}  // namespace gj::serve
