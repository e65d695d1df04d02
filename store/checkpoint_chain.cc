#include "store/checkpoint_chain.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file_io.h"
#include "base/torch_status.h"
#include "proto/checkpoint.pb.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

constexpr char kMagicV1[8] = {'D', 'S', 'C', 'H', 'A', 'I', 'N', '1'};
constexpr char kMagicV2[8] = {'D', 'S', 'C', 'H', 'A', 'I', 'N', '2'};
constexpr uint64_t kMagicBytes = 8;
// A record's size (uint64) and CRC (uint32) before its bytes.
constexpr uint64_t kRecordPrefixBytes = 12;
// A link's description (its first record) holds no rows: far below this.
constexpr uint64_t kMaxDescriptionBytes = uint64_t{256} << 20;
// VerifyChainLink reads records through a buffer of this size.
constexpr uint64_t kVerifyBufferBytes = uint64_t{1} << 20;

uint32_t Crc(uint32_t crc, const char* data, uint64_t size) {
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(data), size));
}

uint32_t CrcOf(const char* data, uint64_t size) {
  return Crc(static_cast<uint32_t>(crc32_z(0, nullptr, 0)), data, size);
}

std::string LinkName(bool full, int64_t start, int64_t end) {
  return absl::StrFormat("%s-%012d-%012d.ckpt", full ? "full" : "incr", start,
                         end);
}

std::string Name(const ChainLink& link) {
  return std::filesystem::path(link.path).filename().string();
}

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("'", path, "' ", what));
}

// What a cancelled load returns, naming the link it was reading.
absl::Status LoadCancelled(const std::string& path) {
  return absl::CancelledError(
      absl::StrCat("loading '", path, "' was cancelled"));
}

