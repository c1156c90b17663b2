// Streaming detokenizer: emits only complete, valid UTF-8.
#include "dspark/tokenizer/tokenizer.hpp"

#include "utf8.hpp"

namespace dspark::tok {

std::string StreamDecoder::push(TokenId id) {
  pending_ += tok_->token_bytes(id);
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    size_t len = 0;
    const detail::Utf8Status st = detail::classify_utf8(p + i, n - i, len);
    if (st == detail::Utf8Status::Incomplete) break;  // wait for the rest
    if (st == detail::Utf8Status::Complete) {
      out.append(pending_, i, len);
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = detail::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

void StreamDecoder::finish() {
  // push() returns every sequence that is complete or can never complete, so
  // what is left is the unfinished prefix of one character.
  pending_.clear();
}

}  // namespace dspark::tok
