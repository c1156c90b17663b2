// Self-distillation data regeneration; see regen.hpp.
#include "dspark/io/regular_file.hpp"
#include "dspark/train/regen.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/io/safetensors.hpp"
#include "dspark/speculative/runner.hpp"
#include "dspark/tokenizer/tokenizer.hpp"

namespace dspark::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string shard_name(size_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "data-%05zu.safetensors", index);
  return buf;
}

bool is_shard_name(const std::string& name) {
  if (name.size() != std::strlen("data-00000.safetensors")) return false;
  if (name.rfind("data-", 0) != 0 || name.substr(10) != ".safetensors") return false;
  return std::all_of(name.begin() + 5, name.begin() + 10, [](char c) { return c >= '0' && c <= '9'; });
}

// Exclusive advisory lock on DIR/.lock for the lifetime of the object, so two
// runs never append to one directory at the same time.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    const std::string path = dir + "/.lock";
    fd_ = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path + ": open failed: " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK) throw Error(dir + " is in use by another `dspark regen` run");
      throw Error(path + ": flock failed: " + std::strerror(err));
    }
  }
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

// A string-array metadata value of a shard ("[]" when absent).
std::vector<std::string> metadata_list(const io::SafetensorsData& d, const std::string& key,
                                       const std::string& file) {
  auto it = d.metadata.find(key);
  if (it == d.metadata.end()) return {};
  json j;
  try {
    j = json::parse(it->second);
  } catch (const json::exception&) {
    throw FormatError(file + ": metadata '" + key + "' is not valid JSON");
  }
  if (!j.is_array()) throw FormatError(file + ": metadata '" + key + "' must be a JSON array of strings");
  std::vector<std::string> out;
  for (const auto& v : j) {
    if (!v.is_string()) throw FormatError(file + ": metadata '" + key + "' must be a JSON array of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

// Validated view of one shard's tensors.
struct ShardView {
  at::Tensor tokens, offsets, mask;  // I32 [N], I64 [n+1], U8 [N]
  std::vector<std::string> prompt_ids, dropped_ids;
};

ShardView check_shard(io::SafetensorsData&& d, const std::string& file) {
  auto get = [&](const char* name, at::ScalarType type) {
    auto it = d.tensors.find(name);
    if (it == d.tensors.end()) throw FormatError(file + ": tensor '" + name + "' is missing");
    const at::Tensor& t = it->second;
    if (t.scalar_type() != type || t.dim() != 1) {
      throw FormatError(file + ": tensor '" + name + "' must be 1-D " +
                        std::string(*io::safetensors_dtype_name(type)) + ", found " +
                        std::to_string(t.dim()) + "-D " +
                        std::string(io::safetensors_dtype_name(t.scalar_type()).value_or("?")));
    }
    return t;
  };
  ShardView v;
  v.tokens = get("tokens", at::kInt);
  v.offsets = get("offsets", at::kLong);
  v.mask = get("loss_mask", at::kByte);
  v.prompt_ids = metadata_list(d, "prompt_ids", file);
  v.dropped_ids = metadata_list(d, "dropped_ids", file);
  const int64_t n_tok = v.tokens.numel(), n_seq = v.offsets.numel() - 1;
  if (n_seq < 0) throw FormatError(file + ": tensor 'offsets' is empty, expected n_seq + 1 entries");
  if (v.mask.numel() != n_tok) {
    throw FormatError(file + ": 'loss_mask' has " + std::to_string(v.mask.numel()) +
                      " entries, 'tokens' " + std::to_string(n_tok));
  }
  if (static_cast<int64_t>(v.prompt_ids.size()) != n_seq) {
    throw FormatError(file + ": metadata 'prompt_ids' names " + std::to_string(v.prompt_ids.size()) +
                      " prompts, 'offsets' describes " + std::to_string(n_seq) + " sequences");
  }
  const int64_t* off = v.offsets.data_ptr<int64_t>();
  if (off[0] != 0 || off[n_seq] != n_tok) {
    throw FormatError(file + ": 'offsets' must start at 0 and end at " + std::to_string(n_tok) +
                      ", found " + std::to_string(off[0]) + " .. " + std::to_string(off[n_seq]));
  }
  for (int64_t i = 0; i < n_seq; ++i) {
    if (off[i + 1] < off[i])
      throw FormatError(file + ": 'offsets' decreases at entry " + std::to_string(i + 1));
  }
  return v;
}

json load_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  json m;
  try {
    m = json::parse(in);
  } catch (const json::exception& e) {
    throw FormatError(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!m.is_object() || m.value("format", "") != kRegenFormat || !m.contains("shards") ||
      !m["shards"].is_array()) {
    throw FormatError(path + ": not a " + std::string(kRegenFormat) +
                      " manifest (expected an object with \"format\" and \"shards\")");
  }
  for (const auto& s : m["shards"]) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() ||
        !is_shard_name(s["file"].get<std::string>()))
      throw FormatError(path + ": shard entry " + s.dump() + " lacks a valid \"file\"");
  }
  return m;
}

// A prompt's outcome, held until every earlier prompt has one.
struct Outcome {
  bool stored = false;
  std::vector<TokenId> tokens;
  std::vector<uint8_t> mask;
  std::string text;
};

}  // namespace

