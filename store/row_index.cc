#include "store/row_index.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "store/row_gather.h"

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

// Hash slots are looked up this many IDs ahead of where they are prefetched:
// the slots of a large table miss the cache.
constexpr int64_t kSlotPrefetchIds = 16;
// The same, for loops that do little else per ID: they need to look further
// ahead to cover a miss.
constexpr int64_t kTightPrefetchIds = 64;
// IDs read in order are fetched this many ahead (1 KiB: 16 lines).
constexpr int64_t kRunPrefetchIds = 128;
// A bitmap up to this size is taken to stay in a core's cache (L2) while a
// lookup is folded, so its words are not prefetched.
constexpr int64_t kCachedBitmapBytes = int64_t{1} << 20;

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

#if defined(__x86_64__) && !defined(__POPCNT__)
// Whether the CPU has the popcnt instruction (every x86-64 CPU since about
// 2008 does, but the build targets them all).
const bool kCpuHasPopcnt = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("popcnt") != 0;
}();
#endif

// Bits set in `word`. Without -mpopcnt (the build targets every x86-64 CPU)
// __builtin_popcountll is a call into libgcc's table lookup: this uses the
// popcnt instruction where the CPU has one (a predictable branch), else a few
// inline instructions. Reads rank every ID they place (last mode: every ID
// recorded), where popcnt saves about 1 ms in 983k.
inline int64_t PopCount(uint64_t word) {
#if defined(__POPCNT__) || !defined(__x86_64__)
  return __builtin_popcountll(word);
#else
  if (kCpuHasPopcnt) {
    uint64_t count;
    asm("popcnt %1, %0" : "=r"(count) : "r"(word) : "cc");
    return static_cast<int64_t>(count);
  }
  word -= (word >> 1) & 0x5555555555555555ULL;
  word = (word & 0x3333333333333333ULL) + ((word >> 2) & 0x3333333333333333ULL);
  word = (word + (word >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return static_cast<int64_t>((word * 0x0101010101010101ULL) >> 56);
#endif
}

// The place of `id` among the IDs of a bitmap whose words have IDs `rank`
// below them: the IDs held below it.
inline int64_t RankOf(const std::vector<int32_t>& rank, const uint64_t* bits,
                      int64_t id) {
  const uint64_t lower = (uint64_t{1} << (id & 63)) - 1;
  return rank[id >> 6] + PopCount(bits[id >> 6] & lower);
}

const uint8_t* NoRow(int64_t) { return nullptr; }

}  // namespace

RowIndex::RowIndex(UpdateMode mode, int64_t row_bytes, Rows rows)
    : mode_(mode),
      row_bytes_(mode == UpdateMode::kNone ? 0 : row_bytes),
      borrowed_(rows == Rows::kBorrowed),
      dense_(mode == UpdateMode::kNone),
      direct_(mode != UpdateMode::kNone),
      block_rows_(std::max<int64_t>(
          1, kStateBlockBytes / std::max<int64_t>(row_bytes_, 1))) {}

bool RowIndex::DenseCanHold(int64_t id, int64_t rows) const {
  return id >= 0 &&
         id < std::max(kDenseFreeBits, kDenseBitsPerRow * (rows + 1));
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
      !DenseCanHold(high, rows_after)) {
    MakeHashed();
    return;
  }
  const int64_t covered = static_cast<int64_t>(held_bits_.size()) * 64;
  if (high < covered) return;
  // One resize to the next power of two that covers the IDs.
  int64_t bits = std::max<int64_t>(covered, 1024);
  while (bits <= high) bits *= 2;
  held_bits_.resize(bits / 64, 0);
}

inline int64_t RowIndex::SlotOf(int64_t id, bool& added) {
  if (direct_) {
    uint64_t& word = held_bits_[id >> 6];
    const uint64_t bit = uint64_t{1} << (id & 63);
    added = (word & bit) == 0;
    if (!added) return -1;
    word |= bit;
  } else {
    auto [it, inserted] = slot_of_id_.try_emplace(id, rows_);
    added = inserted;
    if (!added) return it->second;
  }
  ids_.push_back(id);
  return rows_++;
}

