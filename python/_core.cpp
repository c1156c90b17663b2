// dspark._core — the Python binding of the engine. The Python package
// (python/dspark) builds the public API on these few entry points:
//
//   Model      a loaded target, its drafter and a serve::Engine that decodes
//              every submitted request (continuous batching of slots)
//   Request    one submitted generation; poll() releases the GIL
//   cli()      the `dspark` command line run in-process (bench, calibrate, ...)
//   sts_report the calibration report of recorded verify rounds
//
// Objects cross as JSON text: the OpenAI-shaped responses and chunks are
// built by serve/api (the same code as `dspark serve`).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "app.hpp"
#include "common.hpp"
#include "drafter_options.hpp"
#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/serve/api.hpp"
#include "dspark/serve/engine.hpp"
#include "dspark/serve/request_checks.hpp"
#include "dspark/speculative/calibration.hpp"

namespace py = pybind11;
using namespace dspark;

namespace {

/// Sampling and length options of one request, as the Python layer passes them.
/// Values are checked in Model::submit, by the server's checks
/// (dspark/serve/request_checks.hpp).
struct RequestOptions {
  int64_t max_tokens = 256;
  double temperature = 0.8;
  int64_t top_k = 40;
  double top_p = 0.95;
  double min_p = 0.05;
  std::string seed;  // decimal; "": SamplingParams' default seed, "-1": a random one
  std::vector<std::string> stop;
};

class Model {
 public:
  Model(const std::string& path, const std::string& drafter, int threads, const std::string& compute,
        int64_t ctx_size, int parallel, int lookup_ngram, double unread_timeout_s) {
    if (!(unread_timeout_s >= 0))
      throw InvalidArgument("unread_timeout must be a number of seconds >= 0, got " + std::to_string(unread_timeout_s));
    if (threads < 1) throw InvalidArgument("threads must be at least 1, got " + std::to_string(threads));
    if (ctx_size < 0) throw InvalidArgument("n_ctx must be >= 0, got " + std::to_string(ctx_size));
    cli::ModelOptions mo;
    mo.model = path;
    mo.threads = threads;
    mo.compute = compute;
    mo.ctx_size = ctx_size;
    if (compute != "quant" && compute != "bf16")
      throw InvalidArgument("compute must be 'quant' or 'bf16', got '" + compute + "'");
    mo.apply_threads();
    model_ = LoadedModel::load(path, mo.compute_mode());
    ctx_size_ = ctx_size;
    cli::DrafterOptions dopt;
    dopt.drafter = drafter;
    if (lookup_ngram > 64) throw InvalidArgument("lookup_ngram must be in [0, 64], got " + std::to_string(lookup_ngram));
    if (lookup_ngram >= 0) {  // < 0: the default (2 with a drafter, off without)
      dopt.lookup.min_ngram = lookup_ngram;
      dopt.lookup_explicit = true;
    }
    drafter_ = dopt.load(path, *model_.target);
    drafter_dir_ = dopt.resolved_dir();
    serve::EngineOptions eo;
    eo.parallel = parallel;
    // Verify lengths come from each request's own confidence pruning, not
    // from a schedule over the whole batch (EngineOptions::sps): a request's
    // output then does not depend on what else is decoding at the same time
    // (sampling consumes random numbers per verified position).
    eo.spec = dopt.spec();
    eo.unread_timeout = std::chrono::milliseconds(static_cast<int64_t>(std::min(unread_timeout_s, 1e12) * 1000));
    engine_ = std::make_unique<serve::Engine>(*model_.target, *model_.tokenizer, drafter_.get(), eo);
  }
  ~Model() { close(); }

  void close() {
    if (engine_) {
      py::gil_scoped_release nogil;
      engine_->shutdown();
    }
  }

  std::vector<TokenId> tokenize(const std::string& text, bool add_bos, bool special) const {
    std::vector<TokenId> ids;
    const auto& sp = model_.tokenizer->specials();
    if (add_bos && sp.add_bos && sp.bos >= 0) ids.push_back(sp.bos);
    const auto body = model_.tokenizer->encode(text, special);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }

  py::bytes detokenize(const std::vector<TokenId>& ids) const {
    const int64_t vocab = model_.target->info().vocab;
    for (TokenId id : ids)
      if (id < 0 || id >= vocab)
        throw InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
    return py::bytes(model_.tokenizer->decode(ids));
  }

