// The drafter trainer; see include/dspark/train/trainer.hpp.
#include "dspark/train/trainer.hpp"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <list>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/model/aten_forward.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/data_fingerprint.hpp"
#include "dspark/train/drafter_graph.hpp"
#include "dspark/train/feature_cache.hpp"

namespace dspark::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr uint64_t kSplitSalt = 0x5EED'0001'D5BA'4C00ULL;
constexpr uint64_t kEvalSalt = 0x5EED'0002'D5BA'4C00ULL;
constexpr uint64_t kEpochSalt = 0x9E37'79B9'7F4A'7C15ULL;
constexpr uint64_t kFixedAnchorSalt = 0x5EED'0003'D5BA'4C00ULL;

// Fisher-Yates with explicit modular draws (identical on every standard library).
void shuffle(std::vector<size_t>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(rng() % i)]);
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = std::llround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else std::snprintf(buf, sizeof(buf), "%lldm%02llds", t / 60, t % 60);
  return buf;
}

// The weighted total of the mean loss terms (the KL term only when weighted,
// so that runs without it report the same totals as before it existed).
double total_loss(const LossOptions& o, double ce, double l1, double bce, double kl) {
  const double t = o.w_ce * ce + o.w_l1 * l1 + o.w_bce * bce;
  return o.w_kl > 0 ? t + o.w_kl * kl : t;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ": invalid JSON: " + e.what());
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The fields that must not change across a resume (they define the data
// order and the meaning of the saved step).
nlohmann::json identity_json(const TrainConfig& c) {
  nlohmann::json j = {{"seed", c.seed},
                      {"batch", c.batch},
                      {"anchors_per_seq", c.anchors_per_seq},
                      {"eval_fraction", c.eval_fraction},
                      {"eval_max_sequences", c.eval_max_sequences},
                      {"max_len", c.max_len}};
  // Only when it differs from the seed / the default, so checkpoints from
  // before these options match.
  if (c.split_seed && *c.split_seed != c.seed) j["split_seed"] = *c.split_seed;
  if (c.anchors != AnchorDraw::Redraw) j["anchors"] = to_string(c.anchors);
  if (c.optimizer != OptimizerKind::AdamW) j["optimizer"] = to_string(c.optimizer);
  return j;
}

uint64_t split_seed_of(const TrainConfig& c) { return c.split_seed.value_or(c.seed); }

nlohmann::json config_json(const TrainConfig& c) {
  nlohmann::json j = identity_json(c);
  j.update({{"steps", c.steps},
            {"lr", c.lr},
            {"warmup", c.warmup},
            {"weight_decay", c.weight_decay},
            {"grad_clip", c.grad_clip},
            {"gamma_decay", c.loss.gamma_decay},
            {"loss_weights", {c.loss.w_ce, c.loss.w_l1, c.loss.w_bce}},
            {"w_kl", c.loss.w_kl},
            {"optimizer", to_string(c.optimizer)},
            {"muon", {{"lr", c.muon_lr}, {"momentum", c.muon_momentum}, {"lr_scale", to_string(c.muon_lr_scale)}}},
            {"anchors", to_string(c.anchors)},
            {"grow_layers", c.grow_layers},
            {"precision", c.precision == MatmulPrecision::BFloat16 ? "bf16" : "fp32"},
            {"device", c.device},
            {"aten_only", c.aten_only},
            {"data_dir", c.data_dirs.size() == 1 ? nlohmann::json(c.data_dirs[0]) : nlohmann::json(c.data_dirs)}});
  return j;
}

}  // namespace

std::string to_string(AnchorDraw a) { return a == AnchorDraw::Fixed ? "fixed" : "redraw"; }

AnchorDraw parse_anchor_draw(const std::string& s) {
  if (s == "redraw") return AnchorDraw::Redraw;
  if (s == "fixed") return AnchorDraw::Fixed;
  throw InvalidArgument("unknown anchor draw '" + s + "' (expected redraw or fixed)");
}

std::string TrainConfig::data_label() const { return train::data_label(data_dirs); }

void TrainConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument("train config: " + what);
  };
  const bool some_dir_empty =
      std::any_of(data_dirs.begin(), data_dirs.end(), [](const std::string& d) { return d.empty(); });
  need(!data_dirs.empty() && !some_dir_empty, "a data directory is required");
  need(eval_only || !out_dir.empty(), "an output directory is required");
  need(!eval_only || !init_drafter.empty(), "evaluation only needs a drafter to evaluate (init_drafter)");
  need(!eval_only || !resume, "evaluation only does not resume a run");
  need(steps >= 1, "steps must be >= 1");
  need(batch >= 1, "batch must be >= 1");
  need(anchors_per_seq >= 1, "anchors_per_seq must be >= 1");
  need(lr > 0 && std::isfinite(lr), "lr must be positive");
  need(warmup >= 0 && warmup < 1, "warmup must be in [0, 1)");
  need(weight_decay >= 0, "weight_decay must be >= 0");
  need(save_every >= 0 && eval_every >= 0 && log_every >= 1,
       "save_every/eval_every must be >= 0 and log_every >= 1");
  need(loss.gamma_decay >= 0 && std::isfinite(loss.gamma_decay),
       "gamma_decay must be positive (or 0: equal position weights)");
  need(loss.w_ce >= 0 && loss.w_l1 >= 0 && loss.w_bce >= 0 && loss.w_kl >= 0, "loss weights must be >= 0");
  need(loss.w_ce + loss.w_l1 + loss.w_bce + loss.w_kl > 0, "at least one loss weight must be positive");
  need(muon_lr > 0 && std::isfinite(muon_lr), "muon_lr must be positive");
  need(muon_momentum >= 0 && muon_momentum < 1, "muon_momentum must be in [0, 1)");
  need(grow_layers >= 0 && grow_layers <= 32, "grow_layers must be in [0, 32]");
  need(grow_layers == 0 || !init_drafter.empty() || resume,
       "growing draft layers needs an init drafter (a fresh drafter takes drafter.n_layers)");
  need(eval_fraction >= 0 && eval_fraction < 1, "eval_fraction must be in [0, 1)");
  need(eval_max_sequences >= 0 && eval_anchors_per_seq >= 1, "eval sizes must be positive");
  need(max_len >= 0 && feature_cache_mb >= 0, "max_len and feature_cache_mb must be >= 0");
  need(keep_checkpoints >= 1, "keep_checkpoints must be >= 1");
  train_device(*this);
}

