#ifndef DELTASTREAM_CLIENTS_FAN_IN_CLIENT_H_
#define DELTASTREAM_CLIENTS_FAN_IN_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
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
//
// Every read is one consistent cut: it names a fresh cut id
// (GetDeltaRequest.cut) on every rank, and the ranks serve their parts at the
// same step boundary, holding there until all parts are read
// (trainer/cut_agreement.h): every part ends at the same end_batch, the
// values are the tables after that step, and the dense parameters
// (include_dense, rank 0's: data-parallel, equal on every rank) are that
// step's. A commit of end_batch then reaches every rank as it is. The
// merged header: resync_required if any rank says so (and, without rows,
// when a column-wise table's blocks carry other IDs because the ranks'
// parts start at different batches: cursors restored from snapshots of
// different steps), start_batch the latest rank's (the batches every
// part covers: a rank whose cursor moved on a read the consumer never got
// starts later, and the consumer sees the gap), lost_rows summed, the
// change times spanning all ranks, run_id joining the ranks' (a restart of
// any rank is a new run), run_start_batch the latest rank's.
//
// Subscribe with several ranks polls: reads at the subscription's schedule
// (base/subscription_schedule.h, as the server's Subscribe), the tracker's
// batch from rank 0's status (every 10 ms while a push waits). As the
// server's Subscribe, while a push waits it keeps the consumer in contact on
// every rank every second (consumer expiry: a schedule longer than the
// ranks' expiry keeps its consumer), and a consumer removed from any rank,
// or expired there, ends it within about a second, NotFound naming the rank
// and the consumer, not at the next push, which may be hours away.
// Status merges every rank's (current_batch the lowest; sizes summed; per
// consumer the lowest cursor and the highest, the largest lag, a resync any
// rank asks for); consumers are added, removed and cleared on every rank;
// Snapshot and Compact run on every rank (rank 0's answer).
//
// The ranks are discovered at the first call and again after a rank was
// unreachable or a read came from another run (a restarted group may have
// moved), so a client outlives trainer restarts. With a world size of 1 (a
// one-process trainer, tracker_server) every call passes through to a
// DeltaClient of `target` unchanged.
//
// Thread-safe: calls may run concurrently.
class FanInClient final : public TrackerClient {
 public:
  // Contacts nothing yet: the first call discovers the ranks.
  static std::unique_ptr<FanInClient> Connect(const std::string& target,
                                              ClientOptions options = {});
  // Connect, then discovers the ranks at once: the Topology call's error
  // (UNAVAILABLE when unreachable); InvalidArgument when the topology is
  // malformed (no ranks, an endpoint missing).
  static absl::StatusOr<std::unique_ptr<FanInClient>> Create(
      const std::string& target, ClientOptions options = {});

  // Sends `request` to every rank at once, at one cut, and merges the
  // answers (see the class comment). The ranks' streams are all read on the
  // calling thread (DeltaClient::GetDeltaFromEach). The error of the first
  // rank whose read fails, naming the rank (the other ranks' reads are
  // cancelled then); DataLoss, naming the table, when the parts do not fit
  // together; Aborted when the parts end at different batches (a trainer
  // without consistent cuts).
  absl::StatusOr<ReceivedDelta> GetDelta(
      const v1::GetDeltaRequest& request,
      const CallCanceller* cancel = nullptr) override;
  absl::Status Subscribe(const v1::SubscribeRequest& request,
                         const std::function<bool(ReceivedDelta&&)>& on_delta,
                         CallCanceller* subscription = nullptr) override;
  // Commits `end_batch` on every rank. OK when every rank accepts;
  // otherwise the first error, naming the rank (the other ranks' commits
  // stand).
  absl::Status Commit(const std::string& consumer, int64_t end_batch) override;
  // Touches `consumer` on every rank: OK when every rank has it; otherwise
  // the first rank's error, naming the rank.
  absl::Status Touch(const std::string& consumer,
                     const CallCanceller* cancel = nullptr) override;
  // Rank 0's list.
  absl::StatusOr<std::vector<std::string>> ListConsumers() override;
  // On every rank; AlreadyExists (NotFound) only when every rank says so.
  absl::StatusOr<std::vector<std::string>> AddConsumer(
      const std::string& consumer) override;
  absl::StatusOr<std::vector<std::string>> RemoveConsumer(
      const std::string& consumer) override;
  absl::StatusOr<v1::StatusResponse> Compact() override;
  absl::StatusOr<v1::StatusResponse> Clear(
      const std::string& consumer) override;
  absl::StatusOr<v1::StatusResponse> Status() override;
  absl::StatusOr<v1::TopologyResponse> Topology() override;
  absl::StatusOr<v1::SnapshotInfo> Snapshot() override;
  const std::string& target() const override { return target_; }

