// dspark/train/regen.hpp — self-distillation data: the target answers a set
// of prompts itself, and the token ids of prompt + response are stored with
// an assistant mask in the sharded layout the drafter trainer reads.
//
// Generation is batched: up to B sequences are active at once, each with its
// own KV cache; every step is ONE target forward call over all of them (a new
// sequence's whole prompt and the other sequences' last tokens in the same
// ragged batch, Logits::Last each), and a finished sequence's slot is refilled
// from the queue. The target's forward is batch invariant, so a sequence's
// tokens do not depend on what else shares its batch: batched greedy output
// equals generate_plain token for token, and sampled output is reproducible
// from (seed + prompt index) alone.
//
// Output directory layout (format "dspark-regen-v1"):
//
//   DIR/manifest.json          rewritten atomically after every shard:
//     {"format": "dspark-regen-v1",
//      "target_id": "...",                 TargetInfo::id of the generating target
//      "target_path": "...",               file name of the model
//      "prompts_file": "...",              absolute path of the first run's file
//      "chat_template": true,              prompts wrapped as one user turn
//      "n_sequences": S, "n_tokens": N,    totals over all shards
//      "n_supervised": M,                  tokens with loss_mask 1
//      "n_dropped": D,                     prompts processed but not stored
//      "sampling": {"temperature", "top_k", "top_p", "min_p", "seed",
//                   "n_predict", "min_supervised", "ctx_size" (only when set)},
//      "shards": [{"file": "data-00000.safetensors", "n_sequences",
//                  "n_tokens", "n_supervised", "n_dropped"}, ...]}
//
//   DIR/data-00000.safetensors, data-00001.safetensors, ... each holding
//     "tokens"    I32 [N_tok]     the shard's sequences concatenated
//     "offsets"   I64 [n_seq + 1] sequence i is tokens[offsets[i], offsets[i+1])
//     "loss_mask" U8  [N_tok]     1 on response tokens (including the final
//                                 end-of-generation token when one was
//                                 generated), 0 on prompt tokens
//   and __metadata__ (every value a JSON document in a string):
//     "format"       "dspark-regen-v1"
//     "prompt_ids"   ["id", ...]   n_seq ids, in the shard's sequence order
//     "dropped_ids"  ["id", ...]   prompts processed while filling the shard
//                                  but not stored (too few supervised tokens,
//                                  prompt longer than the context)
//     "responses"    ["text", ...] decoded responses (only with save_text)
//
// Sequences are stored in prompt-file order (a sequence that finishes early
// waits for the ones before it), so a run that was interrupted and resumed
// writes exactly the shards one uninterrupted run writes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dspark/model/loaded_model.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/sampling.hpp"

namespace dspark::train {

/// Format tag written into manifests and shard metadata.
inline constexpr const char* kRegenFormat = "dspark-regen-v1";

/// One line of a prompts file.
struct PromptEntry {
  std::string id;    // unique within the file
  std::string kind;  // e.g. "chat", "code", "math"; empty when absent
  std::string text;  // the user message
};

/// Reads a JSONL prompts file: one JSON object per non-blank line with a
/// non-empty string "prompt", an optional string "id" (default "line-<n>",
/// n 1-based) and an optional string "kind"; other keys are ignored.
/// Throws dspark::Error when the file cannot be opened, and
/// dspark::FormatError "<path>:<line>: <what was expected and found>" for a
/// line that is not JSON, not an object, lacks "prompt", has a non-string
/// "id"/"kind", an empty prompt, or repeats an earlier id; "<path>: no
/// prompts" for a file without any.
std::vector<PromptEntry> read_prompts_jsonl(const std::string& path);

/// One sequence for generate_batched.
struct BatchRequest {
  std::vector<TokenId> prompt;  // [T] prompt ids (T >= 1)
  uint64_t seed = 0;            // this sequence's RNG seed (ignored when greedy)
};

/// A finished sequence of generate_batched.
struct BatchResult {
  size_t index = 0;              // position of its request in the request span
  std::vector<TokenId> response; // generated ids; ends with the end-of-generation
                                 // id when stopped_by_eog
  bool stopped_by_eog = false;   // a stop id ended it (else n_predict or the context)
};

/// Batched plain decoding. Keeps up to `batch` sequences active; each step is
/// one target forward call over every active sequence (new ones contribute
/// their whole prompt, the others their last token; Logits::Last for all).
/// Per sequence the semantics are those of generate_plain with
/// `opts.sampling.seed` replaced by the request's seed: at most
/// `opts.n_predict` tokens other than a stop id, generation also ends when
/// the context (opts.ctx_size, 0 = the model's) is full; the difference is
/// that the stop id that ended a sequence is kept as its last response token.
///
/// `on_done` is called once per finished sequence, in completion order
/// (which is not request order); returning false stops generation at once
/// (active sequences are abandoned). `on_step`, when set, is called after
/// every forward call with the number of tokens sampled in it; returning
/// false stops likewise. Requests are started in span order.
///
/// Throws dspark::InvalidArgument when batch < 1, n_predict < 1, the sampling
/// parameters are invalid, or a prompt is empty or does not fit the context
/// (message names the request index and both lengths); nothing is generated
/// then.
void generate_batched(TargetModel& model, std::span<const BatchRequest> requests,
                      const GenerateOptions& opts, int64_t batch,
                      const std::function<bool(BatchResult&&)>& on_done,
                      const std::function<bool(int64_t)>& on_step = {});

/// Progress of a regeneration run, passed to RegenOptions::on_progress.
struct RegenProgress {
  int64_t total = 0;             // prompts selected (after limit), all runs together
  int64_t done = 0;              // of those, stored or dropped so far (all runs)
  int64_t done_before = 0;       // already done when this run started
  int64_t stored = 0;            // sequences stored (all runs)
  int64_t dropped = 0;           // prompts dropped (all runs)
  int64_t generated_tokens = 0;  // tokens sampled in this run (including unsaved ones)
  int64_t shards = 0;            // shards in the directory
  int64_t shards_this_run = 0;   // shards written by this run
  double elapsed_s = 0;          // seconds since this run started
  bool shard_written = false;    // true when this call follows a shard write

