// Drafter configuration: validation and its dspark.json form (see
// include/dspark/speculative/drafter_config.hpp). Apart from the
// tensors, so that the config reader builds without the inference code.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "dspark/error.hpp"
#include "dspark/io/regular_file.hpp"
#include "dspark/speculative/drafter_config.hpp"
#include "json_get.hpp"

namespace dspark {

namespace fs = std::filesystem;

std::string to_string(SeqHead h) {
  switch (h) {
    case SeqHead::None: return "none";
    case SeqHead::Markov: return "markov";
    case SeqHead::Gated: return "gated";
    case SeqHead::Rnn: return "rnn";
    case SeqHead::Elman: return "elman";
  }
  return "?";
}

SeqHead parse_seq_head(const std::string& s) {
  for (SeqHead h : {SeqHead::None, SeqHead::Markov, SeqHead::Gated, SeqHead::Rnn, SeqHead::Elman})
    if (to_string(h) == s) return h;
  throw InvalidArgument("unknown sequential head '" + s + "' (expected none, markov, gated, rnn or elman)");
}

void DrafterConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument("drafter config: " + what);
  };
  need(gamma >= 1 && gamma <= kMaxGamma, "gamma must be in [1, " + std::to_string(kMaxGamma) + "], got " + std::to_string(gamma));
  need(n_layers >= 1 && n_layers <= 32, "n_layers must be in [1, 32], got " + std::to_string(n_layers));
  need(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
       "n_heads must be a positive multiple of n_kv_heads");
  need(head_dim > 0 && head_dim % 2 == 0, "head_dim must be positive and even");
  need(hidden > 0 && hidden % 32 == 0, "hidden size must be a multiple of 32");
  need((n_heads * head_dim) % 32 == 0 && ffn % 32 == 0, "attention and MLP widths must be multiples of 32");
  need(markov_rank >= 32 && markov_rank % 32 == 0,
       "markov_rank must be a positive multiple of 32, got " + std::to_string(markov_rank));
  need(!tap_layers.empty(), "at least one tap layer is required");
  for (size_t i = 0; i < tap_layers.size(); ++i)
    need(tap_layers[i] >= 0 && (i == 0 || tap_layers[i] > tap_layers[i - 1]),
         "tap_layers must be strictly ascending layer indices (the order of the fc input the drafter was "
         "trained on), got " + nlohmann::json(tap_layers).dump());
  need(vocab > 0, "vocab must be positive");
  need(mask_token_id < vocab, "mask_token_id outside the vocabulary");
  need(std::isfinite(rope_base) && rope_base > 1,
       "rope_base must be a finite number above 1, got " + nlohmann::json(rope_base).dump());
  need(std::isfinite(eps) && eps > 0 && eps < 1,
       "eps (RMSNorm epsilon) must lie in (0, 1), got " + nlohmann::json(eps).dump());
  for (size_t i = 0; i < draft_vocab.size(); ++i) {
    need(draft_vocab[i] >= 0 && draft_vocab[i] < vocab,
         "draft_vocab id " + std::to_string(draft_vocab[i]) + " outside the vocabulary [0, " +
             std::to_string(vocab) + ")");
    need(i == 0 || draft_vocab[i] > draft_vocab[i - 1], "draft_vocab must be strictly ascending");
  }
}


std::string sts_report_of(const nlohmann::json& sts) {
  nlohmann::json report = nlohmann::json::object();
  for (const auto& [k, v] : sts.items())
    if (k != "thresholds" && k != "temperatures") report[k] = v;
  return report.empty() ? std::string() : report.dump();
}

nlohmann::json sts_json(const DrafterConfig& c) {
  nlohmann::json sts = c.sts_report.empty() ? nlohmann::json::object() : nlohmann::json::parse(c.sts_report);
  if (!c.sts_thresholds.empty()) sts["thresholds"] = c.sts_thresholds;
  if (!c.sts_temperatures.empty()) sts["temperatures"] = c.sts_temperatures;
  return sts;
}

nlohmann::json config_to_json(const DrafterConfig& c) {
  nlohmann::json cfg = {
      {"gamma", c.gamma},           {"d_draft", c.hidden},
      {"n_layers", c.n_layers},     {"n_heads", c.n_heads},
      {"n_kv_heads", c.n_kv_heads}, {"head_dim", c.head_dim},
      {"ffn", c.ffn},               {"markov_rank", c.markov_rank},
      {"tap_layers", c.tap_layers}, {"seq_head", to_string(c.seq_head)},
      {"mask_token_id", c.mask_token_id}, {"rope_base", c.rope_base},
  };
  if (nlohmann::json sts = sts_json(c); !sts.empty()) cfg["sts"] = std::move(sts);
  if (!c.draft_vocab.empty()) cfg["draft_vocab"] = c.draft_vocab;
  return cfg;
}

