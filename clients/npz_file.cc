#include "clients/npz_file.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <zlib.h>

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"

namespace deltastream {
namespace {

constexpr uint32_t kMax32 = 0xFFFFFFFFu;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01

absl::StatusOr<std::string> Descr(at::ScalarType dtype) {
  switch (dtype) {
    case at::kLong:
      return std::string("<i8");
    case at::kInt:
      return std::string("<i4");
    case at::kFloat:
      return std::string("<f4");
    case at::kHalf:
      return std::string("<f2");
    case at::kDouble:
      return std::string("<f8");
    case at::kBool:
      return std::string("|b1");
    case at::kByte:
      return std::string("|u1");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no NumPy dtype for ", c10::toString(dtype)));
  }
}

// The NPY 1.0 preamble of `t`: magic, version, header length, header dict.
std::string NpyHeader(const at::Tensor& t, const std::string& descr) {
  std::string shape;
  for (int64_t d = 0; d < t.dim(); ++d) {
    absl::StrAppend(&shape, t.size(d),
                    t.dim() == 1 || d + 1 < t.dim() ? "," : "",
                    d + 1 < t.dim() ? " " : "");
  }
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Total preamble length a multiple of 64, the dict ended by '\n'.
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>(dict.size() >> 8));
  return out + dict;
}

void Put16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>(v >> 8));
}
void Put32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void Put64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

struct Entry {
  std::string name;
  uint32_t crc = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
  bool zip64 = false;
};

class ZipWriter {
 public:
  ZipWriter(std::string path, bool force_zip64)
      : path_(std::move(path)), force_zip64_(force_zip64) {}

  // Starts the archive (base/file_io.h: a temporary beside `path`, made
  // `path` by Finish; destroying the writer unfinished leaves `path` as it
  // was).
  absl::Status Open() {
    absl::StatusOr<DurableFile> file = DurableFile::Create(path_);
    if (!file.ok()) return file.status();
    file_.emplace(*std::move(file));
    return absl::OkStatus();
  }

  // One stored entry made of `parts` (pointer, length), in order.
  absl::Status Add(const std::string& name,
                   const std::vector<std::pair<const char*, uint64_t>>& parts) {
    Entry entry;
    entry.name = name;
    entry.offset = offset_;
    uLong crc = crc32_z(0L, Z_NULL, 0);
    for (const auto& [data, size] : parts) {
      // crc32_z(crc, NULL, 0) restarts the checksum: skip empty parts.
      if (size == 0) continue;
      crc = crc32_z(crc, reinterpret_cast<const Bytef*>(data), size);
      entry.size += size;
    }
    entry.crc = static_cast<uint32_t>(crc);
    entry.zip64 = force_zip64_ || entry.size >= kMax32 || offset_ >= kMax32;
    std::string header;
    Put32(header, 0x04034b50);
    Put16(header, entry.zip64 ? 45 : 20);
    Put16(header, 0);  // flags
    Put16(header, 0);  // stored
    Put16(header, 0);  // time
    Put16(header, kDosDate);
    Put32(header, entry.crc);
    Put32(header, entry.zip64 ? kMax32 : static_cast<uint32_t>(entry.size));
    Put32(header, entry.zip64 ? kMax32 : static_cast<uint32_t>(entry.size));
    Put16(header, static_cast<uint16_t>(name.size()));
    Put16(header, entry.zip64 ? 20 : 0);
    header += name;
    if (entry.zip64) {
      Put16(header, 0x0001);
      Put16(header, 16);
      Put64(header, entry.size);
      Put64(header, entry.size);
    }
    if (absl::Status s = Write(header.data(), header.size()); !s.ok()) return s;
    for (const auto& [data, size] : parts) {
      if (absl::Status s = Write(data, size); !s.ok()) return s;
    }
    entries_.push_back(std::move(entry));
    return absl::OkStatus();
  }

