#ifndef DELTASTREAM_CLIENTS_DELTA_CLIENT_H_
#define DELTASTREAM_CLIENTS_DELTA_CLIENT_H_

#include <ATen/core/Tensor.h>
#include <grpcpp/grpcpp.h>

#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/tracker.grpc.pb.h"

namespace deltastream {

// One table's rows of a delta, reassembled from its chunks; host tensors, row
// i for ids[i]; undefined where the server's mode provides none.
struct ReceivedTable {
  at::Tensor ids;     // int64 [n], ascending
  at::Tensor states;  // [n, ...]
  at::Tensor values;  // [n, dim]
  at::Tensor scores;  // float [n]
  // The columns `values` holds: [col_offset, col_offset + width) of a table
  // `table_cols` wide (DeltaChunk.col_offset / table_cols): a column-wise
  // shard of a sharded trainer. table_cols 0: the full width.
  int64_t col_offset = 0;
  int64_t table_cols = 0;
  // AddDeltaChunk's bookkeeping: how many rows of ids, states, values and
  // scores arrived, in order from row 0. A delta must cover every row of
  // each tensor it sends (rows left out would be read uninitialised).
  std::array<int64_t, 4> rows_received{};
};

struct ReceivedDelta {
  v1::DeltaHeader header;
  std::map<std::string, ReceivedTable> tables;
  // The model's dense parameters at header.end_batch, in the model's order,
  // when the read asked for them (include_dense); empty otherwise.
  std::vector<std::pair<std::string, at::Tensor>> dense;
  // AddDeltaChunk's bookkeeping while the last dense parameter comes in
  // pieces (v1::NamedTensor.piece_of): how many of its elements arrived; 0
  // once it is whole.
  int64_t dense_elements_received = 0;
};

// Adds one serialized v1::DeltaChunk (a GetDelta or Subscribe message) to
// `delta`; `*last` says whether it ends the delta. Parsed by hand so that rows
// are copied once, from gRPC's buffers straight into the tables, instead of
// into the message's strings first (stream_bench: 44% -> 80-100% of a bare
// stream). Needs the table's name and row range (fields 2-4) before its
// tensors (5-8), as protobuf writes them, and each table's rows in order:
// every tensor's rows from row 0 on, all of them by the last chunk. DataLoss,
// naming what is wrong, for malformed bytes, rows out of order, or a delta
// that ends without some; `delta` may then hold part of the chunk.
absl::Status AddDeltaChunk(grpc::ByteBuffer& buffer, ReceivedDelta& delta,
                           bool* last);

// Rows to record for one table.
struct RecordTable {
  std::string fqn;
  at::Tensor ids;
  at::Tensor states;  // optional
};

struct ClientOptions {
  // Per-call deadline for unary calls; streams get `stream_timeout`.
  std::chrono::milliseconds timeout{10000};
  std::chrono::milliseconds stream_timeout{600000};
  // GetDelta and GetDeltaFromEach: a stream that has received nothing for
  // this long is taken for a hung server (a trainer or rank stuck, or ranks
  // stalled behind one) and the read fails, DeadlineExceeded naming it,
  // instead of waiting out `stream_timeout`. (A stopped process or a dead
  // host is found by the keepalive pings below, as Unavailable.) Longer than a
  // step of the trainer: a read of a cut waits for the next step boundary
  // before its first chunk.
  std::chrono::milliseconds stream_idle_timeout{60000};
  // While a call is open, the channel pings the server every
  // `keepalive_time` and drops the connection when a ping has no answer
  // within `keepalive_timeout`: a subscription (which may rightly be
  // silent for as long as the trainer does not step) to a server whose host
  // died or was cut off (no FIN, no RST) or that is stopped fails as
  // Unavailable, and the caller reconnects, instead of waiting forever.
  // Servers of this project (base/grpc_server.h) accept pings every
  // kMinPingIntervalMs; a smaller keepalive_time gets the connection closed.
  std::chrono::milliseconds keepalive_time{20000};
  std::chrono::milliseconds keepalive_timeout{20000};
  int max_receive_message_bytes = 64 << 20;
  // A record's tables go in one message, all or nothing, up to this many
  // bytes; a larger table is sent in slices of rows, each its own message
  // (all or nothing per slice), so records of any size fit the server's limit.
  int64_t record_message_bytes = 2 << 20;
  // Sent as "authorization: Bearer <token>" on every call; empty: none.
  std::string auth_token;
  // PEM root certificates to verify the server with: non-empty means TLS.
  std::string tls_root_certs_pem;
  // How long the channel waits, at most, before it tries to connect again
  // after failing to (gRPC's backoff starts at 100 ms here and grows to this).
  // gRPC's own default grows to 120 s, so a client retrying a restarted
  // trainer every second would fail fast for seconds after it is back.
  std::chrono::milliseconds max_reconnect_backoff{1000};
};

// Fills `options` from the credential files the CLI, the predictor and the
// checkpoint job take: `token_file`'s first line (whitespace trimmed) as the
// bearer token, `tls_ca_file` as the PEM roots. An empty path leaves its
// field alone. The OS's error, naming the file, when one cannot be read;
// InvalidArgument, naming it, for a token CheckToken (base/auth.h) refuses
// or roots that hold no PEM certificate.
absl::Status ReadCredentialFiles(const std::string& token_file,
                                 const std::string& tls_ca_file,
                                 ClientOptions& options);

// Lets another thread end a running Subscribe (DeltaClient's stream, or
// FanInClient's polling) or GetDelta (within 100 ms: Cancelled). Thread-safe.
class CallCanceller {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // Sleeps `duration` unless cancelled meanwhile; false when cancelled.
  bool Sleep(absl::Duration duration) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class DeltaClient;
  grpc::ClientContext context_;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// What consumers (the predictor, the checkpoint job, deltactl) use of a
// trainer's tracker: one server (DeltaClient) or every rank of a sharded
// trainer as one model (FanInClient, clients/fan_in_client.h). Errors are
// the server's status codes with a message naming the target (and the rank);
// UNAVAILABLE when unreachable. Thread-safe: calls may run concurrently.
class TrackerClient {
 public:
  virtual ~TrackerClient() = default;

