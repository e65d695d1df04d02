#include "store/row_index.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace deltastream {

RowIndex::RowIndex(UpdateMode mode, int64_t row_bytes)
    : mode_(mode), row_bytes_(mode == UpdateMode::kNone ? 0 : row_bytes) {}

void RowIndex::Fold(const int64_t* ids, const uint8_t* states, int64_t count) {
  // Reserving for the worst case would waste memory on skewed traffic, where
  // most IDs repeat; let the containers grow geometrically instead.
  for (int64_t i = 0; i < count; ++i) {
    auto [it, inserted] = slot_of_id_.try_emplace(ids[i], size());
    if (inserted) {
      ids_.push_back(ids[i]);
      if (row_bytes_ > 0) {
        const uint8_t* row = states + i * row_bytes_;
        states_.insert(states_.end(), row, row + row_bytes_);
      }
    } else if (mode_ == UpdateMode::kLast) {
      std::memcpy(states_.data() + it->second * row_bytes_,
                  states + i * row_bytes_, row_bytes_);
    }
  }
}

void RowIndex::Fold(const RowIndex& later) {
  Fold(later.ids_.data(), later.states_.data(), later.size());
}

int64_t RowIndex::bytes() const {
  // flat_hash_map stores one control byte and one slot per bucket.
  const int64_t index_bytes =
      static_cast<int64_t>(slot_of_id_.capacity()) *
      static_cast<int64_t>(sizeof(std::pair<int64_t, int64_t>) + 1);
  return static_cast<int64_t>(ids_.capacity() * sizeof(int64_t) +
                              states_.capacity()) +
         index_bytes;
}

UniqueRows RowIndex::ToUniqueRows(at::ScalarType state_dtype) const {
  const int64_t n = size();
  std::vector<std::pair<int64_t, int64_t>> order(n);  // (ID, slot)
  for (int64_t slot = 0; slot < n; ++slot) order[slot] = {ids_[slot], slot};
  std::sort(order.begin(), order.end());

  UniqueRows rows;
  rows.ids = at::empty({n}, at::kLong);
  int64_t* out_ids = rows.ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) out_ids[i] = order[i].first;
  if (row_bytes_ == 0) return rows;

  const int64_t element_size = c10::elementSize(state_dtype);
  rows.states = at::empty({n, row_bytes_ / element_size}, state_dtype);
  auto* out_states = static_cast<uint8_t*>(rows.states.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out_states + i * row_bytes_,
                states_.data() + order[i].second * row_bytes_, row_bytes_);
  }
  return rows;
}

}  // namespace deltastream
