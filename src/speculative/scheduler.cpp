// Hardware-aware prefix scheduler (DSpark Alg. 1); see
// include/dspark/speculative/scheduler.hpp.
#include "dspark/speculative/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "dspark/error.hpp"

namespace dspark {

namespace {

void check_curve(const std::vector<double>& sps) {
  if (sps.empty()) throw InvalidArgument("SPS curve is empty");
  for (size_t i = 0; i < sps.size(); ++i)
    if (!(sps[i] > 0) || !std::isfinite(sps[i]))
      throw InvalidArgument("SPS curve: value at B = " + std::to_string(i + 1) +
                            " must be positive and finite");
}

// Step time past the curve's end: least-squares slope of 1/SPS over the last
// quarter of the curve (at least two points), clamped to >= 0.
double extrapolated_time(const std::vector<double>& sps, int64_t b) {
  const int64_t n = static_cast<int64_t>(sps.size());
  const double t_end = 1.0 / sps.back();
  if (n < 2) return t_end;
  const int64_t m = std::max<int64_t>(2, n / 4);
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int64_t x = n - m + 1; x <= n; ++x) {
    const double y = 1.0 / sps[static_cast<size_t>(x - 1)];
    sx += x, sy += y, sxx += static_cast<double>(x) * x, sxy += x * y;
  }
  const double den = m * sxx - sx * sx;
  const double slope = den > 0 ? std::max(0.0, (m * sxy - sx * sy) / den) : 0.0;
  return t_end + slope * static_cast<double>(b - n);
}

// sps_at without the curve check (callers have checked it).
double lookup(const std::vector<double>& sps, int64_t b) {
  b = std::max<int64_t>(b, 1);
  if (b <= static_cast<int64_t>(sps.size())) return sps[static_cast<size_t>(b - 1)];
  return 1.0 / extrapolated_time(sps, b);
}

}  // namespace

double sps_at(const std::vector<double>& sps, int64_t b) {
  check_curve(sps);
  return lookup(sps, b);
}

bool any_draft_can_pay(int64_t R, const std::vector<double>& sps) {
  check_curve(sps);
  if (R <= 0) return false;
  const double r = static_cast<double>(R);
  return (r + 1.0) * lookup(sps, R + 1) > r * lookup(sps, R);
}

ScheduleResult schedule_prefixes(const std::vector<std::vector<double>>& survival,
                                 const std::vector<double>& sps) {
  check_curve(sps);
  ScheduleResult res;
  const int64_t R = static_cast<int64_t>(survival.size());
  res.lengths.assign(survival.size(), 0);
  if (R == 0) return res;

  struct Cand {
    double a;
    int j, r;
  };
  std::vector<Cand> cands;
  for (int r = 0; r < static_cast<int>(R); ++r) {
    double prev = 1.0;
    for (int j = 0; j < static_cast<int>(survival[r].size()); ++j) {
      const double a = survival[r][j];
      if (!std::isfinite(a) || a < 0 || a > 1 + 1e-9)
        throw InvalidArgument("scheduler: survival of request " + std::to_string(r) + " position " +
                              std::to_string(j + 1) + " is not in [0, 1]");
      if (a > prev + 1e-9)
        throw InvalidArgument("scheduler: survival of request " + std::to_string(r) +
                              " increases at position " + std::to_string(j + 1));
      prev = std::min(prev, a);
      cands.push_back({prev, j, r});
    }
  }
  std::sort(cands.begin(), cands.end(), [](const Cand& x, const Cand& y) {
    if (x.a != y.a) return x.a > y.a;
    if (x.j != y.j) return x.j < y.j;
    return x.r < y.r;
  });

  int64_t B = R;
  double tau = static_cast<double>(R);
  double theta = tau * lookup(sps, B);
  for (const Cand& c : cands) {
    const double tau2 = tau + c.a;
    const double theta2 = tau2 * lookup(sps, B + 1);
    if (!(theta2 > theta)) break;  // early stop: never look past this candidate
    // Prefix property: the admitted position is the next one of its request.
    if (res.lengths[c.r] != c.j) throw std::logic_error("scheduler: admitted set is not a prefix");
    res.lengths[c.r] = c.j + 1;
    B += 1;
    tau = tau2;
    theta = theta2;
  }
  res.batch = B;
  res.tau = tau;
  res.theta = theta;
  return res;
}

int schedule_single(const std::vector<double>& survival, const std::vector<double>& sps) {
  return schedule_prefixes({survival}, sps).lengths[0];
}

}  // namespace dspark