// ---------------------------------------------------------------------------
// Prompts file.

std::vector<PromptEntry> read_prompts_jsonl(const std::string& path) {
  if (std::filesystem::exists(path)) io::require_regular_file(path, "a prompts file (JSONL)");
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open prompts file");
  std::vector<PromptEntry> out;
  std::unordered_set<std::string> seen;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      throw FormatError(where + "not valid JSON (expected one object per line)");
    }
    if (!j.is_object()) throw FormatError(where + "expected a JSON object, found " + std::string(j.type_name()));
    if (!j.contains("prompt") || !j["prompt"].is_string())
      throw FormatError(where + "expected a string \"prompt\"");
    PromptEntry e;
    e.text = j["prompt"].get<std::string>();
    if (e.text.empty()) throw FormatError(where + "\"prompt\" is empty");
    if (j.contains("id")) {
      if (!j["id"].is_string())
        throw FormatError(where + "\"id\" must be a string, found " + std::string(j["id"].type_name()));
      e.id = j["id"].get<std::string>();
    } else {
      e.id = "line-" + std::to_string(n);
    }
    if (j.contains("kind")) {
      if (!j["kind"].is_string())
        throw FormatError(where + "\"kind\" must be a string, found " + std::string(j["kind"].type_name()));
      e.kind = j["kind"].get<std::string>();
    }
    if (!seen.insert(e.id).second) throw FormatError(where + "id '" + e.id + "' repeats an earlier line");
    out.push_back(std::move(e));
  }
  if (out.empty()) throw FormatError(path + ": no prompts");
  return out;
}

// ---------------------------------------------------------------------------
// Batched decoding.

void generate_batched(TargetModel& model, std::span<const BatchRequest> requests,
                      const GenerateOptions& opts, int64_t batch,
                      const std::function<bool(BatchResult&&)>& on_done,
                      const std::function<bool(int64_t)>& on_step) {
  if (batch < 1) throw InvalidArgument("batch must be >= 1, got " + std::to_string(batch));
  if (opts.n_predict < 1)
    throw InvalidArgument("n_predict must be >= 1, got " + std::to_string(opts.n_predict));
  opts.sampling.validate();
  const TargetInfo& info = model.info();
  const int64_t ctx = opts.ctx_size > 0 ? opts.ctx_size : info.context;
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      check_prompt_fits(static_cast<int64_t>(requests[i].prompt.size()), ctx, info.context);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("request " + std::to_string(i) + ": " + e.what());
    }
  }
  // Plain sessions stepped by the one runner: the stop, budget and
  // full-context rules are the session's.
  struct Slot {
    size_t index;
    std::unique_ptr<SpecSession> session;
  };
  BatchRunner runner(model, nullptr, SpecOptions{});
  std::vector<Slot> active;
  std::vector<SpecSession*> sessions;
  size_t next = 0;
  for (;;) {
    while (static_cast<int64_t>(active.size()) < batch && next < requests.size()) {
      GenerateOptions o = opts;
      o.sampling.seed = requests[next].seed;
      active.push_back(Slot{next, std::make_unique<SpecSession>(model, nullptr, requests[next].prompt, o)});
      ++next;
    }
    if (active.empty()) break;
    sessions.clear();
    for (const Slot& s : active) sessions.push_back(s.session.get());
    const int64_t sampled = runner.step(sessions);

    std::vector<BatchResult> finished;
    std::vector<Slot> still;
    still.reserve(active.size());
    for (Slot& s : active) {
      if (!s.session->finished()) {
        still.push_back(std::move(s));
        continue;
      }
      GenerateResult& r = s.session->result();
      // The stop id that ended a sequence is kept as its last response token.
      if (r.stopped_by_eog) r.tokens.push_back(r.stop_token);
      finished.push_back(BatchResult{s.index, std::move(r.tokens), r.stopped_by_eog});
    }
    active = std::move(still);
    for (auto& r : finished)
      if (!on_done(std::move(r))) return;
    // A stop id is sampled too: count it as the old per-token loop did.
    int64_t stops = 0;
    for (const auto& r : finished) stops += r.stopped_by_eog ? 1 : 0;
    if (on_step && !on_step(sampled + stops)) return;
  }
}

