#ifndef DELTASTREAM_CLIENTS_FAN_IN_CLIENT_H_
#define DELTASTREAM_CLIENTS_FAN_IN_CLIENT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "clients/delta_client.h"
#include "proto/tracker.pb.h"

namespace deltastream {

// A client of a sharded trainer as one model (issue 16, "clients fan in"):
// given any rank's address it discovers every rank (the Topology RPC) and
// reads them all, returning one delta per table with global row IDs,
// ascending and each once, and full-width rows, as a one-process trainer
// serves them:
//   - row-wise, table-row-wise and table-wise shards: each rank's rows,
//     concatenated and sorted by ID (an ID two ranks serve is an error);
//   - column-wise shards: each rank's column block of the same IDs, joined by
//     ID into full rows; every block must carry the same IDs and together
//     the blocks must cover the table's columns (an error otherwise). A 2-D
//     `states` is joined like `values` (the tracked states of each block,
//     side by side in column order: for `rowwise_adagrad`, one column per
//     block); `scores` are the first block's;
//   - data-parallel tables (whole on every rank, equal after every step):
//     the union of the ranks' IDs, one row per ID (the lowest rank's).
// The header: end_batch is the minimum over the ranks and start_batch too;
// resync_required is true if any rank says so; lost_rows is the sum; the
// change times span all ranks; run_id joins the ranks' run ids (so a restart
// of any rank is a new run) and run_start_batch is the latest rank's. Dense
// parameters (include_dense) are rank 0's (data-parallel: equal on every
// rank).
//
// NOT one consistent cut: each rank's part ends at that rank's own batch
// (the ranks step together, so they differ by at most the batch in flight);
// end_batch is the earliest, so rows of a later batch may be in the delta
// already, which a consumer re-reading from end_batch rewrites with the same
// or newer values. A cut where every rank ends at the same batch is future
// work. Top-k reads pick each rank's own top k: a column-wise table's blocks
// may then disagree on IDs (an error).
//
// With a world size of 1 (a one-process trainer, tracker_server) it behaves
// as a DeltaClient of `target`: reads and commits pass through unchanged.
//
// Thread-safe: calls may run concurrently.
class FanInClient {
 public:
  // Asks `target` (any rank) for the topology and makes a DeltaClient of
  // every rank's endpoint (of `target` itself for the rank answering). The
  // Topology call's error (UNAVAILABLE when unreachable); InvalidArgument
  // when the topology is malformed (no ranks, an endpoint missing).
  static absl::StatusOr<std::unique_ptr<FanInClient>> Create(
      const std::string& target, ClientOptions options = {});

  // Sends `request` to every rank at once and merges the answers (see the
  // class comment). The first rank's error, naming the rank, when a read
  // fails; DataLoss, naming the table, when the parts do not fit together.
  // In acknowledged mode every rank's read is pending until Commit.
  absl::StatusOr<ReceivedDelta> GetDelta(const v1::GetDeltaRequest& request);

  // Commits `end_batch` (a merged delta's) on every rank: each rank gets the
  // end of its own part of that read (remembered for the newest 64 reads of
  // each consumer), or `end_batch` itself for a read this client did not
  // make. OK when every rank accepts; otherwise the first error, naming the
  // rank (the other ranks' commits stand).
  absl::Status Commit(const std::string& consumer, int64_t end_batch);

  int world_size() const { return static_cast<int>(ranks_.size()); }
  // The topology `target` answered at Create.
  const v1::TopologyResponse& topology() const { return topology_; }
  // Rank r's client (0 <= r < world_size()); owned by this client.
  DeltaClient& rank(int r) const { return *ranks_[r]; }

 private:
  FanInClient(v1::TopologyResponse topology,
              std::vector<std::unique_ptr<DeltaClient>> ranks);

  // The ends of each rank's part of one merged read.
  struct RankEnds {
    int64_t end_batch = 0;
    std::vector<int64_t> ends;
  };

  const v1::TopologyResponse topology_;
  const std::vector<std::unique_ptr<DeltaClient>> ranks_;
  absl::Mutex mu_;
  // By consumer, oldest first; at most 64 each.
  absl::flat_hash_map<std::string, std::deque<RankEnds>> reads_
      ABSL_GUARDED_BY(mu_);
};

// Merges one read's parts, one per rank in rank order, as FanInClient does
// (its class comment), with `topology` saying which tables are
// data-parallel. DataLoss, naming the table, when the parts do not fit.
// Exposed for tests; `parts` are consumed.
absl::StatusOr<ReceivedDelta> MergeRankDeltas(
    const v1::TopologyResponse& topology, std::vector<ReceivedDelta> parts);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_FAN_IN_CLIENT_H_
