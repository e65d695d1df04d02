#include "clients/checkpoint_chain.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/wire_format_lite.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file_io.h"
#include "proto/checkpoint.pb.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'C', 'H', 'A', 'I', 'N', '1'};
constexpr size_t kHeaderBytes = 8 + 8 + 4;

std::string LinkName(bool full, int64_t start, int64_t end) {
  return absl::StrFormat("%s-%012d-%012d.ckpt", full ? "full" : "incr", start,
                         end);
}

absl::StatusOr<v1::CheckpointLink> ReadLink(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  uint64_t size = 0;
  uint32_t crc = 0;
  if (bytes.size() < kHeaderBytes ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is not a checkpoint link"));
  }
  std::memcpy(&size, bytes.data() + 8, 8);
  std::memcpy(&crc, bytes.data() + 16, 4);
  if (bytes.size() - kHeaderBytes != size) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is truncated: ", bytes.size() - kHeaderBytes,
                     " of ", size, " payload bytes"));
  }
  const auto* payload =
      reinterpret_cast<const Bytef*>(bytes.data() + kHeaderBytes);
  if (crc32(crc32(0, nullptr, 0), payload, static_cast<uInt>(size)) != crc) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' fails its checksum: corrupt"));
  }
  v1::CheckpointLink link;
  if (!link.ParseFromArray(bytes.data() + kHeaderBytes,
                           static_cast<int>(size))) {
    return absl::DataLossError(absl::StrCat("'", path, "' does not parse"));
  }
  return link;
}

// What a link holds besides its tables.
struct LinkExtras {
  std::string consumer;
  const DenseParameters* dense = nullptr;
  int64_t dense_batch = -1;
  std::string run_id;
  int64_t run_start_batch = 0;
};

absl::StatusOr<ChainLink> WriteLink(const std::string& dir, bool full,
                                    int64_t start, int64_t end,
                                    const ChainTables& tables,
                                    const LinkExtras& extras) {
  if (start < 0 || end <= start) {
    return absl::InvalidArgumentError(
        absl::StrCat("a link covers a non-empty range of batches, got [", start,
                     ", ", end, ")"));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  v1::CheckpointLink link;
  link.set_full(full);
  link.set_start_batch(start);
  link.set_end_batch(end);
  link.set_consumer(extras.consumer);
  link.set_written_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  link.set_run_id(extras.run_id);
  link.set_run_start_batch(extras.run_start_batch);
  for (const auto& [fqn, table] : tables) {
    v1::CheckpointTable* out = link.add_tables();
    out->set_fqn(fqn);
    if (absl::Status s = EncodeTensor(table.ids, out->mutable_ids()); !s.ok()) {
      return s;
    }
    if (absl::Status s = EncodeTensor(table.values, out->mutable_values());
        !s.ok()) {
      return s;
    }
  }
  if (extras.dense != nullptr && !extras.dense->empty()) {
    link.set_dense_batch(extras.dense_batch);
    for (const auto& [name, tensor] : *extras.dense) {
      v1::NamedTensor* out = link.add_dense();
      out->set_name(name);
      if (absl::Status s = EncodeTensor(tensor.cpu(), out->mutable_tensor());
          !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dense parameter '", name, "': ", s.message()));
      }
    }
  }
  const std::string payload = link.SerializeAsString();
  const uint64_t size = payload.size();
  const uint32_t crc = crc32(crc32(0, nullptr, 0),
                             reinterpret_cast<const Bytef*>(payload.data()),
                             static_cast<uInt>(payload.size()));
  std::string bytes(kMagic, sizeof(kMagic));
  bytes.append(reinterpret_cast<const char*>(&size), 8);
  bytes.append(reinterpret_cast<const char*>(&crc), 4);
  bytes += payload;
  ChainLink written{dir + "/" + LinkName(full, start, end), full, start, end,
                    static_cast<int64_t>(bytes.size())};
  if (absl::Status s = WriteFileDurably(written.path, bytes); !s.ok()) return s;
  return written;
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

std::string Name(const ChainLink& link) {
  return std::filesystem::path(link.path).filename().string();
}

}  // namespace

ChainTables MergeTables(const ChainTables& base, const ChainTables& later) {
  ChainTables merged = base;
  for (const auto& [fqn, table] : later) {
    auto it = merged.find(fqn);
    if (it == merged.end() || it->second.ids.numel() == 0) {
      merged[fqn] = table;
      continue;
    }
    if (table.ids.numel() == 0) continue;
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

absl::StatusOr<ChainLink> WriteChainLink(const std::string& dir,
                                         const ReceivedDelta& delta) {
  const v1::DeltaHeader& header = delta.header;
  const bool full = header.all_rows();
  if (header.resync_required() && !full) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the service dropped ", header.lost_rows(),
        " rows this consumer had not read: an increment would miss them; "
        "resync with a full read (all_rows)"));
  }
  ChainTables tables;
  for (const auto& [fqn, table] : delta.tables) {
    if (table.ids.numel() > 0 && !table.values.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", fqn,
          "' came without values: checkpoints need a tracker served by the "
          "trainer (live rows)"));
    }
    tables[fqn] = {table.ids, table.values.defined()
                                  ? table.values
                                  : at::empty({0, 0}, at::kFloat)};
  }
  LinkExtras extras;
  extras.consumer = header.consumer();
  extras.dense = &delta.dense;
  extras.dense_batch = header.end_batch();
  extras.run_id = header.run_id();
  extras.run_start_batch = header.run_start_batch();
  return WriteLink(dir, full,
                   full ? 0 : std::max<int64_t>(header.start_batch(), 0),
                   header.end_batch(), tables, extras);
}