// Reads a link file front to back.
class LinkFileReader {
 public:
  // The OS's error when `path` cannot be opened (absl::ErrnoToStatus:
  // ENOENT NotFound, a link removed meanwhile; EIO Unknown). `cancelled`
  // (not owned; may be null) is asked before each record is read: true
  // fails the read with Cancelled.
  static absl::StatusOr<LinkFileReader> Open(
      const std::string& path, const CancelLoad* cancelled = nullptr) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int error = errno;  // before the message's allocations
      return absl::ErrnoToStatus(error,
                                 absl::StrCat("cannot read '", path, "'"));
    }
    struct stat file;
    if (::fstat(fd, &file) != 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error,
                                 absl::StrCat("cannot stat '", path, "'"));
    }
    return LinkFileReader(path, fd, static_cast<uint64_t>(file.st_size),
                          cancelled);
  }
  LinkFileReader(LinkFileReader&& other) noexcept
      : path_(std::move(other.path_)),
        fd_(std::exchange(other.fd_, -1)),
        size_(other.size_),
        offset_(other.offset_),
        cancelled_(other.cancelled_) {}
  LinkFileReader& operator=(LinkFileReader&&) = delete;
  ~LinkFileReader() {
    if (fd_ >= 0) ::close(fd_);
  }

  uint64_t size() const { return size_; }
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

  // The next `n` bytes into `dst`; DataLoss "truncated" past the end.
  absl::Status ReadExact(char* dst, uint64_t n) {
    if (n > size_ - offset_) {
      return Corrupt(path_, absl::StrCat("is truncated: ", size_ - offset_,
                                         " bytes left where ", n,
                                         " were expected at offset ", offset_));
    }
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = ::read(fd_, dst + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return absl::InternalError(absl::StrCat(
            "cannot read '", path_,
            "': ", got < 0 ? std::strerror(errno) : "unexpected end of file"));
      }
      done += static_cast<uint64_t>(got);
    }
    offset_ += n;
    return absl::OkStatus();
  }

  // The next record, of 1 to `max` bytes, into `dst` (or, when `dst` is
  // null, through a buffer, to check it); its size. DataLoss when it is
  // truncated, has another size or fails its checksum.
  absl::StatusOr<uint64_t> ReadRecord(char* dst, uint64_t max) {
    absl::StatusOr<RecordPrefix> prefix = ReadPrefix(max);
    if (!prefix.ok()) return prefix.status();
    const uint64_t size = prefix->size;
    uint32_t actual = CrcOf(nullptr, 0);
    if (dst != nullptr) {
      if (absl::Status s = ReadExact(dst, size); !s.ok()) return s;
      actual = Crc(actual, dst, size);
    } else {
      buffer_.resize(std::min(size, kVerifyBufferBytes));
      for (uint64_t done = 0; done < size;) {
        const uint64_t n = std::min<uint64_t>(buffer_.size(), size - done);
        if (absl::Status s = ReadExact(buffer_.data(), n); !s.ok()) return s;
        actual = Crc(actual, buffer_.data(), n);
        done += n;
      }
    }
    if (absl::Status s = CheckCrc(actual, prefix->crc, size); !s.ok()) {
      return s;
    }
    return size;
  }

  // The next record, of 1 to `max` bytes, in a string of its size. Errors
  // as ReadRecord.
  absl::StatusOr<std::string> ReadRecordString(uint64_t max) {
    absl::StatusOr<RecordPrefix> prefix = ReadPrefix(max);
    if (!prefix.ok()) return prefix.status();
    std::string record(prefix->size, '\0');
    if (absl::Status s = ReadExact(record.data(), record.size()); !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CheckCrc(Crc(CrcOf(nullptr, 0), record.data(), record.size()),
                     prefix->crc, record.size());
        !s.ok()) {
      return s;
    }
    return record;
  }

 private:
  LinkFileReader(std::string path, int fd, uint64_t size,
                 const CancelLoad* cancelled)
      : path_(std::move(path)), fd_(fd), size_(size), cancelled_(cancelled) {}

  struct RecordPrefix {
    uint64_t size = 0;
    uint32_t crc = 0;
  };

  // A record's size and checksum, the size checked: 1 to `max` bytes, all
  // in the file. DataLoss otherwise; Cancelled, reading nothing, when the
  // load was cancelled.
  absl::StatusOr<RecordPrefix> ReadPrefix(uint64_t max) {
    if (cancelled_ != nullptr && *cancelled_ && (*cancelled_)()) {
      return LoadCancelled(path_);
    }
    char bytes[kRecordPrefixBytes];
    if (absl::Status s = ReadExact(bytes, kRecordPrefixBytes); !s.ok()) {
      return s;
    }
    RecordPrefix prefix;
    std::memcpy(&prefix.size, bytes, 8);
    std::memcpy(&prefix.crc, bytes + 8, 4);
    if (prefix.size > size_ - offset_) {
      return Corrupt(path_,
                     absl::StrCat("is truncated: a record of ", prefix.size,
                                  " bytes at offset ", offset_, " has ",
                                  size_ - offset_, " left"));
    }
    if (prefix.size == 0 || prefix.size > max) {
      return Corrupt(
          path_, absl::StrCat("is corrupt: a record of ", prefix.size,
                              " bytes at offset ", offset_, " where 1 to ", max,
                              " belong"));
    }
    return prefix;
  }

  // DataLoss unless the `size` bytes just read, of checksum `actual`, match
  // the record's `expected`.
  absl::Status CheckCrc(uint32_t actual, uint32_t expected, uint64_t size) {
    if (actual == expected) return absl::OkStatus();
    return Corrupt(path_, absl::StrCat("fails its checksum at offset ",
                                       offset_ - size, ": corrupt"));
  }

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
  const CancelLoad* cancelled_ = nullptr;
  std::string buffer_;
};

// A link as read: its description and (when asked for) its tensors.
struct LinkFile {
  v1::CheckpointLink link;
  ChainTables tables;
  DenseParameters dense;
};

