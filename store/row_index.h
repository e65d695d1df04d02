#ifndef DELTASTREAM_STORE_ROW_INDEX_H_
#define DELTASTREAM_STORE_ROW_INDEX_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "store/unique_rows.h"
#include "store/update_mode.h"

namespace deltastream {

// Unique rows held on the host, with an index of the IDs held, so that
// folding in more lookups costs time proportional to the IDs folded, not to the
// rows already held. This is what makes the store's compaction incremental.
//
// Rows keep insertion order internally; ToUniqueRows() sorts by ID. States are
// opaque fixed-size byte rows (`row_bytes` each), so every dtype is handled
// alike. No fold copies a state row it can point at where it was recorded, and
// the one copy of a kept row is the one ToUniqueRows makes into its result:
//  - kFirst: a new ID's slot points at its state in the folded lookup's states
//    tensor, which the index then holds (a reference, not a copy); a known ID
//    costs a bit test (direct mode, below) or a hash probe, nothing more.
//  - kLast: a fold finds the new IDs as kFirst does and keeps the folded
//    lookup as a *run* (its IDs and states tensors, held). Which state is the
//    latest of each ID is settled at the read, in one pass over the runs in
//    fold order (each ID's row pointer overwritten by every later occurrence),
//    so a known ID costs a fold nothing: no slot lookup, no repointing.
//
// Memory (an owning index): kFirst holds a folded states tensor while at
// least 1/kHeldFraction of its rows are kept rows (rows whose first state it
// holds); the kept rows of a sparser one are copied into the index's own
// blocks and the tensor is released (at the end of its fold when it was so
// from the start, and in a sweep once such tensors hold half as many bytes as
// the kept rows after merges). kLast holds its runs until they take more than
// kHeldFraction times the kept rows' bytes, then settles: copies each ID's
// latest state into one block of its own, in ID order, and releases every
// run. Either way the states held stay within about kHeldFraction times the
// kept rows' bytes; in practice they are the recorded states of the window
// (4.5 times the kept rows on DESIGN.md's workload). ReleaseHeld() copies
// every kept row and releases all tensors.
//
// While the IDs are small non-negative numbers (row indices of a table, as
// embedding lookups produce), the index is direct instead of hashed: a bitmap
// of the IDs held (a bit test per ID, an eighth of a byte per possible row),
// in which the rank of an ID is its place in the sorted output. In kNone the
// bitmap is all there is; kFirst and kLast add a slot per ID held. Either
// turns into the hash index when an ID is negative or too far out for the rows
// held (see kDenseBitsPerRow).
//
// Not thread-safe: the owning DeltaStore serialises access.
class RowIndex {
 public:
  // How an index holds state rows.
  enum class Rows {
    kOwned,     // the index holds what its rows point into (folded states
                // tensors and its own blocks)
    kBorrowed,  // pointers only: the folded tensors and indexes must outlive
                // the index and stay unchanged (a read's transient index)
  };

  // A folded states tensor is held while at least 1/kHeldFraction of its rows
  // are kept.
  static constexpr int64_t kHeldFraction = 8;

  // `row_bytes` is the size of one state row; 0 when `mode` is kNone.
  RowIndex(UpdateMode mode, int64_t row_bytes, Rows rows = Rows::kOwned);

  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // Folds a lookup: `ids` contiguous host int64 [n], in order, and `states`
  // contiguous host [n, dim] of row_bytes per row (undefined in kNone). A new
  // ID takes a new slot; a known ID keeps its state in kFirst and takes the
  // new one in kLast. Copies no state row unless `states` ends up too sparse
  // to hold (kFirst) or the runs held outgrow their bound (kLast; see above).
  void Fold(const at::Tensor& ids, const at::Tensor& states);

  // Folds every row of `later` as if its lookups came after this index's.
  // An owning index takes over what `later` holds; `later` is left empty.
  void Fold(RowIndex&& later);
  // Same, for a borrowing index: `later` must outlive it, unchanged.
  void Fold(const RowIndex& later);

