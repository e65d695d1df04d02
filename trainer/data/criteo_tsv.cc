#include "trainer/data/criteo_tsv.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace deltastream {
namespace {

constexpr size_t kChunkBytes = 1 << 20;
constexpr size_t kMaxLineBytes = 64 << 10;
constexpr size_t kMaxExamples = 5;

}  // namespace

absl::StatusOr<std::unique_ptr<CriteoTsvSource>> CriteoTsvSource::Create(
    CriteoOptions options) {
  if (options.paths.empty()) {
    return absl::InvalidArgumentError("criteo: no paths");
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "criteo: batch_size must be positive, got ", options.batch_size));
  }
  if (options.num_rows.size() == 1) {
    options.num_rows.assign(kNumCategorical, options.num_rows[0]);
  }
  if (options.num_rows.size() != kNumCategorical) {
    return absl::InvalidArgumentError(
        absl::StrCat("criteo: num_rows needs 1 or 26 values, got ",
                     options.num_rows.size()));
  }
  for (int64_t rows : options.num_rows) {
    if (rows <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("criteo: num_rows must be positive, got ", rows));
    }
  }
  if (!(options.max_malformed_fraction >= 0 &&
        options.max_malformed_fraction <= 1)) {
    return absl::InvalidArgumentError(
        "criteo: max_malformed_fraction must be in [0, 1]");
  }
  return std::unique_ptr<CriteoTsvSource>(
      new CriteoTsvSource(std::move(options)));
}

CriteoTsvSource::CriteoTsvSource(CriteoOptions options)
    : options_(std::move(options)),
      ids_(kNumCategorical),
      lengths_(kNumCategorical) {}

CriteoTsvSource::~CriteoTsvSource() {
  if (file_ != nullptr) gzclose(static_cast<gzFile>(file_));
}

absl::Status CriteoTsvSource::OpenNext() {
  if (file_ != nullptr) gzclose(static_cast<gzFile>(file_));
  file_ = nullptr;
  if (next_path_ == options_.paths.size()) {
    if (!options_.loop || stats_.lines == 0) {
      exhausted_ = true;
      return absl::OkStatus();
    }
    next_path_ = 0;
  }
  current_path_ = options_.paths[next_path_++];
  gzFile file = gzopen(current_path_.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("criteo: cannot open '", current_path_, "'"));
  }
  gzbuffer(file, 1 << 17);
  file_ = file;
  file_done_ = false;
  current_line_ = 0;
  buffer_.clear();
  buffer_pos_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> CriteoTsvSource::NextLine() {
  while (true) {
    if (file_ == nullptr || (file_done_ && buffer_pos_ >= buffer_.size())) {
      if (absl::Status status = OpenNext(); !status.ok()) return status;
      if (exhausted_) return std::nullopt;
    }
    const size_t end = buffer_.find('\n', buffer_pos_);
    if (end != std::string::npos ||
        (file_done_ && buffer_pos_ < buffer_.size())) {
      const size_t stop = end == std::string::npos ? buffer_.size() : end;
      std::string line = buffer_.substr(buffer_pos_, stop - buffer_pos_);
      buffer_pos_ = end == std::string::npos ? buffer_.size() : end + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      ++current_line_;
      return line;
    }
    if (file_done_) continue;
    // Keep the partial line, read the next chunk.
    buffer_.erase(0, buffer_pos_);
    buffer_pos_ = 0;
    if (buffer_.size() > kMaxLineBytes) {
      // An over-long line: drop it up to its end, counted as malformed.
      ++stats_.lines;
      ++stats_.malformed;
      ++current_line_;
      if (stats_.malformed_examples.size() < kMaxExamples) {
        stats_.malformed_examples.push_back(absl::StrCat(
            current_path_, ":", current_line_, ": line longer than 64 KiB"));
      }
      buffer_.clear();
      while (true) {
        char chunk[1 << 16];
        const int n = gzread(static_cast<gzFile>(file_), chunk, sizeof(chunk));
        if (n <= 0) {
          file_done_ = true;
          break;
        }
        const char* newline = static_cast<const char*>(memchr(chunk, '\n', n));
        if (newline != nullptr) {
          buffer_.assign(newline + 1,
                         static_cast<size_t>(chunk + n - (newline + 1)));
          break;
        }
      }
      continue;
    }
    const size_t old = buffer_.size();
    buffer_.resize(old + kChunkBytes);
    const int n =
        gzread(static_cast<gzFile>(file_), buffer_.data() + old, kChunkBytes);
    if (n < 0) {
      int code = 0;
      const char* message = gzerror(static_cast<gzFile>(file_), &code);
      return absl::DataLossError(absl::StrCat(
          "criteo: reading '", current_path_, "' failed: ", message));
    }
    buffer_.resize(old + static_cast<size_t>(n));
    if (n == 0) file_done_ = true;
  }
}