// Reads a "DSCHAIN1" link (one message; such links are under 2 GiB) whose
// magic `reader` has read.
absl::StatusOr<LinkFile> ReadLinkV1(LinkFileReader& reader) {
  const std::string& path = reader.path();
  char prefix[kRecordPrefixBytes];
  if (absl::Status s = reader.ReadExact(prefix, kRecordPrefixBytes); !s.ok()) {
    return s;
  }
  uint64_t size = 0;
  uint32_t crc = 0;
  std::memcpy(&size, prefix, 8);
  std::memcpy(&crc, prefix + 8, 4);
  if (reader.size() - reader.offset() != size) {
    return Corrupt(
        path, absl::StrCat("is truncated: ", reader.size() - reader.offset(),
                           " of ", size, " payload bytes"));
  }
  if (size > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return Corrupt(path, "does not parse");
  }
  std::string bytes(size, '\0');
  if (absl::Status s = reader.ReadExact(bytes.data(), size); !s.ok()) return s;
  if (CrcOf(bytes.data(), size) != crc) {
    return Corrupt(path, "fails its checksum: corrupt");
  }
  LinkFile file;
  if (!file.link.ParseFromString(bytes)) return Corrupt(path, "does not parse");
  for (v1::CheckpointTable& table : *file.link.mutable_tables()) {
    absl::StatusOr<at::Tensor> ids = DecodeTensor(table.ids());
    absl::StatusOr<at::Tensor> values = DecodeTensor(table.values());
    // Int64 IDs, as the later format's description requires: IDs of
    // another type would pass as sound and fail only where a load uses them.
    if (!ids.ok() || !values.ok() || ids->scalar_type() != at::kLong ||
        ids->dim() != 1 ||
        (ids->numel() > 0 &&
         (values->dim() < 1 || values->size(0) != ids->numel()))) {
      return Corrupt(
          path, absl::StrCat(": table '", table.fqn(), "' does not decode"));
    }
    file.tables[table.fqn()] = {*ids, *values};
    table.mutable_ids()->clear_data();
    table.mutable_values()->clear_data();
  }
  for (v1::NamedTensor& parameter : *file.link.mutable_dense()) {
    absl::StatusOr<at::Tensor> tensor = DecodeTensor(parameter.tensor());
    if (!tensor.ok()) {
      return Corrupt(path, absl::StrCat(": dense parameter '", parameter.name(),
                                        "' does not decode"));
    }
    file.dense.emplace_back(parameter.name(), *std::move(tensor));
    parameter.mutable_tensor()->clear_data();
  }
  return file;
}

// Reads the data of a tensor described by `wire` (a "DSCHAIN2" description:
// dtype and shape, no data): into a new tensor when `keep`, else only
// checked. `what` names it in errors.
absl::StatusOr<at::Tensor> ReadTensor(LinkFileReader& reader,
                                      const v1::Tensor& wire, bool keep,
                                      const std::string& what) {
  absl::StatusOr<WireLayout> layout = CheckLayout(
      wire.dtype(),
      std::vector<int64_t>(wire.shape().begin(), wire.shape().end()));
  if (!layout.ok() || !wire.data().empty()) {
    return Corrupt(
        reader.path(),
        absl::StrCat(": ", what, " does not decode", layout.ok() ? "" : ": ",
                     layout.ok() ? "" : layout.status().message()));
  }
  if (layout->bytes > reader.size() - reader.offset()) {
    return Corrupt(
        reader.path(),
        absl::StrCat("is truncated: ", what, " needs ", layout->bytes,
                     " bytes, ", reader.size() - reader.offset(), " are left"));
  }
  at::Tensor tensor;
  char* data = nullptr;
  if (keep) {
    tensor = at::empty(layout->shape, at::TensorOptions(layout->dtype));
    data = static_cast<char*>(tensor.data_ptr());
  }
  for (uint64_t done = 0; done < layout->bytes;) {
    absl::StatusOr<uint64_t> n = reader.ReadRecord(
        data == nullptr ? nullptr : data + done, layout->bytes - done);
    if (!n.ok()) return n.status();
    done += *n;
  }
  return tensor;
}

