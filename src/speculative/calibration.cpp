// STS calibration, precision thresholds, calibration metrics and reliability
// diagrams; see include/dspark/speculative/calibration.hpp.
#include "dspark/io/regular_file.hpp"
#include "dspark/speculative/calibration.hpp"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"

namespace dspark {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

int bin_of(double p, int bins) {
  const int b = static_cast<int>(std::floor(p * bins));
  return std::clamp(b, 0, bins - 1);
}

void check_lengths(size_t a, size_t b, const char* what) {
  if (a != b) throw InvalidArgument(std::string(what) + ": probabilities and labels differ in length");
}

// Samples of one position: survival of the earlier positions under fixed
// temperatures, this position's raw logit, and its survival label.
struct PositionData {
  std::vector<double> prefix;
  std::vector<double> z;
  std::vector<uint8_t> y;
};

PositionData position_data(const std::vector<CalibrationRound>& rounds,
                           const std::vector<double>& temps, int k) {
  PositionData d;
  for (const auto& r : rounds) {
    if (static_cast<int>(r.conf_logits.size()) <= k) continue;
    double p = 1.0;
    for (int i = 0; i < k; ++i)
      p *= sigmoid(r.conf_logits[i] / (i < static_cast<int>(temps.size()) ? temps[i] : 1.0));
    d.prefix.push_back(p);
    d.z.push_back(r.conf_logits[k]);
    d.y.push_back(k < r.accepted ? 1 : 0);
  }
  return d;
}

std::vector<double> survival_at(const PositionData& d, double t) {
  std::vector<double> a(d.z.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = d.prefix[i] * sigmoid(d.z[i] / t);
  return a;
}

nlohmann::json num_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

nlohmann::json vec_json(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(num_or_null(x));
  return a;
}

}  // namespace

RoundCallback collect_rounds(std::vector<CalibrationRound>& out) {
  return [&out](int position, float conf_logit, bool survived) {
    if (position == 0 || out.empty()) out.emplace_back();
    auto& r = out.back();
    r.conf_logits.push_back(conf_logit);
    if (survived) ++r.accepted;
  };
}

void write_rounds_jsonl(const std::string& path, const std::vector<CalibrationRound>& rounds) {
  std::string out;
  for (const auto& r : rounds) {
    out += nlohmann::json{{"conf_logits", r.conf_logits}, {"accepted", r.accepted}}.dump();
    out += '\n';
  }
  io::write_file_atomic(path, out);
}

std::vector<CalibrationRound> read_rounds_jsonl(const std::string& path) {
  if (std::filesystem::exists(path)) io::require_regular_file(path, "a rounds file (JSONL)");
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open rounds file");
  std::vector<CalibrationRound> rounds;
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(no) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(where + "expected a JSON object, got invalid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("conf_logits") || !j["conf_logits"].is_array() ||
        !j.contains("accepted") || !j["accepted"].is_number_integer())
      throw FormatError(where + "expected {\"conf_logits\": [numbers], \"accepted\": integer}");
    CalibrationRound r;
    for (const auto& z : j["conf_logits"]) {
      if (!z.is_number()) throw FormatError(where + "conf_logits holds a non-number: " + z.dump());
      r.conf_logits.push_back(z.get<float>());
    }
    r.accepted = j["accepted"].get<int>();
    if (r.accepted < 0 || r.accepted > static_cast<int>(r.conf_logits.size()))
      throw FormatError(where + "accepted " + std::to_string(r.accepted) + " outside [0, " +
                        std::to_string(r.conf_logits.size()) + "]");
    rounds.push_back(std::move(r));
  }
  if (rounds.empty()) throw Error(path + ": no rounds in the file");
  return rounds;
}

std::vector<double> calibrated_survival(const std::vector<float>& conf_logits,
                                        const std::vector<double>& temperatures) {
  std::vector<double> a(conf_logits.size());
  double p = 1.0;
  for (size_t k = 0; k < a.size(); ++k) {
    const double t = k < temperatures.size() ? temperatures[k] : 1.0;
    p *= sigmoid(static_cast<double>(conf_logits[k]) / t);
    a[k] = p;
  }
  return a;
}

