// convert.cc — IDX, CIFAR-10 and image-folder converters; the inspector.
#include "data/convert.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>

#include "data/datum.h"
#include "data/idx.h"
#include "data/image.h"
#include "data/lmdb_io.h"
#include "data/transform.h"

namespace downpour::data {
namespace {

// Writes records round robin into `shards` LMDBs.
class ShardedWriter {
 public:
  ShardedWriter() = default;
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;
  // Unless Finish() succeeded, removes `out`.incomplete: a failed conversion leaves nothing.
  ~ShardedWriter() {
    if (finished_ || staging_.empty()) return;
    writers_.clear();  // close the environments before their files go
    std::error_code ec;
    std::filesystem::remove_all(staging_, ec);
  }
  // Writes under `out`.incomplete and renames it to `out` in Finish(), so a conversion that
  // fails half-way never leaves something that looks like a dataset.
  Status Open(const ConvertOptions& options) {
    namespace fs = std::filesystem;
    if (options.out.empty()) return InvalidArgument("convert: --out is empty");
    if (options.shards < 1 || options.shards > 4096) {
      return InvalidArgument("convert: --shards is {}, must be in [1, 4096]", options.shards);
    }
    std::error_code ec;
    if (fs::exists(options.out, ec) && !fs::is_empty(options.out, ec)) {
      return FailedPrecondition("convert: output {} exists and is not empty; remove it first", options.out);
    }
    out_ = options.out;
    staging_ = options.out + ".incomplete";
    fs::remove_all(staging_, ec);  // our own leftover from a failed run
    paths_ = ShardPaths(options.out, options.shards);
    for (const auto& p : ShardPaths(staging_, options.shards)) {
      std::unique_ptr<LmdbWriter> w;
      DP_RETURN_IF_ERROR(LmdbWriter::Create(p, &w));
      writers_.push_back(std::move(w));
    }
    return Status::Ok();
  }
  Status Put(int64_t index, std::string_view name, const std::string& value) {
    return writers_[static_cast<size_t>(index % static_cast<int64_t>(writers_.size()))]->Put(
        RecordKey(index, name), value);
  }
  Status Finish(ConvertReport* report) {
    for (auto& w : writers_) DP_RETURN_IF_ERROR(w->Finish());
    std::error_code ec;
    std::filesystem::remove(out_, ec);  // an empty directory given as --out
    std::filesystem::rename(staging_, out_, ec);
    if (ec) return IoError("convert: renaming {} to {} failed: {}", staging_, out_, ec.message());
    finished_ = true;
    report->lmdbs = paths_;
    return Status::Ok();
  }

 private:
  bool finished_ = false;
  std::string out_, staging_;
  std::vector<std::string> paths_;
  std::vector<std::unique_ptr<LmdbWriter>> writers_;
};

// The record order: identity, or a seeded permutation.
std::vector<int64_t> WriteOrder(int64_t n, const ConvertOptions& options) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (options.shuffle) {
    std::mt19937_64 rng(Mix64(options.seed));
    // Fisher-Yates with our own index draw: the same permutation on every standard library.
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(order[i], order[rng() % static_cast<uint64_t>(i + 1)]);
    }
  }
  return order;
}

}  // namespace

std::vector<std::string> ShardPaths(const std::string& out, int shards) {
  if (shards == 1) return {out};
  std::vector<std::string> paths;
  for (int i = 0; i < shards; ++i) {
    paths.push_back((std::filesystem::path(out) / fmt::format("shard_{}_of_{}", i, shards)).string());
  }
  return paths;
}

