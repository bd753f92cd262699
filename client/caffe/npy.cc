// npy.cc — see npy.h.
#include "client/caffe/npy.h"

#include <fmt/format.h>

#include <bit>
#include <cctype>
#include <cstring>

namespace downpour::caffe_io {
namespace {

static_assert(std::endian::native == std::endian::little, "the .npy writer assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";  // 6 bytes
constexpr size_t kMagicLen = 6;

std::string ShapeTuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (int64_t d : shape) s += fmt::format("{}, ", d);
  if (shape.size() == 1)
    s.resize(s.size() - 1);  // "(n,)" as Python writes a 1-tuple
  else if (!shape.empty())
    s.resize(s.size() - 2);
  return s + ")";
}

// The value of `key` in the header dict: the text after "'key':" up to the matching end.
bool FindValue(const std::string& header, const std::string& key, std::string* value) {
  const std::string needle = "'" + key + "':";
  const size_t at = header.find(needle);
  if (at == std::string::npos) return false;
  size_t i = at + needle.size();
  while (i < header.size() && header[i] == ' ') ++i;
  size_t end = i;
  if (i < header.size() && header[i] == '(') {
    end = header.find(')', i);
    if (end == std::string::npos) return false;
    ++end;
  } else if (i < header.size() && header[i] == '\'') {
    end = header.find('\'', i + 1);
    if (end == std::string::npos) return false;
    ++end;
  } else {
    while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  }
  *value = header.substr(i, end - i);
  return true;
}

bool ParseShape(const std::string& tuple, std::vector<int64_t>* shape) {
  shape->clear();
  if (tuple.size() < 2 || tuple.front() != '(' || tuple.back() != ')') return false;
  size_t i = 1;
  while (i < tuple.size() - 1) {
    while (i < tuple.size() - 1 && (tuple[i] == ' ' || tuple[i] == ',')) ++i;
    if (i >= tuple.size() - 1) break;
    if (!std::isdigit(static_cast<unsigned char>(tuple[i]))) return false;
    int64_t v = 0;
    while (i < tuple.size() - 1 && std::isdigit(static_cast<unsigned char>(tuple[i]))) {
      if (v > (INT64_MAX - 9) / 10) return false;
      v = v * 10 + (tuple[i++] - '0');
    }
    if (tuple[i] == 'L') ++i;  // Python 2 longs
    shape->push_back(v);
  }
  return true;
}

}  // namespace

Status EncodeNpy(const std::vector<int64_t>& shape, const std::vector<float>& data, std::string* bytes) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) return InvalidArgument("npy: negative dimension in shape {}", ShapeTuple(shape));
    count *= d;
  }
  if (count != static_cast<int64_t>(data.size())) {
    return InvalidArgument("npy: shape {} holds {} values but {} were given", ShapeTuple(shape), count, data.size());
  }
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': {}, }}", ShapeTuple(shape));
  const size_t unpadded = kMagicLen + 2 + 2 + header.size() + 1;  // + the final '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 65535)
    return InvalidArgument("npy: header of shape {} is too long for format 1.0", ShapeTuple(shape));
  std::string out(kMagic, kMagicLen);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  const size_t at = out.size();
  out.resize(at + data.size() * sizeof(float));
  if (!data.empty()) std::memcpy(out.data() + at, data.data(), data.size() * sizeof(float));
  *bytes = std::move(out);
  return Status::Ok();
}

Status DecodeNpy(const std::string& bytes, const std::string& source, std::vector<int64_t>* shape,
                 std::vector<float>* data) {
  if (bytes.size() < kMagicLen + 4 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0) {
    return Corrupt("{}: not a .npy file (no \\x93NUMPY magic)", source);
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, header_at = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    header_at = 10;
  } else if (major == 2) {
    if (bytes.size() < 12) return Corrupt("{}: truncated .npy header", source);
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    header_at = 12;
  } else {
    return Corrupt("{}: .npy version {}.{} is not supported (1.0 and 2.0 are)", source, major,
                   static_cast<uint8_t>(bytes[7]));
  }
  if (bytes.size() < header_at + header_len) return Corrupt("{}: truncated .npy header", source);
  const std::string header = bytes.substr(header_at, header_len);
  std::string descr, fortran, tuple;
  if (!FindValue(header, "descr", &descr) || !FindValue(header, "fortran_order", &fortran) ||
      !FindValue(header, "shape", &tuple)) {
    return Corrupt("{}: .npy header lacks descr, fortran_order or shape: {}", source, header);
  }
  if (descr != "'<f4'") return InvalidArgument("{}: dtype {} is not little-endian float32 ('<f4')", source, descr);
  if (fortran != "False") return InvalidArgument("{}: Fortran-order arrays are not supported", source);
  std::vector<int64_t> dims;
  if (!ParseShape(tuple, &dims)) return Corrupt("{}: cannot read the shape {}", source, tuple);
  const size_t at = header_at + header_len;
  const size_t available = (bytes.size() - at) / sizeof(float);
  int64_t count = 1;
  for (int64_t d : dims) {
    // Checked as it grows, so a corrupt header cannot overflow the product.
    if (d != 0 && count > static_cast<int64_t>(available) / d + 1) {
      return Corrupt("{}: shape {} needs more data than the file's {} bytes", source, tuple, bytes.size() - at);
    }
    count *= d;
  }
  if (bytes.size() - at != static_cast<size_t>(count) * sizeof(float)) {
    return Corrupt("{}: shape {} needs {} bytes of data, the file has {}", source, tuple, count * 4, bytes.size() - at);
  }
  data->resize(static_cast<size_t>(count));
  if (count > 0) std::memcpy(data->data(), bytes.data() + at, static_cast<size_t>(count) * sizeof(float));
  *shape = std::move(dims);
  return Status::Ok();
}

std::string NpyFileName(const std::string& tensor_name) {
  std::string out;
  for (char c : tensor_name) {
    if (c == '/')
      out += "%2F";
    else if (c == '%')
      out += "%25";
    else
      out.push_back(c);
  }
  return out + ".npy";
}

}  // namespace downpour::caffe_io
