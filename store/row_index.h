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

// Unique rows held on the host, with an index from row ID to its slot, so that
// folding in more lookups costs time proportional to the IDs folded, not to the
// rows already held. This is what makes the store's compaction incremental.
//
// Rows keep insertion order internally; ToUniqueRows() sorts by ID. States are
// opaque fixed-size byte rows (`row_bytes` each), so every dtype is handled
// alike. Each slot points at its state row where it lies: in a folded lookup's
// states tensor, which the index then holds (a reference, not a copy), or in
// the index's own blocks. So a fold costs a slot and a pointer per new ID (and
// per known one in kLast), and the one copy of a kept row is the one
// ToUniqueRows makes into its result.
//
// Memory (an owning index): a folded states tensor is held while at least
// 1/kHeldFraction of its rows are still kept rows (kFirst: rows whose first
// state it holds; kLast: rows whose latest state it holds). A tensor below
// that is released and its kept rows are copied into the index's own blocks:
// at the end of its fold when it was so from the start, and for a tensor that
// later lookups outdated (kLast), in a sweep once such tensors hold half as
// many bytes as the kept rows. States held thus stay within about
// kHeldFraction + 1/2 times the kept rows' bytes; in practice they are the
// recorded states of the window (4.5 times the kept rows on DESIGN.md's
// workload). ReleaseHeld() copies every kept row and releases all tensors.
//
// While the IDs are small non-negative numbers (row indices of a table, as
// embedding lookups produce), the index is direct instead of hashed: in kNone
// a bitmap of IDs (a bit test per ID, an eighth of a byte per possible row);
// in kFirst such a bitmap too (a known ID needs nothing but the test), in
// kLast with an array of slots indexed by ID (four bytes per possible row,
// valid where the bitmap says, so never cleared); the rank of an ID in the
// bitmap is its place in the sorted output. Either turns into the hash index
// when an ID is negative or too far out for the rows held (see
// kDenseBitsPerRow, kDirectSlotsPerRow).
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
  // to hold (see above).
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

 private:
  // A folded states tensor that rows point into.
  struct Holder {
    at::Tensor states;  // undefined once released
    int64_t rows = 0;   // rows of `states`
    int64_t kept = 0;   // slots pointing into it
    bool sparse = false;
  };
  static constexpr int32_t kOwnRow = -1;  // holder_of_: row in own blocks

  bool holds() const { return !borrowed_ && row_bytes_ > 0; }

  // Makes the direct index cover ids[0, count), or leaves direct mode when
  // that would break its density bound.
  void PrepareFor(const int64_t* ids, int64_t count);
  // Slot of `id`, a new one (its row not yet set) when unknown; `added` says
  // which. A direct index covers `id` (PrepareFor).
  int64_t SlotOf(int64_t id, bool& added);
  // Folds IDs alone (kNone).
  void FoldIds(const int64_t* ids, int64_t count);
  // Folds ids[0, count) with rows states + i * row_bytes_, tagging the rows
  // an owning index points at with `holder`; kLast collects the known slots
  // repointed into `holder` in touched_.
  void FoldRows(const int64_t* ids, const uint8_t* states, int64_t count,
                int32_t holder);
  // Drops the slot's current row: its holder keeps one row fewer, or its own
  // row goes to the free list.
  void DropRow(int64_t slot);
  // Notes a holder that lost kept rows: released at Settle() when it kept
  // none, counted as sparse below 1/kHeldFraction.
  void MarkIfSparse(int32_t holder);
  // A row of own storage, from the free list or a block.
  uint8_t* NewOwnRow();
  // Copies the row of `slot` into own storage (the caller fixes the counts).
  void MoveToOwn(int64_t slot);
  // Drops the holder's tensor.
  void Release(Holder& holder);
  // Releases holders with no kept row; sweeps sparse ones once they hold
  // half as many bytes as the kept rows.
  void Settle();
  // Copies the rows of every sparse holder (every holder with `all`) into own
  // storage and releases those holders.
  void Sweep(bool all);
  // Empties the index (after another took over what it held).
  void Clear();

  // Bitmap mode: folds ids[from..count); returns where it stopped because an
  // ID does not fit (count when all did).
  int64_t FoldDense(const int64_t* ids, int64_t from, int64_t count);
  // Whether a bitmap covering `id` stays within the density bound.
  bool DenseCanHold(int64_t id) const;
  // Leaves bitmap mode: the IDs held move to ids_ and slot_of_id_.
  void MakeSparse();
  // Leaves direct-slot mode: slots move to slot_of_id_.
  void MakeHashed();
  // Calls f(id) for every ID held, ascending in bitmap mode, else by slot.
  template <typename F>
  void ForEachId(F&& f) const;

  UpdateMode mode_;
  int64_t row_bytes_;
  bool borrowed_;
  int64_t rows_ = 0;
  bool dense_;                       // bitmap mode (kNone only)
  std::vector<uint64_t> id_bits_;    // bitmap mode: bit i set = ID i held
  bool direct_;                      // direct-slot mode (kFirst, kLast)
  std::vector<uint64_t> held_bits_;  // direct mode: bit i set = ID i held
  // Direct kLast: ID -> slot, set where held_bits_ is (covers as many IDs).
  std::unique_ptr<int32_t[]> direct_slot_;
  absl::flat_hash_map<int64_t, int64_t> slot_of_id_;
  std::vector<int64_t> ids_;            // slot -> ID
  std::vector<const uint8_t*> row_of_;  // slot -> state row
  std::vector<int32_t> holder_of_;      // owning: slot -> holder or kOwnRow
  std::vector<Holder> holders_;
  std::vector<int32_t> emptied_;  // holders that may keep no row
  int64_t held_count_ = 0;        // holders with a tensor
  int64_t held_bytes_ = 0;        // bytes of their tensors
  int64_t sparse_bytes_ = 0;      // bytes of the sparse ones among them
  // Own storage: rows in blocks, the last one being filled.
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  int64_t block_rows_;               // rows per full block
  int64_t last_block_rows_ = 0;      // rows of blocks_.back()
  int64_t last_block_used_ = 0;      // rows used in blocks_.back()
  int64_t own_rows_capacity_ = 0;    // rows of all blocks
  std::vector<uint8_t*> free_rows_;  // own rows no slot points at
  // kLast, during a fold: slots repointed into the folded tensor, and the
  // slot of each folded ID (-1: not held before the fold).
  std::vector<int64_t> touched_;
  std::vector<int32_t> fold_slots_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_ROW_INDEX_H_