namespace {

// An image (any layout, 1 or 3 channels) -> a serialized Datum: raw planar, or encoded as
// `encoded` ("jpg" / "png") with c/h/w recording what decoding it gives.
Status ImageRecord(const Image& img, const std::string& encoded, int jpeg_quality, int label, std::string* value) {
  if (encoded.empty()) {
    const Image chw = ToLayout(img, Layout::kChw);
    *value = MakeRawDatum(chw.c, chw.h, chw.w, chw.pixels.data(), label);
    return Status::Ok();
  }
  std::string bytes;
  if (encoded == "jpg") {
    DP_RETURN_IF_ERROR(EncodeJpeg(img, jpeg_quality, &bytes));
  } else {
    DP_RETURN_IF_ERROR(EncodePng(img, &bytes));
  }
  *value = MakeEncodedDatum(bytes, img.c, img.h, img.w, label);
  return Status::Ok();
}

Status ValidateIdxOptions(const IdxOptions& idx) {
  if (idx.resize < 0 || idx.resize > 4096) {
    return InvalidArgument("convert-idx: --resize is {}, must be in [1, 4096] (or 0 to keep the size)", idx.resize);
  }
  if (idx.channels != 1 && idx.channels != 3) {
    return InvalidArgument("convert-idx: --channels is {}, must be 1 (grey) or 3 (grey replicated to B, G, R)",
                           idx.channels);
  }
  if (idx.encoded != "" && idx.encoded != "jpg" && idx.encoded != "png") {
    return InvalidArgument("convert-idx: --encoded is '{}', must be jpg, png or empty", idx.encoded);
  }
  if (idx.jpeg_quality < 1 || idx.jpeg_quality > 100) {
    return InvalidArgument("convert-idx: --quality is {}, must be in [1, 100]", idx.jpeg_quality);
  }
  if (idx.limit < 0) return InvalidArgument("convert-idx: --limit is {}, must be >= 0 (0 = all)", idx.limit);
  return Status::Ok();
}

// IDX image i (rows x cols grey) -> channels x side x side, planar.
Image IdxImage(const IdxImages& img, int64_t i, const IdxOptions& idx) {
  Image grey;
  grey.c = 1;
  grey.h = static_cast<int>(img.rows);
  grey.w = static_cast<int>(img.cols);
  grey.layout = Layout::kChw;
  const size_t plane = size_t(img.rows) * img.cols;
  grey.pixels.assign(img.pixels.begin() + static_cast<int64_t>(i * plane),
                     img.pixels.begin() + static_cast<int64_t>((i + 1) * plane));
  if (idx.resize > 0 && (grey.h != idx.resize || grey.w != idx.resize)) {
    grey = ResizeBilinear(grey, idx.resize, idx.resize);
  }
  if (idx.channels == 1) return grey;
  Image out = grey;  // planar: the plane three times is B = G = R
  out.c = 3;
  out.pixels.reserve(grey.pixels.size() * 3);
  out.pixels.insert(out.pixels.end(), grey.pixels.begin(), grey.pixels.end());
  out.pixels.insert(out.pixels.end(), grey.pixels.begin(), grey.pixels.end());
  return out;
}

}  // namespace

Status ConvertIdx(const std::string& images, const std::string& labels, const ConvertOptions& options,
                  ConvertReport* report) {
  return ConvertIdx(images, labels, IdxOptions{}, options, report);
}

Status ConvertIdx(const std::string& images, const std::string& labels, const IdxOptions& idx,
                  const ConvertOptions& options, ConvertReport* report) {
  DP_RETURN_IF_ERROR(ValidateIdxOptions(idx));
  IdxImages img;
  DP_RETURN_IF_ERROR(ReadIdxImages(images, &img));
  std::vector<uint8_t> lab;
  DP_RETURN_IF_ERROR(ReadIdxLabels(labels, &lab));
  if (static_cast<int64_t>(lab.size()) != img.count) {
    return InvalidArgument("convert-idx: {} holds {} images but {} holds {} labels", images,
                           img.count, labels, lab.size());
  }
  // --limit takes the first images of the file (then --shuffle permutes those).
  const int64_t count = idx.limit > 0 ? std::min(idx.limit, img.count) : img.count;
  ShardedWriter writer;
  DP_RETURN_IF_ERROR(writer.Open(options));
  ConvertReport r;
  const auto order = WriteOrder(count, options);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = order[static_cast<size_t>(k)];
    std::string value;
    DP_RETURN_IF_ERROR(ImageRecord(IdxImage(img, i, idx), idx.encoded, idx.jpeg_quality, lab[i], &value));
    DP_RETURN_IF_ERROR(writer.Put(k, std::to_string(i), value));
    ++r.label_counts[lab[i]];
  }
  r.records = count;
  DP_RETURN_IF_ERROR(writer.Finish(&r));
  *report = std::move(r);
  return Status::Ok();
}