double expected_calibration_error(const std::vector<double>& prob, const std::vector<uint8_t>& label,
                                  int bins) {
  check_lengths(prob.size(), label.size(), "expected_calibration_error");
  if (bins < 1) throw InvalidArgument("expected_calibration_error: bins must be >= 1");
  if (prob.empty()) return kNaN;
  std::vector<double> sp(static_cast<size_t>(bins), 0.0), sy(static_cast<size_t>(bins), 0.0);
  for (size_t i = 0; i < prob.size(); ++i) {
    const int b = bin_of(prob[i], bins);
    sp[b] += prob[i];
    sy[b] += label[i] ? 1.0 : 0.0;
  }
  double e = 0;
  for (int b = 0; b < bins; ++b) e += std::abs(sp[b] - sy[b]);  // n_b · |mean p − mean y|
  return e / static_cast<double>(prob.size());
}

double auroc(const std::vector<double>& score, const std::vector<uint8_t>& label) {
  check_lengths(score.size(), label.size(), "auroc");
  std::vector<size_t> idx(score.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  // Mann–Whitney: sum of (mid-)ranks of the positives.
  double rank_sum = 0;
  int64_t n_pos = 0;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j < idx.size() && score[idx[j]] == score[idx[i]]) ++j;
    const double mid = 0.5 * static_cast<double>(i + 1 + j);  // mean of ranks i+1..j
    for (size_t m = i; m < j; ++m)
      if (label[idx[m]]) rank_sum += mid, ++n_pos;
    i = j;
  }
  const int64_t n_neg = static_cast<int64_t>(score.size()) - n_pos;
  if (n_pos == 0 || n_neg == 0) return kNaN;
  const double u = rank_sum - static_cast<double>(n_pos) * (n_pos + 1) / 2.0;
  return u / (static_cast<double>(n_pos) * static_cast<double>(n_neg));
}

std::vector<ReliabilityBin> reliability_bins(const std::vector<double>& prob,
                                             const std::vector<uint8_t>& label, int bins) {
  check_lengths(prob.size(), label.size(), "reliability_bins");
  if (bins < 1) throw InvalidArgument("reliability_bins: bins must be >= 1");
  std::vector<ReliabilityBin> out(static_cast<size_t>(bins));
  for (size_t i = 0; i < prob.size(); ++i) {
    auto& b = out[bin_of(prob[i], bins)];
    b.mean_prob += prob[i];
    b.frequency += label[i] ? 1.0 : 0.0;
    ++b.count;
  }
  for (auto& b : out)
    if (b.count > 0) b.mean_prob /= static_cast<double>(b.count), b.frequency /= static_cast<double>(b.count);
  return out;
}