at::Device train_device(const TrainConfig& cfg) {
  std::optional<at::Device> dev;
  try {
    dev = at::Device(cfg.device);
  } catch (const c10::Error&) {
  }
  if (!dev || !(dev->is_cpu() || dev->is_cuda()))
    throw InvalidArgument("train config: device must be cpu, cuda or cuda:N, got '" + cfg.device + "'");
  if (dev->is_cuda()) {
#ifdef DSPARK_TORCH_CUDA
    if (!torch::cuda::is_available())
      throw Error("train: device '" + cfg.device +
                  "' asked for, but no CUDA device is visible (NVIDIA driver loaded? CUDA_VISIBLE_DEVICES?)");
#else
    throw Error("train: device '" + cfg.device +
                "' asked for, but this build of dspark has no CUDA (`make cuda` builds one against PyTorch's "
                "CUDA libtorch: docs/training.md)");
#endif
    const int64_t n = static_cast<int64_t>(torch::cuda::device_count());
    if (dev->index() >= n)
      throw InvalidArgument("train: device '" + cfg.device + "' asked for, but " + std::to_string(n) +
                            " CUDA device(s) are visible");
  }
  return *dev;
}

double lr_at(const TrainConfig& c, int64_t step) {
  const int64_t warm = c.warmup > 0 ? static_cast<int64_t>(std::ceil(c.warmup * static_cast<double>(c.steps))) : 0;
  if (step < warm) return c.lr * static_cast<double>(step + 1) / static_cast<double>(warm);
  const double progress =
      static_cast<double>(step - warm) / static_cast<double>(std::max<int64_t>(1, c.steps - warm));
  return c.lr * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, progress)));
}

struct Trainer::Impl {
  TrainConfig cfg;
  TargetModel& target;
  TrainDataset data;
  std::unique_ptr<Drafter> drafter;
  std::unique_ptr<DrafterGraph> graph;
  std::vector<at::Tensor> params;  // in param_spec order (the optimizer's order)
  std::unique_ptr<Optimizer> opt;
  std::vector<size_t> train_idx, eval_idx;
  bool eval_held_out = true;
  std::vector<std::vector<int64_t>> eval_anchors;  // per eval_idx entry

  // Data order state (checkpointed).
  int64_t step = 0;
  int64_t epoch = 0;
  size_t cursor = 0;
  std::vector<size_t> order;
  std::mt19937_64 rng;

  // Target features: taps [L, m*d] and final-normed hidden [L, d] (bf16 in
  // bf16 precision, as method §4 stores them, else fp32); with a draft
  // vocabulary also the full-vocabulary logsumexp [L] fp32 and argmax [L]
  // int64 of the target's logits at every position (from the unrounded
  // hidden).
  using Features = TargetFeatures;
  std::unordered_map<size_t, Features> eval_cache;
  std::unordered_map<size_t, std::pair<Features, std::list<size_t>::iterator>> cache;
  std::list<size_t> lru;
  int64_t cache_bytes = 0;
  std::unique_ptr<DiskFeatureCache> disk;  // --feature-cache-dir

  // Device of the drafter and the loss; `portable`: ATen ops only (off the
  // CPU, or aten_only). The target then runs as `aten`, and `lm_head_dev`
  // is its LM head on the device.
  at::Device dev = at::kCPU;
  bool portable = false;
  std::unique_ptr<AtenForward> aten;
  at::Tensor lm_head_dev;

  Impl(TrainConfig c, TargetModel& t) : cfg(std::move(c)), target(t) {}

  void setup_device() {
    dev = train_device(cfg);
    portable = cfg.aten_only || !dev.is_cpu();
    lm_head_dev = target.lm_head().to(dev);  // the same tensor on the CPU
  }

  // Features live on the CPU (cached in memory or on disk); the graph and
  // the loss read them in fp32 on the device.
  Features on_device(const Features& f) const {
    auto put = [&](const at::Tensor& t, std::optional<at::ScalarType> dt) {
      return t.defined() ? t.to(dev, dt.value_or(t.scalar_type())) : at::Tensor();
    };
    return {put(f.taps, at::kFloat), put(f.final_hidden, at::kFloat), put(f.lse, {}), put(f.argmax, {})};
  }
  SlotTargets on_device(const SlotTargets& t) const {
    auto put = [&](const at::Tensor& x) { return x.defined() ? x.to(dev) : at::Tensor(); };
    return {put(t.anchors), put(t.prev_tokens), put(t.labels), put(t.target_pos), put(t.valid), put(t.draft_labels)};
  }
  // The drafter with CPU copies of its parameters (itself on the CPU), for writing.
  Drafter host_drafter() const {
    if (dev.is_cpu()) return *drafter;
    std::map<std::string, at::Tensor> p;
    for (const auto& [name, t] : drafter->params()) p.emplace(name, t.detach().cpu());
    return Drafter(drafter->config(), std::move(p));
  }

