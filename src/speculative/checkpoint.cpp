// Drafter checkpoint read/write; see include/dspark/speculative/checkpoint.hpp.
#include "dspark/io/regular_file.hpp"
#include "dspark/speculative/checkpoint.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/io/safetensors.hpp"
#include "json_get.hpp"

namespace dspark {

namespace fs = std::filesystem;

namespace {

constexpr int kVersion = 1;

// A config that declares no sequential head (seq_head "none", or no key)
// must not come with weights of one: loading them as "none" would silently
// draft without the head the drafter was trained with. The tensors prove a
// head when they hold its own parameters, or a non-zero markov_w2 (the
// Markov projection starts at zero and only a Markov-family head trains it).
// Refused rather than inferred: which head (and whether "none" was meant as
// an ablation) is the config's to say, and the fix is one key.
void check_declared_head(const nlohmann::json& cfg_json, const DrafterConfig& cfg,
                         const std::map<std::string, at::Tensor>& file_tensors, const std::string& where) {
  if (cfg.seq_head != SeqHead::None) return;
  std::string head, evidence;
  for (const auto& [prefix, name] : {std::pair{"markov_gate.", "gated"}, {"rnn.", "rnn"}, {"elman.", "elman"}})
    for (const auto& [t, v] : file_tensors)
      if (head.empty() && t.rfind(prefix, 0) == 0) {
        head = name;
        evidence = "the tensor '" + t + "'";
      }
  if (head.empty()) {
    auto it = file_tensors.find("markov_w2.weight");
    if (it != file_tensors.end() && at::any(it->second != 0).item<bool>()) {
      head = "markov";
      evidence = "a non-zero markov_w2.weight (a trained Markov projection; a drafter without a sequential "
                 "head keeps it at zero)";
    }
  }
  if (head.empty()) return;
  const std::string declared = cfg_json.contains("seq_head") ? "\"seq_head\": " + cfg_json.at("seq_head").dump()
                                                             : "no \"seq_head\" key";
  throw FormatError(where + ": config has " + declared + " but the weights hold " + evidence +
                    ", so they belong to a drafter with a sequential head (\"" + head +
                    "\"); loaded without it the drafter would draft worse than it was trained to. Set "
                    "config.seq_head to \"" + head + "\" (or to the head it was trained with)");
}

}  // namespace

void save_drafter(const Drafter& drafter, const std::string& dir, bool bf16,
                  const nlohmann::json& extra) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the drafter directory: " + ec.message());
  const auto& cfg = drafter.config();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json names = nlohmann::json::array();
  for (const auto& [name, shape] : Drafter::param_spec(cfg)) {
    at::Tensor t = drafter.params().at(name).detach();
    tensors.emplace_back(name, bf16 ? t.to(at::kBFloat16) : t.to(at::kFloat));
    names.push_back(name);
  }
  // Both files are first written completely under temporary names and only
  // then renamed into place, weights first: a failure while writing either
  // leaves the previous checkpoint untouched.
  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  const std::string config = (fs::path(dir) / "dspark.json").string();
  const std::string weights_tmp = weights + ".new", config_tmp = config + ".new";
  try {
    io::save_safetensors(weights_tmp, tensors, {{"format", "pt"}});
    nlohmann::json j = {
        {"kind", "dspark-drafter"},
        {"variant", "dspark"},
        {"version", kVersion},
        {"target_id", cfg.target_id},
        {"config", config_to_json(cfg)},
        {"dims", {{"hidden_size", cfg.hidden}, {"vocab_size", cfg.vocab}, {"eps", cfg.eps}}},
        {"param_names", names},
        {"weights_bytes", static_cast<int64_t>(fs::file_size(weights_tmp))},
        {"dtype", bf16 ? "bf16" : "f32"},
    };
    for (const auto& [k, v] : extra.items()) j[k] = v;
    io::write_json_atomic(config_tmp, j);
    fs::rename(weights_tmp, weights);
    fs::rename(config_tmp, config);
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    fs::remove(weights_tmp, ec);
    fs::remove(config_tmp, ec);
    throw Error(dir + ": cannot write the drafter checkpoint: " + e.what());
  } catch (...) {
    std::error_code ec;
    fs::remove(weights_tmp, ec);
    fs::remove(config_tmp, ec);
    throw;
  }
}

