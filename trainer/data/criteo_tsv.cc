#include "trainer/data/criteo_tsv.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace deltastream {
namespace {

constexpr int kNumDense = CriteoTsvSource::kNumDense;
constexpr int kNumCategorical = CriteoTsvSource::kNumCategorical;
constexpr int kNumFields = 1 + kNumDense + kNumCategorical;
// Fields longer than this are cut in messages.
constexpr size_t kMaxQuotedBytes = 24;

std::string Quote(absl::string_view field) {
  if (field.size() <= kMaxQuotedBytes) {
    return absl::StrCat("'", absl::CHexEscape(field), "'");
  }
  return absl::StrCat("'", absl::CHexEscape(field.substr(0, kMaxQuotedBytes)),
                      "...'");
}

// A decimal integer: an optional '-', then 1 or more digits, within int64.
bool ParseInteger(absl::string_view text, int64_t* value) {
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) text.remove_prefix(1);
  if (text.empty()) return false;
  // Magnitudes up to 2^63 (INT64_MIN's) accumulate without overflow.
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  uint64_t magnitude = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (magnitude > (limit - digit) / 10) return false;
    magnitude = magnitude * 10 + digit;
  }
  *value = negative ? static_cast<int64_t>(0 - magnitude)
                    : static_cast<int64_t>(magnitude);
  return true;
}

// 1 to 16 hexadecimal digits, either case, nothing else.
bool ParseHex(absl::string_view text, uint64_t* value) {
  if (text.empty() || text.size() > 16) return false;
  uint64_t result = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return false;
    }
    result = (result << 4) | static_cast<uint64_t>(digit);
  }
  *value = result;
  return true;
}