namespace {
// j[key] when it is a JSON object; FormatError naming the key and what was found otherwise.
const nlohmann::json& object_at(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw FormatError(where + ": missing key '" + key + "'");
  const auto& v = j.at(key);
  if (!v.is_object())
    throw FormatError(where + ": '" + key + "' must be an object, got " + std::string(v.type_name()) + " " +
                      v.dump().substr(0, 80));
  return v;
}
}  // namespace

DrafterConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  const auto& cfg = object_at(j, "config", where);
  const auto& dims = object_at(j, "dims", where);
  const std::string cw = where + " config";
  if (j.contains("param_names")) (void)json_get<std::vector<std::string>>(j, "param_names", where);
  const nlohmann::json* sts = cfg.contains("sts") ? &object_at(cfg, "sts", cw) : nullptr;
  DrafterConfig c;
  c.gamma = json_get<int>(cfg, "gamma", cw);
  c.n_layers = json_get<int>(cfg, "n_layers", cw);
  c.n_heads = json_get<int>(cfg, "n_heads", cw);
  c.n_kv_heads = json_get<int>(cfg, "n_kv_heads", cw);
  c.head_dim = json_get<int>(cfg, "head_dim", cw);
  c.ffn = json_get<int>(cfg, "ffn", cw);
  c.markov_rank = json_get<int>(cfg, "markov_rank", cw);
  c.tap_layers = json_get<std::vector<int>>(cfg, "tap_layers", cw);
  c.seq_head = SeqHead::None;
  if (cfg.contains("seq_head")) {
    try {
      c.seq_head = parse_seq_head(json_get<std::string>(cfg, "seq_head", cw));
    } catch (const InvalidArgument& e) {
      throw FormatError(cw + ": " + e.what());
    }
  }
  c.mask_token_id = cfg.contains("mask_token_id") ? json_get<int>(cfg, "mask_token_id", cw) : -1;
  // Required: a drafter read with another RoPE base than it was trained with
  // drafts worse without saying so (every writer records it).
  c.rope_base = json_get<double>(cfg, "rope_base", cw);
  if (sts && sts->contains("thresholds")) {
    c.sts_thresholds = json_get<std::vector<double>>(*sts, "thresholds", cw + " sts");
    for (double t : c.sts_thresholds)
      if (!(t >= 0 && t <= 1))
        throw FormatError(cw + " sts: thresholds must lie in [0, 1], got " + std::to_string(t));
  }
  if (sts && sts->contains("temperatures")) {
    c.sts_temperatures = json_get<std::vector<double>>(*sts, "temperatures", cw + " sts");
    for (double t : c.sts_temperatures)
      if (!(t > 0) || !std::isfinite(t))
        throw FormatError(cw + " sts: temperatures must be positive and finite");
  }
  if (sts) c.sts_report = sts_report_of(*sts);
  if (cfg.contains("draft_vocab")) c.draft_vocab = json_get<std::vector<TokenId>>(cfg, "draft_vocab", cw);
  const std::string dw = where + " dims";
  c.hidden = json_get<int64_t>(dims, "hidden_size", dw);
  c.vocab = json_get<int64_t>(dims, "vocab_size", dw);
  c.eps = json_get<double>(dims, "eps", dw);  // required, as rope_base
  c.target_id = json_get<std::string>(j, "target_id", where);
  if (cfg.contains("d_draft")) {
    if (const auto d = json_get<int64_t>(cfg, "d_draft", cw); d != c.hidden)
      throw FormatError(cw + ": d_draft is " + std::to_string(d) + ", expected dims.hidden_size = " +
                        std::to_string(c.hidden) + " (the drafter's width is the target's)");
  }
  try {
    c.validate();
  } catch (const InvalidArgument& e) {
    throw FormatError(where + ": " + e.what());
  }
  // After validate(): gamma is known to be in range.
  const auto per_position = [&](const std::vector<double>& v, const char* what) {
    if (!v.empty() && v.size() != static_cast<size_t>(c.gamma))
      throw FormatError(cw + " sts: expected " + std::to_string(c.gamma) + " " + what +
                        " (one per draft position), got " + std::to_string(v.size()));
  };
  per_position(c.sts_thresholds, "thresholds");
  per_position(c.sts_temperatures, "temperatures");
  return c;
}

nlohmann::json read_drafter_json(const std::string& dir) {
  const std::string path = (fs::path(dir) / "dspark.json").string();
  if (!fs::exists(dir)) throw Error(dir + ": drafter directory does not exist");
  if (!fs::is_directory(dir)) throw Error(dir + ": is a file; expected a drafter directory (with dspark.json)");
  if (fs::exists(path)) io::require_regular_file(path, "a drafter config (dspark.json)");
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open (expected a drafter directory with dspark.json)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ": invalid JSON: " + e.what());
  }
}

}  // namespace dspark