namespace {

std::vector<double> log_grid(double lo, double hi, int n) {
  std::vector<double> g(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) g[i] = std::exp(std::log(lo) + (std::log(hi) - std::log(lo)) * i / (n - 1));
  return g;
}

// Searches a temperature: every point of the log grid on [t_min, t_max], then
// `refine_steps` grids of 21 points between the neighbours of the best point
// so far. `consider(t)` scores t and returns the best temperature seen.
template <typename Consider>
void search_temperature(const StsOptions& o, Consider&& consider) {
  std::vector<double> grid = log_grid(o.t_min, o.t_max, o.grid);
  for (int step = 0; step <= o.refine_steps; ++step) {
    double best_t = 1.0;
    for (double t : grid) best_t = consider(t);
    const auto it = std::min_element(grid.begin(), grid.end(), [&](double a, double b) {
      return std::abs(std::log(a / best_t)) < std::abs(std::log(b / best_t));
    });
    const size_t i = static_cast<size_t>(it - grid.begin());
    const double lo = grid[i > 0 ? i - 1 : i], hi = grid[i + 1 < grid.size() ? i + 1 : i];
    if (!(hi > lo)) break;
    grid = log_grid(lo, hi, 21);
  }
}

// The paper's STS fit: left to right, T_k minimizing ECE_k with T_<k fixed.
std::vector<double> fit_sts_sequential(const std::vector<CalibrationRound>& rounds, int gamma,
                                       const StsOptions& o) {
  std::vector<double> temps;
  for (int k = 0; k < gamma; ++k) {
    const PositionData d = position_data(rounds, temps, k);
    if (d.z.empty()) {
      temps.push_back(1.0);
      continue;
    }
    double best_t = 1.0, best_e = std::numeric_limits<double>::infinity();
    search_temperature(o, [&](double t) {
      const double e = expected_calibration_error(survival_at(d, t), d.y, o.bins);
      if (e < best_e - 1e-12 || (std::abs(e - best_e) <= 1e-12 && std::abs(std::log(t)) < std::abs(std::log(best_t)))) {
        best_e = e;
        best_t = t;
      }
      return best_t;
    });
    temps.push_back(best_t);
  }
  return temps;
}

// Per-position ECE of â_k under `temps` for every k < gamma (NaN where no
// round reached k). Rounds are [N]; z[r][k] the logits.
std::vector<double> ece_per_position(const std::vector<CalibrationRound>& rounds, const std::vector<double>& temps,
                                     int gamma, int bins) {
  std::vector<double> e(static_cast<size_t>(gamma));
  for (int k = 0; k < gamma; ++k) {
    const PositionData d = position_data(rounds, temps, k);
    e[k] = d.z.empty() ? kNaN : expected_calibration_error(survival_at(d, temps[k]), d.y, bins);
  }
  return e;
}

// Lexicographic objective of the repair pass: first the total excess of ECE
// over the uncalibrated ECE (positions made worse), then the total ECE.
struct RepairScore {
  double excess = 0, total = 0;
  bool better_than(const RepairScore& o) const {
    if (excess < o.excess - 1e-12) return true;
    if (excess > o.excess + 1e-12) return false;
    return total < o.total - 1e-12;
  }
};

RepairScore repair_score(const std::vector<double>& ece, const std::vector<double>& raw) {
  RepairScore s;
  for (size_t k = 0; k < ece.size(); ++k) {
    if (!std::isfinite(ece[k])) continue;
    s.excess += std::max(0.0, ece[k] - raw[k]);
    s.total += ece[k];
  }
  return s;
}

// Coordinate descent on RepairScore from the sequential fit, for when a
// position's ECE ended above its uncalibrated ECE (T_k also moves â_j for
// every j > k, which the left-to-right fit cannot take back). Each sweep
// re-searches every T_k on the same grids with the others fixed; a sweep
// that changes nothing ends it.
std::vector<double> repair_sts(const std::vector<CalibrationRound>& rounds, int gamma, const StsOptions& o,
                               std::vector<double> temps) {
  const std::vector<double> raw = ece_per_position(rounds, std::vector<double>(gamma, 1.0), gamma, o.bins);
  RepairScore best = repair_score(ece_per_position(rounds, temps, gamma, o.bins), raw);
  if (best.excess <= 0) return temps;
  // Labels of the rounds that reached each position, and their survival under trial temperatures.
  std::vector<std::vector<double>> prob(static_cast<size_t>(gamma));
  std::vector<std::vector<uint8_t>> lab(static_cast<size_t>(gamma));
  for (int k = 0; k < gamma; ++k)
    for (const auto& rd : rounds)
      if (static_cast<int>(rd.conf_logits.size()) > k) lab[k].push_back(k < rd.accepted ? 1 : 0);
  // Score with T_m = t (others from temps).
  auto score_with = [&](int m, double t) {
    for (int k = 0; k < gamma; ++k) prob[k].clear();
    for (const auto& rd : rounds) {
      const int len = std::min<int>(gamma, static_cast<int>(rd.conf_logits.size()));
      double p = 1.0;
      for (int k = 0; k < len; ++k) {
        p *= sigmoid(rd.conf_logits[k] / (k == m ? t : temps[k]));
        prob[k].push_back(p);
      }
    }
    std::vector<double> e(static_cast<size_t>(gamma), kNaN);
    for (int k = 0; k < gamma; ++k)
      if (!prob[k].empty()) e[k] = expected_calibration_error(prob[k], lab[k], o.bins);
    return repair_score(e, raw);
  };
  for (int sweep = 0; sweep < 8; ++sweep) {
    bool changed = false;
    for (int m = 0; m < gamma; ++m) {
      double best_t = temps[m];
      search_temperature(o, [&](double t) {
        const RepairScore sc = score_with(m, t);
        if (sc.better_than(best)) best = sc, best_t = t;
        return best_t;
      });
      if (best_t != temps[m]) temps[m] = best_t, changed = true;
    }
    if (!changed) break;
  }
  return temps;
}

}  // namespace

