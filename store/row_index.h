#ifndef DELTASTREAM_STORE_ROW_INDEX_H_
#define DELTASTREAM_STORE_ROW_INDEX_H_

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
// alike, kept in fixed-size blocks so that growing never moves rows already
// held.
//
// While the IDs are small non-negative numbers (row indices of a table, as
// embedding lookups produce), the index is direct instead of hashed: in kNone
// a bitmap of IDs (a bit test per ID, an eighth of a byte per possible row),
// in kFirst and kLast an array of slots indexed by ID (four bytes per
// possible row); both give sorted output by a scan. Either turns into the
// hash index when an ID is negative or too far out for the rows held (see
// kDenseBitsPerRow, kDirectSlotsPerRow).
//
// Not thread-safe: the owning DeltaStore serialises access.
class RowIndex {
 public:
  // How an index holds state rows.
  enum class Rows {
    kOwned,     // copied into the index's own blocks
    kBorrowed,  // pointers into the folded memory, which must outlive the
                // index and stay unchanged: for a read's transient index,
                // so that a read copies each row once, into its result
  };

  // `row_bytes` is the size of one state row; 0 when `mode` is kNone.
  RowIndex(UpdateMode mode, int64_t row_bytes, Rows rows = Rows::kOwned);

  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // Folds `count` IDs, in order, with their state rows (`states` points at
  // count * row_bytes bytes; ignored, may be null, in kNone). A new ID takes a
  // new slot; a known ID keeps its state in kFirst and takes the new one in
  // kLast. An owning index copies the rows it keeps (in kFirst only new IDs'
  // rows, in kLast a row looked up several times here once); a borrowing one
  // keeps pointers to them.
  void Fold(const int64_t* ids, const uint8_t* states, int64_t count);

  // Folds every row of `later` as if its lookups came after this index's.
  void Fold(const RowIndex& later);

  int64_t size() const { return rows_; }
  int64_t row_bytes() const { return row_bytes_; }

  // Bytes of memory held: IDs, states and the hash index.
  int64_t bytes() const;

  // The rows sorted by ID ascending: `ids` int64 [n]; `states` [n, dim] with
  // dtype `state_dtype` (dim = row_bytes / element size), undefined in kNone.
  UniqueRows ToUniqueRows(at::ScalarType state_dtype) const;

 private:
  // Where the state row of `slot` is.
  const uint8_t* StateRow(int64_t slot) const {
    return borrowed_ ? borrowed_rows_[slot] : OwnedRow(slot);
  }
  uint8_t* OwnedRow(int64_t slot) const {
    return state_blocks_[slot >> block_shift_].get() +
           (slot & ((int64_t{1} << block_shift_) - 1)) * row_bytes_;
  }
  // Makes room for the state row of slot size(). Block 0 covers slots below
  // one full block and grows in place; later blocks are allocated full.
  void GrowStates();

  // Bitmap mode: folds ids[from..count); returns where it stopped because an
  // ID does not fit (count when all did).
  int64_t FoldDense(const int64_t* ids, int64_t from, int64_t count);
  // Whether a bitmap covering `id` stays within the density bound.
  bool DenseCanHold(int64_t id) const;
  // Leaves bitmap mode: the IDs held move to ids_ and slot_of_id_.
  void MakeSparse();
  // Direct-slot mode: as FoldDense; the state rows to copy go to pending_.
  int64_t FoldDirect(const int64_t* ids, int64_t from, int64_t count);
  bool DirectCanHold(int64_t id) const;
  // Leaves direct-slot mode: slots move to slot_of_id_.
  void MakeHashed();
  // Takes a new slot for `id`, its state row not yet written; returns it.
  int64_t Append(int64_t id);
  // Copies the state rows pending_ names from `states` and clears it.
  void CopyPending(const uint8_t* states);
  // Calls f(id) for every ID held, ascending in bitmap mode, else by slot.
  template <typename F>
  void ForEachId(F&& f) const;

  UpdateMode mode_;
  int64_t row_bytes_;
  int64_t rows_ = 0;
  bool dense_;                        // bitmap mode (kNone only)
  std::vector<uint64_t> id_bits_;     // bitmap mode: bit i set = ID i held
  bool direct_;                       // direct-slot mode (kFirst, kLast)
  std::vector<int32_t> direct_slot_;  // direct mode: ID -> slot + 1 (0: none)
  int block_shift_;                   // log2 of rows per full state block
  int64_t first_block_rows_ = 0;      // rows allocated in state_blocks_[0]
  std::vector<int64_t> ids_;          // slot -> ID
  std::vector<std::unique_ptr<uint8_t[]>> state_blocks_;
  bool borrowed_;                              // Rows::kBorrowed
  std::vector<const uint8_t*> borrowed_rows_;  // borrowed: slot -> row
  absl::flat_hash_map<int64_t, int64_t> slot_of_id_;
  // During a Fold: (slot, row of the folded states) for each state to copy;
  // released when the fold ends.
  std::vector<std::pair<int64_t, int64_t>> pending_;
  // kLast: the fold (numbered by folds_) that last copied each slot's row.
  uint32_t folds_ = 0;
  std::vector<uint32_t> fold_of_slot_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_ROW_INDEX_H_