  /// Sampled tokens per second in this run (0 before the first second).
  double tokens_per_s() const;
  /// Estimated seconds left, from this run's prompt completion rate (0 when unknown).
  double eta_s() const;
};

/// Settings of regenerate().
struct RegenOptions {
  /// Sampling of the responses; sequence i (0-based index in the prompts
  /// file) samples with seed `sampling.seed + i`.
  SamplingParams sampling{0.7f, 20, 0.8f, 0.0f, 0};
  int64_t n_predict = 256;         // maximum response tokens before a stop id
  int64_t ctx_size = 0;            // context length in tokens (0 = the model's)
  int64_t batch = 32;              // active sequences per forward call (measured fastest)
  int64_t min_supervised = 14;     // drop sequences with fewer response tokens
  int64_t shard_sequences = 256;   // stored sequences per shard
  int64_t limit = 0;               // use only the first N prompts (0 = all)
  bool chat = true;                // wrap prompts with the chat template
  bool save_text = false;          // also store decoded responses in shard metadata
  std::string prompts_file;        // recorded in the manifest
  /// Called after every forward step and after every shard write; returning
  /// false ends the run as an interruption would (sequences not yet in a
  /// shard are lost and regenerated by the next run).
  std::function<bool(const RegenProgress&)> on_progress;
};

/// Totals of a regeneration directory after a run.
struct RegenSummary {
  int64_t n_sequences = 0, n_tokens = 0, n_supervised = 0, n_dropped = 0, shards = 0;
  int64_t skipped_existing = 0;    // prompts found done when the run started
  int64_t generated_tokens = 0;    // tokens sampled by this run
  double elapsed_s = 0;            // this run's wall time (seconds)
  bool complete = false;           // every selected prompt is stored or dropped
};

/// Generates responses for `prompts` (in order; the first `opts.limit` when
/// set) with `model`'s target and writes them to `out_dir` (created when
/// missing) in the layout described at the top of this header: a shard every
/// `shard_sequences` stored sequences plus a final partial one, the manifest
/// rewritten atomically after each.
///
/// Resumable: when `out_dir` already holds a manifest, the prompts recorded
/// in its shards (stored or dropped, by id) are skipped and new shards are
/// appended; shard files not listed in the manifest (left by a crash between
/// a shard write and the manifest update) and stale temporary files are
/// removed first. Sequences are stored in prompt order, so an interrupted and
/// resumed run produces the same shards as an uninterrupted one.
///
/// Throws dspark::InvalidArgument for invalid options (batch < 1,
/// n_predict < 1, shard_sequences < 1, min_supervised < 0, limit < 0,
/// ctx_size < 0, bad sampling), dspark::Error when the chat template is requested but the model
/// has none, when the existing manifest was made with another target or other
/// sampling settings (message names the differing field and says to use
/// another --out), and dspark::FormatError for an unreadable manifest or
/// shard; I/O failures throw dspark::Error with the path.
RegenSummary regenerate(const LoadedModel& model, const std::vector<PromptEntry>& prompts,
                        const std::string& out_dir, const RegenOptions& opts);

/// One stored sequence, as read back by read_regen_dir.
struct RegenSequence {
  std::string prompt_id;
  std::vector<TokenId> tokens;     // [L] prompt + response ids
  std::vector<uint8_t> loss_mask;  // [L] 1 on response tokens
};

/// Reads every sequence of a regeneration directory, in shard order, and
/// validates the shards against the manifest (counts, offsets monotone and
/// ending at N_tok, tensor dtypes and shapes). Throws dspark::FormatError
/// naming the file and the inconsistency, dspark::Error when the manifest is
/// missing.
std::vector<RegenSequence> read_regen_dir(const std::string& dir);

}  // namespace dspark::train