// ---------------------------------------------------------------------------
// Progress.

double RegenProgress::tokens_per_s() const {
  return elapsed_s >= 1.0 ? static_cast<double>(generated_tokens) / elapsed_s : 0.0;
}

double RegenProgress::eta_s() const {
  const int64_t done_now = done - done_before;
  if (done_now <= 0 || elapsed_s <= 0) return 0.0;
  return static_cast<double>(total - done) * elapsed_s / static_cast<double>(done_now);
}

// ---------------------------------------------------------------------------
// Regeneration.

RegenSummary regenerate(const LoadedModel& model, const std::vector<PromptEntry>& prompts,
                        const std::string& out_dir, const RegenOptions& opts) {
  if (opts.batch < 1) throw InvalidArgument("--batch must be >= 1, got " + std::to_string(opts.batch));
  if (opts.n_predict < 1) throw InvalidArgument("-n must be >= 1, got " + std::to_string(opts.n_predict));
  if (opts.shard_sequences < 1)
    throw InvalidArgument("shard size must be >= 1, got " + std::to_string(opts.shard_sequences));
  if (opts.min_supervised < 0)
    throw InvalidArgument("min_supervised must be >= 0, got " + std::to_string(opts.min_supervised));
  if (opts.limit < 0) throw InvalidArgument("--limit must be >= 0, got " + std::to_string(opts.limit));
  if (opts.ctx_size < 0) throw InvalidArgument("-c must be >= 0, got " + std::to_string(opts.ctx_size));
  opts.sampling.validate();
  if (opts.chat && !model.chat) {
    throw Error(model.target->info().path +
                ": the model declares no supported chat template; regeneration needs one (or --raw)");
  }
  const auto t0 = Clock::now();
  TargetModel& target = *model.target;
  const TargetInfo& info = target.info();

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir + ": cannot create directory: " + ec.message());
  DirLock lock(out_dir);

  // fp32 settings rounded to 6 decimals so the manifest reads 0.7, not 0.699999988.
  auto dec6 = [](float v) { return std::round(static_cast<double>(v) * 1e6) / 1e6; };
  json sampling = {{"temperature", dec6(opts.sampling.temperature)}, {"top_k", opts.sampling.top_k},
                         {"top_p", dec6(opts.sampling.top_p)},             {"min_p", dec6(opts.sampling.min_p)},
                         {"seed", opts.sampling.seed},               {"n_predict", opts.n_predict},
                         {"min_supervised", opts.min_supervised}};
  if (opts.ctx_size > 0) sampling["ctx_size"] = opts.ctx_size;
  const std::string manifest_path = out_dir + "/manifest.json";
  json manifest;
  std::unordered_set<std::string> done_ids;
  if (fs::exists(manifest_path)) {
    manifest = load_manifest(manifest_path);
    if (manifest.value("target_id", "") != info.id) {
      throw Error(out_dir + " holds data generated by target '" + manifest.value("target_id", "") +
                  "', not '" + info.id + "': use another --out");
    }
    if (manifest.value("chat_template", true) != opts.chat) {
      throw Error(out_dir + " holds data generated with chat_template " +
                  manifest.value("chat_template", json(true)).dump() + ": use another --out");
    }
    json keys = sampling;
    if (manifest.contains("sampling") && manifest["sampling"].is_object()) keys.update(manifest["sampling"]);
    for (const auto& item : keys.items()) {  // every setting either side records
      const std::string& key = item.key();
      const json value = sampling.value(key, json());
      const json old = manifest.contains("sampling") ? manifest["sampling"].value(key, json()) : json();
      if (old != value) {
        throw Error(out_dir + " holds data generated with " + key + " = " + old.dump() + ", not " +
                    value.dump() + ": use the same settings to resume, or another --out");
      }
    }
    for (const auto& s : manifest["shards"]) {
      const std::string file = out_dir + "/" + s["file"].get<std::string>();
      ShardView v = check_shard(io::load_safetensors(file), file);
      for (auto& id : v.prompt_ids) done_ids.insert(std::move(id));
      for (auto& id : v.dropped_ids) done_ids.insert(std::move(id));
    }
    // One data set, one prompts file: what is stored must come from this one
    // (export-data looks every sequence's prompt up in it).
    std::unordered_set<std::string> given;
    for (const auto& p : prompts) given.insert(p.id);
    for (const auto& id : done_ids) {
      if (!given.count(id)) {
        throw Error(out_dir + " holds sequences of prompts that are not in " + opts.prompts_file + " (e.g. '" + id +
                    "'); it was generated from " + manifest.value("prompts_file", json("?")).dump() +
                    ": resume with that prompts file, or use another --out");
      }
    }
  } else {
    manifest = {{"format", kRegenFormat},
                {"target_id", info.id},
                {"target_path", fs::path(info.path).filename().string()},
                {"prompts_file", opts.prompts_file.empty()
                                     ? std::string()
                                     : fs::absolute(opts.prompts_file).lexically_normal().string()},
                {"chat_template", opts.chat},
                {"n_sequences", 0},
                {"n_tokens", 0},
                {"n_supervised", 0},
                {"n_dropped", 0},
                {"sampling", sampling},
                {"shards", json::array()}};
  }
  // Remove what a crash may have left: shards the manifest does not list and
  // temporary files of interrupted atomic writes.
  {
    std::set<std::string> listed;
    for (const auto& s : manifest["shards"]) listed.insert(s["file"].get<std::string>());
    for (const auto& entry : fs::directory_iterator(out_dir)) {
      const std::string name = entry.path().filename().string();
      const bool orphan = is_shard_name(name) && !listed.count(name);
      const bool temp = (name.rfind("data-", 0) == 0 || name.rfind("manifest.json", 0) == 0) &&
                        name.find(".tmp.") != std::string::npos;
      if (orphan || temp) fs::remove(entry.path());
    }
  }

  // The selection and what is left of it.
  const size_t n_sel = opts.limit > 0 ? std::min(prompts.size(), static_cast<size_t>(opts.limit))
                                      : prompts.size();
  std::vector<size_t> todo;  // prompt indices, in file order
  for (size_t i = 0; i < n_sel; ++i)
    if (!done_ids.count(prompts[i].id)) todo.push_back(i);

  RegenProgress prog;
  prog.total = static_cast<int64_t>(n_sel);
  prog.done_before = prog.done = static_cast<int64_t>(n_sel - todo.size());
  prog.stored = manifest["n_sequences"].get<int64_t>();
  prog.dropped = manifest["n_dropped"].get<int64_t>();
  prog.shards = static_cast<int64_t>(manifest["shards"].size());

  RegenSummary summary;
  summary.skipped_existing = prog.done_before;

  // Encode; prompts that cannot fit the context are dropped without generating.
  GenerateOptions gen;
  gen.n_predict = opts.n_predict;
  gen.ctx_size = opts.ctx_size;
  const int64_t ctx = opts.ctx_size > 0 ? opts.ctx_size : info.context;
  gen.sampling = opts.sampling;
  gen.stop_ids = model.stop_ids;
  std::vector<BatchRequest> requests;
  std::vector<size_t> request_pos;  // request -> position in todo
  std::map<size_t, Outcome> ready;  // todo position -> outcome
  for (size_t p = 0; p < todo.size(); ++p) {
    const size_t i = todo[p];
    std::vector<TokenId> ids = model.encode_prompt(prompts[i].text, opts.chat);
    if (ids.empty() || static_cast<int64_t>(ids.size()) >= ctx) {
      ready.emplace(p, Outcome{});
      continue;
    }
    requests.push_back(BatchRequest{std::move(ids), opts.sampling.seed + static_cast<uint64_t>(i)});
    request_pos.push_back(p);
  }

  // The shard being filled.
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};
  std::vector<uint8_t> mask;
  json ids = json::array(), dropped = json::array(), texts = json::array();
  int64_t supervised = 0;
  bool stop = false;

  auto report = [&](bool shard_written) {
    prog.elapsed_s = since(t0);
    prog.shard_written = shard_written;
    if (opts.on_progress && !opts.on_progress(prog)) stop = true;
    return !stop;
  };

  auto write_shard = [&]() {
    const size_t index = manifest["shards"].size();
    const std::string name = shard_name(index);
    const int64_t n_seq = static_cast<int64_t>(offsets.size()) - 1;
    const int64_t n_tok = static_cast<int64_t>(tokens.size());
    std::map<std::string, std::string> meta = {{"format", kRegenFormat},
                                               {"prompt_ids", ids.dump()},
                                               {"dropped_ids", dropped.dump()}};
    if (opts.save_text) meta["responses"] = texts.dump();
    io::save_safetensors(
        out_dir + "/" + name,
        {{"tokens", at::from_blob(tokens.data(), {n_tok}, at::kInt)},
         {"offsets", at::from_blob(offsets.data(), {n_seq + 1}, at::kLong)},
         {"loss_mask", at::from_blob(mask.data(), {n_tok}, at::kByte)}},
        meta);
    const int64_t n_drop = static_cast<int64_t>(dropped.size());
    manifest["shards"].push_back({{"file", name},
                                  {"n_sequences", n_seq},
                                  {"n_tokens", n_tok},
                                  {"n_supervised", supervised},
                                  {"n_dropped", n_drop}});
    manifest["n_sequences"] = manifest["n_sequences"].get<int64_t>() + n_seq;
    manifest["n_tokens"] = manifest["n_tokens"].get<int64_t>() + n_tok;
    manifest["n_supervised"] = manifest["n_supervised"].get<int64_t>() + supervised;
    manifest["n_dropped"] = manifest["n_dropped"].get<int64_t>() + n_drop;
    io::write_json_atomic(manifest_path, manifest);
    tokens.clear();
    offsets.assign(1, 0);
    mask.clear();
    ids = json::array();
    dropped = json::array();
    texts = json::array();
    supervised = 0;
    ++prog.shards;
    ++prog.shards_this_run;
    report(true);
  };

  // Moves consecutive outcomes, in prompt order, into the shard being filled.
  size_t next_emit = 0;
  auto emit = [&]() {
    while (!stop) {
      auto it = ready.find(next_emit);
      if (it == ready.end()) break;
      Outcome& o = it->second;
      const std::string& id = prompts[todo[next_emit]].id;
      if (o.stored) {
        tokens.insert(tokens.end(), o.tokens.begin(), o.tokens.end());
        mask.insert(mask.end(), o.mask.begin(), o.mask.end());
        offsets.push_back(static_cast<int64_t>(tokens.size()));
        for (uint8_t m : o.mask) supervised += m;
        ids.push_back(id);
        if (opts.save_text) texts.push_back(std::move(o.text));
        ++prog.stored;
      } else {
        dropped.push_back(id);
        ++prog.dropped;
      }
      ++prog.done;
      ready.erase(it);
      ++next_emit;
      if (static_cast<int64_t>(offsets.size()) - 1 >= opts.shard_sequences) write_shard();
    }
  };
  emit();  // prompts dropped up front may lead the queue

  if (!stop) {
    generate_batched(
        target, requests, gen, opts.batch,
        [&](BatchResult&& r) {
          const BatchRequest& req = requests[r.index];
          Outcome o;
          if (static_cast<int64_t>(r.response.size()) >= opts.min_supervised) {
            o.stored = true;
            o.tokens = req.prompt;
            o.tokens.insert(o.tokens.end(), r.response.begin(), r.response.end());
            o.mask.assign(req.prompt.size(), 0);
            o.mask.resize(o.tokens.size(), 1);
            if (opts.save_text) {
              std::vector<TokenId> body = r.response;
              if (r.stopped_by_eog) body.pop_back();
              tok::StreamDecoder dec(*model.tokenizer);
              for (TokenId t : body) o.text += dec.push(t);
              o.text += dec.flush();
            }
          }
          ready.emplace(request_pos[r.index], std::move(o));
          emit();
          return !stop;
        },
        [&](int64_t sampled) {
          prog.generated_tokens += sampled;
          return report(false);
        });
  }
  // A complete run flushes the partial shard; an interrupted one leaves it to the next run.
  if (!stop && next_emit == todo.size() && (offsets.size() > 1 || !dropped.empty())) write_shard();

  summary.n_sequences = manifest["n_sequences"].get<int64_t>();
  summary.n_tokens = manifest["n_tokens"].get<int64_t>();
  summary.n_supervised = manifest["n_supervised"].get<int64_t>();
  summary.n_dropped = manifest["n_dropped"].get<int64_t>();
  summary.shards = static_cast<int64_t>(manifest["shards"].size());
  summary.generated_tokens = prog.generated_tokens;
  summary.elapsed_s = since(t0);
  summary.complete = prog.done == prog.total;
  if (!fs::exists(manifest_path)) io::write_json_atomic(manifest_path, manifest);
  return summary;
}

