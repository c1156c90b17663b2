// dspark/serve/stop_matcher.hpp — stop strings matched on streamed text.
//
// Generated text arrives in pieces (one or more tokens' worth of complete
// UTF-8). A stop string may span several pieces, so text that could still be
// the beginning of a stop string is held back until the next piece decides
// it. The stop text itself is never returned.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dspark::serve {

class StopMatcher {
 public:
  /// `stops`: the stop strings; empty strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops = {});

  /// Appends `text` and returns the text that is now safe to emit: everything
  /// except a tail that is a proper prefix of some stop string. When a stop
  /// string completes, returns the text before its earliest occurrence
  /// (leftmost match; among matches at one position the shortest) and
  /// matched() becomes true; after that every call returns "".
  std::string push(std::string_view text);

  /// Returns the held-back tail (generation ended without a match) and
  /// clears it. Returns "" after a match.
  std::string flush();

  /// True once a stop string has been found.
  bool matched() const { return matched_; }
  /// The stop string that matched ("" before a match).
  const std::string& matched_stop() const { return matched_stop_; }
  /// Text currently held back.
  const std::string& held() const { return held_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string matched_stop_;
};

}  // namespace dspark::serve