  bool draft_vocab() const { return graph->vocab_ids().defined(); }

  LossOptions loss_options() const {
    LossOptions o = cfg.loss;
    o.kernels = !portable;
    return o;
  }

  // Target distributions of the slots of `t` [N, γ, V'] (V' = |draft_vocab| or V).
  at::Tensor target_distribution(const Features& f, const SlotTargets& t) const {
    const double softcap = target.info().logit_softcap;
    if (draft_vocab())
      return target_probs_sub(f.final_hidden, graph->head_rows(), f.lse, t.target_pos, softcap, cfg.precision,
                              !portable);
    return target_probs(f.final_hidden, lm_head_dev, t.target_pos, softcap, cfg.precision, !portable);
  }

  SlotTargets slot_targets(size_t i, std::span<const int64_t> anchors) const {
    return make_slot_targets(tokens(i), mask(i), anchors, drafter->config().gamma, drafter->config().draft_vocab);
  }

  int64_t max_len() const {
    const int64_t ctx = target.info().context;
    return cfg.max_len > 0 ? (ctx > 0 ? std::min(cfg.max_len, ctx) : cfg.max_len) : ctx;
  }
  std::span<const TokenId> tokens(size_t i) const {
    const auto& s = data.sequences[i].tokens;
    return {s.data(), static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(s.size()), max_len()))};
  }
  std::span<const uint8_t> mask(size_t i) const {
    const auto& s = data.sequences[i].loss_mask;
    return {s.data(), static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(s.size()), max_len()))};
  }

  Features run_target(size_t i) {
    auto toks = tokens(i);
    const TapRequest taps{drafter->config().tap_layers, /*final_hidden=*/true};
    ForwardOut o;
    if (portable) {
      if (!aten) aten = std::make_unique<AtenForward>(target, AtenForwardOptions{dev, at::kBFloat16});
      o = aten->forward(toks, Logits::None, taps);
    } else {
      KVCache kv = target.new_cache(static_cast<int64_t>(toks.size()));
      o = target.forward_one(kv, toks, Logits::None, taps);
    }
    // bf16 storage halves the feature cache; the rounding happens on every
    // visit, so a cached and a recomputed sequence give identical steps.
    const bool bf16 = cfg.precision == MatmulPrecision::BFloat16;
    const auto dt = bf16 ? at::kBFloat16 : at::kFloat;
    Features f{o.taps.to(at::kCPU, dt), o.final_hidden.to(at::kCPU, dt), {}, {}};
    if (draft_vocab()) {
      // Only positions whose next token is supervised are ever a slot's
      // target (make_slot_targets' `valid`): the full-vocabulary head, most
      // of this function's time for a large vocabulary, runs on those alone.
      // The others get lse +inf (p_target 0) and argmax -1.
      const auto m = mask(i);
      std::vector<int64_t> rows;
      for (size_t t = 0; t + 1 < m.size(); ++t)
        if (m[t + 1] != 0) rows.push_back(static_cast<int64_t>(t));
      const int64_t L = o.final_hidden.size(0);
      const auto lse_type = o.final_hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      f.lse = at::full({L}, std::numeric_limits<double>::infinity(), at::TensorOptions(lse_type));
      f.argmax = at::full({L}, -1, at::kLong);
      if (!rows.empty()) {
        const at::Tensor idx = at::tensor(rows, at::kLong);
        TargetLogitStats st = target_logit_stats(o.final_hidden.index_select(0, idx.to(o.final_hidden.device())),
                                                 lm_head_dev, target.info().logit_softcap, cfg.precision, !portable);
        f.lse.index_copy_(0, idx, st.lse.cpu().to(lse_type));
        f.argmax.index_copy_(0, idx, st.argmax.cpu());
      }
    }
    return f;
  }

  Features features(size_t i, bool eval, double& seconds, int64_t& n_tokens) {
    if (eval) {
      if (auto it = eval_cache.find(i); it != eval_cache.end()) return on_device(it->second);
    } else if (auto it = cache.find(i); it != cache.end()) {
      lru.splice(lru.begin(), lru, it->second.second);
      return on_device(it->second.first);
    }
    std::optional<Features> stored = !eval && disk ? disk->get(i, tokens(i)) : std::nullopt;
    Features f;
    if (stored) {
      f = std::move(*stored);
    } else {
      const auto t0 = Clock::now();
      f = run_target(i);
      seconds += since(t0);
      n_tokens += f.taps.size(0);
      if (!eval && disk) disk->put(i, tokens(i), f);
    }
    if (eval) {
      eval_cache.emplace(i, f);
    } else if (cfg.feature_cache_mb > 0 && f.bytes() <= cfg.feature_cache_mb * (int64_t{1} << 20)) {
      while (cache_bytes + f.bytes() > cfg.feature_cache_mb * (int64_t{1} << 20) && !lru.empty()) {
        auto victim = cache.find(lru.back());
        cache_bytes -= victim->second.first.bytes();
        cache.erase(victim);
        lru.pop_back();
      }
      lru.push_front(i);
      cache.emplace(i, std::make_pair(f, lru.begin()));
      cache_bytes += f.bytes();
    }
    return on_device(f);
  }

  // Opens the --feature-cache-dir cache and prints its size estimate.
  void open_disk_cache() {
    const DrafterConfig& dc = drafter->config();
    // Features depend on the target's compute path (quantized blocks or bf16) too.
    // ... and on who computes them (the kernels, or AtenForward in bf16).
    FeatureCacheKey key{target.info().id + "@" + (portable ? std::string("aten-bf16") : target.info().compute),
                        dc.tap_layers, max_len(),
                        cfg.precision == MatmulPrecision::BFloat16, draft_vocab()};
    disk = std::make_unique<DiskFeatureCache>(cfg.feature_cache_dir, key);
    if (cfg.progress == Progress::None) return;
    int64_t n_tokens = 0;
    for (size_t i : train_idx) n_tokens += static_cast<int64_t>(tokens(i).size());
    const int64_t per = feature_bytes_per_token(key, target.info().hidden);
    const double gb = static_cast<double>(n_tokens * per) / 1e9, free_gb = static_cast<double>(disk->free_bytes()) / 1e9;
    std::fprintf(stderr, "feature cache %s: %zu sequences, %lld tokens x %.1f KB = %.1f GB when full; %.1f GB free there%s\n",
                 cfg.feature_cache_dir.c_str(), train_idx.size(), static_cast<long long>(n_tokens),
                 static_cast<double>(per) / 1e3, gb, free_gb,
                 free_gb < gb + 1.0 ? " (it stops growing 1 GB short of full; the rest is recomputed)" : "");
  }

  void new_epoch_order() {
    order = train_idx;
    std::mt19937_64 r(cfg.seed * kEpochSalt + static_cast<uint64_t>(epoch) + 1);
    shuffle(order, r);
    cursor = 0;
  }

  // Up to `want` anchors of sequence i for this visit (see AnchorDraw). A
  // fixed draw of fewer than anchors_per_seq (the last group of a batch) is
  // a subset of the full one: the partial Fisher-Yates of sample_anchors
  // makes the same first picks from the same generator.
  std::vector<int64_t> draw_anchors(size_t i, int want) {
    if (cfg.anchors == AnchorDraw::Fixed) {
      std::mt19937_64 r(cfg.seed ^ kFixedAnchorSalt ^ (static_cast<uint64_t>(i) * kEpochSalt));
      return sample_anchors(mask(i), want, r);
    }
    return sample_anchors(mask(i), want, rng);
  }

  size_t next_sequence() {
    if (cursor >= order.size()) {
      ++epoch;
      new_epoch_order();
    }
    return order[cursor++];
  }

  // A draft vocabulary asked for in cfg.drafter must be the drafter's own.
  void check_draft_vocab(const std::string& where) const {
    const auto& want = cfg.drafter.draft_vocab;
    if (!want.empty() && drafter->config().draft_vocab != want)
      throw InvalidArgument(where + ": the drafter has a draft vocabulary of " +
                            std::to_string(drafter->config().draft_vocab.size()) +
                            " tokens, this run asks for a different one of " + std::to_string(want.size()) +
                            " tokens");
  }

  void setup_params_and_optimizer() {
    params.clear();
    std::vector<OptParam> named;
    auto& mp = drafter->mutable_params();
    for (const auto& [name, shape] : Drafter::param_spec(drafter->config())) {
      at::Tensor& p = mp.at(name);
      p = p.detach().to(dev).contiguous();
      p.requires_grad_(true);
      params.push_back(p);
      named.push_back({name, p, is_muon_param(name, p.sizes())});
    }
    OptimizerOptions oo;
    oo.kind = cfg.optimizer;
    oo.beta1 = cfg.adam_beta1;
    oo.beta2 = cfg.adam_beta2;
    oo.eps = cfg.adam_eps;
    oo.weight_decay = cfg.weight_decay;
    oo.muon_momentum = cfg.muon_momentum;
    oo.muon_lr_scale = cfg.muon_lr_scale;
    oo.muon_ns_bf16 = cfg.precision == MatmulPrecision::BFloat16;
    opt = std::make_unique<Optimizer>(std::move(named), oo);
    graph = std::make_unique<DrafterGraph>(drafter->config(), target.embedding().to(dev), lm_head_dev,
                                           GraphOptions{cfg.precision, !portable});
  }

  void split() {
    const size_t n = data.sequences.size();
    std::vector<size_t> all(n);
    std::iota(all.begin(), all.end(), size_t{0});
    auto no_anchor = [&](size_t i) { return eligible_anchors(mask(i)).empty(); };
    if (cfg.eval_only) {
      std::erase_if(all, no_anchor);
      if (all.empty())
        throw Error(cfg.data_label() + ": no sequence has an anchor to evaluate (two consecutive supervised "
                    "tokens after position 0)");
      if (cfg.eval_max_sequences > 0 && all.size() > static_cast<size_t>(cfg.eval_max_sequences))
        all.resize(static_cast<size_t>(cfg.eval_max_sequences));
      eval_idx = all;
      train_idx.clear();
      eval_held_out = true;
      sample_eval_anchors();
      return;
    }
    std::mt19937_64 r(split_seed_of(cfg) ^ kSplitSalt);
    shuffle(all, r);
    size_t n_eval = n >= 2 ? static_cast<size_t>(std::floor(cfg.eval_fraction * static_cast<double>(n))) : 0;
    n_eval = std::min<size_t>(n_eval, static_cast<size_t>(cfg.eval_max_sequences));
    eval_idx.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n_eval));
    train_idx.assign(all.begin() + static_cast<std::ptrdiff_t>(n_eval), all.end());
    std::sort(eval_idx.begin(), eval_idx.end());
    std::sort(train_idx.begin(), train_idx.end());
    // Only sequences with at least one anchor take part.
    std::erase_if(train_idx, no_anchor);
    std::erase_if(eval_idx, no_anchor);
    if (train_idx.empty())
      throw Error(cfg.data_label() + ": no sequence has a trainable anchor (two consecutive supervised "
                  "tokens after position 0)");
    eval_held_out = !eval_idx.empty();
    if (!eval_held_out) {
      const size_t k = std::min<size_t>(train_idx.size(), std::max(1, cfg.eval_max_sequences));
      eval_idx.assign(train_idx.begin(), train_idx.begin() + static_cast<std::ptrdiff_t>(k));
    }
    sample_eval_anchors();
  }

  void sample_eval_anchors() {
    eval_anchors.clear();
    for (size_t i : eval_idx) {
      std::mt19937_64 r2(split_seed_of(cfg) ^ kEvalSalt ^ (static_cast<uint64_t>(i) * kEpochSalt));
      eval_anchors.push_back(sample_anchors(mask(i), cfg.eval_anchors_per_seq, r2));
    }
  }

  // ---- checkpoints --------------------------------------------------------

  fs::path ckpt_root() const { return fs::path(cfg.out_dir) / "checkpoints"; }

  // Name of the step directory latest.json points to ("" when none).
  std::string latest_dir() const {
    const fs::path latest = ckpt_root() / "latest.json";
    if (!fs::exists(latest)) return "";
    try {
      return read_json(latest.string()).value("dir", "");
    } catch (const Error&) {
      return "";
    }
  }

  void save() {
    fs::create_directories(ckpt_root());
    const std::string name = step_dir_name(step);
    const fs::path dir = ckpt_root() / name;
    const nlohmann::json train_extra = {{"train", {{"step", step}}}};
    // A checkpoint of this very step that latest.json already names holds
    // exactly these weights (only step() changes them): keep it.
    if (!(fs::exists(dir) && latest_dir() == name)) {
      // Everything goes to a scratch directory that is renamed into place
      // once complete, then latest.json is switched to it.
      const fs::path tmp = ckpt_root() / (name + ".partial");
      std::error_code ec;
      fs::remove_all(tmp, ec);
      save_drafter(host_drafter(), tmp.string(), /*bf16=*/false, train_extra);

      torch::serialize::OutputArchive ar;
      opt->save(ar);
      std::ostringstream os;
      ar.save_to(os);
      const std::string opt_bytes = os.str();
      io::write_file_atomic((tmp / "optimizer.pt").string(), opt_bytes);

      std::ostringstream rs;
      rs << rng;
      nlohmann::json state = {{"step", step},
                              {"epoch", epoch},
                              {"cursor", cursor},
                              {"rng", rs.str()},
                              {"optimizer_bytes", opt_bytes.size()},
                              {"data", data_fingerprint(data)},
                              {"identity", identity_json(cfg)},
                              {"config", config_json(cfg)}};
      io::write_json_atomic((tmp / "trainer_state.json").string(), state);
      fs::remove_all(dir, ec);  // a stale copy that latest.json does not name
      fs::rename(tmp, dir);
      io::write_json_atomic((ckpt_root() / "latest.json").string(), {{"step", step}, {"dir", name}});
    }

    // The shipping export (bf16) next to the checkpoints.
    save_drafter(host_drafter(), cfg.out_dir, /*bf16=*/true, train_extra);

    // Keep the newest keep_checkpoints step directories; drop leftovers of
    // interrupted saves.
    std::error_code ec;
    std::vector<std::string> dirs, partial;
    for (const auto& e : fs::directory_iterator(ckpt_root())) {
      const std::string n = e.path().filename().string();
      if (!e.is_directory() || n.rfind("step-", 0) != 0) continue;
      (n.size() > 8 && n.substr(n.size() - 8) == ".partial" ? partial : dirs).push_back(n);
    }
    std::sort(dirs.begin(), dirs.end());
    for (size_t k = 0; k + static_cast<size_t>(cfg.keep_checkpoints) < dirs.size(); ++k)
      if (dirs[k] != name) partial.push_back(dirs[k]);
    for (const auto& n : partial) fs::remove_all(ckpt_root() / n, ec);
  }

  void resume() {
    const std::string latest = (ckpt_root() / "latest.json").string();
    if (!fs::exists(latest))
      throw Error(latest + ": no checkpoint to resume from (train without --resume first)");
    const nlohmann::json lj = read_json(latest);
    if (!lj.contains("dir") || !lj["dir"].is_string() || !lj.contains("step"))
      throw FormatError(latest + ": expected {\"step\", \"dir\"}");
    const fs::path dir = ckpt_root() / lj["dir"].get<std::string>();
    const std::string spath = (dir / "trainer_state.json").string();
    const nlohmann::json st = read_json(spath);
    const int64_t s = st.value("step", int64_t{-1});
    if (s != lj["step"].get<int64_t>())
      throw FormatError(spath + ": step " + std::to_string(s) + " does not match latest.json step " +
                        std::to_string(lj["step"].get<int64_t>()));
    if (st.value("identity", nlohmann::json()) != identity_json(cfg))
      throw InvalidArgument(spath + ": the checkpoint was made with " + st.value("identity", nlohmann::json()).dump() +
                            ", this run asks for " + identity_json(cfg).dump() +
                            " (seed, batch, anchors_per_seq, anchors, optimizer, eval split and max_len must not "
                            "change on resume)");
    // The data position (epoch, cursor, the split) means something only on
    // the same sequences in the same order. Checkpoints from before the
    // fingerprint was recorded have none and are not checked.
    if (st.contains("data")) {
      const nlohmann::json want = st["data"], got = data_fingerprint(data);
      if (want.value("hash", "") != got.value("hash", ""))
        throw InvalidArgument(spath + ": the checkpoint was trained on other data (" +
                              std::to_string(want.value("n_sequences", int64_t{0})) + " sequences, " +
                              std::to_string(want.value("n_tokens", int64_t{0})) + " tokens, hash " +
                              want.value("hash", "") + ") than " + cfg.data_label() + " holds (" +
                              std::to_string(got.value("n_sequences", int64_t{0})) + " sequences, " +
                              std::to_string(got.value("n_tokens", int64_t{0})) + " tokens, hash " +
                              got.value("hash", "") + "); resume with the data the run started on (its recipe: " +
                              want.value("recipe", nlohmann::json::object()).dump() + ")");
    }
    const nlohmann::json dj = read_drafter_json(dir.string());
    if (!dj.contains("train") || dj["train"].value("step", int64_t{-1}) != s)
      throw FormatError((dir / "dspark.json").string() + ": not the weights of step " + std::to_string(s));
    drafter = std::make_unique<Drafter>(load_drafter(dir.string()));
    check_drafter_matches(drafter->config(), target.info());
    check_draft_vocab(dir.string());
    setup_params_and_optimizer();

    const std::string opath = (dir / "optimizer.pt").string();
    const std::string bytes = read_file(opath);
    if (static_cast<int64_t>(bytes.size()) != st.value("optimizer_bytes", int64_t{-1}))
      throw FormatError(opath + ": size " + std::to_string(bytes.size()) +
                        " does not match trainer_state.json optimizer_bytes");
    torch::serialize::InputArchive ar;
    ar.load_from(bytes.data(), bytes.size(), dev);
    try {
      opt->load(ar);
    } catch (const FormatError& e) {
      throw FormatError(opath + ": " + e.what());
    }

    step = s;
    epoch = st.at("epoch").get<int64_t>();
    cursor = st.at("cursor").get<size_t>();
    std::istringstream rs(st.at("rng").get<std::string>());
    rs >> rng;
    if (rs.fail()) throw FormatError(spath + ": malformed rng state");
    new_epoch_order_keep_cursor();
  }

  void new_epoch_order_keep_cursor() {
    const size_t c = cursor;
    new_epoch_order();
    cursor = c;
  }
};

