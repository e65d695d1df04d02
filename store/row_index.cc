#include "store/row_index.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <utility>

namespace deltastream {
namespace {

// Own state blocks grow from kFirstBlockRows rows, doubling, to about 64 KiB:
// small tables stay small, large ones come from the allocator's heap (no fresh
// pages on every growth) and amortise the block pointer.
constexpr int64_t kStateBlockBytes = int64_t{1} << 16;
constexpr int64_t kFirstBlockRows = 16;

// The bitmap may span up to this many bits per row held (16 bytes per row, as
// much as a hash slot takes), and always the first 2^20 IDs (128 KiB).
constexpr int64_t kDenseBitsPerRow = 128;
constexpr int64_t kDenseFreeBits = int64_t{1} << 20;

// The slot array may span up to this many IDs per row held (16 bytes per row,
// as much as a hash slot takes), and always the first 2^20 IDs (4 MiB, the
// size of a table of 1M rows' index: 1/64 of its float32 rows of dim 64).
constexpr int64_t kDirectSlotsPerRow = 4;
constexpr int64_t kDirectFreeSlots = int64_t{1} << 20;

// Rows are copied this many rows ahead of where they are prefetched: the rows
// a read gathers lie spread over memory, so each copy would otherwise wait
// for its cache misses in turn.
constexpr int64_t kCopyPrefetchRows = 8;

// Slots are looked up this many IDs ahead of where they are prefetched: the
// slots of a large table miss the cache.
constexpr int64_t kSlotPrefetchIds = 16;
// The same, for loops that do little else per ID: they need to look further
// ahead to cover a miss to memory.
constexpr int64_t kTightPrefetchIds = 64;

void PrefetchRow(const uint8_t* row, int64_t row_bytes) {
  for (int64_t offset = 0; offset < row_bytes; offset += 64) {
    __builtin_prefetch(row + offset);
  }
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
      borrowed_(rows == Rows::kBorrowed),
      dense_(mode == UpdateMode::kNone),
      direct_(mode != UpdateMode::kNone),
      block_rows_(std::max<int64_t>(
          1, kStateBlockBytes / std::max<int64_t>(row_bytes_, 1))) {}

bool RowIndex::DenseCanHold(int64_t id) const {
  return id >= 0 &&
         id < std::max(kDenseFreeBits, kDenseBitsPerRow * (rows_ + 1));
}

void RowIndex::PrepareFor(const int64_t* ids, int64_t count) {
  if (!direct_ || count == 0) return;
  int64_t low = ids[0], high = ids[0];
  for (int64_t i = 1; i < count; ++i) {
    low = std::min(low, ids[i]);
    high = std::max(high, ids[i]);
  }
  // Counting the rows this fold may add keeps the density bound up to one
  // lookup's size.
  const int64_t rows_after = rows_ + count;
  if (low < 0 || rows_after >= std::numeric_limits<int32_t>::max() ||
      high >= std::max(kDirectFreeSlots, kDirectSlotsPerRow * rows_after)) {
    MakeHashed();
    return;
  }
  const int64_t covered = static_cast<int64_t>(held_bits_.size()) * 64;
  if (high < covered) return;
  // One resize to the next power of two that covers the IDs.
  int64_t slots = std::max<int64_t>(covered, 64);
  while (slots <= high) slots *= 2;
  held_bits_.resize(slots / 64, 0);
  if (mode_ == UpdateMode::kLast) {
    // Not value-initialised: the bitmap says which entries are set.
    std::unique_ptr<int32_t[]> grown(new int32_t[slots]);
    if (covered > 0) {
      std::memcpy(grown.get(), direct_slot_.get(), covered * sizeof(int32_t));
    }
    direct_slot_ = std::move(grown);
  }
}

inline int64_t RowIndex::SlotOf(int64_t id, bool& added) {
  if (direct_) {
    uint64_t& word = held_bits_[id >> 6];
    const uint64_t bit = uint64_t{1} << (id & 63);
    added = (word & bit) == 0;
    if (!added) {  // kFirst needs no slot of a known ID
      return mode_ == UpdateMode::kLast ? direct_slot_[id] : -1;
    }
    word |= bit;
    if (mode_ == UpdateMode::kLast) {
      direct_slot_[id] = static_cast<int32_t>(rows_);
    }
  } else {
    auto [it, inserted] = slot_of_id_.try_emplace(id, rows_);
    added = inserted;
    if (!added) return it->second;
  }
  ids_.push_back(id);
  return rows_++;
}

void RowIndex::MarkIfSparse(int32_t holder) {
  Holder& h = holders_[holder];
  if (h.kept == 0) {
    emptied_.push_back(holder);
  } else if (!h.sparse && h.kept * kHeldFraction < h.rows) {
    h.sparse = true;
    sparse_bytes_ += h.rows * row_bytes_;
  }
}

void RowIndex::DropRow(int64_t slot) {
  const int32_t old = holder_of_[slot];
  if (old == kOwnRow) {
    free_rows_.push_back(const_cast<uint8_t*>(row_of_[slot]));
    return;
  }
  --holders_[old].kept;
  MarkIfSparse(old);
}

uint8_t* RowIndex::NewOwnRow() {
  if (!free_rows_.empty()) {
    uint8_t* row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if (blocks_.empty() || last_block_used_ == last_block_rows_) {
    last_block_rows_ =
        std::max(kFirstBlockRows, std::min(block_rows_, 2 * last_block_rows_));
    // Not value-initialised: every row is written before it is read.
    blocks_.emplace_back(new uint8_t[last_block_rows_ * row_bytes_]);
    own_rows_capacity_ += last_block_rows_;
    last_block_used_ = 0;
  }
  return blocks_.back().get() + (last_block_used_++) * row_bytes_;
}

void RowIndex::MoveToOwn(int64_t slot) {
  uint8_t* own = NewOwnRow();
  std::memcpy(own, row_of_[slot], row_bytes_);
  row_of_[slot] = own;
  holder_of_[slot] = kOwnRow;
}

void RowIndex::Release(Holder& h) {
  if (!h.states.defined()) return;
  if (h.sparse) sparse_bytes_ -= h.rows * row_bytes_;
  held_bytes_ -= h.rows * row_bytes_;
  --held_count_;
  h.states = at::Tensor();
  h.sparse = false;
}

void RowIndex::Settle() {
  for (int32_t holder : emptied_) {
    if (holders_[holder].kept == 0) Release(holders_[holder]);
  }
  emptied_.clear();
  // Each sweep releases at least half the kept rows' bytes of recorded
  // states, so sweeping costs time in proportion to the states recorded.
  if (2 * sparse_bytes_ > rows_ * row_bytes_) Sweep(/*all=*/false);
}

void RowIndex::Sweep(bool all) {
  // Holders that stay get new, dense numbers.
  std::vector<int32_t> renumbered(holders_.size(), kOwnRow);
  std::vector<Holder> staying;
  for (size_t h = 0; h < holders_.size(); ++h) {
    if (holders_[h].states.defined() && !all && !holders_[h].sparse) {
      renumbered[h] = static_cast<int32_t>(staying.size());
      staying.push_back(std::move(holders_[h]));
    }
  }
  for (int64_t slot = 0; slot < rows_; ++slot) {
    const int32_t holder = holder_of_[slot];
    if (holder == kOwnRow) continue;
    if (renumbered[holder] == kOwnRow) {
      MoveToOwn(slot);
    } else {
      holder_of_[slot] = renumbered[holder];
    }
  }
  holders_ = std::move(staying);
  held_count_ = static_cast<int64_t>(holders_.size());
  held_bytes_ = 0;
  for (const Holder& h : holders_) held_bytes_ += h.rows * row_bytes_;
  sparse_bytes_ = 0;
  emptied_.clear();
}

void RowIndex::ReleaseHeld() {
  if (holds() && held_count_ > 0) Sweep(/*all=*/true);
}

void RowIndex::FoldRows(const int64_t* ids, const uint8_t* states,
                        int64_t count, int32_t holder) {
  PrepareFor(ids, count);
  const bool holds = this->holds();
  if (direct_ && mode_ == UpdateMode::kFirst && row_bytes_ > 0) {
    const int64_t rows_before = rows_;
    // Most IDs are known and keep their state: a bit test each, and no slot
    // (ToUniqueRows ranks IDs in the bitmap).
    for (int64_t i = 0; i < count; ++i) {
      if (i + kTightPrefetchIds < count) {
        __builtin_prefetch(&held_bits_[ids[i + kTightPrefetchIds] >> 6]);
      }
      const int64_t id = ids[i];
      uint64_t& word = held_bits_[id >> 6];
      const uint64_t bit = uint64_t{1} << (id & 63);
      if ((word & bit) != 0) continue;
      word |= bit;
      ids_.push_back(id);
      ++rows_;
      row_of_.push_back(states + i * row_bytes_);
      if (holds) holder_of_.push_back(holder);
    }
    if (holds) holders_[holder].kept += rows_ - rows_before;
    return;
  }
  if (direct_ && mode_ == UpdateMode::kLast && row_bytes_ > 0) {
    // Known IDs are repointed: first every ID's slot, in a tight loop of
    // prefetched loads from the slot array (which misses the cache), then
    // the repointing, prefetching each slot's row and holder.
    fold_slots_.resize(count);
    for (int64_t i = 0; i < count; ++i) {
      if (i + kTightPrefetchIds < count) {
        __builtin_prefetch(&direct_slot_[ids[i + kTightPrefetchIds]]);
      }
      const int64_t id = ids[i];
      fold_slots_[i] =
          (held_bits_[id >> 6] >> (id & 63)) & 1 ? direct_slot_[id] : -1;
    }
    for (int64_t i = 0; i < count; ++i) {
      if (i + kSlotPrefetchIds < count &&
          fold_slots_[i + kSlotPrefetchIds] >= 0) {
        const int64_t ahead = fold_slots_[i + kSlotPrefetchIds];
        __builtin_prefetch(&row_of_[ahead]);
        if (holds) __builtin_prefetch(&holder_of_[ahead]);
      }
      const uint8_t* row = states + i * row_bytes_;
      int64_t slot = fold_slots_[i];
      if (slot < 0) {  // new to the index, unless earlier in this lookup
        bool added;
        slot = SlotOf(ids[i], added);
        if (added) {
          row_of_.push_back(row);
          if (holds) {
            holder_of_.push_back(holder);
            ++holders_[holder].kept;
          }
          continue;
        }
      }
      if (holds && holder_of_[slot] != holder) {
        DropRow(slot);
        holder_of_[slot] = holder;
        ++holders_[holder].kept;
        touched_.push_back(slot);
      }
      row_of_[slot] = row;
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    if (i + kSlotPrefetchIds < count) {
      const int64_t ahead = ids[i + kSlotPrefetchIds];
      if (direct_) {
        __builtin_prefetch(&held_bits_[ahead >> 6]);
      } else {
        slot_of_id_.prefetch(ahead);
      }
    }
    bool added;
    const int64_t slot = SlotOf(ids[i], added);
    if (row_bytes_ == 0) continue;
    const uint8_t* row = states + i * row_bytes_;
    if (added) {
      row_of_.push_back(row);
      if (holds) {
        holder_of_.push_back(holder);
        ++holders_[holder].kept;
      }
    } else if (mode_ == UpdateMode::kLast) {
      if (holds && holder_of_[slot] != holder) {
        DropRow(slot);
        holder_of_[slot] = holder;
        ++holders_[holder].kept;
        touched_.push_back(slot);
      }
      row_of_[slot] = row;
    }
  }
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

void RowIndex::MakeHashed() {
  if (!direct_) return;
  slot_of_id_.reserve(rows_);
  for (int64_t slot = 0; slot < rows_; ++slot) {
    slot_of_id_.emplace(ids_[slot], slot);
  }
  direct_ = false;
  direct_slot_.reset();
  std::vector<uint64_t>().swap(held_bits_);
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

void RowIndex::FoldIds(const int64_t* ids, int64_t count) {
  int64_t start = 0;
  if (dense_) {
    start = FoldDense(ids, 0, count);
    if (start == count) return;
    MakeSparse();
  }
  FoldRows(ids + start, nullptr, count - start, kOwnRow);
}

void RowIndex::Fold(const at::Tensor& ids, const at::Tensor& states) {
  const int64_t count = ids.numel();
  if (count == 0) return;
  const int64_t* id_data = ids.data_ptr<int64_t>();
  if (row_bytes_ == 0) return FoldIds(id_data, count);
  const auto* rows = static_cast<const uint8_t*>(states.data_ptr());
  if (!holds()) return FoldRows(id_data, rows, count, kOwnRow);

  const auto holder = static_cast<int32_t>(holders_.size());
  holders_.push_back({states, count, 0, false});
  ++held_count_;
  held_bytes_ += count * row_bytes_;
  const int64_t before = rows_;
  FoldRows(id_data, rows, count, holder);
  Holder& h = holders_[holder];
  if (h.kept * kHeldFraction < h.rows) {
    // Too few kept rows to hold the tensor for: copy them now. They are the
    // new slots and, in kLast, the ones repointed here.
    for (int64_t slot = before; slot < rows_; ++slot) MoveToOwn(slot);
    for (int64_t slot : touched_) {
      if (holder_of_[slot] == holder) MoveToOwn(slot);
    }
    h.kept = 0;
    Release(h);
    holders_.pop_back();
  }
  touched_.clear();
  Settle();
}

void RowIndex::Fold(const RowIndex& later) {
  if (later.dense_) {
    std::vector<int64_t> ids;
    ids.reserve(later.size());
    later.ForEachId([&ids](int64_t id) { ids.push_back(id); });
    return FoldIds(ids.data(), static_cast<int64_t>(ids.size()));
  }
  if (row_bytes_ == 0) return FoldIds(later.ids_.data(), later.size());
  // A borrowing index: point at `later`'s rows where they lie.
  PrepareFor(later.ids_.data(), later.size());
  for (int64_t s = 0; s < later.size(); ++s) {
    bool added;
    const int64_t slot = SlotOf(later.ids_[s], added);
    if (added) {
      row_of_.push_back(later.row_of_[s]);
    } else if (mode_ == UpdateMode::kLast) {
      row_of_[slot] = later.row_of_[s];
    }
  }
}

void RowIndex::Fold(RowIndex&& later) {
  if (!holds()) return Fold(static_cast<const RowIndex&>(later));
  // Take over what `later` holds: its holders (renumbered after ours) and
  // its own blocks (ahead of the one being filled).
  const auto offset = static_cast<int32_t>(holders_.size());
  for (Holder& h : later.holders_) holders_.push_back(std::move(h));
  held_count_ += later.held_count_;
  held_bytes_ += later.held_bytes_;
  sparse_bytes_ += later.sparse_bytes_;
  if (blocks_.empty()) {  // `later`'s last block is the one to fill
    blocks_ = std::move(later.blocks_);
    last_block_rows_ = later.last_block_rows_;
    last_block_used_ = later.last_block_used_;
  } else {  // ours stays last
    for (auto& block : later.blocks_) {
      blocks_.insert(blocks_.begin(), std::move(block));
    }
  }
  own_rows_capacity_ += later.own_rows_capacity_;
  free_rows_.insert(free_rows_.end(), later.free_rows_.begin(),
                    later.free_rows_.end());

  PrepareFor(later.ids_.data(), later.size());
  for (int64_t s = 0; s < later.size(); ++s) {
    const uint8_t* row = later.row_of_[s];
    const int32_t holder =
        later.holder_of_[s] == kOwnRow ? kOwnRow : later.holder_of_[s] + offset;
    bool added;
    const int64_t slot = SlotOf(later.ids_[s], added);
    if (added) {  // its holder counts it already
      row_of_.push_back(row);
      holder_of_.push_back(holder);
    } else if (mode_ == UpdateMode::kFirst) {  // ours stays, `later`'s goes
      if (holder == kOwnRow) {
        free_rows_.push_back(const_cast<uint8_t*>(row));
      } else {
        --holders_[holder].kept;
        MarkIfSparse(holder);
      }
    } else {  // kLast: `later`'s replaces ours
      DropRow(slot);
      row_of_[slot] = row;
      holder_of_[slot] = holder;
    }
  }
  later.Clear();
  Settle();
}

void RowIndex::Clear() {
  rows_ = 0;
  std::vector<uint64_t>().swap(id_bits_);
  direct_slot_.reset();
  std::vector<uint64_t>().swap(held_bits_);
  slot_of_id_.clear();
  std::vector<int64_t>().swap(ids_);
  std::vector<const uint8_t*>().swap(row_of_);
  std::vector<int32_t>().swap(holder_of_);
  std::vector<Holder>().swap(holders_);
  held_count_ = held_bytes_ = sparse_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>>().swap(blocks_);
  own_rows_capacity_ = last_block_used_ = last_block_rows_ = 0;
  std::vector<uint8_t*>().swap(free_rows_);
}

int64_t RowIndex::bytes() const {
  if (dense_)
    return static_cast<int64_t>(id_bits_.capacity() * sizeof(uint64_t));
  // flat_hash_map stores one control byte and one slot per bucket.
  const int64_t index_bytes =
      static_cast<int64_t>(slot_of_id_.capacity()) *
          static_cast<int64_t>(sizeof(std::pair<int64_t, int64_t>) + 1) +
      static_cast<int64_t>(
          (direct_slot_ ? held_bits_.size() * 64 * sizeof(int32_t) : 0) +
          held_bits_.capacity() * sizeof(uint64_t));
  const int64_t slot_bytes =
      static_cast<int64_t>(ids_.capacity() * sizeof(int64_t) +
                           row_of_.capacity() * sizeof(const uint8_t*) +
                           holder_of_.capacity() * sizeof(int32_t) +
                           holders_.capacity() * sizeof(Holder) +
                           free_rows_.capacity() * sizeof(uint8_t*) +
                           touched_.capacity() * sizeof(int64_t) +
                           fold_slots_.capacity() * sizeof(int32_t));
  return index_bytes + slot_bytes + own_rows_capacity_ * row_bytes_ +
         held_bytes_;
}

UniqueRows RowIndex::ToUniqueRows(at::ScalarType state_dtype) const {
  const int64_t n = size();
  UniqueRows rows;
  rows.ids = at::empty({n}, at::kLong);
  int64_t* out_ids = rows.ids.data_ptr<int64_t>();
  if (dense_) {  // the bitmap is already in ID order
    ForEachId([&out_ids](int64_t id) { *out_ids++ = id; });
    return rows;
  }
  std::vector<std::pair<int64_t, int64_t>> order;  // (ID, slot)
  if (direct_) {
    // An ID's place is its rank in the bitmap: the IDs held below it.
    const std::vector<uint64_t>* bits = &held_bits_;
    std::vector<int32_t> rank(bits->size());
    int32_t below = 0;
    for (size_t w = 0; w < bits->size(); ++w) {
      rank[w] = below;
      below += __builtin_popcountll((*bits)[w]);
    }
    order.resize(n);
    for (int64_t slot = 0; slot < n; ++slot) {
      const int64_t id = ids_[slot];
      const uint64_t lower = (uint64_t{1} << (id & 63)) - 1;
      order[rank[id >> 6] + __builtin_popcountll((*bits)[id >> 6] & lower)] = {
          id, slot};
    }
  } else {
    order.reserve(n);
    for (int64_t slot = 0; slot < n; ++slot) {
      order.emplace_back(ids_[slot], slot);
    }
    SortById(order);
  }
  for (int64_t i = 0; i < n; ++i) out_ids[i] = order[i].first;
  if (row_bytes_ == 0) return rows;

  const int64_t element_size = c10::elementSize(state_dtype);
  rows.states = at::empty({n, row_bytes_ / element_size}, state_dtype);
  auto* out = static_cast<uint8_t*>(rows.states.data_ptr());
  // Two stages of prefetching: the row pointers (slots come in ID order, so
  // at random), then the rows they point at.
  for (int64_t i = 0; i < n; ++i) {
    if (i + kSlotPrefetchIds < n) {
      __builtin_prefetch(&row_of_[order[i + kSlotPrefetchIds].second]);
    }
    if (i + kCopyPrefetchRows < n) {
      PrefetchRow(row_of_[order[i + kCopyPrefetchRows].second], row_bytes_);
    }
    std::memcpy(out + i * row_bytes_, row_of_[order[i].second], row_bytes_);
  }
  return rows;
}

}  // namespace deltastream