Status ConvertCifar(const std::vector<std::string>& batches, const ConvertOptions& options,
                    ConvertReport* report) {
  constexpr size_t kRecord = 1 + 3 * 32 * 32;
  if (batches.empty()) return InvalidArgument("convert-cifar: no batch files given");
  // Read every batch first: all input problems are reported before anything is written.
  std::string all;
  std::vector<std::string> names;
  for (const auto& path : batches) {
    std::string bytes;
    DP_RETURN_IF_ERROR(ReadFileBytes(path, &bytes));
    if (bytes.empty() || bytes.size() % kRecord != 0) {
      return InvalidArgument("convert-cifar: {} has {} bytes, not a multiple of the {}-byte "
                             "CIFAR-10 record", path, bytes.size(), kRecord);
    }
    for (size_t off = 0; off < bytes.size(); off += kRecord) {
      const int label = static_cast<uint8_t>(bytes[off]);
      if (label > 9) {
        return InvalidArgument("convert-cifar: {} record {} has label {}, CIFAR-10 labels are "
                               "0..9", path, off / kRecord, label);
      }
      names.push_back(fmt::format("{}_{}", std::filesystem::path(path).stem().string(), off / kRecord));
    }
    all += bytes;
  }
  const int64_t n = static_cast<int64_t>(all.size() / kRecord);
  ShardedWriter writer;
  DP_RETURN_IF_ERROR(writer.Open(options));
  ConvertReport r;
  const auto order = WriteOrder(n, options);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = order[static_cast<size_t>(k)];
    const auto* rec = reinterpret_cast<const uint8_t*>(all.data()) + i * kRecord;
    DP_RETURN_IF_ERROR(writer.Put(k, names[static_cast<size_t>(i)], MakeRawDatum(3, 32, 32, rec + 1, rec[0])));
    ++r.label_counts[rec[0]];
  }
  r.records = n;
  DP_RETURN_IF_ERROR(writer.Finish(&r));
  *report = std::move(r);
  return Status::Ok();
}