absl::StatusOr<std::vector<ChainLink>> ListChain(const std::string& dir) {
  std::vector<ChainLink> links;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
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
    link.bytes = static_cast<int64_t>(entry.file_size(error));
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
  namespace io = google::protobuf::io;
  using google::protobuf::internal::WireFormatLite;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  char header[kHeaderBytes];
  size_t got = 0;
  while (got < kHeaderBytes) {
    const ssize_t n = ::read(fd, header + got, kHeaderBytes - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  struct stat file;
  uint64_t size = 0;
  if (got == kHeaderBytes) std::memcpy(&size, header + 8, 8);
  if (got < kHeaderBytes || std::memcmp(header, kMagic, sizeof(kMagic)) != 0 ||
      ::fstat(fd, &file) != 0) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat("'", path, "' is not a checkpoint link"));
  }
  if (static_cast<uint64_t>(file.st_size) - kHeaderBytes != size ||
      size > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat("'", path, "' is truncated: ", file.st_size - kHeaderBytes,
                     " of ", size, " payload bytes"));
  }
  ChainLinkInfo info;
  int64_t dense_batch = 0;
  bool parsed = true;
  {
    // Skipping a field seeks past it: the rows are never read.
    io::FileInputStream raw(fd);
    io::CodedInputStream in(&raw);
    in.PushLimit(static_cast<int>(size));
    uint64_t number = 0;
    std::string text;
    while (parsed) {
      const uint32_t tag = in.ReadTag();
      if (tag == 0) break;
      const int field = WireFormatLite::GetTagFieldNumber(tag);
      const auto wire = WireFormatLite::GetTagWireType(tag);
      const bool varint = wire == WireFormatLite::WIRETYPE_VARINT;
      const bool bytes = wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
      switch (field) {
        case 5:  // consumer
        case 9:  // run_id
          parsed = bytes && WireFormatLite::ReadString(&in, &text);
          (field == 5 ? info.consumer : info.run_id) = text;
          break;
        case 6:   // written_unix_ms
        case 8:   // dense_batch
        case 10:  // run_start_batch
          parsed = varint && in.ReadVarint64(&number);
          (field == 6   ? info.written_unix_ms
           : field == 8 ? dense_batch
                        : info.run_start_batch) = static_cast<int64_t>(number);
          break;
        case 4:  // tables
        case 7:  // dense
          ++(field == 4 ? info.tables : info.dense_parameters);
          parsed = bytes && WireFormatLite::SkipField(&in, tag);
          break;
        default:
          parsed = WireFormatLite::SkipField(&in, tag);
      }
    }
    parsed = parsed && in.ConsumedEntireMessage() &&
             in.CurrentPosition() == static_cast<int>(size);
  }
  ::close(fd);
  if (!parsed) {
    return absl::DataLossError(absl::StrCat("'", path, "' does not parse"));
  }
  info.dense_batch = info.dense_parameters > 0 ? dense_batch : -1;
  return info;
}