// Reads the link at `path`; its tensors only when `keep` (otherwise every
// byte is read and checked, and the tables and dense parameters stay
// empty). `description_only` stops after the description. `cancelled` as
// LinkFileReader::Open's.
absl::StatusOr<LinkFile> ReadLinkFile(const std::string& path, bool keep,
                                      bool description_only = false,
                                      const CancelLoad* cancelled = nullptr) {
  absl::StatusOr<LinkFileReader> reader = LinkFileReader::Open(path, cancelled);
  if (!reader.ok()) return reader.status();
  char magic[kMagicBytes];
  if (reader->size() < kMagicBytes + kRecordPrefixBytes) {
    return Corrupt(path, "is not a checkpoint link");
  }
  // A read that fails (EIO) is the disk's error, not a link that is not one:
  // that would have the chain's end unknown, or the link removed.
  if (absl::Status s = reader->ReadExact(magic, kMagicBytes); !s.ok()) {
    return s;
  }
  if (std::memcmp(magic, kMagicV1, kMagicBytes) != 0 &&
      std::memcmp(magic, kMagicV2, kMagicBytes) != 0) {
    return Corrupt(path, "is not a checkpoint link");
  }
  if (std::memcmp(magic, kMagicV1, kMagicBytes) == 0) {
    return ReadLinkV1(*reader);
  }
  LinkFile file;
  {
    // Allocated at the size its record says, not at the most it may be.
    absl::StatusOr<std::string> description =
        reader->ReadRecordString(kMaxDescriptionBytes);
    if (!description.ok()) return description.status();
    if (!file.link.ParseFromString(*description)) {
      return Corrupt(path, "does not parse");
    }
  }
  if (description_only) return file;
  for (const v1::CheckpointTable& table : file.link.tables()) {
    const std::string what = absl::StrCat("table '", table.fqn(), "'");
    if (table.ids().dtype() != v1::Tensor::INT64 ||
        table.ids().shape_size() != 1 || table.values().shape_size() < 1 ||
        (table.ids().shape(0) > 0 &&
         table.values().shape(0) != table.ids().shape(0))) {
      return Corrupt(path, absl::StrCat(": ", what, " does not decode"));
    }
    absl::StatusOr<at::Tensor> ids =
        ReadTensor(*reader, table.ids(), keep, what + " ids");
    if (!ids.ok()) return ids.status();
    absl::StatusOr<at::Tensor> values =
        ReadTensor(*reader, table.values(), keep, what + " values");
    if (!values.ok()) return values.status();
    if (keep) file.tables[table.fqn()] = {*std::move(ids), *std::move(values)};
  }
  for (const v1::NamedTensor& parameter : file.link.dense()) {
    absl::StatusOr<at::Tensor> tensor =
        ReadTensor(*reader, parameter.tensor(), keep,
                   absl::StrCat("dense parameter '", parameter.name(), "'"));
    if (!tensor.ok()) return tensor.status();
    if (keep) file.dense.emplace_back(parameter.name(), *std::move(tensor));
  }
  if (reader->offset() != reader->size()) {
    return Corrupt(
        path, absl::StrCat("is corrupt: ", reader->size() - reader->offset(),
                           " bytes after its last record"));
  }
  return file;
}

// DataLoss unless `file` holds what `link`'s name says.
absl::Status CheckMatchesName(const ChainLink& link, const LinkFile& file) {
  if (file.link.full() != link.full ||
      file.link.start_batch() != link.start_batch ||
      file.link.end_batch() != link.end_batch) {
    return absl::DataLossError(
        absl::StrCat("'", link.path, "' holds ",
                     file.link.full() ? "a full link" : "an increment",
                     " of batches [", file.link.start_batch(), ", ",
                     file.link.end_batch(), "), not what its name says"));
  }
  return absl::OkStatus();
}

