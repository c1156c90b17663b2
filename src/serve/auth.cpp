// API keys of the server; see include/dspark/serve/auth.hpp.
#include "dspark/serve/auth.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "dspark/error.hpp"
#include "dspark/io/regular_file.hpp"

namespace dspark::serve {

namespace {

bool valid_key_char(unsigned char c) { return c > 0x20 && c < 0x7F; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

bool constant_time_equal(std::string_view given, std::string_view expected) {
  // Every byte of `given` is looked at once, against a byte of `expected`
  // (cycled), whatever matched before; the lengths enter the result too.
  unsigned diff = given.size() != expected.size();
  for (size_t i = 0; i < given.size(); ++i) {
    const unsigned char e = expected.empty() ? 0 : static_cast<unsigned char>(expected[i % expected.size()]);
    diff |= static_cast<unsigned char>(given[i]) ^ e;
  }
  return diff == 0;
}

void ApiKeys::add(std::string key) {
  if (key.empty()) throw InvalidArgument("--api-key: expected a key, got an empty string");
  if (!std::all_of(key.begin(), key.end(), [](char c) { return valid_key_char(static_cast<unsigned char>(c)); }))
    throw InvalidArgument("--api-key: a key must be printable ASCII without spaces (it travels in an HTTP header)");
  keys_.push_back(std::move(key));
}

void ApiKeys::add_file(const std::string& path) {
  io::require_regular_file(path, "--api-key-file: a file of API keys, one per line");
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the API key file");
  std::string line;
  size_t added = 0;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string_view key = trim(line);
    if (key.empty() || key.front() == '#') continue;
    try {
      add(std::string(key));
    } catch (const InvalidArgument& e) {
      throw Error(path + ":" + std::to_string(n) + ": " + e.what());
    }
    ++added;
  }
  if (added == 0) throw Error(path + ": the API key file holds no key (one per line)");
}

bool ApiKeys::allows(std::string_view authorization) const {
  if (keys_.empty()) return true;
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  const std::string_view token = trim(authorization.substr(kScheme.size()));
  bool ok = false;
  for (const std::string& key : keys_) ok |= constant_time_equal(token, key);  // no early exit
  return ok;
}

bool is_loopback(std::string_view host) {
  if (host == "localhost") return true;
  const std::string h(host);
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace dspark::serve