  // Reads `request`. Cancelled when `cancel` (not owned; may be null) is
  // cancelled before the read ends: nothing of it is kept.
  virtual absl::StatusOr<ReceivedDelta> GetDelta(
      const v1::GetDeltaRequest& request,
      const CallCanceller* cancel = nullptr) = 0;
  // Receives the subscription's deltas, each whole, until `on_delta` returns
  // false or `subscription` is cancelled (both: OK), or the stream fails. No
  // deadline.
  virtual absl::Status Subscribe(
      const v1::SubscribeRequest& request,
      const std::function<bool(ReceivedDelta&&)>& on_delta,
      CallCanceller* subscription = nullptr) = 0;
  virtual absl::Status Commit(const std::string& consumer,
                              int64_t end_batch) = 0;
  // Keeps `consumer` from expiring on the tracker, reading and moving
  // nothing (Touch in proto/tracker.proto): for a consumer busy elsewhere
  // longer than the tracker's consumer expiry. NotFound when the tracker
  // has no such consumer (removed, or expired already). Cancelled within
  // 100 ms when `cancel` (not owned; may be null) is cancelled first.
  virtual absl::Status Touch(const std::string& consumer,
                             const CallCanceller* cancel = nullptr) = 0;
  virtual absl::StatusOr<std::vector<std::string>> ListConsumers() = 0;
  virtual absl::StatusOr<std::vector<std::string>> AddConsumer(
      const std::string& consumer) = 0;
  virtual absl::StatusOr<std::vector<std::string>> RemoveConsumer(
      const std::string& consumer) = 0;
  virtual absl::StatusOr<v1::StatusResponse> Compact() = 0;
  // Clears one consumer, or everything when `consumer` is empty.
  virtual absl::StatusOr<v1::StatusResponse> Clear(
      const std::string& consumer) = 0;
  virtual absl::StatusOr<v1::StatusResponse> Status() = 0;
  // The serving trainer's ranks: world size, every rank's endpoint, every
  // shard of every tracked table (a one-process trainer or tracker_server:
  // world size 1).
  virtual absl::StatusOr<v1::TopologyResponse> Topology() = 0;
  // Writes a snapshot on the server (every rank) now.
  virtual absl::StatusOr<v1::SnapshotInfo> Snapshot() = 0;