// `tensor` described in `wire` (dtype and shape, no data).
absl::Status Describe(const at::Tensor& tensor, v1::Tensor* wire) {
  absl::StatusOr<v1::Tensor::DType> dtype = WireDType(tensor.scalar_type());
  if (!dtype.ok()) return dtype.status();
  wire->set_dtype(*dtype);
  for (int64_t size : tensor.sizes()) wire->add_shape(size);
  return absl::OkStatus();
}

absl::Status AppendRecord(DurableFile& file, const char* data, uint64_t size) {
  char prefix[kRecordPrefixBytes];
  const uint32_t crc = CrcOf(data, size);
  std::memcpy(prefix, &size, 8);
  std::memcpy(prefix + 8, &crc, 4);
  if (absl::Status s = file.Append(absl::string_view(prefix, sizeof(prefix)));
      !s.ok()) {
    return s;
  }
  return file.Append(absl::string_view(data, size));
}

// `tensor`'s bytes (host, contiguous) in records of at most `chunk` bytes.
absl::Status AppendTensor(DurableFile& file, const at::Tensor& tensor,
                          uint64_t chunk) {
  const char* data = static_cast<const char*>(tensor.data_ptr());
  const uint64_t bytes = tensor.nbytes();
  for (uint64_t done = 0; done < bytes; done += chunk) {
    if (absl::Status s =
            AppendRecord(file, data + done, std::min(chunk, bytes - done));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// The links a load applies: the newest full one and everything after it.
std::vector<ChainLink> FromNewestFull(const std::vector<ChainLink>& links) {
  size_t base = links.size();
  for (size_t i = 0; i < links.size(); ++i) {
    if (links[i].full &&
        (base == links.size() || links[i].end_batch >= links[base].end_batch)) {
      base = i;
    }
  }
  if (base == links.size()) return links;
  std::vector<ChainLink> chain = {links[base]};
  for (const ChainLink& link : links) {
    if (!link.full && link.end_batch > links[base].end_batch) {
      chain.push_back(link);
    }
  }
  return chain;
}

}  // namespace

absl::StatusOr<ChainTables> MergeTables(const ChainTables& base,
                                        const ChainTables& later) {
  ChainTables merged = base;
  for (const auto& [fqn, table] : later) {
    auto it = merged.find(fqn);
    if (it == merged.end() || it->second.ids.numel() == 0) {
      merged[fqn] = table;
      continue;
    }
    if (table.ids.numel() == 0) continue;
    const at::Tensor& held = it->second.values;
    if (held.sizes().slice(1) != table.values.sizes().slice(1) ||
        held.scalar_type() != table.values.scalar_type()) {
      return absl::DataLossError(absl::StrCat(
          "table '", fqn, "' has rows of ", c10::str(held.sizes().slice(1)),
          " ", c10::toString(held.scalar_type()), " in one link and of ",
          c10::str(table.values.sizes().slice(1)), " ",
          c10::toString(table.values.scalar_type()), " in a later one"));
    }
    at::Tensor ids = at::cat({it->second.ids, table.ids});
    at::Tensor values = at::cat({it->second.values, table.values});
    // A stable sort keeps equal IDs in order: the last of a run is the newer.
    at::Tensor order = std::get<1>(ids.sort(/*stable=*/true, 0, false));
    at::Tensor sorted = ids.index_select(0, order);
    const int64_t n = sorted.numel();
    at::Tensor last = at::ones({n}, at::kBool);
    if (n > 1) {
      last.narrow(0, 0, n - 1)
          .copy_(sorted.narrow(0, 0, n - 1) != sorted.narrow(0, 1, n - 1));
    }
    at::Tensor keep = order.masked_select(last);
    merged[fqn] = {ids.index_select(0, keep), values.index_select(0, keep)};
  }
  return merged;
}

absl::StatusOr<ChainLink> WriteChainLinkContent(
    const std::string& dir, const ChainLinkContent& content,
    const ChainWriteOptions& options) {
  const int64_t start = content.start_batch;
  const int64_t end = content.end_batch;
  if (start < 0 || end <= start) {
    return absl::InvalidArgumentError(
        absl::StrCat("a link covers a non-empty range of batches, got [", start,
                     ", ", end, ")"));
  }
  if (options.chunk_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_bytes must be at least 1, got ", options.chunk_bytes));
  }
  v1::CheckpointLink link;
  link.set_full(content.full);
  link.set_start_batch(start);
  link.set_end_batch(end);
  link.set_consumer(content.consumer);
  link.set_written_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  link.set_run_id(content.run_id);
  link.set_run_start_batch(content.run_start_batch);
  // Host, contiguous tensors in the order their bytes follow.
  std::vector<at::Tensor> tensors;
  try {
    for (const auto& [fqn, table] : content.tables) {
      if (!table.ids.defined() || !table.values.defined() ||
          table.ids.dim() != 1 || table.values.dim() < 1 ||
          table.ids.scalar_type() != at::kLong ||
          (table.ids.numel() > 0 &&
           table.values.size(0) != table.ids.numel())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", fqn,
            "': a link holds int64 ids [n] and values [n, ...], got ",
            table.ids.defined() ? c10::str(table.ids.sizes()) : "no ids",
            " and ",
            table.values.defined() ? c10::str(table.values.sizes())
                                   : "no values"));
      }
      v1::CheckpointTable* out = link.add_tables();
      out->set_fqn(fqn);
      for (auto [tensor, wire] :
           {std::pair(&table.ids, out->mutable_ids()),
            std::pair(&table.values, out->mutable_values())}) {
        if (absl::Status s = Describe(*tensor, wire); !s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("table '", fqn, "': ", s.message()));
        }
        tensors.push_back(tensor->cpu().contiguous());
      }
    }
    if (!content.dense.empty()) {
      link.set_dense_batch(content.dense_batch);
      for (const auto& [name, tensor] : content.dense) {
        v1::NamedTensor* out = link.add_dense();
        out->set_name(name);
        if (absl::Status s = Describe(tensor, out->mutable_tensor()); !s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("dense parameter '", name, "': ", s.message()));
        }
        tensors.push_back(tensor.cpu().contiguous());
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot gather a link's tensors: ",
                                            e.what_without_backtrace()));
  }
  std::error_code error;
  if (std::filesystem::create_directories(dir, error)) {
    // The new directory's entry durable too, before any link in it is.
    const std::filesystem::path parent =
        std::filesystem::absolute(dir).parent_path();
    if (absl::Status s = SyncDirectory(parent.string()); !s.ok()) return s;
  }
  ChainLink written{dir + "/" + LinkName(content.full, start, end),
                    content.full, start, end, 0};
  absl::StatusOr<DurableFile> file = DurableFile::Create(written.path);
  if (!file.ok()) return file.status();
  const std::string description = link.SerializeAsString();
  absl::Status status = file->Append(absl::string_view(kMagicV2, kMagicBytes));
  if (status.ok()) {
    status = AppendRecord(*file, description.data(), description.size());
  }
  for (size_t i = 0; i < tensors.size() && status.ok(); ++i) {
    status = AppendTensor(*file, tensors[i],
                          static_cast<uint64_t>(options.chunk_bytes));
  }
  written.bytes = static_cast<int64_t>(file->size());
  if (status.ok()) status = file->Commit();
  if (!status.ok()) return status;
  return written;
}