  /// The prompt ids of a raw prompt, as `dspark generate -p` builds them.
  std::vector<TokenId> encode_prompt(const std::string& text) const { return model_.encode_prompt(text, false); }

  /// The prompt ids of a conversation under the model's chat template.
  std::vector<TokenId> encode_chat(const std::vector<std::pair<std::string, std::string>>& messages) const {
    if (!model_.chat) throw Error(model_.no_chat_reason + "; complete a raw prompt with generate() instead");
    std::vector<tok::ChatMessage> msgs;
    for (const auto& [role, content] : messages) msgs.push_back({role, content});
    return model_.chat->apply(msgs, true);
  }

  std::shared_ptr<serve::Request> submit(std::vector<TokenId> prompt, const RequestOptions& r) {
    if (!engine_) throw Error("the model is closed");
    const int64_t ctx = ctx_size_ > 0 ? ctx_size_ : model_.target->info().context;
    const auto n_prompt = static_cast<int64_t>(prompt.size());
    serve::check_prompt_length(n_prompt, ctx, "prompt");
    serve::check_max_tokens(r.max_tokens, n_prompt, ctx, "max_tokens");
    GenerateOptions opts;
    opts.n_predict = r.max_tokens;
    opts.ctx_size = ctx_size_;
    opts.sampling.temperature = static_cast<float>(r.temperature);
    opts.sampling.top_k = serve::top_k_value(r.top_k, "top_k");
    opts.sampling.top_p = static_cast<float>(r.top_p);
    opts.sampling.min_p = static_cast<float>(r.min_p);
    if (!r.seed.empty()) {
      const std::optional<uint64_t> seed = serve::seed_value(r.seed, "seed");
      opts.sampling.seed = seed ? *seed : serve::random_seed();
    }
    opts.sampling.validate();
    opts.stop_ids = model_.stop_ids;
    return engine_->submit(std::move(prompt), std::move(opts), serve::stop_strings(r.stop, "stop"));
  }

  py::dict load() const {
    py::dict d;
    if (!engine_) return d;
    const serve::EngineLoad l = engine_->load();
    d["active"] = l.active;
    d["queued"] = l.queued;
    d["parallel"] = l.parallel;
    d["steps"] = l.steps;
    d["completed"] = l.completed;
    return d;
  }

  py::dict info() const {
    const auto& i = model_.target->info();
    py::dict d;
    d["n_ctx"] = ctx_size_ > 0 ? ctx_size_ : i.context;
    d["n_vocab"] = i.vocab;
    d["drafter"] = drafter_ ? py::object(py::str(drafter_dir_)) : py::object(py::none());
    d["gamma"] = drafter_ ? drafter_->gamma() : 0;
    d["has_chat_template"] = model_.chat.has_value();
    return d;
  }

