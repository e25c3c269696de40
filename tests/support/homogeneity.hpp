// Two-sample chi-square homogeneity test for categorical samples of equal size: do two sets of
// counts come from one distribution? Bins that both samples reach fewer than `min_pooled`
// times together are pooled into one bin (so every expected count is large enough for the
// chi-square approximation). The critical value is the chi-square quantile at 1 - alpha by
// Wilson-Hilferty, with alpha given by its standard-normal quantile z (3.719: alpha = 1e-4).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>

namespace tandem::testing {

struct Homogeneity {
  double chi2 = 0;
  double critical = 0;
  int df = 0;  // degrees of freedom (bins - 1); 0: one bin, nothing to compare
};

template <typename Key>
Homogeneity homogeneity(const std::map<Key, int>& a, const std::map<Key, int>& b,
                        double z = 3.719, int min_pooled = 10) {
  std::map<Key, std::pair<int, int>> bins;
  for (const auto& [k, n] : a) bins[k].first += n;
  for (const auto& [k, n] : b) bins[k].second += n;
  Homogeneity out;
  double pooled_a = 0, pooled_b = 0;
  int df = -1;
  for (const auto& [k, ab] : bins) {
    if (ab.first + ab.second < min_pooled) {
      pooled_a += ab.first;
      pooled_b += ab.second;
      continue;
    }
    double d = ab.first - ab.second;
    out.chi2 += d * d / (ab.first + ab.second);
    ++df;
  }
  if (pooled_a + pooled_b > 0) {
    out.chi2 += (pooled_a - pooled_b) * (pooled_a - pooled_b) / (pooled_a + pooled_b);
    ++df;
  }
  out.df = df < 0 ? 0 : df;
  if (out.df == 0) return out;
  double v = 2.0 / (9.0 * out.df);
  out.critical = out.df * std::pow(1 - v + z * std::sqrt(v), 3);
  return out;
}

}  // namespace tandem::testing
