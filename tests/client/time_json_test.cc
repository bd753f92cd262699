// time_json_test.cc — `downpour-time --json`: one JSON object that a JSON parser reads (checked
// by /usr/bin/python3's json module, as the tools' tests use it), one entry per layer of the
// model in net order with its type and times, and the run's batch, threads and backend.
#include <gtest/gtest.h>

#include <string>

#include "client/engine/net_spec.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

TEST(TimeJson, IsOneObjectWithEveryLayerInNetOrder) {
  const std::string model = test::SourcePath("configs/models/fmnist_small.toml");
  engine::NetSpec spec;
  ASSERT_TRUE(engine::ParseNetSpecFile(model, &spec).ok());
  std::string layers;
  for (const auto& l : spec.layers) layers += (layers.empty() ? "" : ",") + l.name;
  const std::string check =
      "import json, sys\n"
      "d = json.load(sys.stdin)\n"
      "assert [l['layer'] for l in d['layers']] == sys.argv[1].split(','), d['layers']\n"
      "assert all(l['forward_ms'] >= 0 and l['backward_ms'] >= 0 and l['type'] for l in d['layers'])\n"
      "assert d['batch'] == 2 and d['threads'] == 1 and d['iterations'] == 1 and d['device'] == 'cpu', d\n"
      "assert d['backend'] and d['model'] == 'fmnist_small' and d['params'] > 0, d\n"
      "assert abs(d['forward_ms'] - sum(l['forward_ms'] for l in d['layers'])) < 0.01 * len(d['layers']), d\n"
      "assert d['step_ms'] > 0 and d['step_cpu_ms'] > 0, d\n"
      "print('checked', len(d['layers']))\n";
  std::string out;
  const int code = test::RunShell(test::Binary("downpour-time") + " --model '" + model +
                                      "' --batch 2 --iterations 1 --warmup 0 --threads 1 --json | /usr/bin/python3 -c \"" +
                                      check + "\" '" + layers + "'",
                                  &out);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("checked " + std::to_string(spec.layers.size())), std::string::npos) << out;
}

}  // namespace
}  // namespace downpour