namespace {

struct ListEntry {
  std::string path;  // relative to the root
  int label = 0;
  int line = 0;  // in the list file, 1-based
};

// Reads "<path> <label>" lines (the label is the last field, so paths may hold spaces, as in
// Caffe's list files). With folder.strict every named file must exist, so a missing one fails
// before anything is written; otherwise the conversion skips it as convert_imageset does.
Status ReadFolderList(const FolderOptions& folder, std::vector<ListEntry>* out) {
  std::error_code ec;
  if (std::filesystem::is_directory(folder.list, ec)) {
    return InvalidArgument("convert-folder: label list {} is a directory; give the list file", folder.list);
  }
  std::ifstream list(folder.list);
  if (!list) return NotFound("convert-folder: label list {}: cannot open", folder.list);
  std::vector<ListEntry> entries;
  std::string line;
  for (int line_no = 1; std::getline(list, line); ++line_no) {
    const size_t end = line.find_last_not_of(" \t\r");
    if (end == std::string::npos) continue;
    const std::string text = line.substr(0, end + 1);  // trailing blanks and CR dropped
    const size_t sep = text.find_last_of(" \t");
    int label = 0;
    std::istringstream label_in(sep == std::string::npos ? "" : text.substr(sep + 1));
    if (sep == std::string::npos || !(label_in >> label) || !label_in.eof()) {
      return InvalidArgument("convert-folder: {} line {}: expected '<path> <integer label>', got '{}'", folder.list,
                             line_no, text);
    }
    ListEntry e{text.substr(0, text.find_last_not_of(" \t", sep) + 1), label, line_no};
    const std::string full = (std::filesystem::path(folder.root) / e.path).string();
    if (folder.strict && !std::filesystem::is_regular_file(full)) {
      return NotFound("convert-folder: {} line {}: image file {} does not exist", folder.list,
                      line_no, full);
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) return InvalidArgument("convert-folder: label list {} is empty", folder.list);
  // The path is the record's key (after its number): LMDB would refuse a long one half-way.
  const int64_t last_index = static_cast<int64_t>(entries.size()) - 1;
  for (const ListEntry& e : entries) {
    const size_t key_bytes = RecordKey(last_index, e.path).size();
    if (key_bytes > kMaxKeyBytes) {
      return InvalidArgument(
          "convert-folder: {} line {}: the path is {} bytes; with the record number its LMDB key would be {} "
          "bytes, over LMDB's limit of {}",
          folder.list, e.line, e.path.size(), key_bytes, kMaxKeyBytes);
    }
  }
  *out = std::move(entries);
  return Status::Ok();
}

// One image file -> a serialized Datum whose channels/height/width always say what decoding
// its data gives. `bytes` is the file, `stored_c` the channels it decodes to by itself and
// `img` it decoded with folder.channels.
Status FolderRecord(const FolderOptions& folder, std::string bytes, int stored_c, Image img, int label,
                    std::string* value) {
  const bool resize = folder.resize_h > 0 && (img.h != folder.resize_h || img.w != folder.resize_w);
  if (resize) img = ResizeBilinear(img, folder.resize_h, folder.resize_w);
  if (folder.encoded.empty()) return ImageRecord(img, "", 0, label, value);
  // Like Caffe, a file of the right kind that nothing changes is stored as it is: no resize,
  // and channels as wanted, or a greyscale file in a colour set (kept, recorded as 1 channel:
  // the loader decodes it with the channels the run asks for). A colour file in a greyscale
  // set is re-encoded as greyscale, so the record holds what its header says.
  const bool is_jpeg = static_cast<uint8_t>(bytes[0]) == 0xFF;
  if (!resize && (folder.encoded == "jpg") == is_jpeg && (stored_c == img.c || stored_c == 1)) {
    *value = MakeEncodedDatum(bytes, stored_c, img.h, img.w, label);
    return Status::Ok();
  }
  return ImageRecord(img, folder.encoded, folder.jpeg_quality, label, value);
}

}  // namespace

Status ConvertFolder(const FolderOptions& folder, const ConvertOptions& options, ConvertReport* report) {
  if (folder.encoded != "" && folder.encoded != "jpg" && folder.encoded != "png") {
    return InvalidArgument("convert-folder: --encoded is '{}', must be jpg, png or empty", folder.encoded);
  }
  if (folder.channels != 1 && folder.channels != 3) {
    return InvalidArgument("convert-folder: channels is {}, must be 1 or 3", folder.channels);
  }
  if (folder.resize_h < 0 || folder.resize_w < 0 || (folder.resize_h == 0) != (folder.resize_w == 0)) {
    return InvalidArgument("convert-folder: resize {}x{}: give both sides > 0, or neither", folder.resize_h,
                           folder.resize_w);
  }
  if (folder.jpeg_quality < 1 || folder.jpeg_quality > 100) {
    return InvalidArgument("convert-folder: --quality is {}, must be in [1, 100]", folder.jpeg_quality);
  }
  std::vector<ListEntry> entries;
  DP_RETURN_IF_ERROR(ReadFolderList(folder, &entries));
  ShardedWriter writer;
  DP_RETURN_IF_ERROR(writer.Open(options));
  ConvertReport r;
  int64_t written = 0;  // keys stay dense (and shards balanced) when images are skipped
  const auto order = WriteOrder(static_cast<int64_t>(entries.size()), options);
  for (size_t k = 0; k < order.size(); ++k) {
    const ListEntry& e = entries[static_cast<size_t>(order[k])];
    const std::string full = (std::filesystem::path(folder.root) / e.path).string();
    std::string bytes;
    int stored_c = 0;
    Image img;
    Status s = ReadFileBytes(full, &bytes);
    if (s.ok()) s = EncodedChannels(bytes, full, &stored_c);
    if (s.ok()) s = DecodeImage(bytes, folder.channels, full, &img);
    if (!s.ok()) {
      const std::string why = fmt::format("{} line {}: {}", folder.list, e.line, s.message());
      if (folder.strict) return Status(s.code(), "convert-folder: " + why);
      spdlog::warn("convert-folder: skipping unreadable image: {}", why);
      r.skipped.push_back(why);
      continue;
    }
    std::string value;
    DP_RETURN_IF_ERROR(FolderRecord(folder, std::move(bytes), stored_c, std::move(img), e.label, &value));
    DP_RETURN_IF_ERROR(writer.Put(written++, e.path, value));
    ++r.label_counts[e.label];
  }
  if (written == 0) {
    return InvalidArgument("convert-folder: none of the {} images of {} could be read; the first: {}", entries.size(),
                           folder.list, r.skipped.front());
  }
  r.records = written;
  DP_RETURN_IF_ERROR(writer.Finish(&r));
  *report = std::move(r);
  return Status::Ok();
}

namespace {

// An encoded record's channels/height/width are informative (Caffe leaves them 0), but when
// set they must be what decoding the stored image gives.
Status CheckEncodedHeader(const caffe::Datum& datum, const ImageView& v, const std::string& where) {
  if (!datum.encoded() || (datum.channels() == 0 && datum.height() == 0 && datum.width() == 0)) {
    return Status::Ok();
  }
  if (datum.channels() != v.c || datum.height() != v.h || datum.width() != v.w) {
    return Corrupt("{}: the header says channels x height x width = {}x{}x{} but the stored image decodes to {}x{}x{}",
                   where, datum.channels(), datum.height(), datum.width(), v.c, v.h, v.w);
  }
  return Status::Ok();
}

}  // namespace

Status InspectLmdb(const std::string& path, const std::string& sheet_path, int sheet_images,
                   InspectReport* report) {
  std::unique_ptr<LmdbEnv> env;
  DP_RETURN_IF_ERROR(LmdbEnv::OpenReadOnly(path, &env));
  std::unique_ptr<ReadTxn> txn;
  DP_RETURN_IF_ERROR(ReadTxn::Begin(env.get(), &txn));
  InspectReport r;
  std::vector<Image> sheet;  // the first images, planar uint8
  caffe::Datum datum;
  Image scratch;
  bool found = false;
  DP_RETURN_IF_ERROR(txn->First(&found));
  while (found) {
    const std::string where = fmt::format("LMDB {} key {}", path, txn->key());
    ImageView v;
    Status s = ParseDatum(txn->value(), where, &datum);
    if (s.ok()) s = ViewDatum(datum, 0, where, &scratch, &v);
    if (s.ok()) s = CheckEncodedHeader(datum, v, where);
    ++r.records;
    if (!s.ok()) {
      if (r.bad++ == 0) r.first_bad = s.message();
    } else {
      r.encoded += datum.encoded() ? 1 : 0;
      ++r.shapes[fmt::format("{}x{}x{}", v.c, v.h, v.w)];
      ++r.label_counts[datum.label()];
      if (!sheet_path.empty() && static_cast<int>(sheet.size()) < sheet_images) {
        sheet.push_back(ViewToImage(v));
      }
    }
    DP_RETURN_IF_ERROR(txn->Next(&found));
  }
  if (!sheet_path.empty()) {
    if (sheet.empty()) return InvalidArgument("inspect: LMDB {} has no readable image for a sheet", path);
    // Cells of the largest image size (capped at 128 px: big images are shrunk), 8 per row,
    // 2 px gaps; greyscale cells are drawn into all three channels.
    int cell_h = 0, cell_w = 0;
    for (const auto& im : sheet) {
      cell_h = std::max(cell_h, std::min(im.h, 128));
      cell_w = std::max(cell_w, std::min(im.w, 128));
    }
    const int cols = std::min<int>(8, static_cast<int>(sheet.size()));
    const int rows = (static_cast<int>(sheet.size()) + cols - 1) / cols;
    Image out;
    out.c = 3;
    out.h = rows * (cell_h + 2) + 2;
    out.w = cols * (cell_w + 2) + 2;
    out.layout = Layout::kChw;
    out.pixels.assign(size_t(3) * out.h * out.w, 40);
    for (size_t k = 0; k < sheet.size(); ++k) {
      Image im = sheet[k];
      if (im.h > 128 || im.w > 128) im = ResizeBilinear(im, std::min(im.h, 128), std::min(im.w, 128));
      const int oy = 2 + static_cast<int>(k / cols) * (cell_h + 2);
      const int ox = 2 + static_cast<int>(k % cols) * (cell_w + 2);
      for (int ch = 0; ch < 3; ++ch)
        for (int y = 0; y < im.h; ++y)
          for (int x = 0; x < im.w; ++x)
            out.pixels[(size_t(ch) * out.h + oy + y) * out.w + ox + x] = im.At(std::min(ch, im.c - 1), y, x);
    }
    DP_RETURN_IF_ERROR(WritePngFile(out, sheet_path));
  }
  *report = std::move(r);
  return Status::Ok();
}

}  // namespace downpour::data