  // Copies every kept row that lies in a held tensor into the index's own
  // blocks and releases the tensors. Reads answer the same.
  void ReleaseHeld();

  int64_t size() const { return rows_; }
  int64_t row_bytes() const { return row_bytes_; }
  // Folded states tensors held (an owning index).
  int64_t held_tensors() const { return held_count_; }

  // Bytes of memory held: IDs, slots, the index, own blocks and held tensors.
  int64_t bytes() const;

  // The rows sorted by ID ascending: `ids` int64 [n]; `states` [n, dim] with
  // dtype `state_dtype` (dim = row_bytes / element size), undefined in kNone.
  // Copies each state row once, into the result.
  UniqueRows ToUniqueRows(at::ScalarType state_dtype) const;
  // ToUniqueRows without the copy: `ids` as ToUniqueRows gives them and
  // `states` allocated but not written (undefined in kNone); (*rows_at)[i]
  // points at the state row of ids[i] where the index holds it (left empty in
  // kNone). The pointers stay valid while this index is unchanged and, for a
  // borrowing index, while what it borrows is.
  UniqueRows SortedRows(at::ScalarType state_dtype,
                        std::vector<const uint8_t*>* rows_at) const;

 private:
  // Allocates like std::allocator but leaves elements that a vector grows by
  // uninitialised (they are written before they are read): a fold writes
  // every ID past the slots held and keeps the new ones, and zeroing that
  // space first would cost as much as the fold.
  template <typename T>
  struct UninitializedAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
      using other = UninitializedAllocator<U>;
    };
    UninitializedAllocator() = default;
    template <typename U>
    UninitializedAllocator(const UninitializedAllocator<U>&) {}
    template <typename U>
    void construct(U* p) {
      ::new (static_cast<void*>(p)) U;
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };
  template <typename T>
  using SlotVector = std::vector<T, UninitializedAllocator<T>>;

  // A folded states tensor that kFirst rows point into.
  struct Holder {
    at::Tensor states;  // undefined once released
    int64_t rows = 0;   // rows of `states`
    int64_t kept = 0;   // slots pointing into it
    bool sparse = false;
  };
  // kLast: rows folded after the settled slots, in fold order. Row i of a
  // run has ID ids[i] and state states + i * row_bytes_, or rows[i] when
  // `rows` is set. An owning index holds what the pointers point into.
  struct Run {
    const int64_t* ids = nullptr;
    int64_t count = 0;
    const uint8_t* states = nullptr;
    const uint8_t* const* rows = nullptr;
    at::Tensor ids_tensor, states_tensor;  // a folded lookup's, held
    SlotVector<int64_t> own_ids;           // a merged index's settled slots
    SlotVector<const uint8_t*> own_rows;
  };
  static constexpr int32_t kOwnRow = -1;  // holder_of_: row in own blocks

  bool holds() const { return !borrowed_ && row_bytes_ > 0; }

