// gradient_case_check.h — one layer gradient case (client/engine/gradient_cases.h) checked on a
// backend, for the suites that run every case on each backend (engine_layer_gradcheck_test.cc:
// reference and oneDNN; gpu_gradcheck_test.cc: CUDA).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "client/engine/gradient_cases.h"
#include "client/engine/layer.h"

namespace downpour::engine {

// Every element of `c` (the case's bottom and parameters, made from `g`) matches central
// differences on `backend`, and every one was checked except the kink points g.options names.
inline void ExpectEveryElementChecked(Backend& backend, const GradientCase& g, const LayerCase& c) {
  GradientCheckResult r;
  const Status s = CheckLayerGradients(backend, c, g.options, &r);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::printf("  %s\n", r.Summary().c_str());
  EXPECT_TRUE(r.ok()) << r.Summary();
  EXPECT_EQ(r.failed, 0) << r.Summary();
  int64_t elements = ShapeCount(c.bottom_shapes[0]), at_kink = 0;
  for (const auto& p : c.param_specs) elements += p.numel();
  for (float v : c.bottoms[0]) at_kink += g.options.kink_range >= 0 && std::abs(v) <= g.options.kink_range;
  EXPECT_EQ(r.skipped_at_kink, at_kink) << r.Summary();
  EXPECT_EQ(r.checked, elements - at_kink) << r.Summary();
}

}  // namespace downpour::engine
