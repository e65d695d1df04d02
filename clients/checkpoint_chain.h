#ifndef DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_
#define DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/delta_client.h"

namespace deltastream {

// A chain of checkpoints in one directory: a full link (every row of every
// table at its end batch), then increments (the rows a consumer's read
// returned), each covering batches [start_batch, end_batch), the next
// starting where the previous ended. Links may also carry the model's dense
// parameters and name the trainer run that served them.
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

// A model's dense parameters by name, in the model's order.
using DenseParameters = std::vector<std::pair<std::string, at::Tensor>>;

// Writes one read of a consumer as a link. An all_rows read
// (header.all_rows) makes a full link covering [0, end_batch), whatever the
// read's start; any other read an increment covering [start_batch, end_batch)
// (a consumer's first read, start_batch -1, starts at 0). The delta's dense
// parameters (if any) are stored as read at end_batch, with its run_id and
// run_start_batch. Needs the delta's values (a tracker served by the trainer
// sends them). FailedPrecondition for an increment from a read whose service
// dropped rows the consumer had not read (resync_required: it would silently
// miss them; an all_rows read is whole and is written) or a table without
// values; InvalidArgument for an empty range; errors naming the path when the
// file cannot be written.
absl::StatusOr<ChainLink> WriteChainLink(const std::string& dir,
                                         const ReceivedDelta& delta);

// The links of `dir` by position (names only; nothing is read). A name that
// looks like a link but does not parse is DataLoss. A missing directory is an
// empty chain.
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

// What a link's file says beyond its name, read without its rows (fields are
// skipped, not decoded, and the checksum is not verified: LoadChain does).
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

// NotFound for a missing file; DataLoss when it is not a link, is truncated
// or does not parse.
absl::StatusOr<ChainLinkInfo> ReadChainLinkInfo(const std::string& path);

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

// Applies the newest full link and every increment after it, in order, later
// rows replacing earlier ones. Refuses to build a wrong table:
// FailedPrecondition for no full link, a missing, duplicated or overlapping
// increment (ChainProblems); DataLoss for a file whose checksum or contents
// do not verify.
absl::StatusOr<LoadedChain> LoadChain(const std::string& dir);

// Writes the loaded chain as one full link covering [0, end), keeping the
// newest dense parameters (with their batch) and the newest run, and deletes
// the links it replaces. Errors as LoadChain and WriteChainLink.
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
// `later`'s values).
ChainTables MergeTables(const ChainTables& base, const ChainTables& later);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_