Drafter load_drafter(const std::string& dir) {
  const nlohmann::json j = read_drafter_json(dir);
  const std::string where = (fs::path(dir) / "dspark.json").string();
  if (!j.is_object()) throw FormatError(where + ": expected a JSON object");
  if (j.contains("kind") && (!j["kind"].is_string() || j["kind"] != "dspark-drafter")) {
    throw FormatError(where + ": 'kind' is " + j["kind"].dump() +
                      ", expected \"dspark-drafter\" (this is not a drafter checkpoint)");
  }
  if (j.contains("version") && (!j["version"].is_number_integer() || j["version"].get<int64_t>() < 1 ||
                                j["version"].get<int64_t>() > kVersion)) {
    throw FormatError(where + ": format version " + j["version"].dump() + ", this build reads versions 1.." +
                      std::to_string(kVersion) +
                      (j["version"].is_number_integer() && j["version"].get<int64_t>() > kVersion
                           ? " (written by a newer dspark)"
                           : ""));
  }
  if (j.contains("dtype") && (!j["dtype"].is_string() || (j["dtype"] != "bf16" && j["dtype"] != "f32"))) {
    throw FormatError(where + ": 'dtype' is " + j["dtype"].dump() + ", expected \"bf16\" or \"f32\"");
  }
  if (!j.contains("variant") && !j.contains("config")) {
    throw FormatError(where + ": missing keys 'variant' and 'config' (expected dspark.json as `dspark train` or "
                      "`dspark init-drafter` write it: kind, variant, config, dims, target_id)");
  }
  if (!j.contains("variant")) {
    throw FormatError(where +
                      ": no 'variant' key: this is the obsolete single-vector drafter format, which "
                      "this version cannot load; retrain the drafter with `dspark train` (or "
                      "re-create it with `dspark init-drafter`)");
  }
  const std::string variant = json_get<std::string>(j, "variant", where);
  if (variant != "dspark" && variant != "dflash") {
    throw FormatError(where + ": unknown variant '" + variant + "' (expected dspark or dflash)");
  }
  DrafterConfig cfg = config_from_json(j, where);
  if (variant == "dflash" && !j.at("config").contains("seq_head")) cfg.seq_head = SeqHead::None;

  const std::string weights = (fs::path(dir) / "model.safetensors").string();
  const int64_t weights_bytes = j.contains("weights_bytes") ? json_get<int64_t>(j, "weights_bytes", where) : -1;
  if (fs::exists(weights)) io::require_regular_file(weights, "drafter weights (safetensors file)");
  if (weights_bytes >= 0 && fs::exists(weights) &&
      static_cast<int64_t>(fs::file_size(weights)) != weights_bytes) {
    throw FormatError(weights + ": size " + std::to_string(fs::file_size(weights)) +
                      " bytes does not match dspark.json weights_bytes " +
                      std::to_string(weights_bytes) + " (incomplete or mismatched checkpoint)");
  }
  io::SafetensorsData data = io::load_safetensors_dir(dir);
  std::map<std::string, at::Tensor> params;
  if (variant == "dflash") {
    // Legacy DFlash drafters have no sequential/confidence head: start those
    // from their initial values (W2 = 0, so drafting is pure DFlash).
    Drafter fresh = Drafter::init(cfg, 0);
    params = fresh.params();
  }
  for (auto& [name, t] : data.tensors) {
    params[name] = t.to(at::kFloat);
    if (!at::isfinite(params[name]).all().item<bool>())
      throw FormatError(weights + ": tensor '" + name + "' holds NaN or infinite values (a diverged or corrupt drafter)");
  }
  std::map<std::string, at::Tensor> from_file;
  for (const auto& [name, t] : data.tensors) from_file.emplace(name, params.at(name));
  check_declared_head(j.at("config"), cfg, from_file, where);
  try {
    return Drafter(cfg, std::move(params));
  } catch (const FormatError& e) {
    throw FormatError(weights + ": " + e.what());
  }
}

void check_drafter_matches(const DrafterConfig& c, const TargetInfo& t) {
  if (c.target_id != t.id || c.hidden != t.hidden || c.vocab != t.vocab) {
    throw InvalidArgument("drafter/target mismatch: the drafter was built for '" + c.target_id +
                          "' (hidden " + std::to_string(c.hidden) + ", vocab " +
                          std::to_string(c.vocab) + "), the loaded target is '" + t.id +
                          "' (hidden " + std::to_string(t.hidden) + ", vocab " +
                          std::to_string(t.vocab) + ")");
  }
  for (int l : c.tap_layers)
    if (l < 0 || l >= t.n_layers)
      throw InvalidArgument("drafter taps target layer " + std::to_string(l) + " but the target has layers 0.." +
                            std::to_string(t.n_layers - 1));
}

}  // namespace dspark

namespace dspark {
void Drafter::check_target(const TargetInfo& target) const { check_drafter_matches(cfg_, target); }
}  // namespace dspark
