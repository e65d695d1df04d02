#include "store/row_gather.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace deltastream {
namespace {

// Rows are prefetched this many bytes of rows before they are copied: they
// lie spread over memory, so each copy would otherwise wait for its misses in
// turn. 8 KiB (128 lines) ahead brings a gather of 256-byte rows spread
// over memory near the speed of one sequential copy of the same bytes; 2 KiB
// (8 such rows) took up to 1.5x as long, and 8 rows of 64 bytes twice as
// long (micro_bench BM_CopyRowsAt).
constexpr int64_t kPrefetchBytes = 8 << 10;
// Fewer rows than this ahead would not cover a miss's latency.
constexpr int64_t kMinPrefetchRows = 8;

void PrefetchRow(const uint8_t* row, int64_t row_bytes) {
  for (int64_t offset = 0; offset < row_bytes; offset += 64) {
    __builtin_prefetch(row + offset);
  }
}

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
  const int64_t ahead = std::max(
      kMinPrefetchRows, kPrefetchBytes / std::max<int64_t>(1, row_bytes));
  // The first rows, which no earlier row prefetched (within a piece after
  // the first these are already on their way: one cheap hint more).
  for (int64_t i = begin; i < std::min(end, begin + ahead); ++i) {
    PrefetchRow(rows_at[i], row_bytes);
  }
  for (int64_t i = begin; i < end; ++i) {
    if (i + ahead < n) PrefetchRow(rows_at[i + ahead], row_bytes);
    std::memcpy(out + i * row_bytes, rows_at[i], row_bytes);
  }
}

void RowGather::Copy(int64_t begin, int64_t end) {
  CopyRowsAt(rows_at_, begin, end, row_bytes_,
             static_cast<uint8_t*>(states_.data_ptr()));
}

}  // namespace deltastream
