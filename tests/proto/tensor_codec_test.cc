#include "proto/tensor_codec.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

namespace deltastream {
namespace {

TEST(TensorCodecTest, EveryDtypeRoundTripsAsRawBytes) {
  for (at::ScalarType dtype :
       {at::kLong, at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    at::Tensor t = (at::arange(12) - 3).reshape({3, 4}).to(dtype);
    v1::Tensor wire;
    ASSERT_TRUE(EncodeTensor(t.t(), &wire).ok());  // non-contiguous input
    EXPECT_EQ(wire.data().size(), t.nbytes());
    auto back = DecodeTensor(wire);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(at::equal(*back, t.t().contiguous()));
  }
  v1::Tensor wire;
  EXPECT_EQ(EncodeTensor(at::ones({2}, at::kInt), &wire).code(),
            absl::StatusCode::kInvalidArgument);
}

// A tensor's field prefix and its raw bytes, sent from where they lie, must
// be byte for byte what serialising the encoded tensor in that field gives.
TEST(TensorCodecTest, FieldPrefixAndRawDataEqualTheSerializedField) {
  for (at::ScalarType dtype :
       {at::kLong, at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
    for (int64_t rows : {0, 1, 3, 5000}) {
      at::Tensor t = at::randn({rows, 7}).to(dtype);
      v1::NamedTensor expected;  // field 2 holds a v1::Tensor
      ASSERT_TRUE(EncodeTensor(t, expected.mutable_tensor()).ok());
      absl::StatusOr<std::string> prefix = TensorFieldPrefix(2, t);
      ASSERT_TRUE(prefix.ok()) << prefix.status();
      const std::string got =
          *prefix + std::string(static_cast<const char*>(t.data_ptr()),
                                static_cast<size_t>(t.nbytes()));
      EXPECT_EQ(got, expected.SerializeAsString())
          << c10::toString(dtype) << " rows " << rows;
    }
  }
  EXPECT_EQ(TensorFieldPrefix(2, at::ones({2}, at::kInt)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorFieldPrefix(2, at::ones({3, 4}).t()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorCodecTest, MalformedWireTensorsAreRefused) {
  v1::Tensor wire;
  wire.set_dtype(v1::Tensor::FLOAT32);
  wire.add_shape(2);
  wire.add_shape(3);
  wire.set_data(std::string(20, '\0'));  // needs 24
  auto status = DecodeTensor(wire).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("needs 24 bytes, got 20"), std::string::npos);
  wire.set_shape(0, -1);
  EXPECT_FALSE(DecodeTensor(wire).ok());
  wire.set_shape(0, int64_t{1} << 40);
  wire.set_shape(1, int64_t{1} << 40);
  EXPECT_FALSE(DecodeTensor(wire).ok());  // overflow, not a huge allocation
  wire.set_dtype(static_cast<v1::Tensor::DType>(99));
  EXPECT_FALSE(DecodeTensor(wire).ok());
}

TEST(TensorCodecTest, ChunksOfRowsLandInPlace) {
  const at::Tensor table = at::randn({10, 4});
  at::Tensor received;
  for (int64_t offset : {6, 0, 3}) {  // any order
    const int64_t rows = offset == 6 ? 4 : 3;
    v1::Tensor wire;
    ASSERT_TRUE(EncodeTensor(table.narrow(0, offset, rows), &wire).ok());
    ASSERT_TRUE(DecodeRowsInto(wire, offset, 10, &received).ok());
  }
  EXPECT_TRUE(at::equal(received, table));

  v1::Tensor wire;
  ASSERT_TRUE(EncodeTensor(table.narrow(0, 0, 3), &wire).ok());
  EXPECT_FALSE(DecodeRowsInto(wire, 8, 10, &received).ok());  // past the end
  ASSERT_TRUE(EncodeTensor(at::ones({3, 5}), &wire).ok());
  EXPECT_FALSE(DecodeRowsInto(wire, 0, 10, &received).ok());  // other row shape
  ASSERT_TRUE(EncodeTensor(at::ones({3, 4}, at::kHalf), &wire).ok());
  EXPECT_FALSE(DecodeRowsInto(wire, 0, 10, &received).ok());  // other dtype
}

}  // namespace
}  // namespace deltastream