Trainer::Trainer(TrainConfig cfg, TargetModel& target) : impl_(std::make_unique<Impl>(std::move(cfg), target)) {
  Impl& m = *impl_;
  m.cfg.validate();
  m.data = TrainDataset::load(m.cfg.data_dirs);
  const TargetInfo& ti = target.info();
  if (m.data.target_id != ti.id)
    throw InvalidArgument(m.cfg.data_label() + ": the data set was generated by '" + m.data.target_id +
                          "', the loaded target is '" + ti.id + "'");
  for (size_t i = 0; i < m.data.sequences.size(); ++i)
    for (TokenId t : m.data.sequences[i].tokens)
      if (t >= ti.vocab)
        throw FormatError(m.cfg.data_label() + ": sequence " + std::to_string(i) + " holds token id " +
                          std::to_string(t) + " outside the target's vocabulary");
  m.setup_device();
  m.rng.seed(m.cfg.seed);
  m.split();
  if (m.cfg.resume) {
    m.resume();
  } else {
    if (!m.cfg.init_drafter.empty()) {
      m.drafter = std::make_unique<Drafter>(load_drafter(m.cfg.init_drafter));
      check_drafter_matches(m.drafter->config(), ti);
      const auto& want = m.cfg.drafter.draft_vocab;
      if (!want.empty() && m.drafter->config().draft_vocab.empty()) {
        DrafterConfig dc = m.drafter->config();
        dc.draft_vocab = want;
        dc.validate();
        m.drafter = std::make_unique<Drafter>(dc, m.drafter->params());
      }
      m.check_draft_vocab(m.cfg.init_drafter);
      if (m.cfg.grow_layers > 0 && m.cfg.grow_layers != m.drafter->config().n_layers)
        m.drafter = std::make_unique<Drafter>(grow_drafter(*m.drafter, m.cfg.grow_layers, m.cfg.seed));
    } else {
      DrafterConfig dc = m.cfg.drafter;
      dc.complete_from(ti);
      m.drafter = std::make_unique<Drafter>(Drafter::init(dc, m.cfg.seed));
    }
    m.setup_params_and_optimizer();
    m.new_epoch_order();
  }
  if (!m.cfg.feature_cache_dir.empty()) m.open_disk_cache();
}

