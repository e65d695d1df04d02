#ifndef DELTASTREAM_TRAINER_DATA_CRITEO_TSV_H_
#define DELTASTREAM_TRAINER_DATA_CRITEO_TSV_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"

namespace deltastream {

struct CriteoOptions {
  // Files read in order; each plain or gzip (told by content, not name).
  std::vector<std::string> paths;
  int64_t batch_size = 512;
  // Rows per categorical feature: 26 values, or one for all. An ID is the
  // field's hexadecimal value modulo its feature's rows.
  std::vector<int64_t> num_rows = {1 << 20};
  // Once more than `malformed_grace_lines` lines were read, a malformed
  // fraction above this fails the read.
  double max_malformed_fraction = 0.01;
  int64_t malformed_grace_lines = 1000;
  // Start again at the first file after the last.
  bool loop = false;
};

struct CriteoStats {
  int64_t lines = 0;
  int64_t examples = 0;
  int64_t malformed = 0;
  // The first few malformed lines, "path:line: reason".
  std::vector<std::string> malformed_examples;
};

// A streaming reader of Criteo-format TSV: per line `label \t I1..I13 \t
// C1..C26`; label 0 or 1; integer fields possibly empty or negative;
// categorical fields hexadecimal hashes (e.g. 68fd1e64) or empty.
// Batches: dense float [B, 13] = log(1 + max(x, 0)) (empty: 0); sparse keys
// "cat_0".."cat_25", each example one ID or none (empty field); labels float
// [B]. The last batch may be short; then Next() returns nullopt (unless
// loop). Memory is bounded (1 MiB chunks, lines up to 64 KiB) whatever the
// file size; CRLF and a missing final newline are fine. Malformed lines
// (field count, numbers, hex, label, length) are skipped and counted.
class CriteoTsvSource : public BatchSource {
 public:
  static constexpr int kNumDense = 13;
  static constexpr int kNumCategorical = 26;

  // InvalidArgument for no paths, batch_size <= 0, num_rows not 1 or 26
  // positive values, a fraction outside [0, 1]. Files are opened lazily:
  // a missing one is Next()'s NotFound.
  static absl::StatusOr<std::unique_ptr<CriteoTsvSource>> Create(
      CriteoOptions options);
  ~CriteoTsvSource() override;

  // Errors: NotFound for a file that cannot be opened, DataLoss for a read
  // error or too many malformed lines (with the counts and first examples).
  absl::StatusOr<std::optional<Batch>> Next() override;

  const CriteoStats& stats() const { return stats_; }

 private:
  explicit CriteoTsvSource(CriteoOptions options);
  // The next complete line (without its end), or nullopt at the end of all
  // files. Errors as Next().
  absl::StatusOr<std::optional<std::string>> NextLine();
  absl::Status OpenNext();
  // Parses into the pending batch; false (and a reason) when malformed.
  bool Parse(const std::string& line, std::string* reason);

  CriteoOptions options_;
  CriteoStats stats_;
  size_t next_path_ = 0;
  void* file_ = nullptr;  // gzFile
  std::string current_path_;
  int64_t current_line_ = 0;
  std::string buffer_;
  size_t buffer_pos_ = 0;
  bool file_done_ = true;
  bool exhausted_ = false;
  // The batch being filled.
  std::vector<float> dense_, labels_;
  std::vector<std::vector<int64_t>> ids_, lengths_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_DATA_CRITEO_TSV_H_
