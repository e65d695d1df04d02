#ifndef DELTASTREAM_STORE_CHECKPOINT_CHAIN_H_
#define DELTASTREAM_STORE_CHECKPOINT_CHAIN_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deltastream {

// A chain of checkpoints in one directory: a full link (every row of every
// table at its end batch), then increments (the rows a consumer's read
// returned), each covering batches [start_batch, end_batch), the next
// starting where the previous ended. Links may also carry the model's dense
// parameters and name the trainer run that served them. The checkpoint job
// writes links from the reads it pulls (clients/checkpoint_chain.h); the
// trainer restores from them; `deltactl chain` verifies them.
//
// Files: "full-<start>-<end>.ckpt" and "incr-<start>-<end>.ckpt" (12-digit
// batch numbers, so names sort by position). A link is the 8 bytes
// "DSCHAIN2", then records, each a uint64 little-endian size, the CRC-32
// (zlib's crc32_z, any length) of its bytes as uint32 little-endian, then the
// bytes:
//  - first a serialized v1::CheckpointLink (proto/checkpoint.proto) whose
//    tensors carry dtype and shape but no data;
//  - then the raw little-endian bytes of every tensor it names, in order
//    (each table's ids, then its values; then each dense parameter), each
//    split into records of at most ChainWriteOptions::chunk_bytes;
//  - and nothing after them.
// Tables of any size fit (nothing is one protobuf message over 2 GiB), and a
// link is written and read without a second copy of its rows in memory.
// Links of the previous format ("DSCHAIN1": size, CRC, one serialized
// v1::CheckpointLink with its data) are still read.
//
// Every link is written through base/file_io's DurableFile (temporary file,
// fsync, rename, directory fsync): a crash leaves the previous chain or the
// new link, never a torn one.
//
// Thread safety: the functions hold no state; concurrent writers of one
// directory must coordinate themselves (a chain has one writer).
struct ChainLink {
  std::string path;
  bool full = false;
  int64_t start_batch = 0;
  int64_t end_batch = 0;
  int64_t bytes = 0;
};

// Rows by table FQN: ids int64 [n] ascending, values [n, dim].
struct ChainTable {
  at::Tensor ids;
  at::Tensor values;
};
using ChainTables = std::map<std::string, ChainTable>;

// A model's dense parameters by name, in the model's order.
using DenseParameters = std::vector<std::pair<std::string, at::Tensor>>;

// What one link holds.
struct ChainLinkContent {
  bool full = false;
  // Batches [start_batch, end_batch); a full link starts at 0.
  int64_t start_batch = 0;
  int64_t end_batch = 0;
  std::string consumer;
  ChainTables tables;
  // Read at dense_batch; empty when the link carries none.
  DenseParameters dense;
  int64_t dense_batch = -1;
  // The trainer run that served the rows and the batch it started at.
  std::string run_id;
  int64_t run_start_batch = 0;
};

struct ChainWriteOptions {
  // The most bytes of one tensor in one record (at least 1). Smaller values
  // only add 12 bytes of framing per record.
  int64_t chunk_bytes = int64_t{64} << 20;
};

// Writes `content` as the link "<dir>/<full|incr>-<start>-<end>.ckpt"
// (creating `dir`), replacing a link of the same name. Host or device
// tensors of int64, float32, float16, bfloat16 or float64. InvalidArgument
// for an empty or negative range, a table whose values have another number
// of rows than its ids, or a dtype the format lacks; errors naming the path
// (base/file_io.h) when the file cannot be written, in which case nothing
// changed on disk.
absl::StatusOr<ChainLink> WriteChainLinkContent(
    const std::string& dir, const ChainLinkContent& content,
    const ChainWriteOptions& options = ChainWriteOptions());

// The links of `dir` by position (names only; nothing is read). A name that
// looks like a link but does not parse is DataLoss. A missing directory is an
// empty chain; one that cannot be read (permissions, I/O) is Internal.
absl::StatusOr<std::vector<ChainLink>> ListChain(const std::string& dir);

