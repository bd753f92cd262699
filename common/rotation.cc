#include "common/rotation.h"

namespace downpour {
namespace {

// Holders of model m in pipeline stage t: workers i < W with (i + t) mod K == m.
int Holders(int m, int t, int models, int workers) {
  int n = 0;
  for (int i = 0; i < workers; ++i) n += PipelineModel(i, t, models) == m ? 1 : 0;
  return n;
}

}  // namespace

std::vector<StageTask> WorkerStages(RotationScheme scheme, int models, int workers, int passes, int worker,
                                    RotationGroups groups) {
  std::vector<StageTask> out;
  if (models < 1 || workers < 1 || passes < 1 || worker < 0 || worker >= workers) return out;
  switch (scheme) {
    case RotationScheme::kPipeline: {
      std::vector<int64_t> moves(static_cast<size_t>(models), 0);    // per model, before stage t
      std::vector<int64_t> trained(static_cast<size_t>(models), 0);  // stages with a holder, before t
      for (int t = 0; t < models * passes; ++t) {
        StageTask s;
        s.model = PipelineModel(worker, t, models);
        s.partition = worker;
        s.group = Holders(s.model, t, models, workers);
        s.moves_before = moves[static_cast<size_t>(s.model)];
        s.stages_before = trained[static_cast<size_t>(s.model)];
        s.data_parallel = models < workers && groups == RotationGroups::kDataParallel;
        out.push_back(s);
        for (int m = 0; m < models; ++m) {
          const int h = Holders(m, t, models, workers);
          moves[static_cast<size_t>(m)] += h;
          trained[static_cast<size_t>(m)] += h > 0 ? 1 : 0;
        }
      }
      break;
    }
    case RotationScheme::kSequential:
      for (int k = 0; k < models; ++k) {
        StageTask s;
        s.model = k;
        s.partition = worker;
        s.units = passes;
        s.group = workers;
        s.data_parallel = true;
        out.push_back(s);
      }
      break;
    case RotationScheme::kIndependent:
      for (int k = worker; k < models; k += workers) {
        for (int j = 0; j < workers * passes; ++j) {
          StageTask s;
          s.model = k;
          s.partition = (worker + j) % workers;
          s.moves_before = j;
          s.pull = j == 0;  // the job keeps its weights and momentum between its stages
          out.push_back(s);
        }
      }
      break;
  }
  return out;
}

int64_t MovesPerModel(RotationScheme scheme, int models, int workers, int passes, RotationGroups groups) {
  if (scheme == RotationScheme::kSequential) return 0;
  if (scheme == RotationScheme::kPipeline && models < workers && groups == RotationGroups::kDataParallel) return 0;
  return int64_t{workers} * passes;
}

bool EveryStageHasOneHolder(RotationScheme scheme, int models, int workers) {
  switch (scheme) {
    case RotationScheme::kPipeline:
      return models >= workers;
    case RotationScheme::kIndependent:
      return true;
    case RotationScheme::kSequential:
      break;
  }
  return false;
}

int64_t VersionsBefore(const StageTask& t, ConsistencyMode mode, int64_t steps) {
  if (!t.data_parallel) return t.moves_before;
  return (mode == ConsistencyMode::kSync ? t.stages_before : t.moves_before) * steps;
}

int64_t VersionsAfter(const StageTask& t, ConsistencyMode mode, int64_t steps) {
  if (!t.data_parallel) return t.moves_before + t.group;
  return mode == ConsistencyMode::kSync ? (t.stages_before + 1) * steps : (t.moves_before + t.group) * steps;
}

bool HoldsModel(int worker, int model, int64_t version, int64_t stage_steps, int models, int workers, int passes) {
  if (stage_steps < 1 || models < 1 || version < 0 || worker < 0 || worker >= workers) return false;
  const int64_t stage = version / stage_steps;
  if (stage >= int64_t{models} * passes) return false;
  return PipelineModel(worker, static_cast<int>(stage), models) == model;
}

}  // namespace downpour