std::vector<double> fit_sts_temperatures(const std::vector<CalibrationRound>& rounds, int gamma,
                                         const StsOptions& o) {
  if (gamma < 1) throw InvalidArgument("fit_sts_temperatures: gamma must be >= 1");
  if (!(o.t_min > 0) || !(o.t_max > o.t_min) || o.grid < 2 || o.bins < 1 || o.refine_steps < 0)
    throw InvalidArgument("fit_sts_temperatures: invalid search options");
  std::vector<double> temps = fit_sts_sequential(rounds, gamma, o);
  return o.repair ? repair_sts(rounds, gamma, o, std::move(temps)) : temps;
}

std::vector<double> precision_thresholds(const std::vector<CalibrationRound>& rounds,
                                         const std::vector<double>& temperatures, int gamma,
                                         double target) {
  if (!(target >= 0 && target <= 1)) throw InvalidArgument("precision target must be in [0, 1]");
  std::vector<double> th;
  for (int k = 0; k < gamma; ++k) {
    const PositionData d = position_data(rounds, temperatures, k);
    const std::vector<double> a = d.z.empty() ? std::vector<double>{} : [&] {
      const double t = k < static_cast<int>(temperatures.size()) ? temperatures[k] : 1.0;
      return survival_at(d, t);
    }();
    if (a.empty()) {
      th.push_back(0.0);
      continue;
    }
    std::vector<size_t> idx(a.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return a[x] < a[y]; });
    // Suffix counts: kept set of threshold a[idx[i]] is idx[i..].
    double pos = 0;
    for (uint8_t y : d.y) pos += y;
    double kept = static_cast<double>(a.size());
    double chosen = 1.0;
    if (pos >= target * kept) {
      chosen = 0.0;
    } else {
      for (size_t i = 0; i < idx.size();) {
        size_t j = i;
        while (j < idx.size() && a[idx[j]] == a[idx[i]]) ++j;
        // Threshold a[idx[i]] keeps idx[i..]; check it, then drop the tie group.
        if (kept > 0 && pos >= target * kept) {
          chosen = a[idx[i]];
          break;
        }
        for (size_t m = i; m < j; ++m) pos -= d.y[idx[m]], kept -= 1;
        i = j;
      }
    }
    th.push_back(chosen);
  }
  return th;
}

StsReport calibrate_sts(const std::vector<CalibrationRound>& rounds, int gamma, double target,
                        const StsOptions& opts) {
  if (rounds.empty()) throw InvalidArgument("calibration: no verify rounds recorded");
  StsReport r;
  r.gamma = gamma;
  r.samples = static_cast<int64_t>(rounds.size());
  r.target = target;
  r.temperatures = fit_sts_temperatures(rounds, gamma, opts);
  r.thresholds = precision_thresholds(rounds, r.temperatures, gamma, target);
  for (int k = 0; k < gamma; ++k) {
    const PositionData before = position_data(rounds, {}, k);
    const PositionData after = position_data(rounds, r.temperatures, k);
    const std::vector<double> a0 = survival_at(before, 1.0);
    const std::vector<double> a1 = survival_at(after, r.temperatures[k]);
    r.reached.push_back(static_cast<int64_t>(a0.size()));
    double surv = 0;
    for (uint8_t y : before.y) surv += y;
    r.survival_rate.push_back(a0.empty() ? kNaN : surv / static_cast<double>(a0.size()));
    int64_t prev = 0, acc = 0;
    for (const auto& rd : rounds)
      if (static_cast<int>(rd.conf_logits.size()) > k && rd.accepted >= k) ++prev, acc += rd.accepted > k;
    r.acceptance.push_back(prev ? static_cast<double>(acc) / static_cast<double>(prev) : kNaN);
    r.ece_before.push_back(expected_calibration_error(a0, before.y, opts.bins));
    r.ece_after.push_back(expected_calibration_error(a1, after.y, opts.bins));
    r.auroc_before.push_back(auroc(a0, before.y));
    r.auroc_after.push_back(auroc(a1, after.y));
    r.bins_before.push_back(reliability_bins(a0, before.y, opts.bins));
    r.bins_after.push_back(reliability_bins(a1, after.y, opts.bins));
  }
  return r;
}

nlohmann::json sts_to_json(const StsReport& r, int bins) {
  return {{"temperatures", r.temperatures},
          {"thresholds", r.thresholds},
          {"target", r.target},
          {"samples", r.samples},
          {"bins", bins},
          {"ece_before", vec_json(r.ece_before)},
          {"ece_after", vec_json(r.ece_after)},
          {"auroc", vec_json(r.auroc_after)},
          {"auroc_before", vec_json(r.auroc_before)},
          {"acceptance", vec_json(r.acceptance)}};
}

