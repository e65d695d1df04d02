#ifndef DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_
#define DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/delta_client.h"

namespace deltastream {

// A chain of checkpoints in one directory: a full link (every row), then
// increments (the rows a consumer's read returned), each covering batches
// [start_batch, end_batch), the next starting where the previous ended.
//
// Files: "full-<start>-<end>.ckpt" and "incr-<start>-<end>.ckpt" (12-digit
// batch numbers, so names sort by position), each the 8 bytes "DSCHAIN1", the
// payload's size (uint64 little-endian), its CRC-32 (uint32 little-endian),
// then a serialized v1::CheckpointLink (proto/checkpoint.proto). Written to a
// temporary file, fsync'd and renamed: a crash leaves no torn link.
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

// Writes one read of a consumer as a link: full when `full` (a consumer's
// read from batch 0, or a compaction), else an increment. A "full" link holds
// every row changed since its start: rows never changed keep the values the
// trainer started with (its initial checkpoint holds them). Needs the delta's
// values (a tracker served by the trainer sends them). A consumer's first read
// (start_batch -1) starts at 0. FailedPrecondition when the service dropped
// rows the consumer had not read (resync_required: an increment would silently
// miss them) or a table has no values; InvalidArgument for an empty range;
// errors naming the path when the file cannot be written.
absl::StatusOr<ChainLink> WriteChainLink(const std::string& dir,
                                         const ReceivedDelta& delta,
                                         bool full = false);

// The links of `dir` by position (names only; nothing is read). A name that
// looks like a link but does not parse is DataLoss.
absl::StatusOr<std::vector<ChainLink>> ListChain(const std::string& dir);

// Where the chain has holes or overlaps, one line each, e.g. "batches
// 40..59 missing between incr-...-40 and incr-60-..."; empty when sound. The
// chain starts at its newest full link (older links are superseded).
std::vector<std::string> ChainProblems(const std::vector<ChainLink>& links);

struct LoadedChain {
  ChainTables tables;
  int64_t end_batch = 0;
  std::vector<ChainLink> links;  // those applied, in order
};

// Applies the newest full link and every increment after it, in order, later
// rows replacing earlier ones. Refuses to build a wrong table:
// FailedPrecondition for no full link, a missing, duplicated or overlapping
// increment (ChainProblems); DataLoss for a file whose checksum or contents
// do not verify.
absl::StatusOr<LoadedChain> LoadChain(const std::string& dir);

// Writes the loaded chain as one full link covering [0, end) and deletes the
// links it replaces. Errors as LoadChain and WriteChainLink.
absl::StatusOr<ChainLink> CompactChain(const std::string& dir);

// `later`'s rows over `base`'s, per table (IDs ascending; a row in both takes
// `later`'s values).
ChainTables MergeTables(const ChainTables& base, const ChainTables& later);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_