absl::StatusOr<std::vector<ChainLink>> ListChain(const std::string& dir) {
  // A directory that cannot be read is not an empty chain: a job would
  // start a new one beside links it cannot see.
  absl::StatusOr<std::vector<std::filesystem::directory_entry>> entries =
      ListDirectory(dir, "the checkpoint chain");
  if (!entries.ok()) return entries.status();
  std::vector<ChainLink> links;
  for (const std::filesystem::directory_entry& entry : *entries) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 5 || name.compare(name.size() - 5, 5, ".ckpt") != 0) {
      continue;  // temporaries and other files
    }
    std::vector<std::string> parts =
        absl::StrSplit(name.substr(0, name.size() - 5), '-');
    ChainLink link;
    link.path = entry.path().string();
    if (parts.size() != 3 || (parts[0] != "full" && parts[0] != "incr") ||
        !absl::SimpleAtoi(parts[1], &link.start_batch) ||
        !absl::SimpleAtoi(parts[2], &link.end_batch)) {
      return absl::DataLossError(
          absl::StrCat("'", link.path, "' is not a checkpoint link name"));
    }
    link.full = parts[0] == "full";
    std::error_code size_error;  // a link removed meanwhile: 0 bytes
    link.bytes = static_cast<int64_t>(entry.file_size(size_error));
    if (size_error) link.bytes = 0;
    links.push_back(std::move(link));
  }
  std::sort(links.begin(), links.end(),
            [](const ChainLink& a, const ChainLink& b) {
              return std::tie(a.start_batch, a.end_batch, b.full) <
                     std::tie(b.start_batch, b.end_batch, a.full);
            });
  return links;
}