// OK when `path` is a file this process may read; otherwise the error,
// naming it: what the system says (NotFound, PermissionDenied, ...), or
// FailedPrecondition for a directory.
absl::Status CheckDataFile(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    const int error = errno;  // before the message's allocations
    return absl::ErrnoToStatus(
        error, absl::StrCat("criteo: cannot open '", path, "'"));
  }
  if (S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("criteo: '", path, "' is a directory, not a file"));
  }
  if (access(path.c_str(), R_OK) != 0) {
    const int error = errno;  // before the message's allocations
    return absl::ErrnoToStatus(
        error, absl::StrCat("criteo: cannot open '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

// One file's lines, read in kChunkBytes chunks through zlib (which reads
// plain files as they are). Holds at most kMaxLineBytes + 1 + kChunkBytes.
class CriteoTsvSource::LineReader {
 public:
  enum class Kind {
    kLine,     // a line, without its LF or CRLF
    kTooLong,  // a line longer than kMaxLineBytes, skipped
    kEnd,      // the end of the file
  };

  static absl::StatusOr<std::unique_ptr<LineReader>> Open(
      const std::string& path) {
    if (absl::Status status = CheckDataFile(path); !status.ok()) return status;
    errno = 0;
    gzFile file = gzopen(path.c_str(), "rb");
    if (file == nullptr) {
      const int error = errno;  // before the message's allocations
      const std::string message =
          absl::StrCat("criteo: cannot open '", path, "'");
      if (error != 0) return absl::ErrnoToStatus(error, message);
      return absl::ResourceExhaustedError(message);
    }
    gzbuffer(file, 1 << 17);
    return std::unique_ptr<LineReader>(new LineReader(file, path));
  }

  ~LineReader() { gzclose(file_); }

  const std::string& path() const { return path_; }
  // The number (from 1) of the line last returned.
  int64_t line_number() const { return line_number_; }

  // The next line in *line, valid until the next call.
  absl::StatusOr<Kind> Next(absl::string_view* line) {
    while (true) {
      const char* begin = buffer_.get() + begin_;
      const size_t pending = end_ - begin_;
      const char* newline =
          static_cast<const char*>(std::memchr(begin, '\n', pending));
      if (newline != nullptr || (eof_ && pending > 0)) {
        const size_t length =
            newline != nullptr ? static_cast<size_t>(newline - begin) : pending;
        begin_ += newline != nullptr ? length + 1 : length;
        return Take(absl::string_view(begin, length), line);
      }
      if (eof_) return Kind::kEnd;
      if (pending > kMaxLineBytes + 1) {  // too long even before a CR
        ++line_number_;
        return SkipRestOfLine();
      }
      // Keep the partial line, read the next chunk after it.
      std::memmove(buffer_.get(), begin, pending);
      begin_ = 0;
      end_ = pending;
      if (absl::Status status = Fill(); !status.ok()) return status;
    }
  }

 private:
  LineReader(gzFile file, std::string path)
      : file_(file),
        path_(std::move(path)),
        buffer_(new char[kMaxLineBytes + 1 + kChunkBytes]) {}

  Kind Take(absl::string_view text, absl::string_view* line) {
    ++line_number_;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.size() > kMaxLineBytes) return Kind::kTooLong;
    *line = text;
    return Kind::kLine;
  }

  // Reads up to kChunkBytes after end_; sets eof_ at the end of the file.
  absl::Status Fill() {
    errno = 0;
    const int n =
        gzread(file_, buffer_.get() + end_, static_cast<unsigned>(kChunkBytes));
    const int read_error = errno;
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (n < 0 || (n == 0 && code != Z_OK)) {
      const std::string what =
          absl::StrCat("criteo: reading '", path_, "' failed");
      // The disk's error (EIO on a network volume) is not damaged data: a
      // restart may read it.
      if (code == Z_ERRNO && read_error != 0) {
        return absl::ErrnoToStatus(read_error, what);
      }
      // A truncated gzip stream reads as far as it goes, then Z_BUF_ERROR.
      return absl::DataLossError(absl::StrCat(what, ": ", message));
    }
    end_ += static_cast<size_t>(n);
    if (n == 0) eof_ = true;
    return absl::OkStatus();
  }

  // Drops the current line up to and including its LF (or the end of file).
  absl::StatusOr<Kind> SkipRestOfLine() {
    while (true) {
      begin_ = end_ = 0;
      if (absl::Status status = Fill(); !status.ok()) return status;
      if (eof_) return Kind::kTooLong;
      const char* newline =
          static_cast<const char*>(std::memchr(buffer_.get(), '\n', end_));
      if (newline != nullptr) {
        begin_ = static_cast<size_t>(newline - buffer_.get()) + 1;
        return Kind::kTooLong;
      }
    }
  }

  gzFile file_;
  std::string path_;
  std::unique_ptr<char[]> buffer_;
  size_t begin_ = 0;  // [begin_, end_): read, not yet returned
  size_t end_ = 0;
  bool eof_ = false;
  int64_t line_number_ = 0;
};

// The examples of the batch being filled, feature by feature.
struct CriteoTsvSource::PendingBatch {
  std::vector<float> dense;  // [size, kNumDense], row-major
  std::vector<float> labels;
  std::vector<int64_t> ids[kNumCategorical];
  std::vector<int64_t> lengths[kNumCategorical];

  int64_t size() const { return static_cast<int64_t>(labels.size()); }

  void Clear() {
    dense.clear();
    labels.clear();
    for (int c = 0; c < kNumCategorical; ++c) {
      ids[c].clear();
      lengths[c].clear();
    }
  }

  // Appends the example on `line`; false, with *reason, when malformed (and
  // then nothing is appended).
  bool Append(absl::string_view line, const std::vector<int64_t>& num_rows,
              std::string* reason) {
    absl::string_view fields[kNumFields];
    int count = 0;
    size_t start = 0;
    while (true) {
      const size_t tab = line.find('\t', start);
      const absl::string_view field = line.substr(
          start, tab == absl::string_view::npos ? absl::string_view::npos
                                                : tab - start);
      if (count < kNumFields) fields[count] = field;
      ++count;
      if (tab == absl::string_view::npos) break;
      start = tab + 1;
    }
    if (count != kNumFields) {
      *reason = absl::StrCat(count, " fields, expected ", kNumFields);
      return false;
    }
    if (fields[0] != "0" && fields[0] != "1") {
      *reason = absl::StrCat("label ", Quote(fields[0]), " is not 0 or 1");
      return false;
    }
    float dense_values[kNumDense];
    for (int d = 0; d < kNumDense; ++d) {
      const absl::string_view field = fields[1 + d];
      int64_t value = 0;
      if (!field.empty() && !ParseInteger(field, &value)) {
        *reason = absl::StrCat("I", d + 1, " ", Quote(field),
                               " is not a 64-bit integer");
        return false;
      }
      dense_values[d] = static_cast<float>(
          std::log1p(static_cast<double>(std::max<int64_t>(value, 0))));
    }
    uint64_t hashes[kNumCategorical];
    for (int c = 0; c < kNumCategorical; ++c) {
      const absl::string_view field = fields[1 + kNumDense + c];
      if (!field.empty() && !ParseHex(field, &hashes[c])) {
        *reason = absl::StrCat("C", c + 1, " ", Quote(field),
                               " is not 1-16 hexadecimal digits");
        return false;
      }
    }
    labels.push_back(fields[0] == "1" ? 1.0f : 0.0f);
    dense.insert(dense.end(), dense_values, dense_values + kNumDense);
    for (int c = 0; c < kNumCategorical; ++c) {
      const bool present = !fields[1 + kNumDense + c].empty();
      lengths[c].push_back(present ? 1 : 0);
      if (present) {
        ids[c].push_back(static_cast<int64_t>(
            hashes[c] % static_cast<uint64_t>(num_rows[c])));
      }
    }
    return true;
  }

  absl::StatusOr<Batch> ToBatch() const {
    const int64_t b = size();
    std::vector<std::string> keys;
    size_t total = 0;
    for (int c = 0; c < kNumCategorical; ++c) {
      keys.push_back(absl::StrCat("cat_", c));
      total += ids[c].size();
    }
    at::Tensor values = at::empty({static_cast<int64_t>(total)}, at::kLong);
    at::Tensor all_lengths = at::empty({kNumCategorical * b}, at::kLong);
    int64_t* value_data = values.data_ptr<int64_t>();
    int64_t* length_data = all_lengths.data_ptr<int64_t>();
    for (int c = 0; c < kNumCategorical; ++c) {
      value_data = std::copy(ids[c].begin(), ids[c].end(), value_data);
      length_data =
          std::copy(lengths[c].begin(), lengths[c].end(), length_data);
    }
    absl::StatusOr<KeyedJaggedTensor> sparse =
        KeyedJaggedTensor::FromLengths(std::move(keys), std::move(values),
                                       std::move(all_lengths), std::nullopt, b);
    if (!sparse.ok()) return sparse.status();
    Batch batch;
    batch.dense = at::empty({b, kNumDense}, at::kFloat);
    std::copy(dense.begin(), dense.end(), batch.dense.data_ptr<float>());
    batch.labels = at::empty({b}, at::kFloat);
    std::copy(labels.begin(), labels.end(), batch.labels.data_ptr<float>());
    batch.sparse = *std::move(sparse);
    return batch;
  }
};

absl::StatusOr<std::unique_ptr<CriteoTsvSource>> CriteoTsvSource::Create(
    CriteoOptions options) {
  auto invalid = [](auto... message) {
    return absl::InvalidArgumentError(absl::StrCat("criteo: ", message...));
  };
  if (options.paths.empty()) return invalid("paths: none given");
  if (options.batch_size <= 0) {
    return invalid("batch_size must be positive, got ", options.batch_size);
  }
  if (options.num_rows.size() == 1) {
    options.num_rows.assign(kNumCategorical, options.num_rows[0]);
  }
  if (options.num_rows.size() != kNumCategorical) {
    return invalid("num_rows needs 1 or ", kNumCategorical, " values, got ",
                   options.num_rows.size());
  }
  for (int c = 0; c < kNumCategorical; ++c) {
    if (options.num_rows[c] <= 0) {
      return invalid("num_rows[", c, "] must be positive, got ",
                     options.num_rows[c]);
    }
  }
  if (!(options.max_malformed_fraction >= 0 &&
        options.max_malformed_fraction <= 1)) {
    return invalid("max_malformed_fraction must be in [0, 1], got ",
                   options.max_malformed_fraction);
  }
  if (options.malformed_grace_lines < 0) {
    return invalid("malformed_grace_lines must be >= 0, got ",
                   options.malformed_grace_lines);
  }
  // Every file now, not when reached: a run must not fail hours in.
  for (const std::string& path : options.paths) {
    if (absl::Status status = CheckDataFile(path); !status.ok()) return status;
  }
  return std::unique_ptr<CriteoTsvSource>(
      new CriteoTsvSource(std::move(options)));
}

CriteoTsvSource::CriteoTsvSource(CriteoOptions options)
    : options_(std::move(options)), pending_(new PendingBatch()) {}

CriteoTsvSource::~CriteoTsvSource() = default;

absl::StatusOr<std::optional<Batch>> CriteoTsvSource::Next() {
  if (!failure_.ok()) return failure_;
  if (ended_) return std::nullopt;
  absl::StatusOr<std::optional<Batch>> batch = ReadBatch();
  if (!batch.ok()) {
    failure_ = batch.status();
    reader_.reset();
  }
  return batch;
}

absl::StatusOr<bool> CriteoTsvSource::OpenNextFile() {
  if (next_path_ == options_.paths.size()) {
    // Another pass only when the last one gave examples (else it would spin).
    if (!options_.loop || stats_.examples == examples_at_pass_start_) {
      return false;
    }
    next_path_ = 0;
    examples_at_pass_start_ = stats_.examples;
  }
  absl::StatusOr<std::unique_ptr<LineReader>> reader =
      LineReader::Open(options_.paths[next_path_++]);
  if (!reader.ok()) return reader.status();
  reader_ = *std::move(reader);
  return true;
}

void CriteoTsvSource::CountMalformed(int64_t line_number,
                                     const std::string& reason) {
  ++stats_.malformed;
  if (stats_.malformed_examples.size() < kMaxMalformedExamples) {
    stats_.malformed_examples.push_back(
        absl::StrCat(reader_->path(), ":", line_number, ": ", reason));
  }
}

absl::StatusOr<std::optional<Batch>> CriteoTsvSource::ReadBatch() {
  pending_->Clear();
  std::string reason;
  while (pending_->size() < options_.batch_size) {
    if (reader_ == nullptr) {
      absl::StatusOr<bool> opened = OpenNextFile();
      if (!opened.ok()) return opened.status();
      if (!*opened) break;
    }
    absl::string_view line;
    absl::StatusOr<LineReader::Kind> kind = reader_->Next(&line);
    if (!kind.ok()) return kind.status();
    if (*kind == LineReader::Kind::kEnd) {
      reader_.reset();
      continue;
    }
    if (*kind == LineReader::Kind::kLine && line.empty()) continue;
    ++stats_.lines;
    if (*kind == LineReader::Kind::kTooLong) {
      CountMalformed(
          reader_->line_number(),
          absl::StrCat("line longer than ", kMaxLineBytes, " bytes"));
    } else if (pending_->Append(line, options_.num_rows, &reason)) {
      ++stats_.examples;
    } else {
      CountMalformed(reader_->line_number(), reason);
    }
    if (stats_.malformed > 0 && stats_.lines > options_.malformed_grace_lines &&
        static_cast<double>(stats_.malformed) >
            options_.max_malformed_fraction *
                static_cast<double>(stats_.lines)) {
      return absl::DataLossError(absl::StrCat(
          "criteo: ", stats_.malformed, " of ", stats_.lines,
          " lines are malformed (",
          100.0 * static_cast<double>(stats_.malformed) /
              static_cast<double>(stats_.lines),
          "%, more than max_malformed_fraction ",
          options_.max_malformed_fraction * 100,
          "%); first: ", absl::StrJoin(stats_.malformed_examples, "; ")));
    }
  }
  if (pending_->size() == 0) {
    ended_ = true;
    if (stats_.examples == 0 && stats_.malformed > 0) {
      return absl::DataLossError(absl::StrCat(
          "criteo: no valid example in the data, ", stats_.malformed, " of ",
          stats_.lines, " lines are malformed; first: ",
          absl::StrJoin(stats_.malformed_examples, "; ")));
    }
    return std::nullopt;
  }
  absl::StatusOr<Batch> batch = pending_->ToBatch();
  if (!batch.ok()) return batch.status();
  return std::optional<Batch>(*std::move(batch));
}

}  // namespace deltastream
