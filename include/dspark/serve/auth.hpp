// dspark/serve/auth.hpp — API keys of `dspark serve` (--api-key,
// --api-key-file): which requests may use the model.
//
// A request is let in when its `Authorization` header is `Bearer <key>` for
// one of the keys. Keys are compared in constant time: how long a check
// takes depends on the presented token's length only, never on how much of
// it matches a key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dspark::serve {

class ApiKeys {
 public:
  /// Adds a key. Throws dspark::InvalidArgument for an empty key or one with
  /// whitespace or control characters (it could not be sent in a header).
  void add(std::string key);
  /// Adds the keys of a file: one per line; blank lines and lines starting
  /// with '#' are skipped, surrounding whitespace is trimmed. Throws
  /// dspark::Error naming the file (and the line for a bad key), or when the
  /// file holds no key.
  void add_file(const std::string& path);

  /// No keys: every request is let in.
  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }

  /// Whether a request with this Authorization header value may proceed:
  /// true when there are no keys, or the value is "Bearer <key>" (the scheme
  /// in any case) for one of them. Every key is compared, match or not.
  bool allows(std::string_view authorization) const;

 private:
  std::vector<std::string> keys_;
};

/// `given == expected`, in time that depends only on given.size().
bool constant_time_equal(std::string_view given, std::string_view expected);

/// True for addresses that only this machine can reach: 127.0.0.0/8, ::1,
/// "localhost". `dspark serve` warns when it listens elsewhere without a key.
bool is_loopback(std::string_view host);

}  // namespace dspark::serve