std::vector<std::string> ChainProblems(const std::vector<ChainLink>& links) {
  std::vector<std::string> problems;
  std::vector<ChainLink> chain = FromNewestFull(links);
  if (chain.empty()) return problems;
  if (!chain.front().full) {
    problems.push_back("no full checkpoint: the chain has no base");
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    const ChainLink& previous = chain[i - 1];
    const ChainLink& link = chain[i];
    if (link.start_batch > previous.end_batch) {
      problems.push_back(absl::StrCat("batches ", previous.end_batch, "..",
                                      link.start_batch - 1, " missing between ",
                                      Name(previous), " and ", Name(link)));
    } else if (link.start_batch < previous.end_batch) {
      problems.push_back(absl::StrCat(
          Name(link), " overlaps ", Name(previous),
          link.start_batch == previous.start_batch ? " (a duplicate)" : "",
          ": batches ", link.start_batch, "..", previous.end_batch - 1,
          " twice"));
    }
  }
  return problems;
}

std::vector<ChainLink> AppliedLinks(const std::vector<ChainLink>& links) {
  return FromNewestFull(links);
}

absl::StatusOr<ChainLinkInfo> ReadChainLinkInfo(const std::string& path) {
  absl::StatusOr<LinkFile> file =
      ReadLinkFile(path, /*keep=*/false, /*description_only=*/true);
  if (!file.ok()) return file.status();
  ChainLinkInfo info;
  info.consumer = file->link.consumer();
  info.written_unix_ms = file->link.written_unix_ms();
  info.tables = file->link.tables_size();
  info.dense_parameters = file->link.dense_size();
  info.dense_batch =
      info.dense_parameters > 0 ? file->link.dense_batch() : int64_t{-1};
  info.run_id = file->link.run_id();
  info.run_start_batch = file->link.run_start_batch();
  return info;
}

absl::Status VerifyChainLink(const ChainLink& link) {
  absl::StatusOr<LinkFile> file = ReadLinkFile(link.path, /*keep=*/false);
  if (!file.ok()) return file.status();
  return CheckMatchesName(link, *file);
}

