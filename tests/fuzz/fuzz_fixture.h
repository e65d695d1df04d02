#ifndef DELTASTREAM_TESTS_FUZZ_FUZZ_FIXTURE_H_
#define DELTASTREAM_TESTS_FUZZ_FUZZ_FIXTURE_H_

// The service fuzzer's fixture: the tracker configurations an input picks,
// and a fresh tracker (with its live rows, snapshot database and authorizer
// as configured) behind the service behind an in-process server.

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/auth.h"
#include "tracker_service/delta_tracker_service.h"
#include "tracker_service/live_rows_reader.h"
#include "tracker_service/names.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"
#include "tracker_service/tracking_mode.h"

namespace deltastream {
namespace service_fuzz {

// Test tables "t0".."t7" have these dims.
inline constexpr int64_t kTableDims[8] = {4, 8, 1, 16, 64, 2, 3, 32};

// The dim of test table `fqn`, or -1 for any other name.
inline int64_t TableDim(absl::string_view fqn) {
  if (fqn.size() != 2 || fqn[0] != 't' || fqn[1] < '0' || fqn[1] > '7') {
    return -1;
  }
  return kTableDims[fqn[1] - '0'];
}

// A trainer's live rows, made up from the IDs: row `id` of a test table is
// ((id mod 97) / 4 + j * salt) for j < dim. Unknown tables are NotFound,
// negative IDs InvalidArgument, as a trainer's reader reports them.
class FakeLiveRows final : public LiveRowsReader {
 public:
  explicit FakeLiveRows(TrackingMode mode) : mode_(mode) {}

  absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                            const at::Tensor& ids) override {
    return Rows(fqn, ids, TableDim(fqn), 0.5);
  }

  absl::StatusOr<at::Tensor> ReadOptimizerStates(
      absl::string_view fqn, const at::Tensor& ids) override {
    const int64_t dim = TableDim(fqn);
    return Rows(fqn, ids,
                mode_ == TrackingMode::kRowwiseAdagrad && dim > 0 ? 1 : dim,
                0.125);
  }

 private:
  static absl::StatusOr<at::Tensor> Rows(absl::string_view fqn,
                                         const at::Tensor& ids, int64_t dim,
                                         double salt) {
    if (dim < 0) {
      return absl::NotFoundError(absl::StrCat("no table '", fqn, "'"));
    }
    if (!ids.defined() || ids.dim() != 1 || ids.scalar_type() != at::kLong) {
      return absl::InvalidArgumentError("IDs must be 1-D int64");
    }
    if ((ids < 0).any().item<bool>()) {
      return absl::InvalidArgumentError("negative ID");
    }
    return ids.remainder(97).to(at::kFloat).unsqueeze(1) * 0.25 +
           at::arange(dim, at::kFloat) * salt;
  }

