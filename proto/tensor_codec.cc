#include "proto/tensor_codec.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltastream {
namespace {

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
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown tensor dtype ", dtype));
  }
}

}  // namespace

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

absl::StatusOr<at::Tensor> DecodeTensor(const v1::Tensor& tensor) {
  absl::StatusOr<at::ScalarType> dtype = HostDType(tensor.dtype());
  if (!dtype.ok()) return dtype.status();
  std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  if (shape.size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of ", shape.size(), " dims: at most 8"));
  }
  uint64_t elements = 1;
  for (int64_t size : shape) {
    if (size < 0 || (size > 0 && elements > (uint64_t{1} << 40) / size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad tensor shape: dimension ", size));
    }
    elements *= static_cast<uint64_t>(size);
  }
  const uint64_t expected = elements * c10::elementSize(*dtype);
  if (tensor.data().size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor of shape [", absl::StrJoin(shape, ", "), "] needs ", expected,
        " bytes, got ", tensor.data().size()));
  }
  at::Tensor out = at::empty(shape, *dtype);
  if (expected > 0) std::memcpy(out.data_ptr(), tensor.data().data(), expected);
  return out;
}

}  // namespace deltastream