absl::StatusOr<LoadedChain> LoadChain(const std::string& dir,
                                      const CancelLoad& cancelled) {
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return links.status();
  if (links->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", dir, "' holds no checkpoint"));
  }
  if (std::vector<std::string> problems = ChainProblems(*links);
      !problems.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint chain in '", dir,
                     "' is broken: ", absl::StrJoin(problems, "; ")));
  }
  LoadedChain loaded;
  for (const ChainLink& link : FromNewestFull(*links)) {
    // LibTorch throws where there is no memory for a table.
    absl::StatusOr<LinkFile> read = CatchTorchErrors([&] {
      return ReadLinkFile(link.path, /*keep=*/true,
                          /*description_only=*/false, &cancelled);
    });
    if (read.status().code() == absl::StatusCode::kResourceExhausted) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot load '", link.path, "': ", read.status().message()));
    }
    if (!read.ok()) return read.status();
    if (absl::Status s = CheckMatchesName(link, *read); !s.ok()) return s;
    // Read whole (a link without records to read: a V1 one), before the
    // merge.
    if (cancelled && cancelled()) return LoadCancelled(link.path);
    if (read->link.dense_size() > 0) {
      loaded.dense = std::move(read->dense);
      loaded.dense_batch = read->link.dense_batch();
    }
    if (link.full) {
      loaded.tables = std::move(read->tables);
    } else {
      absl::StatusOr<ChainTables> merged = CatchTorchErrors(
          [&] { return MergeTables(loaded.tables, read->tables); });
      if (!merged.ok()) {
        return absl::Status(merged.status().code(),
                            absl::StrCat("cannot load '", link.path,
                                         "': ", merged.status().message()));
      }
      loaded.tables = *std::move(merged);
    }
    loaded.end_batch = link.end_batch;
    loaded.run_id = read->link.run_id();
    loaded.run_start_batch = read->link.run_start_batch();
    loaded.links.push_back(link);
  }
  return loaded;
}

namespace {

// Removes every link of `dir` but `full` that ends where it ends or before
// (what a load from `full` never applies), durably; returns `full`.
absl::StatusOr<ChainLink> RemoveLinksBefore(const std::string& dir,
                                            const ChainLink& full) {
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return links.status();
  std::error_code error;
  for (const ChainLink& link : *links) {
    if (link.path != full.path && link.end_batch <= full.end_batch) {
      std::filesystem::remove(link.path, error);
    }
  }
  if (absl::Status s = SyncDirectory(dir); !s.ok()) return s;
  return full;
}

}  // namespace

absl::StatusOr<ChainLink> CompactChain(const std::string& dir) {
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  if (!loaded.ok()) return loaded.status();
  if (loaded->links.size() == 1) {
    // Already one full link: the links it superseded still go.
    return RemoveLinksBefore(dir, loaded->links.front());
  }
  ChainLinkContent content;
  content.full = true;
  content.start_batch = 0;
  content.end_batch = loaded->end_batch;
  content.consumer = "compaction";
  content.tables = std::move(loaded->tables);
  content.dense = std::move(loaded->dense);
  content.dense_batch = loaded->dense_batch;
  content.run_id = loaded->run_id;
  content.run_start_batch = loaded->run_start_batch;
  absl::StatusOr<ChainLink> full = WriteChainLinkContent(dir, content);
  if (!full.ok()) return full.status();
  return RemoveLinksBefore(dir, *full);
}

absl::StatusOr<std::vector<ChainLink>> TruncateChainAfter(
    const std::string& dir, int64_t batch) {
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return links.status();
  std::vector<ChainLink> doomed;
  for (const ChainLink& link : *links) {
    if (link.end_batch > batch) doomed.push_back(link);
  }
  // Newest first: a crash midway leaves a shorter chain, not a hole.
  std::stable_sort(doomed.begin(), doomed.end(),
                   [](const ChainLink& a, const ChainLink& b) {
                     return std::tie(a.end_batch, a.start_batch) >
                            std::tie(b.end_batch, b.start_batch);
                   });
  std::vector<ChainLink> removed;
  for (const ChainLink& link : doomed) {
    std::error_code error;
    std::filesystem::remove(link.path, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot remove '", link.path, "': ", error.message(),
                       " (removed ", removed.size(), " links before it)"));
    }
    // Each removal durable before the next: a file system that does not keep
    // unlinks in order could otherwise keep a later one and lose this one.
    if (absl::Status s = SyncDirectory(dir); !s.ok()) return s;
    removed.push_back(link);
  }
  return removed;
}

}  // namespace deltastream