  const TrackingMode mode_;
};

struct Config {
  TrackingMode mode;
  bool live_rows;  // a LiveRowsReader (inside a trainer) or none (sidecar)
  bool acknowledged_reads;
  bool delete_on_read;
  bool auto_compact;
  int64_t memory_cap_bytes;
  // A snapshot database (the Snapshot handler snapshots for real; after the
  // input, its state is snapshotted and restored into a fresh tracker, which
  // must then read like any other).
  bool database = false;
  // A token authorizer: each call carries the next of kTokens in turn, so
  // every role (and no or an unknown token) meets every handler.
  bool tokens = false;
};

// Memory caps are small: an input records at most kRowBudget rows (1 MiB of
// float states at dim 64) into fresh trackers, and the cap's compaction and
// drops should run.
inline constexpr Config kConfigs[8] = {
    {TrackingMode::kEmbedding, true, false, true, true, 768 << 10},
    {TrackingMode::kIdOnly, false, true, true, false, 16 << 10},
    {TrackingMode::kEmbedding, false, false, false, false, 512 << 10, true},
    {TrackingMode::kMomentumLast, false, false, true, true, 32 << 10},
    {TrackingMode::kMomentumDiff, true, true, true, false, 256 << 10},
    {TrackingMode::kRowwiseAdagrad, true, false, false, true, 64 << 10, false,
     true},
    {TrackingMode::kIdOnly, false, false, false, true, 8 << 10},
    {TrackingMode::kEmbedding, true, true, true, false, 0, true, true},
};

// The tokens file of configurations with `tokens`, and the tokens calls
// carry in turn (the last two: an unknown token, and none).
inline constexpr char kTokenFile[] =
    "admin-token-0123456789 admin\n"
    "producer-token-012345 producer\n"
    "consumer-token-012345 consumer a\n";
inline constexpr const char* kTokens[] = {
    "admin-token-0123456789", "producer-token-012345", "consumer-token-012345",
    "unknown-token-0123456", ""};

// A service that streams until stopped (Subscribe) has Stop(), to be called
// before the server shuts down; older ones have none.
template <typename S, typename = void>
struct HasStop : std::false_type {};
template <typename S>
struct HasStop<S, std::void_t<decltype(std::declval<S&>().Stop())>>
    : std::true_type {};

template <typename S>
void StopService(S& service) {
  if constexpr (HasStop<S>::value) service.Stop();
}

// A tracker behind the service behind an in-process server.
class Fixture {
 public:
  explicit Fixture(const Config& config) {
    if (config.live_rows) {
      live_rows_ = std::make_unique<FakeLiveRows>(config.mode);
    }
    TrackerOptions options;
    options.mode = config.mode;
    options.consumers = {"a", "b"};
    options.acknowledged_reads = config.acknowledged_reads;
    options.delete_on_read = config.delete_on_read;
    options.auto_compact = config.auto_compact;
    options.memory_cap_bytes = config.memory_cap_bytes;
    absl::StatusOr<std::unique_ptr<Tracker>> tracker =
        Tracker::Create(std::move(options), live_rows_.get());
    if (!tracker.ok()) {
      std::fprintf(stderr, "Tracker::Create: %s\n",
                   tracker.status().ToString().c_str());
      std::abort();
    }
    tracker_ = *std::move(tracker);
    options_ = config;
    ServiceOptions service_options;
    if (config.database) {
      char dir[] = "/tmp/service_fuzzer.XXXXXX";
      if (mkdtemp(dir) == nullptr) {
        std::fprintf(stderr, "mkdtemp failed\n");
        std::abort();
      }
      db_path_ = dir;
      snapshots_ = OpenSnapshots(tracker_.get());
      service_options.snapshots = snapshots_.get();
    }
    if (config.tokens) {
      absl::StatusOr<TokenAuthorizer> auth =
          TokenAuthorizer::Parse(kTokenFile, &ValidateName);
      if (!auth.ok()) std::abort();
      auth_ = std::make_unique<TokenAuthorizer>(*std::move(auth));
      service_options.auth = auth_.get();
    }
    service_ =
        std::make_unique<DeltaTrackerService>(tracker_.get(), service_options);
    grpc::ServerBuilder builder;
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) {
      std::fprintf(stderr, "cannot start the in-process server\n");
      std::abort();
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    stub_ =
        std::make_unique<grpc::GenericStub>(server_->InProcessChannel(args));
  }

  ~Fixture() {
    stub_.reset();
    StopService(*service_);
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
    server_->Wait();
    if (snapshots_ != nullptr) RestartFromSnapshot();
    if (!db_path_.empty()) std::filesystem::remove_all(db_path_);
  }

  grpc::GenericStub& stub() { return *stub_; }

  // The token the next call carries; empty: none (or no authorizer).
  std::string NextToken() {
    if (auth_ == nullptr) return "";
    return kTokens[next_token_++ % (sizeof(kTokens) / sizeof(kTokens[0]))];
  }

 private:
  std::unique_ptr<TrackerSnapshots> OpenSnapshots(Tracker* tracker) {
    absl::StatusOr<std::unique_ptr<TrackerSnapshots>> opened =
        TrackerSnapshots::Open(db_path_, tracker);
    if (!opened.ok()) {
      std::fprintf(stderr, "TrackerSnapshots::Open: %s\n",
                   opened.status().ToString().c_str());
      std::abort();
    }
    return *std::move(opened);
  }

  // What the input left, snapshotted and restored into a fresh tracker (a
  // restart): whatever the handlers accepted must survive it, and the
  // restored tracker must answer reads with statuses, never a crash. A
  // snapshot or restore may refuse (a status), but must not abort.
  void RestartFromSnapshot() {
    if (!snapshots_->Snapshot().ok()) return;
    snapshots_.reset();
    TrackerOptions options;
    options.mode = options_.mode;
    options.consumers = {"a", "b"};
    options.acknowledged_reads = options_.acknowledged_reads;
    options.delete_on_read = options_.delete_on_read;
    absl::StatusOr<std::unique_ptr<Tracker>> restarted =
        Tracker::Create(std::move(options), live_rows_.get());
    if (!restarted.ok()) std::abort();
    std::unique_ptr<TrackerSnapshots> reopened =
        OpenSnapshots(restarted->get());
    if (!reopened->Restore().ok()) return;
    for (const char* consumer : {"a", "b"}) {
      DeltaRequest request;
      request.consumer = consumer;
      request.include_scores = true;
      (*restarted)->GetDelta(request).status().IgnoreError();
    }
  }

  Config options_{};
  std::string db_path_;
  std::unique_ptr<TrackerSnapshots> snapshots_;
  std::unique_ptr<TokenAuthorizer> auth_;
  size_t next_token_ = 0;
  std::unique_ptr<FakeLiveRows> live_rows_;
  std::unique_ptr<Tracker> tracker_;
  std::unique_ptr<DeltaTrackerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

}  // namespace service_fuzz
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_FUZZ_FUZZ_FIXTURE_H_