 private:
  LoadedModel model_;
  std::unique_ptr<Drafter> drafter_;
  std::string drafter_dir_;
  int64_t ctx_size_ = 0;
  std::unique_ptr<serve::Engine> engine_;  // destroyed first: it uses the members above
};

serve::ResponseMeta meta_of(bool chat, const std::string& id, int64_t created, const std::string& model) {
  return {chat ? serve::Endpoint::ChatCompletions : serve::Endpoint::Completions, id, created, model};
}

/// Polls `req` for up to `timeout_ms` with the GIL released: (ended, new text).
std::pair<bool, py::bytes> poll(serve::Request& req, int timeout_ms) {
  std::string text;
  bool ended;
  {
    py::gil_scoped_release nogil;
    ended = req.poll(text, std::chrono::milliseconds(timeout_ms));
  }
  return {ended, py::bytes(text)};
}

/// (exit status, whether an argument's value was refused): cli::run.
std::pair<int, bool> run_cli(const std::vector<std::string>& args) {
  std::vector<std::string> own = {"dspark"};
  own.insert(own.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : own) argv.push_back(a.data());
  argv.push_back(nullptr);
  py::gil_scoped_release nogil;
  bool invalid = false;
  const int rc = cli::run(static_cast<int>(own.size()), argv.data(), &invalid);
  return {rc, invalid};
}

/// The calibration report of the rounds in a JSONL file (`dspark calibrate
/// --save-rounds`), as JSON text: sts_to_json plus the reliability bins
/// before and after calibration per position.
std::string sts_report(const std::string& rounds_path, int gamma, double target, int bins) {
  const auto rounds = read_rounds_jsonl(rounds_path);
  if (gamma <= 0)
    for (const auto& r : rounds) gamma = std::max<int>(gamma, static_cast<int>(r.conf_logits.size()));
  StsOptions opts;
  opts.bins = bins;
  const StsReport rep = calibrate_sts(rounds, gamma, target, opts);
  nlohmann::json j = sts_to_json(rep, bins);
  auto bins_json = [](const std::vector<std::vector<ReliabilityBin>>& per_position) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& pos : per_position) {
      nlohmann::json row = nlohmann::json::array();
      for (const auto& b : pos) row.push_back({{"mean_prob", b.mean_prob}, {"frequency", b.frequency}, {"count", b.count}});
      out.push_back(row);
    }
    return out;
  };
  j["gamma"] = rep.gamma;
  j["bins_before"] = bins_json(rep.bins_before);
  j["bins_after"] = bins_json(rep.bins_after);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "dspark engine binding (use the dspark package)";
  m.attr("__version__") = DSPARK_VERSION;

  // Every user-facing failure is a dspark::Error; bad arguments are ValueError.
  // Never destroyed: the interpreter may be gone when static destructors run.
  static auto* error = new py::exception<Error>(m, "DsparkError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      py::set_error(*error, e.what());
    }
  });

  py::class_<RequestOptions>(m, "RequestOptions")
      .def(py::init<>())
      .def_readwrite("max_tokens", &RequestOptions::max_tokens)
      .def_readwrite("temperature", &RequestOptions::temperature)
      .def_readwrite("top_k", &RequestOptions::top_k)
      .def_readwrite("top_p", &RequestOptions::top_p)
      .def_readwrite("min_p", &RequestOptions::min_p)
      .def_readwrite("seed", &RequestOptions::seed)
      .def_readwrite("stop", &RequestOptions::stop);

  py::class_<serve::Request, std::shared_ptr<serve::Request>>(m, "Request")
      .def("poll", &poll, py::arg("timeout_ms"))
      .def("cancel", &serve::Request::cancel)
      .def_property_readonly("finish_reason",
                             [](const serve::Request& r) { return std::string(to_string(r.outcome().reason)); })
      .def_property_readonly("error", [](const serve::Request& r) { return r.outcome().error; })
      .def("response",
           [](const serve::Request& r, bool chat, const std::string& text, const std::string& id, int64_t created,
              const std::string& model) { return dump(serve::response_json(meta_of(chat, id, created, model), text, r.outcome())); })
      .def("final_chunk", [](const serve::Request& r, bool chat, const std::string& id, int64_t created,
                             const std::string& model) {
        return dump(serve::final_chunk_json(meta_of(chat, id, created, model), r.outcome()));
      });

  m.def("chunk", [](bool chat, const std::string& text, const std::string& id, int64_t created, const std::string& model) {
    return dump(serve::chunk_json(meta_of(chat, id, created, model), text));
  });
  m.def("role_chunk", [](const std::string& id, int64_t created, const std::string& model) {
    return dump(serve::role_chunk_json(meta_of(true, id, created, model)));
  });

  py::class_<Model>(m, "Model")
      .def(py::init<const std::string&, const std::string&, int, const std::string&, int64_t, int, int, double>(),
           py::arg("path"), py::arg("drafter"), py::arg("threads"), py::arg("compute"), py::arg("n_ctx"),
           py::arg("parallel"), py::arg("lookup_ngram"), py::arg("unread_timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def("close", &Model::close)
      .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("add_bos"), py::arg("special"))
      .def("detokenize", &Model::detokenize, py::arg("tokens"))
      .def("encode_prompt", &Model::encode_prompt, py::arg("text"))
      .def("encode_chat", &Model::encode_chat, py::arg("messages"))
      .def("submit", &Model::submit, py::arg("prompt"), py::arg("options"))
      .def("load", &Model::load)
      .def("info", &Model::info);

  m.def("cli", &run_cli, py::arg("args"), "Runs the `dspark` command line in-process; returns (exit status, whether an argument was refused).");
  m.def("sts_report", &sts_report, py::arg("rounds_path"), py::arg("gamma"), py::arg("target"), py::arg("bins"));
}
