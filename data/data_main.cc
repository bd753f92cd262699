// downpour-data — dataset tool: convert IDX / CIFAR-10 / image folders to LMDB shards,
// inspect an LMDB, compute its mean image. A thin main over data/convert.h, mean_file.h.
//
//   downpour-data convert-idx --images X --labels Y --out DIR [--shards N] [--shuffle --seed S]
//                             [--resize 256] [--channels 3] [--encoded jpg|png] [--quality Q] [--limit N]
//   downpour-data convert-cifar data_batch_1.bin ... --out DIR [--shards N]
//   downpour-data convert-folder --root R --list L --out DIR [--resize 256] [--shuffle]
//                                [--encoded jpg|png] [--gray] [--shards N] [--strict]
//   downpour-data inspect DB [--sheet out.png] [--sheet-images 64]
//   downpour-data mean DB --out mean.tensor|mean.binaryproto
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/cli.h"
#include "data/convert.h"
#include "data/mean_file.h"

namespace {

using downpour::Status;
using namespace downpour::data;
namespace cli = downpour::cli;

// Bad input named on the command line (a missing file, a bad value) exits 2, a failure while
// reading or writing (a corrupt record, a full disk) 1 (common/cli.h).
int Report(const Status& s) {
  if (s.ok()) return cli::kExitOk;
  return cli::Fail("downpour-data", s, cli::SetupExitCode(s));
}

void PrintLabels(const std::map<int, int64_t>& counts) {
  fmt::print("labels:");
  for (const auto& [label, n] : counts) fmt::print(" {}:{}", label, n);
  fmt::print("\n");
}

int PrintConvert(const Status& s, const ConvertReport& r) {
  if (!s.ok()) return Report(s);
  fmt::print("wrote {} records into {} LMDB(s):\n", r.records, r.lmdbs.size());
  for (const auto& p : r.lmdbs) fmt::print("  {}\n", p);
  PrintLabels(r.label_counts);
  if (!r.skipped.empty()) {
    fmt::print("skipped {} unreadable images:\n", r.skipped.size());
    for (const auto& why : r.skipped) fmt::print("  {}\n", why);
  }
  return 0;
}

void AddConvertFlags(CLI::App* cmd, ConvertOptions* o) {
  cmd->add_option("--out", o->out, "output LMDB directory (parent of shard_i_of_N when --shards > 1)")->required();
  cmd->add_option("--shards", o->shards, "number of shard LMDBs (records dealt round robin)");
  cmd->add_flag("--shuffle", o->shuffle, "permute the records before writing");
  cmd->add_option("--seed", o->seed, "shuffle seed");
}

int Run(int argc, char** argv) {
  CLI::App app{"downpour-data: LMDB datasets of Caffe Datum records"};
  cli::AddStandardFlags(&app, "downpour-data");
  app.require_subcommand(1);

  ConvertOptions idx_opts;
  std::string idx_images, idx_labels;
  auto* idx = app.add_subcommand("convert-idx", "IDX images + labels (MNIST, Fashion-MNIST) -> LMDB");
  idx->add_option("--images", idx_images, "idx3-ubyte images (.gz or raw)")->required();
  idx->add_option("--labels", idx_labels, "idx1-ubyte labels (.gz or raw)")->required();
  IdxOptions idx_shape;
  idx->add_option("--resize", idx_shape.resize, "bilinear resize to NxN (e.g. 256, ImageNet-shaped); 0 keeps the size");
  idx->add_option("--channels", idx_shape.channels, "1 = grey as stored; 3 = grey replicated to B, G, R");
  idx->add_option("--encoded", idx_shape.encoded, "store encoded images: jpg or png (default raw)");
  idx->add_option("--quality", idx_shape.jpeg_quality, "JPEG quality with --encoded jpg");
  idx->add_option("--limit", idx_shape.limit, "convert only the first N images (0 = all)");
  AddConvertFlags(idx, &idx_opts);

  ConvertOptions cifar_opts;
  std::vector<std::string> cifar_batches;
  auto* cifar = app.add_subcommand("convert-cifar", "CIFAR-10 binary batches -> LMDB");
  cifar->add_option("batches", cifar_batches, "CIFAR-10 binary batch files (data_batch_*.bin, test_batch.bin)")
      ->required();
  AddConvertFlags(cifar, &cifar_opts);

  ConvertOptions folder_opts;
  FolderOptions folder;
  int resize = 0;
  bool gray = false;
  auto* fold = app.add_subcommand("convert-folder", "image folder + '<path> <label>' list -> LMDB");
  fold->add_option("--root", folder.root, "folder the list's paths are relative to")->required();
  fold->add_option("--list", folder.list, "label list file")->required();
  fold->add_option("--resize", resize, "resize to NxN (e.g. 256); 0 keeps the size")->check(cli::AtLeast(0));
  fold->add_option("--resize-height", folder.resize_h, "resize height (with --resize-width)");
  fold->add_option("--resize-width", folder.resize_w, "resize width (with --resize-height)");
  fold->add_option("--encoded", folder.encoded, "store encoded images: jpg or png (default raw)");
  fold->add_option("--quality", folder.jpeg_quality, "JPEG quality when re-encoding");
  fold->add_flag("--gray", gray, "store greyscale (1 channel) instead of BGR");
  fold->add_flag("--strict", folder.strict,
                 "fail on the first unreadable image (default: skip it with a warning and list it)");
  AddConvertFlags(fold, &folder_opts);

  std::string inspect_db, sheet;
  int sheet_images = 64;
  auto* insp = app.add_subcommand("inspect", "count, shapes, label histogram, contact sheet");
  insp->add_option("db", inspect_db, "LMDB directory")->required();
  insp->add_option("--sheet", sheet, "write a PNG contact sheet of the first images");
  insp->add_option("--sheet-images", sheet_images, "images on the sheet")->check(CLI::Range(1, 1024));

  std::string mean_db, mean_out;
  auto* mean = app.add_subcommand("mean", "mean image of an LMDB -> file");
  mean->add_option("db", mean_db, "LMDB directory")->required();
  mean->add_option("--out", mean_out,
                   "mean file to write: Caffe's BlobProto when it ends in .binaryproto, else "
                   "downpour's tensor file")
      ->required();

  if (const auto code = cli::Parse(app, argc, argv)) return *code;

  ConvertReport report;
  if (*idx) return PrintConvert(ConvertIdx(idx_images, idx_labels, idx_shape, idx_opts, &report), report);
  if (*cifar) return PrintConvert(ConvertCifar(cifar_batches, cifar_opts, &report), report);
  if (*fold) {
    if (resize > 0) folder.resize_h = folder.resize_w = resize;
    folder.channels = gray ? 1 : 3;
    return PrintConvert(ConvertFolder(folder, folder_opts, &report), report);
  }
  if (*insp) {
    InspectReport r;
    const Status s = InspectLmdb(inspect_db, sheet, sheet_images, &r);
    if (!s.ok()) return Report(s);
    fmt::print("{}: {} records ({} encoded, {} bad)\n", inspect_db, r.records, r.encoded, r.bad);
    for (const auto& [shape, n] : r.shapes) fmt::print("shape {}: {}\n", shape, n);
    PrintLabels(r.label_counts);
    if (r.bad > 0) fmt::print("first bad record: {}\n", r.first_bad);
    if (!sheet.empty()) fmt::print("contact sheet: {}\n", sheet);
    return r.bad > 0 ? cli::kExitFailure : cli::kExitOk;
  }
  if (*mean) {
    MeanImage m;
    Status s = ComputeMean(mean_db, &m);
    if (s.ok()) s = WriteMeanFile(m, mean_out);
    if (!s.ok()) return Report(s);
    double avg = 0;
    for (float v : m.values) avg += v;
    fmt::print("mean image {}x{}x{} (average {:.3f}) -> {} ({})\n", m.c, m.h, m.w,
               avg / static_cast<double>(m.values.size()), mean_out,
               mean_out.ends_with(".binaryproto") ? "Caffe BlobProto" : "tensor file");
    return 0;
  }
  return cli::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::Main("downpour-data", [&] { return Run(argc, argv); });
}