  // The ranks' number, discovering them when needed.
  absl::StatusOr<int> WorldSize();

 private:
  // The ranks as discovered: the topology and a client of every rank (of
  // `target` itself for the rank that answered).
  struct Ranks {
    v1::TopologyResponse topology;
    std::vector<std::unique_ptr<DeltaClient>> clients;
  };

  FanInClient(std::string target, ClientOptions options);

  // The current ranks, discovering them first when none are known.
  absl::StatusOr<std::shared_ptr<const Ranks>> CurrentRanks()
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `ranks` (when still current), so the next call rediscovers.
  void Forget(const std::shared_ptr<const Ranks>& ranks)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `status` of rank `rank`, named so; forgets the ranks when it says a
  // rank is unreachable.
  absl::Status RankError(const std::shared_ptr<const Ranks>& ranks, int rank,
                         const absl::Status& status);
  // One read at one cut on every rank (several ranks).
  absl::StatusOr<ReceivedDelta> ReadAtCut(
      const std::shared_ptr<const Ranks>& ranks,
      const v1::GetDeltaRequest& request, const CallCanceller* cancel);
  // `call` (AddConsumer or RemoveConsumer) on every rank: `benign`
  // (AlreadyExists, NotFound) from some ranks is what an earlier, partly
  // failed call left, and is passed over; from every rank it is the answer.
  // Otherwise the first other error, naming its rank, or the list of the
  // first rank that answered with one.
  absl::StatusOr<std::vector<std::string>> ChangeConsumers(
      const std::function<
          absl::StatusOr<std::vector<std::string>>(DeltaClient&)>& call,
      absl::StatusCode benign);
  // `call` on every rank, the answers merged (Status, Compact, Clear).
  absl::StatusOr<v1::StatusResponse> MergedStatus(
      const std::function<absl::StatusOr<v1::StatusResponse>(DeltaClient&)>&
          call);
  // Touch on each of `ranks`; the first error as RankError gives it.
  absl::Status TouchEveryRank(const std::shared_ptr<const Ranks>& ranks,
                              const std::string& consumer,
                              const CallCanceller* cancel);
  // Subscribe of several ranks (the class comment).
  absl::Status PollingSubscribe(
      const std::shared_ptr<const Ranks>& ranks,
      const v1::SubscribeRequest& request,
      const std::function<bool(ReceivedDelta&&)>& on_delta,
      CallCanceller& subscription);

  const std::string target_;
  const ClientOptions options_;
  absl::Mutex mu_;
  std::shared_ptr<const Ranks> ranks_ ABSL_GUARDED_BY(mu_);
  // The run id of the last merged read (a change: rediscover).
  std::string last_run_id_ ABSL_GUARDED_BY(mu_);
};

// Merges one read's parts, one per rank in rank order, as FanInClient does
// (its class comment), with `topology` saying which tables are
// data-parallel. DataLoss, naming the table, when the parts do not fit.
// Exposed for tests; `parts` are consumed.
absl::StatusOr<ReceivedDelta> MergeRankDeltas(
    const v1::TopologyResponse& topology, std::vector<ReceivedDelta> parts);

// Every rank's status as one, in rank order, as FanInClient::Status merges
// them (its class comment; per consumer also the highest cursor). Exposed
// for tests; `statuses` (at least one) are consumed.
v1::StatusResponse MergeStatuses(std::vector<v1::StatusResponse> statuses);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_FAN_IN_CLIENT_H_