// Where the chain has holes or overlaps, one line each, e.g. "batches
// 40..59 missing between incr-...-40 and incr-60-..."; empty when sound. The
// chain starts at its newest full link, the one with the latest end batch:
// older links, and increments ending at or before it, are superseded (kept on
// disk, never applied).
std::vector<std::string> ChainProblems(const std::vector<ChainLink>& links);

// The links a load applies, in order: the newest full link, then the
// increments that end after it (all links when there is no full one).
std::vector<ChainLink> AppliedLinks(const std::vector<ChainLink>& links);

// What a link's file says beyond its name, read without its rows (only the
// first record is read and checked; VerifyChainLink checks the rest).
struct ChainLinkInfo {
  std::string consumer;
  int64_t written_unix_ms = 0;
  int64_t tables = 0;
  int64_t dense_parameters = 0;  // 0: the link carries none
  int64_t dense_batch = -1;      // the batch they were read at; -1: none
  // The trainer run that served the link; empty for a link written before
  // run ids (or from a service without them).
  std::string run_id;
  int64_t run_start_batch = 0;
};

// NotFound for a missing file; DataLoss when it is not a link, is truncated,
// fails its checksum or does not parse.
absl::StatusOr<ChainLinkInfo> ReadChainLinkInfo(const std::string& path);

// Checks everything LoadChain checks of one link, reading it through a small
// buffer (memory does not grow with its size): the framing, every record's
// checksum, that its tensors decode, and that it holds what its name says
// (kind and batches). OK when sound; NotFound for a missing file; DataLoss
// naming the path and the first problem otherwise.
absl::Status VerifyChainLink(const ChainLink& link);

struct LoadedChain {
  ChainTables tables;
  int64_t end_batch = 0;
  std::vector<ChainLink> links;  // those applied, in order
  // The dense parameters of the newest applied link that carried them, and
  // the batch they were read at (equal to end_batch when that link is the
  // last one); empty and -1 when no applied link carried any.
  DenseParameters dense;
  int64_t dense_batch = -1;
  // The run of the newest applied link (ChainLinkInfo::run_id).
  std::string run_id;
  int64_t run_start_batch = 0;
};

// Asked while a chain loads, from the loading thread: true ends the load
// (LoadChain). Empty: never.
using CancelLoad = std::function<bool()>;

// Applies the newest full link and every increment after it, in order, later
// rows replacing earlier ones. A full link's rows are read straight into
// their tensors (one copy of the rows in memory). Refuses to build a wrong
// table: FailedPrecondition for no full link, a missing, duplicated or
// overlapping increment (ChainProblems); DataLoss for a file whose checksums
// or contents do not verify or that holds other batches than its name says.
// `cancelled` is asked before every record is read (at most
// ChainWriteOptions::chunk_bytes, 64 MiB by default) and before every link
// is applied, so a load of any size ends within one record of its cancel:
// Cancelled, naming the link, and nothing loaded.
absl::StatusOr<LoadedChain> LoadChain(const std::string& dir,
                                      const CancelLoad& cancelled = {});

// Writes the loaded chain as one full link covering [0, end), keeping the
// newest dense parameters (with their batch) and the newest run, and deletes
// the links it replaces, superseded ones (before the newest full link)
// included; where the chain already loads from one full link, only those go.
// Errors as LoadChain and WriteChainLinkContent.
absl::StatusOr<ChainLink> CompactChain(const std::string& dir);

// Removes every link of `dir` that ends after `batch` (a trainer that
// restarted from `batch` lost those changes), newest first so that a crash
// midway leaves a chain ending earlier, never a hole. Returns the removed
// links in the order removed; an empty chain or none to remove is OK.
// DataLoss as ListChain; Internal, naming the file, when one cannot be
// removed.
absl::StatusOr<std::vector<ChainLink>> TruncateChainAfter(
    const std::string& dir, int64_t batch);

// `later`'s rows over `base`'s, per table (IDs ascending; a row in both takes
// `later`'s values). DataLoss, naming the table, when its rows have another
// width or type in `later` than in `base`.
absl::StatusOr<ChainTables> MergeTables(const ChainTables& base,
                                        const ChainTables& later);

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_CHECKPOINT_CHAIN_H_