template <typename RowAt>
int64_t RowIndex::AddNewIds(const int64_t* ids, int64_t count, RowAt row_at) {
  const int64_t before = rows_;
  const bool with_rows = row_bytes_ > 0;
  int64_t i = 0;
  while (direct_ && i < count) {
    // Most IDs are known: a bit test each, and no branch: every ID is
    // written past the slots held, and only a new one advances the end.
    const int64_t held = rows_;
    ids_.resize(held + count - i);
    if (with_rows) row_of_.resize(held + count - i);
    int64_t* out_ids = ids_.data() + held;
    const uint8_t** out_rows = with_rows ? row_of_.data() + held : nullptr;
    uint64_t* bits = held_bits_.data();
    const uint64_t covered = held_bits_.size() * 64;
    int64_t added = 0;
    auto fold = [&](auto prefetch) {
      for (; i < count; ++i) {
        if (prefetch && i + kTightPrefetchIds < count) {
          const auto ahead = static_cast<uint64_t>(ids[i + kTightPrefetchIds]);
          if (ahead < covered) __builtin_prefetch(&bits[ahead >> 6]);
        }
        const int64_t id = ids[i];
        if (static_cast<uint64_t>(id) >= covered) break;
        uint64_t& word = bits[id >> 6];
        const uint64_t bit = uint64_t{1} << (id & 63);
        const int64_t is_new = (word & bit) == 0;
        word |= bit;
        out_ids[added] = id;
        if (with_rows) out_rows[added] = row_at(i);
        added += is_new;
      }
    };
    // A bitmap that fits the core's cache needs no prefetch.
    if (static_cast<int64_t>(covered / 8) > kCachedBitmapBytes) {
      fold(std::true_type());
    } else {
      fold(std::false_type());
    }
    rows_ += added;
    ids_.resize(rows_);
    if (with_rows) row_of_.resize(rows_);
    // An ID the bitmap does not cover: it grows, or the index turns hashed,
    // for the rest.
    if (i < count) PrepareFor(ids + i, count - i);
  }
  for (; i < count; ++i) {
    if (i + kSlotPrefetchIds < count) {
      slot_of_id_.prefetch(ids[i + kSlotPrefetchIds]);
    }
    bool added;
    SlotOf(ids[i], added);
    if (added && with_rows) row_of_.push_back(row_at(i));
  }
  return rows_ - before;
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
  if (mode_ == UpdateMode::kLast) {
    // Each settling copies the kept rows once after at least
    // kHeldFraction - 1 times their bytes were recorded.
    if (held_bytes_ + own_rows_capacity_ * row_bytes_ >
        kHeldFraction * rows_ * row_bytes_) {
      SettleRuns();
    }
    return;
  }
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

void RowIndex::SettleRuns() {
  if (runs_.empty()) return;
  std::vector<const uint8_t*> rows_at;
  KeptRows(rows_at);
  std::unique_ptr<uint8_t[]> block(
      new uint8_t[std::max<int64_t>(rows_, 1) * row_bytes_]);
  CopyRowsAt(rows_at, 0, rows_, row_bytes_, block.get());
  if (direct_) {  // rows_at is in ID order: so are the slots now
    int64_t slot = 0;
    ForEachHeld(held_bits_, [&](int64_t id) { ids_[slot++] = id; });
  }
  for (int64_t slot = 0; slot < rows_; ++slot) {
    row_of_[slot] = block.get() + slot * row_bytes_;
  }
  settled_rows_ = rows_;
  std::vector<Run>().swap(runs_);
  held_count_ = held_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>>().swap(blocks_);
  blocks_.push_back(std::move(block));
  own_rows_capacity_ = last_block_rows_ = last_block_used_ = rows_;
  std::vector<uint8_t*>().swap(free_rows_);
}

void RowIndex::ReleaseHeld() {
  if (!holds()) return;
  if (mode_ == UpdateMode::kLast) {
    SettleRuns();
  } else if (held_count_ > 0) {
    Sweep(/*all=*/true);
  }
}

void RowIndex::AddRun(Run run) {
  if (holds()) {
    held_bytes_ += static_cast<int64_t>(
        (run.ids_tensor.defined() ? run.ids_tensor.nbytes() : 0) +
        (run.states_tensor.defined() ? run.states_tensor.nbytes() : 0) +
        run.own_ids.capacity() * sizeof(int64_t) +
        run.own_rows.capacity() * sizeof(const uint8_t*));
    held_count_ += run.states_tensor.defined();
  }
  runs_.push_back(std::move(run));
}

int64_t RowIndex::FoldDense(const int64_t* ids, int64_t from, int64_t count) {
  const int64_t covered = static_cast<int64_t>(id_bits_.size()) * 64;
  for (int64_t i = from; i < count; ++i) {
    const int64_t id = ids[i];
    if (static_cast<uint64_t>(id) >= static_cast<uint64_t>(covered)) {
      if (!DenseCanHold(id, rows_)) return i;
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
  std::vector<uint64_t>().swap(held_bits_);
}

template <typename F>
void RowIndex::ForEachHeld(const std::vector<uint64_t>& bits, F&& f) {
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
      f(static_cast<int64_t>(w * 64 + __builtin_ctzll(word)));
    }
  }
}

template <typename F>
void RowIndex::ForEachId(F&& f) const {
  if (dense_) return ForEachHeld(id_bits_, f);
  for (int64_t id : ids_) f(id);
}

void RowIndex::FoldIds(const int64_t* ids, int64_t count) {
  int64_t start = 0;
  if (dense_) {
    start = FoldDense(ids, 0, count);
    if (start == count) return;
    MakeSparse();
  }
  AddNewIds(ids + start, count - start, NoRow);
}

void RowIndex::Fold(const at::Tensor& ids, const at::Tensor& states) {
  const int64_t count = ids.numel();
  if (count == 0) return;
  const int64_t* id_data = ids.data_ptr<int64_t>();
  if (row_bytes_ == 0) return FoldIds(id_data, count);
  const auto* rows = static_cast<const uint8_t*>(states.data_ptr());
  auto row_at = [rows, row_bytes = row_bytes_](int64_t i) {
    return rows + i * row_bytes;
  };
  if (mode_ == UpdateMode::kLast) {
    AddNewIds(id_data, count, NoRow);
    Run run;
    run.ids = id_data;
    run.count = count;
    run.states = rows;
    if (holds()) {
      run.ids_tensor = ids;
      run.states_tensor = states;
    }
    AddRun(std::move(run));
    if (holds()) Settle();
    return;
  }
  if (!holds()) {
    AddNewIds(id_data, count, row_at);
    return;
  }
  const auto holder = static_cast<int32_t>(holders_.size());
  holders_.push_back({states, count, 0, false});
  ++held_count_;
  held_bytes_ += count * row_bytes_;
  const int64_t before = rows_;
  Holder& h = holders_[holder];
  h.kept = AddNewIds(id_data, count, row_at);
  holder_of_.resize(rows_, holder);
  if (h.kept * kHeldFraction < h.rows) {
    // Too few kept rows to hold the tensor for: copy them now.
    for (int64_t slot = before; slot < rows_; ++slot) MoveToOwn(slot);
    h.kept = 0;
    Release(h);
    holders_.pop_back();
  }
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
  if (mode_ == UpdateMode::kFirst) {
    AddNewIds(later.ids_.data(), later.size(),
              [&later](int64_t slot) { return later.row_of_[slot]; });
    return;
  }
  AddNewIds(later.ids_.data(), later.size(), NoRow);
  if (later.settled_rows_ > 0) {
    Run settled;
    settled.ids = later.ids_.data();
    settled.count = later.settled_rows_;
    settled.rows = later.row_of_.data();
    AddRun(std::move(settled));
  }
  for (const Run& run : later.runs_) {
    Run borrowed;
    borrowed.ids = run.ids;
    borrowed.count = run.count;
    borrowed.states = run.states;
    borrowed.rows = run.rows;
    AddRun(std::move(borrowed));
  }
}

void RowIndex::Fold(RowIndex&& later) {
  if (!holds()) return Fold(static_cast<const RowIndex&>(later));
  // Take over `later`'s own blocks (ahead of the one being filled).
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

  if (mode_ == UpdateMode::kLast) {
    // `later`'s settled rows, then its runs, come after ours.
    AddNewIds(later.ids_.data(), later.size(), NoRow);
    if (later.settled_rows_ > 0) {
      Run settled;
      settled.own_ids = std::move(later.ids_);
      settled.own_ids.resize(later.settled_rows_);
      settled.own_rows = std::move(later.row_of_);
      settled.own_rows.resize(later.settled_rows_);
      settled.ids = settled.own_ids.data();
      settled.count = later.settled_rows_;
      settled.rows = settled.own_rows.data();
      AddRun(std::move(settled));
    }
    for (Run& run : later.runs_) AddRun(std::move(run));
    later.Clear();
    Settle();
    return;
  }

  // kFirst: take over `later`'s holders, renumbered after ours.
  PrepareFor(later.ids_.data(), later.size());
  const auto offset = static_cast<int32_t>(holders_.size());
  for (Holder& h : later.holders_) holders_.push_back(std::move(h));
  held_count_ += later.held_count_;
  held_bytes_ += later.held_bytes_;
  sparse_bytes_ += later.sparse_bytes_;
  for (int64_t s = 0; s < later.size(); ++s) {
    const uint8_t* row = later.row_of_[s];
    const int32_t holder =
        later.holder_of_[s] == kOwnRow ? kOwnRow : later.holder_of_[s] + offset;
    bool added;
    SlotOf(later.ids_[s], added);
    if (added) {  // its holder counts it already
      row_of_.push_back(row);
      holder_of_.push_back(holder);
    } else if (holder == kOwnRow) {  // ours stays, `later`'s goes
      free_rows_.push_back(const_cast<uint8_t*>(row));
    } else {
      --holders_[holder].kept;
      MarkIfSparse(holder);
    }
  }
  later.Clear();
  Settle();
}

void RowIndex::Clear() {
  rows_ = settled_rows_ = 0;
  std::vector<uint64_t>().swap(id_bits_);
  std::vector<uint64_t>().swap(held_bits_);
  slot_of_id_.clear();
  SlotVector<int64_t>().swap(ids_);
  SlotVector<const uint8_t*>().swap(row_of_);
  std::vector<int32_t>().swap(holder_of_);
  std::vector<Holder>().swap(holders_);
  std::vector<int32_t>().swap(emptied_);
  std::vector<Run>().swap(runs_);
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
      static_cast<int64_t>(held_bits_.capacity() * sizeof(uint64_t));
  const int64_t slot_bytes = static_cast<int64_t>(
      ids_.capacity() * sizeof(int64_t) +
      row_of_.capacity() * sizeof(const uint8_t*) +
      holder_of_.capacity() * sizeof(int32_t) +
      holders_.capacity() * sizeof(Holder) + runs_.capacity() * sizeof(Run) +
      free_rows_.capacity() * sizeof(uint8_t*));
  return index_bytes + slot_bytes + own_rows_capacity_ * row_bytes_ +
         held_bytes_;
}

std::vector<int32_t> RowIndex::WordRanks() const {
  std::vector<int32_t> rank(held_bits_.size());
  int32_t below = 0;
  for (size_t w = 0; w < held_bits_.size(); ++w) {
    rank[w] = below;
    below += static_cast<int32_t>(PopCount(held_bits_[w]));
  }
  return rank;
}

void RowIndex::KeptRows(std::vector<const uint8_t*>& rows_at) const {
  rows_at.resize(rows_);
  // Puts every row at its ID's position, in fold order: the last put of an
  // ID is its latest row.
  auto place = [&](auto put) {
    for (int64_t slot = 0; slot < settled_rows_; ++slot) {
      put(ids_[slot], row_of_[slot]);
    }
    for (const Run& run : runs_) {
      // A run's IDs are read in order from memory the caches have long
      // dropped (all recorded IDs, 8 MB at DESIGN.md's 30 batches): fetched
      // ahead, as the hardware only does once a stream is under way.
      auto place_run = [&](auto row_at) {
        for (int64_t i = 0; i < run.count; ++i) {
          if (i + kRunPrefetchIds < run.count) {
            __builtin_prefetch(run.ids + i + kRunPrefetchIds);
          }
          if (!direct_ && i + kSlotPrefetchIds < run.count) {
            slot_of_id_.prefetch(run.ids[i + kSlotPrefetchIds]);
          }
          put(run.ids[i], row_at(i));
        }
      };
      if (run.rows != nullptr) {
        place_run([&run](int64_t i) { return run.rows[i]; });
      } else {
        place_run(
            [&run, this](int64_t i) { return run.states + i * row_bytes_; });
      }
    }
  };
  if (!direct_) {
    place([&](int64_t id, const uint8_t* row) {
      rows_at[slot_of_id_.find(id)->second] = row;
    });
    return;
  }
  const std::vector<int32_t> rank = WordRanks();
  const uint64_t* bits = held_bits_.data();
  place([&](int64_t id, const uint8_t* row) {
    rows_at[RankOf(rank, bits, id)] = row;
  });
}

UniqueRows RowIndex::ToUniqueRows(at::ScalarType state_dtype) const {
  std::vector<const uint8_t*> rows_at;
  UniqueRows rows = SortedRows(state_dtype, &rows_at);
  if (rows.states.defined()) {
    RowGather gather(rows.states, std::move(rows_at), row_bytes_, {});
    gather.Copy(0, gather.rows());
  }
  return rows;
}

UniqueRows RowIndex::SortedRows(at::ScalarType state_dtype,
                                std::vector<const uint8_t*>* rows_at) const {
  const int64_t n = size();
  UniqueRows rows;
  rows.ids = at::empty({n}, at::kLong);
  int64_t* out_ids = rows.ids.data_ptr<int64_t>();
  if (row_bytes_ > 0) {
    const int64_t element_size = c10::elementSize(state_dtype);
    rows.states = at::empty({n, row_bytes_ / element_size}, state_dtype);
  }
  if (direct_ && row_bytes_ > 0) {  // an ID's place: its rank in the bitmap
    if (!runs_.empty()) {  // kLast: the latest rows, found from the runs
      ForEachHeld(held_bits_, [&out_ids](int64_t id) { *out_ids++ = id; });
      KeptRows(*rows_at);
      return rows;
    }
    // kFirst: each slot's ID and row go straight to that place, in one pass
    // (no walk of the bitmap, whose words mostly hold no bit or a bit or
    // two, each a branch miss).
    rows_at->resize(n);
    const std::vector<int32_t> rank = WordRanks();
    const uint64_t* bits = held_bits_.data();
    for (int64_t slot = 0; slot < n; ++slot) {
      const int64_t at = RankOf(rank, bits, ids_[slot]);
      out_ids[at] = ids_[slot];
      (*rows_at)[at] = row_of_[slot];
    }
    return rows;
  }
  std::vector<int64_t> slot_at;  // the slot of each row of the result
  if (dense_) {                  // the bitmap is in ID order
    ForEachHeld(id_bits_, [&out_ids](int64_t id) { *out_ids++ = id; });
  } else {
    std::vector<std::pair<int64_t, int64_t>> order;  // (ID, slot)
    order.reserve(n);
    for (int64_t slot = 0; slot < n; ++slot) {
      order.emplace_back(ids_[slot], slot);
    }
    SortById(order);
    slot_at.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      out_ids[i] = order[i].first;
      slot_at[i] = order[i].second;
    }
  }
  rows_at->clear();
  if (row_bytes_ == 0) return rows;

  // Row i's pointer, from slot_at (hashed mode): the slots lie in any order.
  auto by_slot = [&](const auto& of_slot) {
    rows_at->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      if (i + kTightPrefetchIds < n) {
        __builtin_prefetch(&of_slot[slot_at[i + kTightPrefetchIds]]);
      }
      (*rows_at)[i] = of_slot[slot_at[i]];
    }
  };
  if (!runs_.empty()) {  // kLast: the latest rows, by slot
    std::vector<const uint8_t*> of_slot;
    KeptRows(of_slot);
    by_slot(of_slot);
    return rows;
  }
  by_slot(row_of_);
  return rows;
}

}  // namespace deltastream
