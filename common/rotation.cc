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

std::vector<StageTask> WorkerStages(RotationScheme scheme, int models, int workers, int passes, int worker) {
  std::vector<StageTask> out;
  if (models < 1 || workers < 1 || passes < 1 || worker < 0 || worker >= workers) return out;
  switch (scheme) {
    case RotationScheme::kPipeline: {
      std::vector<int64_t> moves(static_cast<size_t>(models), 0);  // per model, before stage t
      for (int t = 0; t < models * passes; ++t) {
        StageTask s;
        s.model = PipelineModel(worker, t, models);
        s.partition = worker;
        s.group = Holders(s.model, t, models, workers);
        s.moves_before = moves[static_cast<size_t>(s.model)];
        out.push_back(s);
        for (int m = 0; m < models; ++m) moves[static_cast<size_t>(m)] += Holders(m, t, models, workers);
      }
      break;
    }
    case RotationScheme::kSequential:
      for (int k = 0; k < models; ++k) {
        StageTask s;
        s.model = k;
        s.partition = worker;
        s.units = passes;
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

int64_t MovesPerModel(RotationScheme scheme, int /*models*/, int workers, int passes) {
  return scheme == RotationScheme::kSequential ? 0 : int64_t{workers} * passes;
}

}  // namespace downpour
