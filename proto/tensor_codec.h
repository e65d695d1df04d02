#ifndef DELTASTREAM_PROTO_TENSOR_CODEC_H_
#define DELTASTREAM_PROTO_TENSOR_CODEC_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"

namespace deltastream {

// The wire dtype of a host dtype; InvalidArgument for one the wire lacks.
absl::StatusOr<v1::Tensor::DType> WireDType(at::ScalarType dtype);
// The host dtype of a wire dtype; InvalidArgument for an unknown one.
absl::StatusOr<at::ScalarType> HostDType(int dtype);

// Writes `tensor` (int64, float32, float16, bfloat16 or float64; any device,
// any layout) as raw little-endian bytes with dtype and shape. InvalidArgument
// for another dtype.
absl::Status EncodeTensor(const at::Tensor& tensor, v1::Tensor* out);

// The wire bytes that put `tensor` (host, contiguous) in field `field_number`
// (a v1::Tensor field) of an enclosing message, all but the raw data: the
// field's tag and length, dtype, shape, and the data field's tag and length
// (left out with the data when the tensor has no bytes, as proto3 does).
// These bytes followed by the tensor's nbytes() bytes are exactly what
// serializing EncodeTensor's result in that field writes: a writer can send
// the data from where it lies instead of copying it into a message.
// InvalidArgument for a dtype the wire lacks or a tensor that is not a
// contiguous host tensor.
absl::StatusOr<std::string> TensorFieldPrefix(int field_number,
                                              const at::Tensor& tensor);

// Reads a wire tensor into a new host tensor. InvalidArgument, with the
// numbers, for an unknown dtype, a negative or overflowing shape, or a byte
// count that does not match the shape.
absl::StatusOr<at::Tensor> DecodeTensor(const v1::Tensor& tensor);

// A wire tensor's layout: dtype, shape and the bytes its data must have.
struct WireLayout {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// The most elements a tensor on the wire (or a row width in a file) may
// have, in all and in each dimension: 2^40.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

// Checks a wire dtype and shape (at most 8 dims, no negative or overflowing
// size); InvalidArgument, with the numbers, otherwise.
absl::StatusOr<WireLayout> CheckLayout(int dtype, std::vector<int64_t> shape);

// Where rows [row_offset, row_offset + layout.shape[0]) of a table of
// `table_rows` rows go in `*table`, allocating it on the first call
// ([table_rows, shape[1:]...]); `layout.bytes` bytes may be written there.
// InvalidArgument when the layout's dtype or row shape differs from the
// table's, or its rows fall outside the table.
absl::StatusOr<char*> RowsDestination(const WireLayout& layout,
                                      int64_t row_offset, int64_t table_rows,
                                      at::Tensor* table);

// Reads a wire tensor holding rows [row_offset, row_offset + shape[0]) of a
// table of `table_rows` rows into `*table`, allocating it on the first call
// ([table_rows, shape[1:]...]): chunks land in place, with one copy and no
// concatenation. InvalidArgument when the wire tensor is malformed, its dtype
// or row shape differs from the table's, or its rows fall outside the table.
absl::Status DecodeRowsInto(const v1::Tensor& tensor, int64_t row_offset,
                            int64_t table_rows, at::Tensor* table);

}  // namespace deltastream

#endif  // DELTASTREAM_PROTO_TENSOR_CODEC_H_