absl::StatusOr<LoadedChain> LoadChain(const std::string& dir) {
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
    absl::StatusOr<v1::CheckpointLink> read = ReadLink(link.path);
    if (!read.ok()) return read.status();
    if (read->full() != link.full || read->start_batch() != link.start_batch ||
        read->end_batch() != link.end_batch) {
      return absl::DataLossError(
          absl::StrCat("'", link.path, "' holds batches [", read->start_batch(),
                       ", ", read->end_batch(), "), not what its name says"));
    }
    ChainTables tables;
    for (const v1::CheckpointTable& table : read->tables()) {
      absl::StatusOr<at::Tensor> ids = DecodeTensor(table.ids());
      absl::StatusOr<at::Tensor> values = DecodeTensor(table.values());
      if (!ids.ok() || !values.ok() ||
          (ids->numel() > 0 && values->size(0) != ids->numel())) {
        return absl::DataLossError(absl::StrCat(
            "'", link.path, "': table '", table.fqn(), "' does not decode"));
      }
      tables[table.fqn()] = {*ids, *values};
    }
    if (read->dense_size() > 0) {
      DenseParameters dense;
      for (const v1::NamedTensor& parameter : read->dense()) {
        absl::StatusOr<at::Tensor> tensor = DecodeTensor(parameter.tensor());
        if (!tensor.ok()) {
          return absl::DataLossError(
              absl::StrCat("'", link.path, "': dense parameter '",
                           parameter.name(), "' does not decode"));
        }
        dense.emplace_back(parameter.name(), *std::move(tensor));
      }
      loaded.dense = std::move(dense);
      loaded.dense_batch = read->dense_batch();
    }
    loaded.tables =
        link.full ? std::move(tables) : MergeTables(loaded.tables, tables);
    loaded.end_batch = link.end_batch;
    loaded.run_id = read->run_id();
    loaded.run_start_batch = read->run_start_batch();
    loaded.links.push_back(link);
  }
  return loaded;
}

absl::StatusOr<ChainLink> CompactChain(const std::string& dir) {
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  if (!loaded.ok()) return loaded.status();
  if (loaded->links.size() == 1) return loaded->links.front();
  LinkExtras extras;
  extras.consumer = "compaction";
  extras.dense = &loaded->dense;
  extras.dense_batch = loaded->dense_batch;
  extras.run_id = loaded->run_id;
  extras.run_start_batch = loaded->run_start_batch;
  absl::StatusOr<ChainLink> full =
      WriteLink(dir, true, 0, loaded->end_batch, loaded->tables, extras);
  if (!full.ok()) return full.status();
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return links.status();
  std::error_code error;
  for (const ChainLink& link : *links) {
    if (link.path != full->path && link.end_batch <= full->end_batch) {
      std::filesystem::remove(link.path, error);
    }
  }
  return full;
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
    removed.push_back(link);
  }
  if (!removed.empty()) {
    if (absl::Status s = SyncDirectory(dir); !s.ok()) return s;
  }
  return removed;
}

}  // namespace deltastream
