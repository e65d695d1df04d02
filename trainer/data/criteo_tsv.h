#ifndef DELTASTREAM_TRAINER_DATA_CRITEO_TSV_H_
#define DELTASTREAM_TRAINER_DATA_CRITEO_TSV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/data/batch.h"

namespace deltastream {

struct CriteoOptions {
  // Files read in order; each plain text or gzip (told by content, not name).
  // At least one.
  std::vector<std::string> paths;
  // Examples per batch; > 0.
  int64_t batch_size = 512;
  // Rows per categorical feature, each > 0: 26 values (cat_0..cat_25), or
  // one for all. An ID is the field's hexadecimal value modulo its feature's
  // rows.
  std::vector<int64_t> num_rows = {int64_t{1} << 20};
  // In [0, 1]. Once more than `malformed_grace_lines` lines were read, a
  // fraction of malformed lines above this fails the read.
  double max_malformed_fraction = 0.01;
  // >= 0.
  int64_t malformed_grace_lines = 1000;
  // Start again at the first file after the last (the stream never ends,
  // unless a whole pass yields no example).
  bool loop = false;
};

struct CriteoStats {
  // Lines read, blank ones excepted (malformed ones included); with `loop`,
  // over all passes.
  int64_t lines = 0;
  // Lines that became examples.
  int64_t examples = 0;
  // Lines skipped as malformed.
  int64_t malformed = 0;
  // The first kMaxMalformedExamples malformed lines, "path:line: reason"
  // (line numbers count from 1 in each file).
  std::vector<std::string> malformed_examples;
};

// A streaming reader of Criteo-format TSV (the Kaggle display-advertising
// layout): per line
//   label \t I1 .. I13 \t C1 .. C26
// with the label "0" or "1"; I1..I13 decimal integers, possibly negative or
// empty; C1..C26 hexadecimal hashes of 1 to 16 digits (e.g. 68fd1e64) or
// empty. Lines end in LF or CRLF; the last may lack its end. Blank lines are
// ignored.
//
// Batches of batch_size examples (the last one of the data may be shorter):
//   dense   float [B, 13]: log(1 + max(x, 0)) of I1..I13, 0 when empty.
//   sparse  keys "cat_0".."cat_25" (C1..C26), int64 lengths and values: per
//           example one ID, hex value % num_rows of that feature, or none
//           (length 0) when the field is empty. Unweighted.
//   labels  float [B], 0 or 1.
// Batches may span files (and, with `loop`, passes).
//
// Memory is bounded whatever the file sizes: files are read in kChunkBytes
// chunks (a line may span chunks), never whole.
//
// Malformed lines are skipped and counted, not fatal: a field count other
// than 40, a label other than 0/1, a non-integer (or out of int64) dense
// field, a categorical field that is not 1-16 hex digits, a line longer than
// kMaxLineBytes. Once stats().lines > malformed_grace_lines and
// stats().malformed / stats().lines > max_malformed_fraction, Next() fails
// with DataLoss stating the counts and the first examples.
//
// Not thread-safe (one reader), as BatchSource.
class CriteoTsvSource : public BatchSource {
 public:
  static constexpr int kNumDense = 13;
  static constexpr int kNumCategorical = 26;
  static constexpr size_t kChunkBytes = size_t{1} << 20;
  static constexpr size_t kMaxLineBytes = size_t{64} << 10;
  static constexpr size_t kMaxMalformedExamples = 5;

  // InvalidArgument, naming the field: no paths, batch_size <= 0, num_rows
  // not 1 or 26 values or one <= 0, max_malformed_fraction outside [0, 1],
  // malformed_grace_lines < 0. Every path must be a file this process can
  // read (the system's error naming it, FailedPrecondition for a
  // directory); files are opened when reached (by Next(), which reports a
  // file gone since the same way).
  static absl::StatusOr<std::unique_ptr<CriteoTsvSource>> Create(
      CriteoOptions options);
  ~CriteoTsvSource() override;

  // The next batch, or std::nullopt after the last one (never with `loop`,
  // unless a whole pass over the files yielded no example). Errors, each
  // naming the path: NotFound / PermissionDenied (errno's code) for a file
  // that cannot be opened, FailedPrecondition for a directory, DataLoss for a
  // read error or a truncated gzip file; DataLoss for too many malformed
  // lines (see above), or when the data ends having yielded no example but
  // some malformed lines. An error is final: later calls return it again.
  absl::StatusOr<std::optional<Batch>> Next() override;

  // Counts so far.
  const CriteoStats& stats() const { return stats_; }

 private:
  class LineReader;
  struct PendingBatch;

  explicit CriteoTsvSource(CriteoOptions options);
  absl::StatusOr<std::optional<Batch>> ReadBatch();
  // Opens the next file (the first again when looping); false at the end.
  absl::StatusOr<bool> OpenNextFile();
  void CountMalformed(int64_t line_number, const std::string& reason);

  CriteoOptions options_;
  CriteoStats stats_;
  absl::Status failure_;  // sticky
  bool ended_ = false;
  size_t next_path_ = 0;
  int64_t examples_at_pass_start_ = 0;
  std::unique_ptr<LineReader> reader_;  // the open file, if any
  std::unique_ptr<PendingBatch> pending_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_DATA_CRITEO_TSV_H_