// ---- PNG ------------------------------------------------------------------------------

std::string encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width <= 0 || height <= 0) throw InvalidArgument("encode_png_rgb: width and height must be positive");
  if (rgb.size() != static_cast<size_t>(width) * 3 * static_cast<size_t>(height))
    throw InvalidArgument("encode_png_rgb: pixel buffer size does not match width * height * 3");
  // libpng's simplified API: a first call sizes the buffer, the second fills it.
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(width);
  img.height = static_cast<png_uint_32>(height);
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  std::string out;
  if (png_image_write_to_memory(&img, nullptr, &size, 0, rgb.data(), 0, nullptr)) {
    out.resize(size);
    if (png_image_write_to_memory(&img, out.data(), &size, 0, rgb.data(), 0, nullptr)) {
      out.resize(size);
      return out;
    }
  }
  const std::string message = img.message;
  png_image_free(&img);
  throw Error("PNG encoding failed: " + message);
}

std::array<uint8_t, 3> reliability_color(int k) {
  static const std::array<std::array<uint8_t, 3>, 10> c = {{{31, 119, 180},
                                                            {255, 127, 14},
                                                            {44, 160, 44},
                                                            {214, 39, 40},
                                                            {148, 103, 189},
                                                            {140, 86, 75},
                                                            {227, 119, 194},
                                                            {127, 127, 127},
                                                            {188, 189, 34},
                                                            {23, 190, 207}}};
  return c[static_cast<size_t>(((k % 10) + 10) % 10)];
}

