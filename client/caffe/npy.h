// npy.h — NumPy's .npy format 1.0 for float32 tensors, so trained weights can be read with
// numpy.load() (or any .npy reader) without downpour.
//
// Layout (NumPy's format.rst, version 1.0):
//   magic "\x93NUMPY", major 1, minor 0, header_len u16 little-endian, then header_len bytes of
//   ASCII: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (d0, d1, ), }
//   padded with spaces and ended by '\n' so that 10 + header_len is a multiple of 64, then the
//   float32 values in C (row-major) order. A 1-D shape is written "(n,)", a scalar "()".
//
// Thread-safety: pure functions. Ownership: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace downpour::caffe_io {

// The .npy bytes of a float32 tensor. data.size() must equal product(shape).
Status EncodeNpy(const std::vector<int64_t>& shape, const std::vector<float>& data, std::string* bytes);

// Parses a version 1.0 / 2.0 .npy of little-endian float32 in C order (what EncodeNpy writes);
// `source` names it in errors. Anything else (another dtype, Fortran order) is refused.
Status DecodeNpy(const std::string& bytes, const std::string& source, std::vector<int64_t>* shape,
                 std::vector<float>* data);

// The file name of a tensor: "<name>.npy", with '/' (Caffe layer names like
// "inception_3a/1x1") written as "%2F" and '%' as "%25", so every name maps to one file in one
// folder and back.
std::string NpyFileName(const std::string& tensor_name);

}  // namespace downpour::caffe_io