  // Makes the direct index cover ids[0, count), or leaves direct mode when
  // that would break its density bound (AddNewIds does so itself).
  void PrepareFor(const int64_t* ids, int64_t count);
  // Slot of `id`, a new one (its row not yet set) when unknown; `added` says
  // which. A direct index covers `id` (PrepareFor) and returns -1 for a
  // known ID (its slot is not needed).
  int64_t SlotOf(int64_t id, bool& added);
  // Gives each new ID among ids[0, count) a slot, in order, with the row
  // row_at(i) of its first occurrence (a kFirst row; kLast ignores it),
  // growing the direct index or leaving direct mode where an ID needs it.
  // Returns the slots added.
  template <typename RowAt>
  int64_t AddNewIds(const int64_t* ids, int64_t count, RowAt row_at);
  // Folds IDs alone (kNone).
  void FoldIds(const int64_t* ids, int64_t count);
  // Adds a run (kLast) of `count` IDs and the rows they point at.
  void AddRun(Run run);
  // Notes a holder that lost kept rows: released at Settle() when it kept
  // none, counted as sparse below 1/kHeldFraction.
  void MarkIfSparse(int32_t holder);
  // A row of own storage, from the free list or a block.
  uint8_t* NewOwnRow();
  // Copies the row of `slot` into own storage (the caller fixes the counts).
  void MoveToOwn(int64_t slot);
  // Drops the holder's tensor.
  void Release(Holder& holder);
  // kFirst: releases holders with no kept row; sweeps sparse ones once they
  // hold half as many bytes as the kept rows. kLast: settles the runs once
  // they hold more than kHeldFraction times the kept rows' bytes.
  void Settle();
  // kFirst: copies the rows of every sparse holder (every holder with `all`)
  // into own storage and releases those holders.
  void Sweep(bool all);
  // kLast: copies each ID's latest row into one own block and drops every
  // run; in direct mode the slots are renumbered in ID order.
  void SettleRuns();
  // Empties the index (after another took over what it held).
  void Clear();
  // kLast: each ID's latest row, by its position in the result (direct: the
  // ID's rank) or by slot (hashed), into rows_at[0, size()).
  void KeptRows(std::vector<const uint8_t*>& rows_at) const;
  // Ranks of the bitmap's words: IDs held below each word (direct mode).
  std::vector<int32_t> WordRanks() const;

  // Bitmap mode: folds ids[from..count); returns where it stopped because an
  // ID does not fit (count when all did).
  int64_t FoldDense(const int64_t* ids, int64_t from, int64_t count);
  // Whether a bitmap covering `id` stays within the density bound.
  bool DenseCanHold(int64_t id, int64_t rows) const;
  // Leaves bitmap mode: the IDs held move to ids_ and slot_of_id_.
  void MakeSparse();
  // Leaves direct mode: slots move to slot_of_id_.
  void MakeHashed();
  // Calls f(id) for every bit set in `bits`, ascending.
  template <typename F>
  static void ForEachHeld(const std::vector<uint64_t>& bits, F&& f);
  // Calls f(id) for every ID held, ascending in bitmap mode, else by slot.
  template <typename F>
  void ForEachId(F&& f) const;

  UpdateMode mode_;
  int64_t row_bytes_;
  bool borrowed_;
  int64_t rows_ = 0;
  bool dense_;                       // bitmap mode (kNone only)
  std::vector<uint64_t> id_bits_;    // bitmap mode: bit i set = ID i held
  bool direct_;                      // direct mode (kFirst, kLast)
  std::vector<uint64_t> held_bits_;  // direct mode: bit i set = ID i held
  absl::flat_hash_map<int64_t, int64_t> slot_of_id_;  // hashed mode
  SlotVector<int64_t> ids_;                           // slot -> ID
  SlotVector<const uint8_t*> row_of_;  // slot -> state row (kLast: settled)
  std::vector<int32_t> holder_of_;     // owning kFirst: slot -> holder
  std::vector<Holder> holders_;
  std::vector<int32_t> emptied_;  // holders that may keep no row
  std::vector<Run> runs_;         // kLast
  int64_t settled_rows_ = 0;      // kLast: slots whose row_of_ is set
  int64_t held_count_ = 0;        // holders or runs with a tensor
  int64_t held_bytes_ = 0;        // bytes of their tensors
  int64_t sparse_bytes_ = 0;      // bytes of the sparse ones among them
  // Own storage: rows in blocks, the last one being filled.
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  int64_t block_rows_;               // rows per full block
  int64_t last_block_rows_ = 0;      // rows of blocks_.back()
  int64_t last_block_used_ = 0;      // rows used in blocks_.back()
  int64_t own_rows_capacity_ = 0;    // rows of all blocks
  std::vector<uint8_t*> free_rows_;  // own rows no slot points at
};

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_ROW_INDEX_H_
