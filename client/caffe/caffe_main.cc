// downpour-caffe — Caffe interop: bring a Caffe model definition and Caffe weights to downpour,
// take trained weights back.
//   downpour-caffe import-prototxt NET.prototxt -o model.toml [--input CxHxW] [--phase train|test]
//   downpour-caffe import-weights NET.caffemodel --model model.toml -o weights.dpt
//   downpour-caffe export-weights weights.dpt --model model.toml -o NET.caffemodel
//   downpour-caffe export-npy weights.dpt -o DIR
// Every output is written whole or not at all (a failure leaves no partial file).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "client/caffe/caffemodel.h"
#include "client/caffe/npy.h"
#include "client/caffe/prototxt_import.h"
#include "client/caffe/weights_io.h"
#include "client/engine/net_spec.h"
#include "common/cli.h"
#include "common/file_io.h"
#include "common/tensor_file.h"

namespace {

namespace cli = downpour::cli;
namespace cio = downpour::caffe_io;
using downpour::Status;

constexpr char kProgram[] = "downpour-caffe";

int Fail(const Status& s) { return cli::Fail(kProgram, s, cli::SetupExitCode(s)); }

// The model config and its shapes (parameter tensors) at batch 1.
Status LoadModel(const std::string& path, downpour::engine::NetSpec* spec, downpour::engine::NetShapes* shapes) {
  DP_RETURN_IF_ERROR(downpour::engine::ParseNetSpecFile(path, spec));
  return downpour::engine::InferShapes(*spec, 1, shapes);
}

int ImportPrototxt(const std::string& in, const std::string& out, const std::string& input, const std::string& phase) {
  cio::ImportOptions options;
  Status s = cio::ParsePhase(phase, &options);
  if (s.ok() && !input.empty()) s = cio::ParseInputSize(input, &options);
  if (!s.ok()) return cli::Fail(kProgram, s, cli::kExitUsage);
  cio::Import import;
  s = cio::ImportPrototxtFile(in, options, &import);
  if (!s.ok()) return Fail(s);
  s = downpour::WriteFileAtomic(out, import.toml);
  if (!s.ok()) return Fail(s);
  for (const std::string& note : import.notes) std::fprintf(stderr, "%s: note: %s\n", kProgram, note.c_str());
  std::printf("wrote %s: net '%s', %zu layers, input %dx%dx%d, %lld learnable parameters in %zu tensors\n", out.c_str(),
              import.spec.name.c_str(), import.spec.layers.size(), import.spec.input_channels, import.spec.input_height,
              import.spec.input_width, static_cast<long long>(downpour::TotalElements(import.shapes.params)),
              import.shapes.params.size());
  return cli::kExitOk;
}

int ImportWeights(const std::string& in, const std::string& model, const std::string& out, bool ignore_extra,
                  bool keep_missing) {
  downpour::engine::NetSpec spec;
  downpour::engine::NetShapes shapes;
  Status s = LoadModel(model, &spec, &shapes);
  if (!s.ok()) return Fail(s);
  cio::CaffeNet caffe;
  s = cio::ReadCaffemodel(in, &caffe);
  if (!s.ok()) return Fail(s);
  cio::WeightsPolicy policy;
  policy.ignore_extra = ignore_extra;
  policy.keep_missing = keep_missing;
  cio::WeightsReport report;
  downpour::TensorFile file;
  s = cio::CaffeToTensors(caffe, in, spec, shapes, policy, &file.tensors, &report);
  if (!s.ok()) return Fail(s);
  file.meta["kind"] = "engine-weights";
  file.meta["model"] = spec.name;
  file.meta["source"] = std::filesystem::path(in).filename().string();
  s = downpour::WriteTensorFile(out, file);
  if (!s.ok()) return Fail(s);
  if (!report.skipped.empty()) {
    std::fprintf(stderr, "%s: skipped caffemodel layers the model lacks: %s\n", kProgram,
                 fmt::format("{}", fmt::join(report.skipped, ", ")).c_str());
  }
  if (!report.kept.empty()) {
    std::fprintf(stderr, "%s: not in the caffemodel, left out of %s (they keep their fillers): %s\n", kProgram,
                 out.c_str(), fmt::format("{}", fmt::join(report.kept, ", ")).c_str());
  }
  int64_t values = 0;
  for (const auto& t : file.tensors) values += static_cast<int64_t>(t.data.size());
  std::printf("wrote %s: %zu tensors, %lld values of model '%s' from %s (%s layers)\n", out.c_str(),
              file.tensors.size(), static_cast<long long>(values), spec.name.c_str(), in.c_str(),
              caffe.from_v1 ? "V1" : "new-style");
  return cli::kExitOk;
}

int ExportWeights(const std::string& in, const std::string& model, const std::string& out) {
  downpour::engine::NetSpec spec;
  downpour::engine::NetShapes shapes;
  Status s = LoadModel(model, &spec, &shapes);
  if (!s.ok()) return Fail(s);
  downpour::TensorFile file;
  s = downpour::ReadTensorFile(in, &file);
  if (!s.ok()) return Fail(s);
  cio::CaffeNet caffe;
  s = cio::TensorsToCaffe(file, in, spec, shapes, &caffe);
  if (!s.ok()) return Fail(s);
  s = cio::WriteCaffemodel(out, caffe);
  if (!s.ok()) return Fail(s);
  std::printf("wrote %s: %zu layers of model '%s', %zu tensors from %s\n", out.c_str(), caffe.layers.size(),
              spec.name.c_str(), file.tensors.size(), in.c_str());
  return cli::kExitOk;
}

int ExportNpy(const std::string& in, const std::string& dir) {
  downpour::TensorFile file;
  Status s = downpour::ReadTensorFile(in, &file);
  if (!s.ok()) return Fail(s);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Fail(downpour::IoError("{}: cannot create the output folder: {}", dir, ec.message()));
  // Every file is written to a temporary first; they are renamed into place only when all are
  // written, so a failure leaves the folder as it was.
  std::vector<std::pair<std::string, std::string>> written;  // (temporary, final path)
  for (const downpour::NamedTensor& t : file.tensors) {
    std::string bytes, tmp;
    const std::string path = (std::filesystem::path(dir) / cio::NpyFileName(t.name)).string();
    s = cio::EncodeNpy(t.shape, t.data, &bytes);
    if (s.ok()) s = downpour::WriteTemp(path, bytes, &tmp);
    if (!s.ok()) {
      for (const auto& w : written) downpour::DiscardTemp(w.first);
      return Fail(Status(s.code(), fmt::format("{}: tensor '{}': {}", in, t.name, s.message())));
    }
    written.emplace_back(tmp, path);
  }
  for (const auto& [tmp, path] : written) {
    s = downpour::CommitTemp(tmp, path);
    if (!s.ok()) return Fail(s);
  }
  std::printf("wrote %zu .npy files (float32, C order) to %s\n", written.size(), dir.c_str());
  return cli::kExitOk;
}

int Run(int argc, char** argv) {
  CLI::App app{
      "downpour-caffe: Caffe interop. Import a Caffe net definition (.prototxt) as a model config,\n"
      "import Caffe weights (.caffemodel, new or V1 format) as a downpour weights file, export\n"
      "weights back to .caffemodel or to NumPy .npy files."};
  cli::AddStandardFlags(&app, kProgram);
  app.require_subcommand(1);

  std::string proto_in, proto_out, input, phase = "train";
  CLI::App* imp = app.add_subcommand("import-prototxt", "Caffe NetParameter prototxt -> model config (TOML)");
  imp->add_option("prototxt", proto_in, "Caffe net definition, e.g. train_val.prototxt")->required();
  imp->add_option("-o,--output", proto_out, "model config to write, e.g. model.toml")->required();
  imp->add_option("--input", input,
                  "input size CxHxW (e.g. 1x28x28); required when the prototxt does not fix it (a Data layer "
                  "without crop_size)");
  imp->add_option("--phase", phase, "which phase's layers (include/exclude rules): train (default) or test")
      ->check(CLI::IsMember({"train", "test"}));
  imp->footer(
      "Layers: Convolution, ReLU, LRN, Pooling (MAX, AVE), InnerProduct, Dropout, SoftmaxWithLoss, Softmax,\n"
      "Accuracy; inputs Data, ImageData, Input. In-place tops are renamed after their layer. Accuracy layers\n"
      "are kept in both phases (one net trains and evaluates). The train Data layer's transform_param is\n"
      "written as comments with the matching run-config keys (data.crop, data.mirror, data.mean_file, ...).");

  std::string w_in, w_model, w_out;
  bool ignore_extra = false, keep_missing = false;
  CLI::App* iw = app.add_subcommand("import-weights", ".caffemodel -> downpour weights file (tensor file)");
  iw->add_option("caffemodel", w_in, "Caffe weights (new 'layer' or old V1 'layers' format)")->required();
  iw->add_option("-m,--model", w_model, "model config the weights are for (TOML)")->required();
  iw->add_option("-o,--output", w_out, "weights file to write, e.g. weights.dpt")->required();
  iw->add_flag("--ignore-extra", ignore_extra,
               "skip caffemodel layers the model lacks (Caffe's fine-tuning rule) instead of failing");
  iw->add_flag("--keep-missing", keep_missing,
               "write only the tensors the caffemodel has; the others keep their fillers when the worker loads "
               "the file (e.g. a renamed fc8)");

  std::string e_in, e_model, e_out;
  CLI::App* ew = app.add_subcommand("export-weights", "downpour weights file -> .caffemodel (new format)");
  ew->add_option("weights", e_in, "downpour weights file (tensor file, e.g. weights.dpt)")->required();
  ew->add_option("-m,--model", e_model, "model config the weights are for (TOML)")->required();
  ew->add_option("-o,--output", e_out, ".caffemodel to write")->required();

  std::string n_in, n_dir;
  CLI::App* en = app.add_subcommand("export-npy", "downpour weights file -> one NumPy .npy per tensor");
  en->add_option("weights", n_in, "downpour weights file (tensor file)")->required();
  en->add_option("-o,--output", n_dir, "folder for <tensor>.npy files (created if missing)")->required();

  if (const auto code = cli::Parse(app, argc, argv)) return *code;
  if (imp->parsed()) return ImportPrototxt(proto_in, proto_out, input, phase);
  if (iw->parsed()) return ImportWeights(w_in, w_model, w_out, ignore_extra, keep_missing);
  if (ew->parsed()) return ExportWeights(e_in, e_model, e_out);
  return ExportNpy(n_in, n_dir);
}

}  // namespace

int main(int argc, char** argv) {
  return downpour::cli::Main(kProgram, [&] { return Run(argc, argv); });
}
