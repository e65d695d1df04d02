#include "store/row_index.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <utility>

namespace deltastream {
namespace {

// State blocks of about 64 KiB: small enough to come from the allocator's heap
// (no fresh pages on every growth), large enough to amortise the pointer.
constexpr int64_t kStateBlockBytes = int64_t{1} << 16;
constexpr int64_t kFirstBlockMinRows = 16;

// The bitmap may span up to this many bits per row held (16 bytes per row, as
// much as a hash slot takes), and always the first 2^20 IDs (128 KiB).
constexpr int64_t kDenseBitsPerRow = 128;
constexpr int64_t kDenseFreeBits = int64_t{1} << 20;

// The slot array may span up to this many IDs per row held (16 bytes per row,
// as much as a hash slot takes), and always the first 2^20 IDs (4 MiB, the
// size of a table of 1M rows' index: 1/64 of its float32 rows of dim 64).
constexpr int64_t kDirectSlotsPerRow = 4;
constexpr int64_t kDirectFreeSlots = int64_t{1} << 20;

// Rows are copied this many rows ahead of where they are prefetched: row
// copies of a fold or a read land on rows spread over memory, so each one
// would otherwise wait for its cache misses in turn.
constexpr int64_t kCopyPrefetchRows = 8;

void PrefetchRow(const uint8_t* row, int64_t row_bytes) {
  for (int64_t offset = 0; offset < row_bytes; offset += 64) {
    __builtin_prefetch(row + offset);
  }
}

// Copies `n` rows of `row_bytes`: row k from source(k) to dest(k), prefetching
// the source rows kCopyPrefetchRows ahead.
template <typename Source, typename Dest>
void CopyRows(int64_t n, int64_t row_bytes, Source&& source, Dest&& dest) {
  for (int64_t k = 0; k < n; ++k) {
    if (k + kCopyPrefetchRows < n) {
      PrefetchRow(source(k + kCopyPrefetchRows), row_bytes);
    }
    std::memcpy(dest(k), source(k), row_bytes);
  }
}

int BlockShift(int64_t row_bytes) {
  int shift = 0;
  while (row_bytes > 0 && (row_bytes << (shift + 1)) <= kStateBlockBytes) {
    ++shift;
  }
  return shift;
}

// Sorts (ID, slot) pairs by ID with an LSD radix sort over the bytes in which
// the IDs differ: row IDs seldom use all 64 bits, so this takes a few linear
// passes where a comparison sort takes log n.
void SortById(std::vector<std::pair<int64_t, int64_t>>& items) {
  if (items.size() < 2) return;
  uint64_t differing = 0;
  const uint64_t first = static_cast<uint64_t>(items[0].first);
  for (const auto& item : items) {
    differing |= static_cast<uint64_t>(item.first) ^ first;
  }
  std::vector<std::pair<int64_t, int64_t>> buffer(items.size());
  for (int byte = 0; byte < 8; ++byte) {
    const int shift = 8 * byte;
    if (((differing >> shift) & 0xff) == 0) continue;
    // Flipping the sign bit orders negative IDs before positive ones.
    auto digit = [shift](int64_t id) {
      return static_cast<size_t>(
          ((static_cast<uint64_t>(id) ^ (uint64_t{1} << 63)) >> shift) & 0xff);
    };
    std::array<size_t, 257> start{};
    for (const auto& item : items) ++start[digit(item.first) + 1];
    for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
    for (const auto& item : items) buffer[start[digit(item.first)]++] = item;
    items.swap(buffer);
  }
}

}  // namespace

RowIndex::RowIndex(UpdateMode mode, int64_t row_bytes, Rows rows)
    : mode_(mode),
      row_bytes_(mode == UpdateMode::kNone ? 0 : row_bytes),
      dense_(mode == UpdateMode::kNone),
      direct_(mode != UpdateMode::kNone),
      block_shift_(BlockShift(row_bytes_)),
      borrowed_(rows == Rows::kBorrowed && row_bytes_ > 0) {}

bool RowIndex::DenseCanHold(int64_t id) const {
  return id >= 0 &&
         id < std::max(kDenseFreeBits, kDenseBitsPerRow * (rows_ + 1));
}

bool RowIndex::DirectCanHold(int64_t id) const {
  return id >= 0 && rows_ < std::numeric_limits<int32_t>::max() &&
         id < std::max(kDirectFreeSlots, kDirectSlotsPerRow * (rows_ + 1));
}

int64_t RowIndex::Append(int64_t id) {
  if (borrowed_) {
    borrowed_rows_.push_back(nullptr);
  } else if (row_bytes_ > 0) {
    GrowStates();
  }
  ids_.push_back(id);
  return rows_++;
}

void RowIndex::CopyPending(const uint8_t* states) {
  if (borrowed_) {
    for (const auto& [slot, row] : pending_) {
      borrowed_rows_[slot] = states + row * row_bytes_;
    }
    std::vector<std::pair<int64_t, int64_t>>().swap(pending_);
    return;
  }
  if (mode_ == UpdateMode::kLast && !pending_.empty()) {
    // A row looked up several times in one fold is copied once, from its last
    // occurrence: walk backwards, keep each slot's first sighting.
    ++folds_;
    if (folds_ == 0) {  // the stamps wrapped around: forget them all
      std::fill(fold_of_slot_.begin(), fold_of_slot_.end(), 0);
      folds_ = 1;
    }
    fold_of_slot_.resize(rows_, 0);
    auto kept = pending_.end();
    for (auto it = pending_.end(); it != pending_.begin();) {
      --it;
      uint32_t& stamp = fold_of_slot_[it->first];
      if (stamp == folds_) continue;
      stamp = folds_;
      *--kept = *it;
    }
    pending_.erase(pending_.begin(), kept);
  }
  if (row_bytes_ > 0) {
    CopyRows(
        static_cast<int64_t>(pending_.size()), row_bytes_,
        [&](int64_t k) { return states + pending_[k].second * row_bytes_; },
        [&](int64_t k) { return OwnedRow(pending_[k].first); });
  }
  // Scratch only: the memory held stays what bytes() counts.
  std::vector<std::pair<int64_t, int64_t>>().swap(pending_);
}

int64_t RowIndex::FoldDirect(const int64_t* ids, int64_t from, int64_t count) {
  // The slots of a large table miss the cache: prefetch them ahead.
  constexpr int64_t kPrefetchDistance = 16;
  for (int64_t i = from; i < count; ++i) {
    if (i + kPrefetchDistance < count &&
        static_cast<uint64_t>(ids[i + kPrefetchDistance]) <
            direct_slot_.size()) {
      __builtin_prefetch(&direct_slot_[ids[i + kPrefetchDistance]]);
    }
    const int64_t id = ids[i];
    if (static_cast<uint64_t>(id) >= direct_slot_.size()) {
      if (!DirectCanHold(id)) return i;
      // Grow to the next power of two that covers the ID.
      int64_t slots = std::max<int64_t>(direct_slot_.size(), 64);
      while (slots <= id) slots *= 2;
      direct_slot_.resize(slots, 0);
    }
    int32_t& slot = direct_slot_[id];
    if (slot == 0) {
      const int64_t added = Append(id);
      slot = static_cast<int32_t>(added + 1);
      pending_.emplace_back(added, i);
    } else if (mode_ == UpdateMode::kLast) {
      pending_.emplace_back(slot - 1, i);
    }
  }
  return count;
}

void RowIndex::MakeHashed() {
  slot_of_id_.reserve(rows_);
  for (int64_t slot = 0; slot < rows_; ++slot) {
    slot_of_id_.emplace(ids_[slot], slot);
  }
  direct_ = false;
  std::vector<int32_t>().swap(direct_slot_);
}

int64_t RowIndex::FoldDense(const int64_t* ids, int64_t from, int64_t count) {
  const int64_t covered = static_cast<int64_t>(id_bits_.size()) * 64;
  for (int64_t i = from; i < count; ++i) {
    const int64_t id = ids[i];
    if (static_cast<uint64_t>(id) >= static_cast<uint64_t>(covered)) {
      if (!DenseCanHold(id)) return i;
      // Grow to the next power of two that covers the ID.
      int64_t bits = std::max<int64_t>(covered, 1024);
      while (bits <= id) bits *= 2;
      id_bits_.resize(bits / 64, 0);
      return FoldDense(ids, i, count);
    }
    uint64_t& word = id_bits_[id >> 6];
    const uint64_t bit = uint64_t{1} << (id & 63);
    rows_ += (word & bit) == 0;
    word |= bit;
  }
  return count;
}

void RowIndex::MakeSparse() {
  ids_.reserve(rows_);
  slot_of_id_.reserve(rows_);
  ForEachId([this](int64_t id) {
    slot_of_id_.emplace(id, static_cast<int64_t>(ids_.size()));
    ids_.push_back(id);
  });
  dense_ = false;
  std::vector<uint64_t>().swap(id_bits_);
}

template <typename F>
void RowIndex::ForEachId(F&& f) const {
  if (!dense_) {
    for (int64_t id : ids_) f(id);
    return;
  }
  for (size_t w = 0; w < id_bits_.size(); ++w) {
    for (uint64_t word = id_bits_[w]; word != 0; word &= word - 1) {
      f(static_cast<int64_t>(w * 64 + __builtin_ctzll(word)));
    }
  }
}

void RowIndex::GrowStates() {
  const int64_t rows_per_block = int64_t{1} << block_shift_;
  if (size() < first_block_rows_) return;
  if (size() < rows_per_block) {
    // The first block grows geometrically up to full size, so small tables
    // stay small; its rows move, which is cheap below one block.
    const int64_t rows = std::min(
        rows_per_block, std::max(kFirstBlockMinRows, 2 * first_block_rows_));
    // Not value-initialised: every row is written before it is read.
    std::unique_ptr<uint8_t[]> grown(new uint8_t[rows * row_bytes_]);
    if (!state_blocks_.empty()) {
      std::memcpy(grown.get(), state_blocks_[0].get(), size() * row_bytes_);
      state_blocks_[0] = std::move(grown);
    } else {
      state_blocks_.push_back(std::move(grown));
    }
    first_block_rows_ = rows;
    return;
  }
  if ((size() >> block_shift_) < static_cast<int64_t>(state_blocks_.size())) {
    return;
  }
  state_blocks_.emplace_back(new uint8_t[rows_per_block * row_bytes_]);
}

void RowIndex::Fold(const int64_t* ids, const uint8_t* states, int64_t count) {
  // First the slots of all IDs (the rows to copy go to pending_), then the
  // copies, prefetched: only new rows in kFirst, every row in kLast.
  int64_t start = 0;
  if (dense_) {
    start = FoldDense(ids, 0, count);
    if (start == count) return;
    MakeSparse();
  } else if (direct_) {
    start = FoldDirect(ids, 0, count);
    if (start == count) return CopyPending(states);
    MakeHashed();
  }
  // Hash probes miss the cache once the index outgrows it; prefetching the
  // slot of an ID a few positions ahead overlaps those misses.
  constexpr int64_t kPrefetchDistance = 8;
  for (int64_t i = start; i < count; ++i) {
    if (i + kPrefetchDistance < count) {
      slot_of_id_.prefetch(ids[i + kPrefetchDistance]);
    }
    auto [it, inserted] = slot_of_id_.try_emplace(ids[i], size());
    if (inserted) {
      const int64_t added = Append(ids[i]);
      if (row_bytes_ > 0) pending_.emplace_back(added, i);
    } else if (mode_ == UpdateMode::kLast) {
      pending_.emplace_back(it->second, i);
    }
  }
  CopyPending(states);
}

void RowIndex::Fold(const RowIndex& later) {
  if (later.dense_) {
    std::vector<int64_t> ids;
    ids.reserve(later.size());
    later.ForEachId([&ids](int64_t id) { ids.push_back(id); });
    Fold(ids.data(), nullptr, static_cast<int64_t>(ids.size()));
    return;
  }
  if (later.borrowed_) {  // rows anywhere: one at a time
    for (int64_t slot = 0; slot < later.size(); ++slot) {
      Fold(&later.ids_[slot], later.StateRow(slot), 1);
    }
    return;
  }
  // Rows of one state block are contiguous: fold a block at a time, so the
  // hash probes keep their prefetching.
  const int64_t rows_per_block =
      row_bytes_ > 0 ? int64_t{1} << later.block_shift_ : later.size();
  for (int64_t slot = 0; slot < later.size(); slot += rows_per_block) {
    Fold(&later.ids_[slot], row_bytes_ > 0 ? later.StateRow(slot) : nullptr,
         std::min(rows_per_block, later.size() - slot));
  }
}

int64_t RowIndex::bytes() const {
  if (dense_)
    return static_cast<int64_t>(id_bits_.capacity() * sizeof(uint64_t));
  // flat_hash_map stores one control byte and one slot per bucket.
  const int64_t index_bytes =
      static_cast<int64_t>(slot_of_id_.capacity()) *
          static_cast<int64_t>(sizeof(std::pair<int64_t, int64_t>) + 1) +
      static_cast<int64_t>(direct_slot_.capacity() * sizeof(int32_t));
  const int64_t full_blocks =
      std::max<int64_t>(0, static_cast<int64_t>(state_blocks_.size()) - 1);
  const int64_t state_bytes =
      (first_block_rows_ + full_blocks * (int64_t{1} << block_shift_)) *
      row_bytes_;
  return static_cast<int64_t>(ids_.capacity() * sizeof(int64_t) +
                              fold_of_slot_.capacity() * sizeof(uint32_t) +
                              borrowed_rows_.capacity() *
                                  sizeof(borrowed_rows_[0])) +
         state_bytes + index_bytes;
}

UniqueRows RowIndex::ToUniqueRows(at::ScalarType state_dtype) const {
  const int64_t n = size();
  if (dense_) {  // the bitmap is already in ID order
    UniqueRows rows;
    rows.ids = at::empty({n}, at::kLong);
    int64_t* out = rows.ids.data_ptr<int64_t>();
    ForEachId([&out](int64_t id) { *out++ = id; });
    return rows;
  }
  std::vector<std::pair<int64_t, int64_t>> order;  // (ID, slot)
  order.reserve(n);
  // The slot array is in ID order; scanning it beats sorting unless it is
  // sparse (IDs spread over a large table).
  constexpr int64_t kScanSlotsPerRow = 16;
  if (direct_ && static_cast<int64_t>(direct_slot_.size()) <=
                     kScanSlotsPerRow * std::max<int64_t>(n, 1)) {
    for (size_t id = 0; id < direct_slot_.size(); ++id) {
      if (direct_slot_[id] != 0) {
        order.emplace_back(static_cast<int64_t>(id), direct_slot_[id] - 1);
      }
    }
  } else {
    for (int64_t slot = 0; slot < n; ++slot)
      order.emplace_back(ids_[slot], slot);
    SortById(order);
  }

  UniqueRows rows;
  rows.ids = at::empty({n}, at::kLong);
  int64_t* out_ids = rows.ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) out_ids[i] = order[i].first;
  if (row_bytes_ == 0) return rows;

  const int64_t element_size = c10::elementSize(state_dtype);
  rows.states = at::empty({n, row_bytes_ / element_size}, state_dtype);
  auto* out_states = static_cast<uint8_t*>(rows.states.data_ptr());
  CopyRows(
      n, row_bytes_, [&](int64_t i) { return StateRow(order[i].second); },
      [&](int64_t i) { return out_states + i * row_bytes_; });
  return rows;
}

}  // namespace deltastream
