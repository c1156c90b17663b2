// Fuzz target: chat templates. The input is a template text and a
// conversation separated by NUL bytes: template, then role/content pairs.
// Detection either succeeds or throws FormatError; apply() either succeeds
// or throws InvalidArgument (unknown role) and, when no content (nor the
// template's default system prompt) holds special token text, equals
// encode(render(...)).
#include <cstdlib>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/tokenizer/chat_template.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark;
  const tok::Tokenizer& t = *fuzz::vocab().tokenizer;
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) parts.emplace_back();
    else parts.back().push_back(static_cast<char>(data[i]));
  }
  std::vector<tok::ChatMessage> messages;
  bool special_text = false;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) {
    messages.push_back({parts[i], parts[i + 1]});
    // Every special token of the vocabulary starts with '<'.
    special_text = special_text || parts[i + 1].find('<') != std::string::npos;
  }
  try {
    const tok::ChatTemplate tmpl = tok::ChatTemplate::from_text(parts[0], t, "fuzz");
    for (bool gen : {false, true}) {
      const std::vector<tok::TokenId> ids = tmpl.apply(messages, gen);
      const std::string text = tmpl.render(messages, gen);
      // The default system prompt is content too.
      const auto& sys = tmpl.default_system_prompt();
      if (!special_text && !(sys && sys->find('<') != std::string::npos)) {
        std::vector<tok::TokenId> want = t.encode(text, true);
        if (t.specials().add_bos && t.specials().bos >= 0) want.insert(want.begin(), t.specials().bos);
        if (ids != want) std::abort();
      }
    }
  } catch (const FormatError&) {
  } catch (const InvalidArgument&) {
  }
  return 0;
}
