#ifndef DELTASTREAM_TRACKER_SERVICE_DELTA_TRACKER_SERVICE_H_
#define DELTASTREAM_TRACKER_SERVICE_DELTA_TRACKER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "proto/tracker.grpc.pb.h"
#include "tracker_service/tracker.h"

namespace deltastream {

// The gRPC face of a Tracker: validates requests, translates them and the
// tracker's statuses, and streams deltas in chunks. It holds no semantics of
// its own. Embeds in any process (a trainer, or tracker_server).
//
// Reads cover closed batches only (DeltaRequest::through_current_batch is
// false): a producer records into the current batch and Step() closes it, so a
// consumer never sees half a step. Step() also triggers auto-compaction.
//
// Without acknowledged reads, a read's cursor moves before its chunks are
// sent: a consumer that needs at-least-once delivery across disconnects runs
// the tracker with acknowledged reads and commits.
//
// Thread-safe: gRPC calls handlers concurrently; the tracker serialises them.
class DeltaTrackerService final : public v1::DeltaTracker::Service {
 public:
  static constexpr int64_t kDefaultChunkBytes = 1 << 20;
  static constexpr size_t kMaxNameBytes = 256;

  // `tracker` must outlive the service.
  explicit DeltaTrackerService(Tracker* tracker) : tracker_(tracker) {}

  grpc::Status Record(grpc::ServerContext* context,
                      grpc::ServerReader<v1::RecordRequest>* reader,
                      v1::RecordResponse* response) override;
  grpc::Status Step(grpc::ServerContext* context,
                    const v1::StepRequest* request,
                    v1::StepResponse* response) override;
  grpc::Status GetDelta(grpc::ServerContext* context,
                        const v1::GetDeltaRequest* request,
                        grpc::ServerWriter<v1::DeltaChunk>* writer) override;
  grpc::Status Commit(grpc::ServerContext* context,
                      const v1::CommitRequest* request,
                      v1::CommitResponse* response) override;
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
  grpc::Status Status(grpc::ServerContext* context,
                      const v1::StatusRequest* request,
                      v1::StatusResponse* response) override;

 private:
  void FillStatus(v1::StatusResponse* response) const;

  Tracker* const tracker_;
};

// absl::Status to grpc::Status (the codes share their numbers).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_DELTA_TRACKER_SERVICE_H_
