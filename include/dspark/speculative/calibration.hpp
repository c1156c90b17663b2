// dspark/speculative/calibration.hpp — calibration of the confidence head for
// confidence-scheduled verification (dspark-method.md §6, "STS calibration",
// DSpark §3.2.1).
//
// Data: per verify round of real speculative decoding at full γ without
// pruning, the raw confidence logits z_1..z_γ of the verified draft
// positions and the accepted-prefix length n. The prefix-survival label of
// position k (1-based) is y_k = 1[positions 1..k all accepted] = 1[k <= n].
// A round "reaches" position k when position k was verified (the round's
// draft held at least k positions).
//
// Sequential temperature scaling (STS): the calibrated survival of
// position k is â_k = ∏_{i<=k} σ(z_i / T_i). Temperatures are fitted left to
// right: for k = 1..γ, with T_1..T_{k-1} fixed, T_k minimizes the expected
// calibration error (ECE) of â_k against y_k over the rounds that reached k.
//
// Precision thresholds (the simpler mlx-bun form): per position, a threshold
// on â_k such that the verified positions reach a target acceptance
// precision; generation-time pruning compares â_k with it (prune_length with
// temperatures, speculative.hpp).
//
// All positions in this header's vectors are 0-based (index k-1 holds
// position k).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dspark/speculative/speculative.hpp"

