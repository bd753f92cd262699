// config/consistency.h — [consistency]: how the servers combine the workers' gradients.
// Rows and enums: common/config/table.h; the whole run config: common/run_config.h.
//
// Thread-safety: plain value types.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/table.h"

namespace downpour {

enum class ConsistencyMode {
  kAsync,  // Downpour: apply every gradient on arrival
  kSync,   // BSP: average all live workers' gradients for clock t, apply once
  kSsp,    // bounded staleness: a pull at clock c waits for the slowest worker to reach c - s
};

// How a server turns a pushed gradient into its update (consistency.algorithm).
enum class Algorithm {
  kSgd,             // "sgd": the gradient as pushed (Downpour / BSP / SSP, by mode)
  kDcAsgd,          // "dc-asgd": delay compensation, Zheng et al. 2017 (async / ssp), constant λ
  kDcAsgdAdaptive,  // "dc-asgd-a": the same with λ / sqrt(mean square of g), per element
  kEasgd,           // "easgd": elastic averaging, Zhang, Choromanska, LeCun 2015 (async)
  kLocalSgd,        // "local-sgd": local steps, progress averaged through the servers (async)
};
inline constexpr std::string_view kAlgorithmNames[] = {"sgd", "dc-asgd", "dc-asgd-a", "easgd", "local-sgd"};

struct ConsistencyConfig;
// "async", "sync" or "ssp:<s>".
std::string ConsistencyModeString(const ConsistencyConfig& c);
// "async" | "sync" | "ssp:<s>" with s a non-negative integer into mode and staleness_bound.
bool ParseConsistencyMode(std::string_view text, ConsistencyConfig* c);

// [consistency] — how the servers combine the workers' gradients (docs/algorithms.md).
struct ConsistencyConfig {
  ConsistencyMode mode = ConsistencyMode::kAsync;
  int staleness_bound = 0;  // s of "ssp:<s>"; 0 for async and sync
  int backup_workers = 0;
  bool staleness_aware_lr = false;
  Algorithm algorithm = Algorithm::kSgd;
  float dc_lambda = 0.04f;
  float dc_lambda0 = 2.0f;
  float dc_mean_square_decay = 0.95f;
  int easgd_tau = 4;
  float easgd_alpha = 0.0f;
  int local_steps = 8;

  template <typename Self, typename V>
  static void Rows(Self& s, V& v) {
    using namespace config;
    const auto in_unit = [](float x) { return x >= 0.0f && x < 1.0f; };
    const auto compensation = [](float x) { return std::isfinite(x) && x >= 0.0f; };
    v.Text("mode", s, ConsistencyModeString, ParseConsistencyMode,
           "expected \"async\", \"sync\" or \"ssp:<s>\" with s >= 0", "\"async\" | \"sync\" | \"ssp:<s>\"",
           "async (Downpour), sync (BSP) or ssp:<s> (a pull waits for the slowest worker within s clocks)");
    v.Key("backup_workers", s.backup_workers, AtLeast(0), "sync only: apply after W - b arrivals");
    v.Key("staleness_aware_lr", s.staleness_aware_lr, "async/ssp: divide lr by the measured staleness (>= 1)");
    v.Named("algorithm", s.algorithm, Names{kAlgorithmNames},
            "sgd (as pushed), dc-asgd / dc-asgd-a (delay compensation), easgd (elastic averaging), local-sgd "
            "(local steps, progress averaged)");
    v.Key("dc_lambda", s.dc_lambda, Must<float>(compensation, "must be >= 0 and finite (0 = no compensation)"),
          "DC-ASGD: g + λ·g⊙g⊙(w − w_pulled)");
    v.Key("dc_lambda0", s.dc_lambda0, Must<float>(compensation, "must be >= 0 and finite (0 = no compensation)"),
          "DC-ASGD-a: λ = dc_lambda0 / sqrt(ms) per element");
    v.Key("dc_mean_square_decay", s.dc_mean_square_decay, Must<float>(in_unit, "must be in [0, 1)"),
          "DC-ASGD-a: m of ms ← m·ms + (1 − m)·g⊙g");
    v.Key("easgd_tau", s.easgd_tau, AtLeast(1, "steps between exchanges"),
          "EASGD: steps between a worker's exchanges with the center");
    v.Key("easgd_alpha", s.easgd_alpha,
          Must<float>([](float x) { return std::isfinite(x) && x >= 0.0f && x < 1.0f; },
                      "must be in [0, 1) (0 = 0.9 / cluster.workers)"),
          "EASGD: moving rate α; 0 = 0.9 / workers");
    v.Key("local_steps", s.local_steps, AtLeast(1, "steps between exchanges"),
          "local SGD: steps between a worker's exchanges of its progress");
  }
  bool operator==(const ConsistencyConfig&) const = default;
};
std::string AlgorithmString(Algorithm a);                    // kAlgorithmNames
bool ParseAlgorithm(std::string_view text, Algorithm* out);  // AlgorithmString's inverse; false for other text
inline bool DelayCompensated(Algorithm a) { return a == Algorithm::kDcAsgd || a == Algorithm::kDcAsgdAdaptive; }
// Whether the workers train their own copies and exchange weight differences with the servers'
// center (elastic exchanges, codec.h kFlagElastic) instead of pushing gradients.
inline bool ExchangesModels(Algorithm a) { return a == Algorithm::kEasgd || a == Algorithm::kLocalSgd; }
// The worker batches one exchange stands for (its steps since the last), where the servers place
// the center on the run's images-processed axis.
inline int ExchangeBatches(const ConsistencyConfig& c) {
  return c.algorithm == Algorithm::kLocalSgd ? c.local_steps : c.easgd_tau;
}
float EasgdAlpha(const ConsistencyConfig& c, int workers);  // easgd_alpha, or 0.9 / workers when it is 0

}  // namespace downpour