bool CriteoTsvSource::Parse(const std::string& line, std::string* reason) {
  std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
  if (fields.size() != 1 + kNumDense + kNumCategorical) {
    *reason = absl::StrCat(fields.size(), " fields, expected 40");
    return false;
  }
  if (fields[0] != "0" && fields[0] != "1") {
    *reason = absl::StrCat("label '", fields[0], "' is not 0 or 1");
    return false;
  }
  float dense[kNumDense];
  for (int d = 0; d < kNumDense; ++d) {
    const absl::string_view field = fields[1 + d];
    int64_t value = 0;
    if (!field.empty() && !absl::SimpleAtoi(field, &value)) {
      *reason = absl::StrCat("integer field ", d + 1, " '", field,
                             "' is not a number");
      return false;
    }
    dense[d] = static_cast<float>(std::log1p(std::max<int64_t>(value, 0)));
  }
  uint64_t hashes[kNumCategorical];
  bool present[kNumCategorical];
  for (int c = 0; c < kNumCategorical; ++c) {
    const absl::string_view field = fields[1 + kNumDense + c];
    present[c] = !field.empty();
    if (present[c] &&
        (field.size() > 16 || !absl::SimpleHexAtoi(field, &hashes[c]))) {
      *reason = absl::StrCat("categorical field ", c + 1, " '", field,
                             "' is not hexadecimal");
      return false;
    }
  }
  labels_.push_back(fields[0] == "1" ? 1.0f : 0.0f);
  dense_.insert(dense_.end(), dense, dense + kNumDense);
  for (int c = 0; c < kNumCategorical; ++c) {
    lengths_[c].push_back(present[c] ? 1 : 0);
    if (present[c]) {
      ids_[c].push_back(static_cast<int64_t>(
          hashes[c] % static_cast<uint64_t>(options_.num_rows[c])));
    }
  }
  return true;
}

absl::StatusOr<std::optional<Batch>> CriteoTsvSource::Next() {
  dense_.clear();
  labels_.clear();
  for (int c = 0; c < kNumCategorical; ++c) {
    ids_[c].clear();
    lengths_[c].clear();
  }
  while (static_cast<int64_t>(labels_.size()) < options_.batch_size) {
    absl::StatusOr<std::optional<std::string>> line = NextLine();
    if (!line.ok()) return line.status();
    if (!line->has_value()) break;
    if ((*line)->empty()) continue;  // blank lines are not examples
    ++stats_.lines;
    std::string reason;
    if (Parse(**line, &reason)) {
      ++stats_.examples;
    } else {
      ++stats_.malformed;
      if (stats_.malformed_examples.size() < kMaxExamples) {
        stats_.malformed_examples.push_back(
            absl::StrCat(current_path_, ":", current_line_, ": ", reason));
      }
    }
    if (stats_.lines > options_.malformed_grace_lines &&
        stats_.malformed > options_.max_malformed_fraction *
                               static_cast<double>(stats_.lines)) {
      return absl::DataLossError(
          absl::StrCat("criteo: ", stats_.malformed, " of ", stats_.lines,
                       " lines are malformed (more than ",
                       options_.max_malformed_fraction * 100, "%), e.g. ",
                       absl::StrJoin(stats_.malformed_examples, "; ")));
    }
  }
  const int64_t b = static_cast<int64_t>(labels_.size());
  if (b == 0) return std::nullopt;
  std::vector<std::string> keys;
  std::vector<int64_t> ids, lengths;
  for (int c = 0; c < kNumCategorical; ++c) {
    keys.push_back(absl::StrCat("cat_", c));
    ids.insert(ids.end(), ids_[c].begin(), ids_[c].end());
    lengths.insert(lengths.end(), lengths_[c].begin(), lengths_[c].end());
  }
  auto tensor = [](auto& values, at::ScalarType type) {
    return at::from_blob(values.data(), {static_cast<int64_t>(values.size())},
                         type)
        .clone();
  };
  absl::StatusOr<KeyedJaggedTensor> sparse = KeyedJaggedTensor::FromLengths(
      std::move(keys), tensor(ids, at::kLong), tensor(lengths, at::kLong),
      std::nullopt, b);
  if (!sparse.ok()) return sparse.status();
  Batch batch;
  batch.dense = tensor(dense_, at::kFloat).view({b, kNumDense});
  batch.sparse = *std::move(sparse);
  batch.labels = tensor(labels_, at::kFloat);
  return batch;
}

}  // namespace deltastream