Trainer::~Trainer() = default;

int64_t Trainer::steps_done() const { return impl_->step; }
int64_t Trainer::epoch() const { return impl_->cursor >= impl_->order.size() ? impl_->epoch + 1 : impl_->epoch; }
const TrainConfig& Trainer::config() const { return impl_->cfg; }
Drafter& Trainer::drafter() { return *impl_->drafter; }
const std::vector<size_t>& Trainer::train_indices() const { return impl_->train_idx; }
const std::vector<size_t>& Trainer::eval_indices() const { return impl_->eval_idx; }

StepStats Trainer::step() {
  Impl& m = *impl_;
  if (m.cfg.eval_only) throw InvalidArgument("train: a trainer made for evaluation only does not step");
  const auto t0 = Clock::now();
  StepStats st;
  st.lr = lr_at(m.cfg, m.step);

  // Draw the batch: (sequence, anchors) groups.
  struct Group {
    size_t seq;
    SlotTargets t;
  };
  std::vector<Group> groups;
  int64_t n_anchors = 0;
  while (n_anchors < m.cfg.batch) {
    const size_t i = m.next_sequence();
    const int want = static_cast<int>(std::min<int64_t>(m.cfg.anchors_per_seq, m.cfg.batch - n_anchors));
    std::vector<int64_t> a = m.draw_anchors(i, want);
    if (a.empty()) continue;
    n_anchors += static_cast<int64_t>(a.size());
    groups.push_back({i, m.slot_targets(i, a)});
    st.groups.push_back({i, std::move(a)});
  }
  double norm = 0;
  for (auto& g : groups) {
    norm += slot_weight_sum(g.t.valid, m.cfg.loss.gamma_decay);
    g.t = m.on_device(g.t);
  }

  m.opt->zero_grad();
  for (const auto& g : groups) {
    Impl::Features f = m.features(g.seq, false, st.target_seconds, st.tokens);
    at::Tensor pt = m.target_distribution(f, g.t);
    GraphOut out = m.graph->forward(m.drafter->params(), f.taps, g.t.anchors, g.t.prev_tokens);
    LossTerms loss = dspark_loss(out, pt, g.t, m.loss_options(), norm);
    loss.total.backward();
    st.ce += loss.ce;
    st.l1 += loss.l1;
    st.bce += loss.bce;
    st.kl += loss.kl;
  }
  st.grad_norm = torch::nn::utils::clip_grad_norm_(
      m.params, m.cfg.grad_clip > 0 ? m.cfg.grad_clip : std::numeric_limits<double>::infinity());
  m.opt->step(st.lr, m.cfg.muon_lr * st.lr / m.cfg.lr);
  ++m.step;

  if (norm > 0) {
    st.ce /= norm;
    st.l1 /= norm;
    st.bce /= norm;
    st.kl /= norm;
  }
  st.loss = total_loss(m.cfg.loss, st.ce, st.l1, st.bce, st.kl);
  st.step = m.step;
  st.anchors = n_anchors;
  st.sequences = static_cast<int64_t>(groups.size());
  st.valid_slots = norm;
  st.seconds = since(t0);
  return st;
}

