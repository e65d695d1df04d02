#ifndef DELTASTREAM_STORE_ROW_GATHER_H_
#define DELTASTREAM_STORE_ROW_GATHER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace deltastream {

// Copies rows_at[i] (`row_bytes` each) to out + i * row_bytes for i in
// [begin, end). The rows lie spread over memory, so each copy would
// otherwise wait for its cache misses in turn: sources are prefetched a few
// rows ahead (within rows_at).
void CopyRowsAt(const std::vector<const uint8_t*>& rows_at, int64_t begin,
                int64_t end, int64_t row_bytes, uint8_t* out);

// The state rows of a read still to be copied, from where the store holds
// them into the read's result, in pieces: a reader can send the first rows
// while later ones are copied (DeltaStore::GetUniqueTableDeferred).
//
// It reads the store's memory through plain pointers, without the store's
// lock: every Copy must be done before anything changes the store (its
// owner serialises that). Not thread-safe: one thread copies.
class RowGather {
 public:
  // Row i of `states` (contiguous host, [n, ...], `row_bytes` per row) is to
  // get the row_bytes at rows_at[i]; `keep` holds what the pointers point
  // into that the store does not (a read's own tensors).
  RowGather(at::Tensor states, std::vector<const uint8_t*> rows_at,
            int64_t row_bytes, std::vector<at::Tensor> keep);

  RowGather(const RowGather&) = delete;
  RowGather& operator=(const RowGather&) = delete;

  // Rows of the result.
  int64_t rows() const { return static_cast<int64_t>(rows_at_.size()); }
  int64_t row_bytes() const { return row_bytes_; }

  // Copies rows [begin, end) into the result; 0 <= begin <= end <= rows().
  void Copy(int64_t begin, int64_t end);

 private:
  at::Tensor states_;
  std::vector<const uint8_t*> rows_at_;
  int64_t row_bytes_;
  std::vector<at::Tensor> keep_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_ROW_GATHER_H_
