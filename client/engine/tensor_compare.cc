// tensor_compare.cc — see tensor_compare.h.
#include "client/engine/tensor_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace downpour::engine {

TensorComparison CompareTensors(std::string_view what, std::span<const float> got, std::span<const float> want,
                                double rel) {
  TensorComparison c;
  if (got.size() != want.size()) {
    c.ok = false;
    c.message = fmt::format("{}: {} elements computed but {} expected", what, got.size(), want.size());
    return c;
  }
  double max_want = 0.0;
  for (float w : want)
    if (std::isfinite(w)) max_want = std::max(max_want, static_cast<double>(std::abs(w)));
  c.scale = std::max(max_want, 1e-6);
  c.tolerance = rel * c.scale;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double diff = std::abs(g - w);
    const bool finite = std::isfinite(g) && std::isfinite(w);
    if (finite) c.worst = std::max(c.worst, diff / c.scale);
    if (finite && diff <= c.tolerance) continue;
    ++c.failures;
    if (c.first_bad < 0) {
      c.first_bad = static_cast<int64_t>(i);
      c.got = g;
      c.want = w;
    }
  }
  c.ok = c.failures == 0;
  if (!c.ok)
    c.message = fmt::format(
        "{}: element {} is {} but {} was expected (|diff| {:.3g}, tolerance {:.3g} = {:.3g} × max |expected| "
        "{:.3g}); {} of {} elements fail; worst finite error {:.3g} of max |expected|",
        what, c.first_bad, c.got, c.want, std::abs(c.got - c.want), c.tolerance, rel, c.scale, c.failures, got.size(),
        c.worst);
  return c;
}

}  // namespace downpour::engine
