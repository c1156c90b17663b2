// `dspark generate`: one prompt, text streamed to stdout, stats to stderr.
#include "generate_cmd.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>

#include "dspark/error.hpp"
#include "dspark/io/regular_file.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/speculative/runner.hpp"
#include "dspark/speculative/session.hpp"
#include "dspark/tokenizer/tokenizer.hpp"

namespace dspark::cli {

namespace {

std::string count(int64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string fixed1(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", x);
  return buf;
}

}  // namespace

GenerateCommand::GenerateCommand(CLI::App& parent) {
  app_ = parent.add_subcommand("generate", "generate text from a prompt");
  model_.add(*app_);
  auto* text = app_->add_option("-p,--prompt", prompt_, "prompt text ('-': read it from standard input)");
  auto* file = app_->add_option("-f,--file", prompt_file_, "a file containing the prompt");
  text->excludes(file);  // one of them is required (prompt_text())
  app_->add_option("-n,--n-predict", n_predict_, "maximum tokens to generate")
      ->check(positive_integer())
      ->capture_default_str();
  rule_.add(*app_, add_sampling_options(*app_, sampling_));
  drafter_.add(*app_);
  app_->add_flag("--chat", chat_, "wrap the prompt as one user message with the chat template");
  app_->add_flag("--json", json_, "print one JSON object instead of streaming text");
}

// The prompt from -p TEXT, -p - (standard input) or -f FILE. As llama.cpp
// does, one trailing newline of a file or of standard input is dropped.
std::string GenerateCommand::prompt_text() const {
  if (prompt_file_.empty() && prompt_ != "-") {
    if (app_->count("--prompt") == 0) throw Error("a prompt is required: -p TEXT, -p - (standard input) or -f FILE");
    return prompt_;
  }
  std::string text;
  if (!prompt_file_.empty()) {
    io::require_regular_file(prompt_file_, "-f: a prompt file");
    std::ifstream in(prompt_file_, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error(prompt_file_ + ": cannot read the prompt file");
  } else {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  if (text.ends_with('\n')) text.pop_back();
  return text;
}

int GenerateCommand::run() {
  const std::string prompt_text = this->prompt_text();
  sampling_.validate();
  sampling_.rule = rule_.resolve();
  model_.apply_threads();
  LoadedModel m = LoadedModel::load(model_.model, model_.compute_mode());
  const auto prompt = m.encode_prompt(prompt_text, chat_);
  const int64_t ctx = model_.ctx_size > 0 ? model_.ctx_size : m.target->info().context;
  // The last generated token need not enter the KV cache: ctx - P + 1 fit.
  const int64_t room = ctx - static_cast<int64_t>(prompt.size()) + 1;
  if (n_predict_ > room && room > 1)
    std::cerr << "warning: -n " << n_predict_ << " asks for more tokens than fit: a context of " << ctx
              << " holds the " << prompt.size() << "-token prompt and " << room
              << " generated tokens (the last is never cached); generation ends when the context is full\n";

  GenerateOptions opts;
  opts.n_predict = n_predict_;
  opts.ctx_size = model_.ctx_size;
  opts.sampling = sampling_;
  opts.stop_ids = m.stop_ids;
  tok::StreamDecoder stream(*m.tokenizer);
  if (!json_) {
    opts.on_token = [&](TokenId id) {
      const std::string piece = stream.push(id);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    };
  }
  const auto drafter = drafter_.load(model_.model, *m.target);
  const SpecOptions spec = drafter_.spec(m.target.get());  // validated even when no drafter runs
  SpecSession session(*m.target, drafter.get(), prompt, opts, spec);
  GenerateResult r = run_session(*m.target, drafter.get(), session, spec);
  const auto& s = r.stats;
  // Neither an end-of-generation token nor -n ended it: the KV cache is full.
  const bool context_full = !r.stopped_by_eog && s.generated_tokens < n_predict_;
  const char* finish = r.stopped_by_eog ? "stop" : context_full ? "context_full" : "length";
  if (json_) {
    // The text as streamed: a character the last token left unfinished is dropped.
    tok::StreamDecoder whole(*m.tokenizer);
    std::string text;
    for (TokenId t : r.tokens) text += whole.push(t);
    whole.finish();
    nlohmann::json out = {{"text", text},
                          {"tokens", r.tokens},
                          {"finish_reason", finish},
                          // Greedy decoding draws nothing: no seed, no rule.
                          {"seed", sampling_.greedy() ? nlohmann::json() : nlohmann::json(sampling_.seed)},
                          {"sampling_rule", sampling_.greedy() ? nlohmann::json() : nlohmann::json(to_string(sampling_.rule))},
                          {"stats", stats_json(s)}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  } else {
    stream.finish();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    auto rate = [](double r) { return r > 0 ? fixed1(r) + " tok/s" : std::string("- tok/s"); };
    std::fprintf(stderr, "prompt: %s, %s | decode: %s, %s", count(s.prompt_tokens, "token").c_str(),
                 rate(s.prefill_tok_s()).c_str(), count(s.generated_tokens, "token").c_str(),
                 rate(s.decode_tok_s()).c_str());
    if (s.rounds > 0)
      std::fprintf(stderr, " | tau %.2f, %lld target calls", s.tau(),
                   static_cast<long long>(s.target_calls));
    if (!sampling_.greedy())
      std::fprintf(stderr, " | seed %llu (%s)", static_cast<unsigned long long>(sampling_.seed),
                   to_string(sampling_.rule));
    if (context_full)
      std::fprintf(stderr, " | stopped: the context of %lld tokens is full",
                   static_cast<long long>(ctx));
    std::fprintf(stderr, "\n");
  }
  return 0;
}

}  // namespace dspark::cli