  // The address this client was given.
  virtual const std::string& target() const = 0;
};

// A client of one tracker server (DeltaTracker service). The CLI, the
// predictor and the checkpoint job all use it. Errors are the server's status
// codes with a message naming the target; UNAVAILABLE when unreachable.
// Thread-safe: calls may run concurrently.
class DeltaClient final : public TrackerClient {
 public:
  // Does not connect yet: the first call does.
  static std::unique_ptr<DeltaClient> Create(const std::string& target,
                                             ClientOptions options = {});

  // Records each element (one lookup per table) on one stream: all or nothing
  // per message (see ClientOptions::record_message_bytes). Returns the batch
  // they went to.
  absl::StatusOr<int64_t> Record(
      const std::vector<std::vector<RecordTable>>& records);
  // Closes the current batch; returns the new one.
  absl::StatusOr<int64_t> Step();

  // GetDeltaFromEach of this one client.
  absl::StatusOr<ReceivedDelta> GetDelta(
      const v1::GetDeltaRequest& request,
      const CallCanceller* cancel = nullptr) override;
  // Reads `request` from every one of `clients` at once, as GetDelta reads
  // from one, all on the calling thread (one completion queue drives every
  // stream: no thread per client). The deltas in the order of `clients`; or
  // the error of the first read to fail, as GetDelta would return it, with
  // `*failed` (when not null) set to that client's index: the other reads
  // are cancelled then, and this returns once every stream has ended. A
  // stream idle for its client's `stream_idle_timeout` fails the read so,
  // and `cancel` (when not null) cancelled: Cancelled within 100 ms.
  // `clients` are not owned and must outlive the call.
  static absl::StatusOr<std::vector<ReceivedDelta>> GetDeltaFromEach(
      absl::Span<DeltaClient* const> clients,
      const v1::GetDeltaRequest& request, size_t* failed = nullptr,
      const CallCanceller* cancel = nullptr);
  absl::Status Subscribe(const v1::SubscribeRequest& request,
                         const std::function<bool(ReceivedDelta&&)>& on_delta,
                         CallCanceller* subscription = nullptr) override;
  absl::Status Commit(const std::string& consumer, int64_t end_batch) override;
  absl::Status Touch(const std::string& consumer,
                     const CallCanceller* cancel = nullptr) override;
  absl::StatusOr<std::vector<std::string>> ListConsumers() override;
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

 private:
  DeltaClient(std::string target, ClientOptions options,
              std::shared_ptr<grpc::Channel> channel);
  // Sets the call's deadline (unless `stream` is a subscription) and token.
  enum class CallKind { kUnary, kStream, kSubscription };
  void Prepare(grpc::ClientContext& context, CallKind kind) const;
  // One unary call with the unary deadline; the server's status on failure.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (v1::DeltaTracker::Stub::*method)(grpc::ClientContext*,
                                                     const Request&, Response*),
      const Request& request);
  absl::Status ToStatus(const grpc::Status& status) const;
  // A subscription's stream of DeltaChunks as raw bytes (decoded by hand,
  // see .cc).
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> ReadSubscription(
      grpc::ClientContext* context, const v1::SubscribeRequest& request);

  const std::string target_;
  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DeltaTracker::Stub> stub_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_DELTA_CLIENT_H_