  absl::Status Finish() {
    const uint64_t directory_offset = offset_;
    std::string directory;
    for (const Entry& e : entries_) {
      Put32(directory, 0x02014b50);
      Put16(directory, e.zip64 ? 45 : 20);  // made by
      Put16(directory, e.zip64 ? 45 : 20);  // needed
      Put16(directory, 0);
      Put16(directory, 0);
      Put16(directory, 0);
      Put16(directory, kDosDate);
      Put32(directory, e.crc);
      Put32(directory, e.zip64 ? kMax32 : static_cast<uint32_t>(e.size));
      Put32(directory, e.zip64 ? kMax32 : static_cast<uint32_t>(e.size));
      Put16(directory, static_cast<uint16_t>(e.name.size()));
      Put16(directory, e.zip64 ? 28 : 0);
      Put16(directory, 0);  // comment
      Put16(directory, 0);  // disk
      Put16(directory, 0);  // internal attributes
      Put32(directory, 0);  // external attributes
      Put32(directory, e.zip64 ? kMax32 : static_cast<uint32_t>(e.offset));
      directory += e.name;
      if (e.zip64) {
        Put16(directory, 0x0001);
        Put16(directory, 24);
        Put64(directory, e.size);
        Put64(directory, e.size);
        Put64(directory, e.offset);
      }
    }
    const uint64_t directory_size = directory.size();
    const bool zip64 = force_zip64_ || entries_.size() >= 0xFFFF ||
                       directory_offset >= kMax32 || directory_size >= kMax32;
    std::string end;
    if (zip64) {
      const uint64_t record_offset = directory_offset + directory_size;
      Put32(end, 0x06064b50);
      Put64(end, 44);
      Put16(end, 45);
      Put16(end, 45);
      Put32(end, 0);
      Put32(end, 0);
      Put64(end, entries_.size());
      Put64(end, entries_.size());
      Put64(end, directory_size);
      Put64(end, directory_offset);
      Put32(end, 0x07064b50);  // locator
      Put32(end, 0);
      Put64(end, record_offset);
      Put32(end, 1);
    }
    const uint16_t count =
        zip64 ? 0xFFFF : static_cast<uint16_t>(entries_.size());
    Put32(end, 0x06054b50);
    Put16(end, 0);
    Put16(end, 0);
    Put16(end, count);
    Put16(end, count);
    Put32(end, zip64 ? kMax32 : static_cast<uint32_t>(directory_size));
    Put32(end, zip64 ? kMax32 : static_cast<uint32_t>(directory_offset));
    Put16(end, 0);
    if (absl::Status s = Write(directory.data(), directory.size()); !s.ok()) {
      return s;
    }
    if (absl::Status s = Write(end.data(), end.size()); !s.ok()) return s;
    if (absl::Status s = file_->Commit(); !s.ok()) return s;
    return absl::OkStatus();
  }

 private:
  absl::Status Write(const char* data, uint64_t size) {
    if (absl::Status s = file_->Append(absl::string_view(data, size));
        !s.ok()) {
      return s;
    }
    offset_ += size;
    return absl::OkStatus();
  }

  const std::string path_;
  const bool force_zip64_;
  std::optional<DurableFile> file_;
  uint64_t offset_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace

absl::Status WriteNpz(
    const std::string& path,
    const std::vector<std::pair<std::string, at::Tensor>>& arrays,
    bool force_zip64) {
  absl::Status status = [&]() -> absl::Status {
    ZipWriter zip(path, force_zip64);
    if (absl::Status s = zip.Open(); !s.ok()) return s;
    for (const auto& [name, array] : arrays) {
      if (name.empty() || name.size() > 60000) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad array name '", name, "' for '", path, "'"));
      }
      at::Tensor host;
      try {
        host =
            array.scalar_type() == at::kBFloat16 ? array.to(at::kFloat) : array;
        host = host.cpu().contiguous();
      } catch (const c10::Error& e) {
        return absl::InternalError(
            absl::StrCat("cannot copy '", name,
                         "' to the host: ", e.what_without_backtrace()));
      }
      absl::StatusOr<std::string> descr = Descr(host.scalar_type());
      if (!descr.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", name, "': ", descr.status().message()));
      }
      const std::string header = NpyHeader(host, *descr);
      if (absl::Status s = zip.Add(
              name + ".npy",
              {{header.data(), header.size()},
               {static_cast<const char*>(host.data_ptr()), host.nbytes()}});
          !s.ok()) {
        return s;
      }
    }
    return zip.Finish();
  }();
  return status;
}

absl::Status WriteDeltaNpz(const std::string& path,
                           const ReceivedDelta& delta) {
  std::vector<std::pair<std::string, at::Tensor>> arrays;
  for (const auto& [fqn, table] : delta.tables) {
    for (const auto& [field, tensor] :
         {std::pair<const char*, const at::Tensor*>{"ids", &table.ids},
          {"states", &table.states},
          {"values", &table.values},
          {"scores", &table.scores}}) {
      if (tensor->defined()) arrays.emplace_back(fqn + "/" + field, *tensor);
    }
  }
  const v1::DeltaHeader& header = delta.header;
  arrays.emplace_back("__delta__/start_batch",
                      at::scalar_tensor(header.start_batch(), at::kLong));
  arrays.emplace_back("__delta__/end_batch",
                      at::scalar_tensor(header.end_batch(), at::kLong));
  arrays.emplace_back("__delta__/resync_required",
                      at::scalar_tensor(header.resync_required(), at::kBool));
  const std::string& consumer = header.consumer();
  at::Tensor name =
      at::empty({static_cast<int64_t>(consumer.size())}, at::kByte);
  if (!consumer.empty()) {
    std::memcpy(name.data_ptr(), consumer.data(), consumer.size());
  }
  arrays.emplace_back("__delta__/consumer", name);
  return WriteNpz(path, arrays);
}

}  // namespace deltastream
