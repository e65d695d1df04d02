#include "store/row_gather.h"

#include <cstring>
#include <utility>

namespace deltastream {
namespace {

// Rows are copied this many rows after they are prefetched: they lie spread
// over memory, so each copy would otherwise wait for its misses in turn.
constexpr int64_t kPrefetchRows = 8;

}  // namespace

RowGather::RowGather(at::Tensor states, std::vector<const uint8_t*> rows_at,
                     int64_t row_bytes, std::vector<at::Tensor> keep)
    : states_(std::move(states)),
      rows_at_(std::move(rows_at)),
      row_bytes_(row_bytes),
      keep_(std::move(keep)) {}

void CopyRowsAt(const std::vector<const uint8_t*>& rows_at, int64_t begin,
                int64_t end, int64_t row_bytes, uint8_t* out) {
  const int64_t n = static_cast<int64_t>(rows_at.size());
  for (int64_t i = begin; i < end; ++i) {
    if (i + kPrefetchRows < n) {
      for (int64_t offset = 0; offset < row_bytes; offset += 64) {
        __builtin_prefetch(rows_at[i + kPrefetchRows] + offset);
      }
    }
    std::memcpy(out + i * row_bytes, rows_at[i], row_bytes);
  }
}

void RowGather::Copy(int64_t begin, int64_t end) {
  CopyRowsAt(rows_at_, begin, end, row_bytes_,
             static_cast<uint8_t*>(states_.data_ptr()));
}

}  // namespace deltastream