namespace {

constexpr int kPanel = 400, kMargin = 30, kGap = 40;

struct Canvas {
  int w, h;
  std::vector<uint8_t> px;
  Canvas(int w_, int h_) : w(w_), h(h_), px(static_cast<size_t>(w_) * h_ * 3, 255) {}
  void set(int x, int y, std::array<uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= w || y >= h) return;
    const size_t i = (static_cast<size_t>(y) * w + x) * 3;
    px[i] = c[0], px[i + 1] = c[1], px[i + 2] = c[2];
  }
  void dot(int x, int y, int r, std::array<uint8_t, 3> c) {
    for (int dy = -r; dy <= r; ++dy)
      for (int dx = -r; dx <= r; ++dx) set(x + dx, y + dy, c);
  }
  // Bresenham line; `thick` draws a (2·thick+1)-pixel square pen; `dash` > 0
  // leaves gaps every `dash` pixels.
  void line(int x0, int y0, int x1, int y1, std::array<uint8_t, 3> c, int thick = 0, int dash = 0) {
    const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy, n = 0;
    while (true) {
      if (dash == 0 || (n / dash) % 2 == 0) dot(x0, y0, thick, c);
      ++n;
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
};

// Pixel of probability-space point (p, f) in panel `panel` (0 or 1).
std::pair<int, int> to_px(int panel, double p, double f) {
  const int x0 = kMargin + panel * (kPanel + kGap);
  return {x0 + static_cast<int>(std::lround(std::clamp(p, 0.0, 1.0) * kPanel)),
          kMargin + kPanel - static_cast<int>(std::lround(std::clamp(f, 0.0, 1.0) * kPanel))};
}

}  // namespace

std::string reliability_png(const StsReport& r) {
  Canvas cv(2 * kPanel + kGap + 2 * kMargin, kPanel + 2 * kMargin);
  const std::array<uint8_t, 3> grid{225, 225, 225}, frame{90, 90, 90}, diag{150, 150, 150};
  for (int panel = 0; panel < 2; ++panel) {
    for (int g = 1; g < 5; ++g) {
      auto [ax, ay] = to_px(panel, g / 5.0, 0.0);
      auto [bx, by] = to_px(panel, g / 5.0, 1.0);
      cv.line(ax, ay, bx, by, grid);
      auto [cx, cy] = to_px(panel, 0.0, g / 5.0);
      auto [dx, dy] = to_px(panel, 1.0, g / 5.0);
      cv.line(cx, cy, dx, dy, grid);
    }
    auto [x0, y0] = to_px(panel, 0, 0);
    auto [x1, y1] = to_px(panel, 1, 1);
    cv.line(x0, y0, x1, y1, diag, 0, 6);
    cv.line(x0, y0, x1, y0, frame);
    cv.line(x0, y1, x1, y1, frame);
    cv.line(x0, y0, x0, y1, frame);
    cv.line(x1, y0, x1, y1, frame);
    const auto& bins = panel == 0 ? r.bins_before : r.bins_after;
    for (size_t k = 0; k < bins.size(); ++k) {
      const auto col = reliability_color(static_cast<int>(k));
      int px = -1, py = -1;
      for (const auto& b : bins[k]) {
        if (b.count == 0) continue;
        auto [x, y] = to_px(panel, b.mean_prob, b.frequency);
        if (px >= 0) cv.line(px, py, x, y, col, 1);
        cv.dot(x, y, 3, col);
        px = x, py = y;
      }
    }
  }
  return encode_png_rgb(cv.w, cv.h, cv.px);
}

std::string reliability_svg(const StsReport& r) {
  const int legend = 150;
  const int W = 2 * kPanel + kGap + 2 * kMargin + legend, H = kPanel + 2 * kMargin + 30;
  std::ostringstream s;
  char buf[64];
  auto hex = [&](int k) {
    const auto c = reliability_color(k);
    std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c[0], c[1], c[2]);
    return std::string(buf);
  };
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (int panel = 0; panel < 2; ++panel) {
    auto [x0, y0] = to_px(panel, 0, 0);
    auto [x1, y1] = to_px(panel, 1, 1);
    s << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << y1 - 10 << "\" text-anchor=\"middle\">"
      << (panel == 0 ? "before calibration (T = 1)" : "after STS calibration") << "</text>\n";
    for (int g = 0; g <= 5; ++g) {
      auto [gx, gy0] = to_px(panel, g / 5.0, 0.0);
      auto [hx, hy] = to_px(panel, 0.0, g / 5.0);
      (void)gy0;
      s << "<line x1=\"" << gx << "\" y1=\"" << y0 << "\" x2=\"" << gx << "\" y2=\"" << y1
        << "\" stroke=\"#e1e1e1\"/><line x1=\"" << x0 << "\" y1=\"" << hy << "\" x2=\"" << x1 << "\" y2=\"" << hy
        << "\" stroke=\"#e1e1e1\"/>\n";
      s << "<text x=\"" << gx << "\" y=\"" << y0 + 14 << "\" text-anchor=\"middle\" font-size=\"10\">" << g / 5.0
        << "</text><text x=\"" << hx - 4 << "\" y=\"" << hy + 3 << "\" text-anchor=\"end\" font-size=\"10\">"
        << g / 5.0 << "</text>\n";
    }
    s << "<rect x=\"" << x0 << "\" y=\"" << y1 << "\" width=\"" << kPanel << "\" height=\"" << kPanel
      << "\" fill=\"none\" stroke=\"#5a5a5a\"/>\n<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x1
      << "\" y2=\"" << y1 << "\" stroke=\"#969696\" stroke-dasharray=\"6,6\"/>\n";
    s << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << y0 + 28
      << "\" text-anchor=\"middle\">predicted survival</text>\n";
    const auto& bins = panel == 0 ? r.bins_before : r.bins_after;
    for (size_t k = 0; k < bins.size(); ++k) {
      std::ostringstream pts;
      for (const auto& b : bins[k]) {
        if (b.count == 0) continue;
        auto [x, y] = to_px(panel, b.mean_prob, b.frequency);
        pts << x << "," << y << " ";
        s << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"3\" fill=\"" << hex(static_cast<int>(k))
          << "\"/>";
      }
      s << "<polyline points=\"" << pts.str() << "\" fill=\"none\" stroke=\"" << hex(static_cast<int>(k))
        << "\" stroke-width=\"2\"/>\n";
    }
  }
  const int lx = 2 * kPanel + kGap + 2 * kMargin + 10;
  for (size_t k = 0; k < r.bins_after.size(); ++k) {
    const int ly = kMargin + 16 * static_cast<int>(k) + 10;
    s << "<rect x=\"" << lx << "\" y=\"" << ly - 9 << "\" width=\"10\" height=\"10\" fill=\""
      << hex(static_cast<int>(k)) << "\"/><text x=\"" << lx + 14 << "\" y=\"" << ly << "\">position " << k + 1
      << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace dspark