EvalStats Trainer::evaluate() {
  Impl& m = *impl_;
  const auto t0 = Clock::now();
  c10::NoGradGuard no_grad;
  EvalStats ev;
  ev.held_out = m.eval_held_out;
  double ts = 0;
  int64_t nt = 0;
  for (size_t k = 0; k < m.eval_idx.size(); ++k) {
    const size_t i = m.eval_idx[k];
    if (m.eval_anchors[k].empty()) continue;
    SlotTargets t = m.on_device(m.slot_targets(i, m.eval_anchors[k]));
    Impl::Features f = m.features(i, true, ts, nt);
    at::Tensor pt = m.target_distribution(f, t);
    GraphOut out = m.graph->forward(m.drafter->params(), f.taps, t.anchors, t.prev_tokens);
    LossTerms loss = dspark_loss(out, pt, t, m.loss_options());
    if (m.draft_vocab()) {
      at::Tensor target_argmax = f.argmax.index_select(0, t.target_pos.reshape({-1})).view_as(t.target_pos);
      accumulate_acceptance(out, target_argmax, m.graph->vocab_ids(), t, loss, ev.acceptance);
    } else {
      accumulate_acceptance(out, pt, t, loss, ev.acceptance);
    }
    ++ev.sequences;
  }
  const auto& a = ev.acceptance;
  if (a.weight_sum > 0) {
    ev.ce = a.ce / a.weight_sum;
    ev.l1 = a.l1 / a.weight_sum;
    ev.bce = a.bce / a.weight_sum;
    ev.kl = a.kl / a.weight_sum;
    ev.loss = total_loss(m.cfg.loss, ev.ce, ev.l1, ev.bce, ev.kl);
  }
  ev.seconds = since(t0);
  return ev;
}

