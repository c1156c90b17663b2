// dspark/speculative/sps_profile.hpp — the target's throughput curve SPS(B): target
// forward steps per second when a call verifies B tokens (dspark-method.md
// §6, "Hardware-aware prefix scheduler": profiled once per model and
// machine, consumed by the scheduler of scheduler.hpp).
//
// Profile file (JSON, written atomically):
//   {"model": profile key (target id @ compute path), "threads": n, "context": tokens, "repetitions": n,
//    "b": [1..Bmax], "sps": [SPS(1)..SPS(Bmax)],
//    "multi"?: {"requests": R, "b": [R..Bmax], "sps": [...]}}
// Default location: $DSPARK_HOME/profiles/<profile key>.json. Verify costs
// depend on the compute path (quantized blocks or bf16) as much as on the
// model, so profiles are keyed by both.
// ($DSPARK_HOME defaults to ~/.cache/dspark).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"

namespace dspark {

/// A measured SPS curve.
struct SpsProfile {
  std::string model;          // sps_profile_key() of the profiled target
  int threads = 0;            // ATen intra-op threads during measurement
  int64_t context = 0;        // tokens already in the cache of each sequence
  int repetitions = 0;        // timed calls per point (the median is kept)
  std::vector<int> b;         // 1..Bmax
  std::vector<double> sps;    // [Bmax] steps per second; sps[i] is SPS(b[i])
  int requests = 1;           // R of the multi-sequence curve (1: none measured)
  std::vector<int> multi_b;   // R..Bmax: total tokens over R sequences
  std::vector<double> multi_sps;
};

/// Measurement settings.
struct SpsProfileOptions {
  int bmax = 32;          // largest B measured (>= 1)
  int64_t context = 256;  // context length of every sequence (>= 1)
  int repetitions = 5;    // timed calls per B (>= 1); the fastest is used
  int warmup = 1;         // untimed calls per B before timing
  int requests = 1;       // R > 1 also measures R sequences sharing B tokens
};

/// Measures SPS(B) for B = 1..bmax on `target`: one sequence holding
/// `context` tokens of fixed pseudo-random ids runs a forward call of B new
/// tokens with logits for every position (as verification does); the call
/// is rolled back (KVCache::trim) and repeated; SPS(B) = 1 / fastest call
/// time in seconds (other work on a shared machine only ever adds time),
/// made monotone (make_sps_monotone). With requests = R > 1 the same is measured for R sequences
/// (each with its own `context`-token cache) in one call, B = R..bmax tokens
/// split as evenly as possible (earlier sequences take the remainder).
/// `progress(b, sps)` is called after each single-sequence point.
/// Throws InvalidArgument for out-of-range options or when context + bmax
/// exceeds the target's context length.
SpsProfile measure_sps(TargetModel& target, const SpsProfileOptions& opts,
                       const std::function<void(int, double)>& progress = {});

/// The checks measure_sps makes before measuring, for callers that print
/// anything first. Throws InvalidArgument as measure_sps does.
void check_sps_options(const TargetInfo& info, const SpsProfileOptions& opts);

/// Makes a curve non-increasing in B, in place: SPS(B) = max over b >= B of
/// the measured SPS(b) (a verify of B tokens never costs more than one of
/// more; a slower point is a measurement disturbed by other work).
void make_sps_monotone(std::vector<double>& sps);

/// A quick check (about 10 forward calls) of whether `p` describes a slower
/// machine than this one now is: true when the fastest of 3 calls of 1 or of
/// `b_probe` tokens (after a 64-token context) takes less than `margin` times
/// the profile's time 1 / SPS(B) — a profile measured while other work ran.
bool sps_profile_too_slow(TargetModel& target, const SpsProfile& p, int b_probe, double margin = 0.75);

/// The SPS curve of the default profile at `path`, kept current: read and
/// used when it is for this target (sps_profile_key), thread count and at
/// least `o.bmax` points; measured with `o` and saved (atomically) when it
/// is missing, unreadable or for something else; measured again when
/// sps_profile_too_slow finds the machine faster, the saved curve then
/// being the new measurement, or the old curve where that is at least as
/// fast at every B (never a mix of the two). The curve comes
/// back monotone. `log` (may be null) gets a line on what is measured and
/// saved; a profile that cannot be saved is used for this run (a warning on
/// stderr).
std::vector<double> current_sps_profile(TargetModel& target, const std::string& path, const SpsProfileOptions& o,
                                        std::ostream* log);

/// The profile's JSON form (see the file comment).
nlohmann::json sps_profile_to_json(const SpsProfile& p);

/// Parses a profile; `where` names the source in errors. Throws FormatError
/// when a key is missing or malformed, "b" is not 1..n, or "sps" differs in
/// length or holds a value that is not positive and finite.
SpsProfile sps_profile_from_json(const nlohmann::json& j, const std::string& where);

/// "<target id>@<compute>", e.g. "llama/smollm2-135M-...@quant": what a
/// profile was measured on.
/// "<model id>@<compute path>@<kernel level>": verify costs differ per path and level.
std::string sps_profile_key(const TargetInfo& t);

/// $DSPARK_HOME (or ~/.cache/dspark when unset).
std::string dspark_home_dir();

/// $DSPARK_HOME/profiles/<id>_t<threads>.json, characters outside
/// [A-Za-z0-9._-] of the model id replaced by '_': one file per thread count,
/// so that runs with different -t do not measure over each other's profile.
std::string default_profile_path(const std::string& model_id, int threads);

/// Writes the profile atomically, creating parent directories. Throws Error
/// on I/O failure.
void save_sps_profile(const std::string& path, const SpsProfile& p);

/// Reads a profile. Throws Error "<path>: no SPS profile; run `dspark profile
/// -m MODEL` first" when the file does not exist, FormatError when it is
/// malformed.
SpsProfile load_sps_profile(const std::string& path);

/// A warning for a profile measured on another model than `target_id`
/// ("SPS profile PATH was measured for model A, not B; ..."), or "" when the
/// ids agree or either is empty. Verify costs of one model do not describe
/// another, so the scheduler's choices would be off (output stays lossless).
std::string sps_profile_mismatch(const SpsProfile& p, const std::string& path, const std::string& target_id);

}  // namespace dspark