namespace dspark {

/// One verify round: the raw confidence logits of the verified positions
/// ([ℓ]) and how many of them were accepted (0..ℓ).
struct CalibrationRound {
  std::vector<float> conf_logits;
  int accepted = 0;
};

/// A SpecOptions::on_round callback that groups the per-position reports of
/// each round into CalibrationRound records appended to `out` (a report for
/// position 0 starts a new round; `accepted` counts the surviving positions).
/// `out` must outlive the callback.
RoundCallback collect_rounds(std::vector<CalibrationRound>& out);

/// Writes rounds as JSON lines {"conf_logits": [z_1..z_ℓ], "accepted": n}
/// to `path`, atomically (temporary file, then rename). Throws dspark::Error
/// when the file cannot be written.
void write_rounds_jsonl(const std::string& path, const std::vector<CalibrationRound>& rounds);

/// Reads rounds written by write_rounds_jsonl. Throws FormatError naming the
/// file, the line and what was expected for a malformed line (not JSON, a
/// missing or non-numeric field, accepted outside [0, ℓ]) and Error when the
/// file cannot be opened or holds no rounds.
std::vector<CalibrationRound> read_rounds_jsonl(const std::string& path);

/// Calibrated survival â_k = ∏_{i<=k} σ(z_i / T_i) for every position of
/// `conf_logits` ([n] → [n], values in [0, 1], non-increasing). T_i =
/// temperatures[i], 1 past the list's end (an empty list gives the raw
/// survival ∏ σ(z_i)).
std::vector<double> calibrated_survival(const std::vector<float>& conf_logits,
                                        const std::vector<double>& temperatures);

/// Expected calibration error with `bins` equal-width bins on [0, 1]:
/// Σ_b (n_b / N) · |mean_b(prob) − mean_b(label)|, bin index
/// min(bins − 1, ⌊p · bins⌋). `prob` and `label` have the same length N;
/// N = 0 gives NaN. Throws InvalidArgument for mismatched lengths or
/// bins < 1.
double expected_calibration_error(const std::vector<double>& prob, const std::vector<uint8_t>& label,
                                  int bins = 15);

/// Area under the ROC curve of `score` for the binary `label` (Mann–Whitney
/// U / (n_pos · n_neg); tied scores count one half). NaN when either class is
/// absent. Throws InvalidArgument for mismatched lengths.
double auroc(const std::vector<double>& score, const std::vector<uint8_t>& label);

/// One bin of a reliability diagram.
struct ReliabilityBin {
  double mean_prob = 0;   // mean predicted probability in the bin
  double frequency = 0;   // observed fraction of positive labels
  int64_t count = 0;      // samples in the bin (bins with 0 are kept, values 0)
};

/// Equal-width reliability bins (same binning as expected_calibration_error).
std::vector<ReliabilityBin> reliability_bins(const std::vector<double>& prob,
                                             const std::vector<uint8_t>& label, int bins = 15);

/// Fitting options.
struct StsOptions {
  int bins = 15;          // ECE bins
  double t_min = 0.05;    // temperature search range (inclusive)
  double t_max = 20.0;
  int grid = 97;          // log-spaced grid points over [t_min, t_max]
  int refine_steps = 3;   // refinements: 21 log-spaced points between the best point's neighbours
  bool repair = true;     // repair pass when a position ends above its uncalibrated ECE (see below)
};

/// Fits STS temperatures for positions 1..gamma (returns [gamma]).
/// Position k uses the rounds that reached it; with T_1..T_{k-1} fixed,
/// T_k minimizes ECE(â_k, y_k) over a log-spaced grid on [t_min, t_max]
/// followed by `refine_steps` finer grids around the best point. Ties (equal
/// ECE, e.g. an uninformative position) go to the temperature closest to 1
/// in log scale; a position no round reached gets T = 1 (dspark-method.md §6).
///
/// Repair pass (opts.repair): T_k also rescales â_j for every j > k, so the
/// left-to-right fit can leave a later position with a higher ECE than its
/// uncalibrated ECE (T = 1 everywhere). When that happens, coordinate descent
/// over T_1..T_γ (same grids, up to 8 sweeps) minimizes first the summed
/// excess Σ_k max(0, ECE_k − ECE_k^raw), then the summed ECE, starting from
/// the left-to-right fit; the result is never worse on either count. When no
/// position is worse the left-to-right fit is returned unchanged. Throws
/// InvalidArgument for gamma < 1 or an invalid range.
std::vector<double> fit_sts_temperatures(const std::vector<CalibrationRound>& rounds, int gamma,
                                         const StsOptions& opts = {});

/// Per-position precision-target thresholds on the calibrated survival
/// (returns [gamma]).
///
/// Rule, per position k: let S_k be the pairs (â_k, y_k) of the rounds that
/// reached k, with â_k from `temperatures`. For a threshold t the kept set is
/// {â_k >= t} (pruning cuts at the first k >= 2 with â_k < t) and its
/// precision is the mean of y_k over it. The threshold is the smallest t in
/// {0} ∪ {distinct â_k values in S_k} whose kept set is non-empty and has
/// precision >= `target` — i.e. 0 when all of S_k already meets the target,
/// otherwise the smallest observed survival that is kept. When no such t
/// exists the threshold is 1 (the position is always pruned unless â_k = 1);
/// a position with no rounds gets 0. Position 1 (index 0) is computed the
/// same way, although pruning never cuts position 1. Throws InvalidArgument
/// when `target` is outside [0, 1].
std::vector<double> precision_thresholds(const std::vector<CalibrationRound>& rounds,
                                         const std::vector<double>& temperatures, int gamma,
                                         double target);

/// Everything a calibration run reports; every per-position vector is [γ].
struct StsReport {
  int gamma = 0;
  int64_t samples = 0;                  // rounds used
  double target = 0.5;                  // precision target of `thresholds`
  std::vector<double> temperatures;     // T_k
  std::vector<double> thresholds;       // on â_k (precision_thresholds)
  std::vector<int64_t> reached;         // rounds that reached k
  std::vector<double> survival_rate;    // mean y_k over those rounds
  std::vector<double> acceptance;       // P(k accepted | 1..k-1 accepted), NaN when undefined
  std::vector<double> ece_before, ece_after;      // T = 1 vs fitted T
  std::vector<double> auroc_before, auroc_after;  // of raw vs calibrated â_k for y_k
  std::vector<std::vector<ReliabilityBin>> bins_before, bins_after;
};

/// Fits temperatures (fit_sts_temperatures) and thresholds
/// (precision_thresholds with `target`) and computes the per-position
/// statistics. Throws InvalidArgument when `rounds` is empty or as the
/// functions above do.
StsReport calibrate_sts(const std::vector<CalibrationRound>& rounds, int gamma, double target,
                        const StsOptions& opts = {});

/// The `config.sts` object of dspark.json: {"temperatures", "thresholds",
/// "target", "samples", "ece_before", "ece_after", "auroc", "auroc_before",
/// "acceptance", "bins"} (NaN statistics are written as null).
nlohmann::json sts_to_json(const StsReport& r, int bins);

// ---- reliability diagrams ---------------------------------------------------------

/// Encodes an 8-bit RGB image ([height][width][3], row-major) as a PNG file
/// (colour type 2, 8 bits per channel) with libpng.
/// Throws InvalidArgument when `rgb.size() != width * height * 3` or a side
/// is not positive.
std::string encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb);

/// Reliability diagram of a calibration as a PNG: two panels (left: before,
/// right: after calibration), each with the diagonal and one coloured curve
/// per position (bin mean prediction → observed survival; empty bins
/// skipped). Colours follow reliability_color().
std::string reliability_png(const StsReport& r);

/// The same diagram as SVG, with axes, titles and a legend.
std::string reliability_svg(const StsReport& r);

/// RGB colour of position k's curve (0-based), cycling through 10 colours.
std::array<uint8_t, 3> reliability_color(int k);

}  // namespace dspark