void Trainer::save_checkpoint() { impl_->save(); }

int64_t Trainer::fill_feature_cache() {
  Impl& m = *impl_;
  if (!m.disk) throw InvalidArgument("train: filling the feature cache needs a cache directory (--feature-cache-dir)");
  const bool talk = m.cfg.progress != Progress::None;
  int64_t computed = 0, tokens = 0;
  double seconds = 0;
  const auto t0 = Clock::now();
  // Every sequence with an anchor, the held-out ones too: a later run with
  // another split seed trains on them.
  std::vector<size_t> all;
  for (size_t i = 0; i < m.data.sequences.size(); ++i)
    if (!eligible_anchors(m.mask(i)).empty()) all.push_back(i);
  for (size_t k = 0; k < all.size(); ++k) {
    const size_t i = all[k];
    if (m.disk->get(i, m.tokens(i))) continue;
    const auto t1 = Clock::now();
    m.disk->put(i, m.tokens(i), m.run_target(i));
    seconds += since(t1);
    tokens += static_cast<int64_t>(m.tokens(i).size());
    ++computed;
    if (talk && (computed % 64 == 0 || k + 1 == all.size()))
      std::fprintf(stderr, "feature cache: %zu/%zu sequences, %lld computed (%.0f tok/s)\n", k + 1,
                   all.size(), static_cast<long long>(computed),
                   static_cast<double>(tokens) / std::max(seconds, 1e-9));
  }
  if (talk)
    std::fprintf(stderr, "feature cache %s: %lld sequences computed, %zu already there, %.0f s\n",
                 m.cfg.feature_cache_dir.c_str(), static_cast<long long>(computed),
                 all.size() - static_cast<size_t>(computed), since(t0));
  return computed;
}

