#include "proto/tensor_codec.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltastream {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tensor bytes go on the wire in host order: little-endian only");

absl::StatusOr<v1::Tensor::DType> WireDType(at::ScalarType dtype) {
  switch (dtype) {
    case at::kLong:
      return v1::Tensor::INT64;
    case at::kFloat:
      return v1::Tensor::FLOAT32;
    case at::kHalf:
      return v1::Tensor::FLOAT16;
    case at::kBFloat16:
      return v1::Tensor::BFLOAT16;
    case at::kDouble:
      return v1::Tensor::FLOAT64;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors of ", c10::toString(dtype), " cannot go on the wire"));
  }
}

absl::StatusOr<at::ScalarType> HostDType(int dtype) {
  switch (dtype) {
    case v1::Tensor::INT64:
      return at::kLong;
    case v1::Tensor::FLOAT32:
      return at::kFloat;
    case v1::Tensor::FLOAT16:
      return at::kHalf;
    case v1::Tensor::BFLOAT16:
      return at::kBFloat16;
    case v1::Tensor::FLOAT64:
      return at::kDouble;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown tensor dtype ", dtype));
  }
}

absl::Status EncodeTensor(const at::Tensor& tensor, v1::Tensor* out) {
  absl::StatusOr<v1::Tensor::DType> dtype = WireDType(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status();
  at::Tensor host = tensor.cpu().contiguous();
  out->set_dtype(*dtype);
  out->clear_shape();
  for (int64_t size : host.sizes()) out->add_shape(size);
  out->set_data(static_cast<const char*>(host.data_ptr()), host.nbytes());
  return absl::OkStatus();
}

namespace {

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// A length-delimited field's tag (wire type 2).
uint64_t DelimitedTag(int field_number) {
  return (static_cast<uint64_t>(field_number) << 3) | 2;
}

}  // namespace

absl::StatusOr<std::string> TensorFieldPrefix(int field_number,
                                              const at::Tensor& tensor) {
  absl::StatusOr<v1::Tensor::DType> dtype = WireDType(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status();
  if (!tensor.device().is_cpu() || !tensor.is_contiguous()) {
    return absl::InvalidArgumentError(
        "only a contiguous host tensor's data can go on the wire in place");
  }
  v1::Tensor meta;  // dtype and shape, serialised as EncodeTensor's are
  meta.set_dtype(*dtype);
  for (int64_t size : tensor.sizes()) meta.add_shape(size);
  std::string inner = meta.SerializeAsString();
  const uint64_t data_bytes = tensor.nbytes();
  if (data_bytes > 0) {
    AppendVarint(DelimitedTag(v1::Tensor::kDataFieldNumber), &inner);
    AppendVarint(data_bytes, &inner);
  }
  std::string prefix;
  AppendVarint(DelimitedTag(field_number), &prefix);
  AppendVarint(inner.size() + data_bytes, &prefix);
  prefix += inner;
  return prefix;
}

absl::StatusOr<WireLayout> CheckLayout(int dtype, std::vector<int64_t> shape) {
  absl::StatusOr<at::ScalarType> host = HostDType(dtype);
  if (!host.ok()) return host.status();
  if (shape.size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of ", shape.size(), " dims: at most 8"));
  }
  uint64_t elements = 1;
  for (int64_t size : shape) {
    // Each size too: with a 0 among them the product stays 0, and a [0,
    // 2^62] would pass (a state width no row could have).
    if (size < 0 || size > kMaxTensorElements ||
        (size > 0 &&
         elements > static_cast<uint64_t>(kMaxTensorElements) / size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad tensor shape: dimension ", size));
    }
    elements *= static_cast<uint64_t>(size);
  }
  WireLayout layout;
  layout.dtype = *host;
  layout.bytes = elements * c10::elementSize(*host);
  layout.shape = std::move(shape);
  return layout;
}

namespace {

// The wire tensor's layout, checked against its byte count.
absl::StatusOr<WireLayout> CheckedLayout(const v1::Tensor& tensor) {
  absl::StatusOr<WireLayout> layout = CheckLayout(
      tensor.dtype(),
      std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end()));
  if (!layout.ok()) return layout.status();
  if (tensor.data().size() != layout->bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor of shape [", absl::StrJoin(layout->shape, ", "), "] needs ",
        layout->bytes, " bytes, got ", tensor.data().size()));
  }
  return layout;
}

}  // namespace

absl::StatusOr<at::Tensor> DecodeTensor(const v1::Tensor& tensor) {
  absl::StatusOr<WireLayout> layout = CheckedLayout(tensor);
  if (!layout.ok()) return layout.status();
  at::Tensor out = at::empty(layout->shape, layout->dtype);
  if (out.nbytes() > 0) {
    std::memcpy(out.data_ptr(), tensor.data().data(), out.nbytes());
  }
  return out;
}

absl::StatusOr<char*> RowsDestination(const WireLayout& layout,
                                      int64_t row_offset, int64_t table_rows,
                                      at::Tensor* table) {
  const std::vector<int64_t>& shape = layout.shape;
  if (shape.empty()) {
    return absl::InvalidArgumentError("a chunk of rows needs at least 1 dim");
  }
  if (row_offset < 0 || table_rows < 0 || shape[0] > table_rows - row_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", row_offset, ", ", row_offset + shape[0],
                     ") fall outside a table of ", table_rows, " rows"));
  }
  std::vector<int64_t> table_shape = shape;
  table_shape[0] = table_rows;
  if (!table->defined()) {
    absl::StatusOr<WireLayout> whole =
        CheckLayout(WireDType(layout.dtype).value(), table_shape);
    if (!whole.ok()) return whole.status();
    try {
      *table = at::empty(table_shape, layout.dtype);
    } catch (const c10::Error&) {  // a table larger than this memory
      return absl::ResourceExhaustedError(absl::StrCat(
          "no memory for a table of ", c10::toString(layout.dtype), " [",
          absl::StrJoin(table_shape, ", "), "] (", whole->bytes, " bytes)"));
    }
  } else if (table->scalar_type() != layout.dtype ||
             table->sizes() != at::IntArrayRef(table_shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", c10::toString(layout.dtype), " [",
                     absl::StrJoin(shape, ", "), "] does not fit a table of ",
                     c10::toString(table->scalar_type()), " [",
                     absl::StrJoin(table->sizes(), ", "), "]"));
  }
  const int64_t row_bytes =
      shape[0] > 0 ? static_cast<int64_t>(layout.bytes) / shape[0] : 0;
  return static_cast<char*>(table->data_ptr()) + row_offset * row_bytes;
}

absl::Status DecodeRowsInto(const v1::Tensor& tensor, int64_t row_offset,
                            int64_t table_rows, at::Tensor* table) {
  absl::StatusOr<WireLayout> layout = CheckedLayout(tensor);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<char*> destination =
      RowsDestination(*layout, row_offset, table_rows, table);
  if (!destination.ok()) return destination.status();
  if (!tensor.data().empty()) {
    std::memcpy(*destination, tensor.data().data(), tensor.data().size());
  }
  return absl::OkStatus();
}

}  // namespace deltastream
