#ifndef DELTASTREAM_TRACKER_SERVICE_DELTA_TRACKER_SERVICE_H_
#define DELTASTREAM_TRACKER_SERVICE_DELTA_TRACKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "base/auth.h"
#include "base/grpc_server.h"
#include "proto/tracker.grpc.pb.h"
#include "tracker_service/service_topology.h"
#include "tracker_service/step_cuts.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"

namespace deltastream {

// Where a delta's chunks go (delta_tracker_service.cc).
class ChunkSink;

struct ServiceOptions {
  // Snapshot RPC and the status's snapshot fields; null: no database.
  TrackerSnapshots* snapshots = nullptr;
  // Null: every call is allowed (loopback or trusted networks only).
  const TokenAuthorizer* auth = nullptr;
  // A rank of a sharded trainer: reads naming a cut (GetDeltaRequest.cut)
  // wait for the step boundary where every rank serves it. Null: a cut is
  // read at once (one process). Not owned; outlives the service.
  StepCuts* step_cuts = nullptr;
  // Record and Step are served. False where the tracker's own process is its
  // one producer (a trainer): a Step from outside would split a training
  // step, and a Record would put rows no model looked up into every
  // consumer's delta; both are then FAILED_PRECONDITION, whatever the token.
  bool network_producers = true;
};

// The gRPC face of a Tracker: validates requests, translates them and the
// tracker's statuses, and streams deltas in chunks. It holds no semantics of
// its own. Embeds in any process (a trainer, or tracker_server).
//
// Reads cover closed batches only (DeltaRequest::through_current_batch is
// false): a producer records into the current batch and Step() closes it, so a
// consumer never sees half a step. Step() also triggers auto-compaction.
//
// Without acknowledged reads, a read's cursor moves before its chunks are
// sent; a read whose stream fails makes its consumer resync (its next read
// says resync_required). A consumer that needs at-least-once delivery across
// disconnects, without a resync, runs the tracker with acknowledged reads
// and commits.
//
// Every request is validated before it reaches the tracker (names by
// tracker_service/names.h; records with RecordTables' check_values;
// subscription periods by SubscriptionSchedule); with an authorizer, every
// call is authorized first (see base/auth.h for who may do what). No exception
// leaves a handler: LibTorch's errors become statuses (base/torch_status.h).
//
// Thread-safe: gRPC calls handlers concurrently; the tracker serialises them.
class DeltaTrackerService final : public v1::DeltaTracker::Service {
 public:
  static constexpr int64_t kDefaultChunkBytes = 1 << 20;
  // A dense parameter of up to this many bytes goes whole, in one chunk (a
  // client with gRPC's usual 64 MiB message limit reads it); a larger one in
  // pieces of the read's chunk bytes (v1::NamedTensor.piece_of).
  static constexpr int64_t kWholeDenseBytes = 32 << 20;
  // How long a read naming a cut waits for the other ranks when its call
  // has no deadline.
  static constexpr absl::Duration kCutWaitWithoutDeadline = absl::Seconds(30);

  // `tracker` and what `options` points to must outlive the service.
  explicit DeltaTrackerService(Tracker* tracker, ServiceOptions options = {});

  // GetDelta's index in the service's method table when it is served from the
  // delta's tensors (bytes out, no copy into protobuf messages), as it is
  // unless the generated service's table no longer matches proto/tracker.proto
  // (then -1, and GetDelta below serves it: the same messages, copied).
  int get_delta_method() const { return get_delta_method_; }

  // Ends running Subscribe calls (within 100 ms) so that the server can shut
  // down; call before grpc::Server::Shutdown.
  void Stop() { stopping_ = true; }

  // What Topology answers from now on, and which columns this rank's chunks
  // of a column-wise shard say they hold (DeltaChunk.col_offset, table_cols:
  // the shards of `topology.rank`). Before the first call Topology is
  // Unavailable. Thread-safe.
  void SetTopology(ServiceTopology topology) ABSL_LOCKS_EXCLUDED(topology_mu_);