EvalStats Trainer::run() {
  Impl& m = *impl_;
  const TrainConfig& c = m.cfg;
  if (c.eval_only) throw InvalidArgument("train: a trainer made for evaluation only does not run; call evaluate()");
  Progress mode = c.progress;
  if (mode == Progress::Auto) mode = isatty(fileno(stderr)) ? Progress::Live : Progress::Lines;
  fs::create_directories(c.out_dir);
  std::ofstream metrics(fs::path(c.out_dir) / "metrics.jsonl", std::ios::app);
  auto log_json = [&](const nlohmann::json& j) {
    if (metrics) metrics << j.dump() << "\n" << std::flush;
  };
  auto eval_line = [&](const EvalStats& e) {
    const auto& a = e.acceptance;
    nlohmann::json j = {{"eval_step", m.step},
                        {"held_out", e.held_out},
                        {"sequences", e.sequences},
                        {"anchors", a.anchors},
                        {"loss", e.loss},
                        {"ce", e.ce},
                        {"l1", e.l1},
                        {"bce", e.bce},
                        {"kl", e.kl},
                        {"tau_greedy", a.mean_tau_greedy()},
                        {"tau_sample", a.mean_tau_sample()},
                        {"acceptance_by_position", a.acceptance_by_position()},
                        {"seconds", e.seconds}};
    log_json(j);
    if (mode != Progress::None) {
      if (mode == Progress::Live) std::fprintf(stderr, "\r\033[K");
      std::fprintf(stderr, "eval @%lld (%s, %lld anchors): loss %.4f | tau greedy %.3f | tau sample %.3f | acc",
                   static_cast<long long>(m.step), e.held_out ? "held-out" : "train split",
                   static_cast<long long>(a.anchors), e.loss, a.mean_tau_greedy(), a.mean_tau_sample());
      for (double v : a.acceptance_by_position()) std::fprintf(stderr, " %.2f", v);
      std::fprintf(stderr, "\n");
    }
  };

  if (mode != Progress::None) {
    const DrafterConfig& dc = m.drafter->config();
    const std::string vocab = dc.draft_vocab.empty()
                                  ? "full vocabulary"
                                  : "draft vocabulary of " + std::to_string(dc.draft_vocab.size()) + " tokens";
    std::fprintf(stderr, "training %s drafter (%d layers, gamma %d, %s) on %zu sequences (%zu held out), %lld steps of %d anchors\n",
                 to_string(dc.seq_head).c_str(), dc.n_layers, dc.gamma, vocab.c_str(), m.train_idx.size(),
                 m.eval_held_out ? m.eval_idx.size() : size_t{0}, static_cast<long long>(c.steps), c.batch);
    if (m.step > 0)
      std::fprintf(stderr, "resumed at step %lld%s\n", static_cast<long long>(m.step),
                   m.step >= c.steps ? " (nothing left to train: --steps is not above it; evaluating and exporting)"
                                     : "");
    if (c.device != "cpu" || c.aten_only)
      std::fprintf(stderr, "device %s%s\n", c.device.c_str(), m.portable ? ", ATen ops (target as AtenForward)" : "");
  }
  const auto t_start = Clock::now();
  const int64_t first = m.step;
  double anchors_total = 0, tokens_total = 0, step_s_total = 0, target_s_total = 0;
  StepStats acc;  // running sums for Lines mode
  int64_t acc_n = 0;
  EvalStats last;
  while (m.step < c.steps) {
    StepStats s = step();
    anchors_total += static_cast<double>(s.anchors);
    tokens_total += static_cast<double>(s.tokens);
    step_s_total += s.seconds;
    target_s_total += s.target_seconds;
    acc.loss += s.loss;
    acc.ce += s.ce;
    acc.l1 += s.l1;
    acc.bce += s.bce;
    acc.kl += s.kl;
    ++acc_n;
    const double el = since(t_start);
    const double sps = static_cast<double>(m.step - first) / std::max(el, 1e-9);
    const double eta = static_cast<double>(c.steps - m.step) / std::max(sps, 1e-9);
    if (mode == Progress::Live) {
      std::fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.4f (ce %.3f l1 %.3f bce %.3f) | lr %.2e | %.2f steps/s | %.1f anchors/s | ETA %s",
                   static_cast<long long>(m.step), static_cast<long long>(c.steps), s.loss, s.ce, s.l1, s.bce, s.lr,
                   sps, anchors_total / std::max(el, 1e-9), format_duration(eta).c_str());
    }
    if (m.step % c.log_every == 0 || m.step == c.steps) {
      const double n = static_cast<double>(std::max<int64_t>(acc_n, 1));
      log_json({{"step", m.step},
                {"loss", acc.loss / n},
                {"ce", acc.ce / n},
                {"l1", acc.l1 / n},
                {"bce", acc.bce / n},
                {"kl", acc.kl / n},
                {"lr", s.lr},
                {"grad_norm", s.grad_norm},
                {"steps_per_s", sps},
                {"anchors_per_s", anchors_total / std::max(el, 1e-9)},
                {"target_tokens_per_s", tokens_total / std::max(el, 1e-9)},
                {"target_time_share", target_s_total / std::max(step_s_total, 1e-9)}});
      if (mode == Progress::Lines)
        std::fprintf(stderr, "step %lld/%lld | loss %.4f (ce %.3f l1 %.3f bce %.3f) | lr %.2e | %.2f steps/s | %.1f anchors/s | ETA %s\n",
                     static_cast<long long>(m.step), static_cast<long long>(c.steps), acc.loss / n, acc.ce / n,
                     acc.l1 / n, acc.bce / n, s.lr, sps, anchors_total / std::max(el, 1e-9),
                     format_duration(eta).c_str());
      acc = StepStats{};
      acc_n = 0;
    }
    const bool final_step = m.step == c.steps;
    if (!final_step && c.eval_every > 0 && m.step % c.eval_every == 0) {
      eval_line(evaluate());
    }
    if (!final_step && c.save_every > 0 && m.step % c.save_every == 0) save_checkpoint();
  }
  if (mode == Progress::Live) std::fprintf(stderr, "\n");
  last = evaluate();
  eval_line(last);
  save_checkpoint();
  if (mode != Progress::None)
    std::fprintf(stderr, "wrote %s (step %lld)\n", c.out_dir.c_str(), static_cast<long long>(m.step));
  return last;
}

}  // namespace dspark::train