// ---------------------------------------------------------------------------
// Reading back.

std::vector<RegenSequence> read_regen_dir(const std::string& dir) {
  const std::string manifest_path = dir + "/manifest.json";
  if (!fs::exists(manifest_path)) throw Error(dir + ": no manifest.json (not a regeneration directory)");
  const json m = load_manifest(manifest_path);
  std::vector<RegenSequence> out;
  int64_t total_seq = 0, total_tok = 0;
  for (const auto& s : m["shards"]) {
    const std::string file = dir + "/" + s["file"].get<std::string>();
    ShardView v = check_shard(io::load_safetensors(file), file);
    const int64_t n_seq = v.offsets.numel() - 1, n_tok = v.tokens.numel();
    if (s.value("n_sequences", int64_t{-1}) != n_seq || s.value("n_tokens", int64_t{-1}) != n_tok) {
      throw FormatError(file + ": holds " + std::to_string(n_seq) + " sequences / " + std::to_string(n_tok) +
                        " tokens, the manifest says " + s.value("n_sequences", json()).dump() + " / " +
                        s.value("n_tokens", json()).dump());
    }
    const int32_t* tk = v.tokens.data_ptr<int32_t>();
    const uint8_t* mk = v.mask.data_ptr<uint8_t>();
    const int64_t* off = v.offsets.data_ptr<int64_t>();
    for (int64_t i = 0; i < n_seq; ++i) {
      RegenSequence seq;
      seq.prompt_id = v.prompt_ids[static_cast<size_t>(i)];
      seq.tokens.assign(tk + off[i], tk + off[i + 1]);
      seq.loss_mask.assign(mk + off[i], mk + off[i + 1]);
      out.push_back(std::move(seq));
    }
    total_seq += n_seq;
    total_tok += n_tok;
  }
  if (m.value("n_sequences", int64_t{-1}) != total_seq || m.value("n_tokens", int64_t{-1}) != total_tok) {
    throw FormatError(manifest_path + ": totals say " + m.value("n_sequences", json()).dump() +
                      " sequences / " + m.value("n_tokens", json()).dump() + " tokens, the shards hold " +
                      std::to_string(total_seq) + " / " + std::to_string(total_tok));
  }
  return out;
}

}  // namespace dspark::train