  grpc::Status Record(grpc::ServerContext* context,
                      grpc::ServerReader<v1::RecordRequest>* reader,
                      v1::RecordResponse* response) override;
  grpc::Status Step(grpc::ServerContext* context,
                    const v1::StepRequest* request,
                    v1::StepResponse* response) override;
  grpc::Status GetDelta(grpc::ServerContext* context,
                        const v1::GetDeltaRequest* request,
                        grpc::ServerWriter<v1::DeltaChunk>* writer) override;
  grpc::Status Subscribe(grpc::ServerContext* context,
                         const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::DeltaChunk>* writer) override;
  grpc::Status Commit(grpc::ServerContext* context,
                      const v1::CommitRequest* request,
                      v1::CommitResponse* response) override;
  grpc::Status Touch(grpc::ServerContext* context,
                     const v1::ConsumerRequest* request,
                     v1::TouchResponse* response) override;
  grpc::Status ListConsumers(grpc::ServerContext* context,
                             const v1::ListConsumersRequest* request,
                             v1::ListConsumersResponse* response) override;
  grpc::Status AddConsumer(grpc::ServerContext* context,
                           const v1::ConsumerRequest* request,
                           v1::ListConsumersResponse* response) override;
  grpc::Status RemoveConsumer(grpc::ServerContext* context,
                              const v1::ConsumerRequest* request,
                              v1::ListConsumersResponse* response) override;
  grpc::Status Compact(grpc::ServerContext* context,
                       const v1::CompactRequest* request,
                       v1::StatusResponse* response) override;
  grpc::Status Clear(grpc::ServerContext* context,
                     const v1::ClearRequest* request,
                     v1::StatusResponse* response) override;
  grpc::Status Snapshot(grpc::ServerContext* context,
                        const v1::SnapshotRequest* request,
                        v1::SnapshotResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context,
                      const v1::StatusRequest* request,
                      v1::StatusResponse* response) override;
  grpc::Status Topology(grpc::ServerContext* context,
                        const v1::TopologyRequest* request,
                        v1::TopologyResponse* response) override;

 private:
  // A column-wise shard's columns (DeltaChunk.col_offset, table_cols); both
  // 0 for a table served at full width.
  struct Columns {
    int64_t offset = 0;
    int64_t table_cols = 0;
  };
  Columns ColumnsOf(const std::string& fqn) const
      ABSL_LOCKS_EXCLUDED(topology_mu_);

  grpc::Status Authorize(const grpc::ServerContext* context, Action action,
                         absl::string_view consumer = "") const;
  // A unary call acting as one consumer (Commit, Touch): Authorize's
  // kRead, then the consumer name rule (INVALID_ARGUMENT).
  grpc::Status AuthorizeConsumerCall(const grpc::ServerContext* context,
                                     absl::string_view consumer) const;
  // GetDelta as gRPC serves it: the chunks go out as bytes, each table's
  // rows sent from the delta's tensors without a copy into a message.
  grpc::Status StreamDelta(
      grpc::ServerContext* context,
      grpc::ServerSplitStreamer<v1::GetDeltaRequest, grpc::ByteBuffer>* stream);
  // The tracker's read of `read`, at `cut`'s step boundary when the
  // service has StepCuts and `cut` is nonzero (ServiceOptions::step_cuts).
  // With `fill`, a filling read (Tracker::GetDeltaFilling) whose copies
  // `*fill` follows.
  absl::StatusOr<Delta> ReadAtCut(grpc::ServerContext* context, int64_t cut,
                                  const DeltaRequest& read,
                                  std::unique_ptr<StatesFill>* fill);
  // Reads the delta `request` asks for and writes it to `sink`; with
  // `fill_while_sending`, sends the first rows while later states are still
  // being copied (a sink that sends rows from where they lie).
  grpc::Status ServeDelta(grpc::ServerContext* context,
                          const v1::GetDeltaRequest& request, ChunkSink& sink,
                          bool fill_while_sending);
  // Streams `delta` as `request` asks (WriteChunks); a stream that fails
  // without acknowledged reads makes the consumer resync
  // (Tracker::RequireResyncOf): its cursor moved past rows it never got.
  grpc::Status WriteDelta(grpc::ServerContext* context, const Delta& delta,
                          const v1::GetDeltaRequest& request, ChunkSink& sink,
                          StatesFill* fill);
  // `delta`'s chunks as `request` asks (chunk size, fields left out); the
  // last chunk has `last`. With `fill`, each chunk's rows once `fill` has
  // them.
  grpc::Status WriteChunks(grpc::ServerContext* context, const Delta& delta,
                           const v1::GetDeltaRequest& request, ChunkSink& sink,
                           StatesFill* fill);
  void FillStatus(v1::StatusResponse* response) const;

  Tracker* const tracker_;
  const ServiceOptions options_;
  std::atomic<bool> stopping_{false};
  mutable absl::Mutex topology_mu_;
  std::optional<v1::TopologyResponse> topology_ ABSL_GUARDED_BY(topology_mu_);
  absl::flat_hash_map<std::string, Columns> columns_
      ABSL_GUARDED_BY(topology_mu_);
  int get_delta_method_ = -1;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_DELTA_TRACKER_SERVICE_H_
