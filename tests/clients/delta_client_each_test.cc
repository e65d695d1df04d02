// DeltaClient::GetDeltaFromEach against real tracker services on loopback:
// one read of several servers on the calling thread gives each server's
// delta as GetDelta does, chunk for chunk; the first read to fail names its
// server and cancels the others (a read waiting for a consistent cut that
// will never come is not waited for, and the server withdraws that cut); a
// stream that sends nothing for its idle timeout fails the read so, and so
// does GetDelta's read of one server; a stream that ends OK before its
// delta's last chunk is DataLoss.

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/grpc_server.h"
#include "clients/delta_client.h"
#include "tracker_service/delta_tracker_service.h"
#include "tracker_service/step_cuts.h"
#include "tracker_service/tracker.h"

namespace deltastream {
namespace {

constexpr char kTable[] = "t";
// Nothing listens on port 1 of loopback: calls fail at once, UNAVAILABLE.
constexpr char kNobody[] = "127.0.0.1:1";

// A tracker served on loopback, its reads of cuts waiting on `cuts` when
// given.
class Served {
 public:
  explicit Served(StepCuts* cuts = nullptr) {
    TrackerOptions options;
    options.mode = TrackingMode::kEmbedding;
    options.consumers = {"each", "one"};
    absl::StatusOr<std::unique_ptr<Tracker>> tracker = Tracker::Create(options);
    EXPECT_TRUE(tracker.ok()) << tracker.status();
    tracker_ = *std::move(tracker);
    ServiceOptions service_options;
    service_options.step_cuts = cuts;
    service_ =
        std::make_unique<DeltaTrackerService>(tracker_.get(), service_options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    absl::StatusOr<StartedServer> started =
        StartServer(builder, "127.0.0.1:0", grpc::InsecureServerCredentials());
    EXPECT_TRUE(started.ok()) << started.status();
    started_ = *std::move(started);
    client_ = DeltaClient::Create(started_.address);
  }
  ~Served() { started_.server->Shutdown(); }

  // Records `batches` batches of `rows` random IDs below `ids` with 3-wide
  // states.
  void Record(int batches, int64_t rows, int64_t ids) {
    for (int b = 0; b < batches; ++b) {
      ASSERT_TRUE(
          tracker_
              ->RecordTables({{kTable, at::randint(ids, {rows}, at::kLong),
                               at::randn({rows, 3})}})
              .ok());
      tracker_->Step();
    }
  }

  DeltaClient* client() const { return client_.get(); }
  const std::string& address() const { return started_.address; }

 private:
  std::unique_ptr<Tracker> tracker_;
  std::unique_ptr<DeltaTrackerService> service_;
  StartedServer started_;
  std::unique_ptr<DeltaClient> client_;
};

v1::GetDeltaRequest Read(const std::string& consumer) {
  v1::GetDeltaRequest read;
  read.set_consumer(consumer);
  read.set_max_chunk_bytes(1000);  // several chunks per delta
  return read;
}

TEST(GetDeltaFromEachTest, ReadsEveryServerAsGetDeltaDoes) {
  at::manual_seed(3);
  Served a, b;
  a.Record(2, 500, 800);
  b.Record(3, 300, 5000);
  absl::StatusOr<std::vector<ReceivedDelta>> each =
      DeltaClient::GetDeltaFromEach({a.client(), b.client()}, Read("each"));
  ASSERT_TRUE(each.ok()) << each.status();
  ASSERT_EQ(each->size(), 2u);
  const Served* served[] = {&a, &b};
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<ReceivedDelta> one =
        served[s]->client()->GetDelta(Read("one"));
    ASSERT_TRUE(one.ok()) << one.status();
    const ReceivedDelta& got = (*each)[s];
    EXPECT_EQ(got.header.end_batch(), one->header.end_batch()) << s;
    EXPECT_EQ(got.header.start_batch(), one->header.start_batch()) << s;
    ASSERT_EQ(got.tables.count(kTable), 1u) << s;
    const ReceivedTable& table = got.tables.at(kTable);
    const ReceivedTable& expected = one->tables.at(kTable);
    EXPECT_GT(table.ids.numel(), 100) << s;
    EXPECT_TRUE(table.ids.equal(expected.ids)) << s;
    EXPECT_TRUE(table.states.equal(expected.states)) << s;
  }
  EXPECT_EQ((*each)[0].header.end_batch(), 2);
  EXPECT_EQ((*each)[1].header.end_batch(), 3);

  absl::StatusOr<std::vector<ReceivedDelta>> none =
      DeltaClient::GetDeltaFromEach({}, Read("each"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
}

TEST(GetDeltaFromEachTest, FirstFailureNamesItsServerAndCancelsTheOthers) {
  // Server a's trainer steps and never opens a cut: its read of one waits
  // (30 s without a deadline) unless cancelled.
  StepCuts cuts(/*stepping=*/true);
  Served a(&cuts);
  a.Record(1, 10, 100);
  std::unique_ptr<DeltaClient> nobody = DeltaClient::Create(kNobody);
  v1::GetDeltaRequest read = Read("each");
  read.set_cut(42);
  for (const bool nobody_first : {false, true}) {
    const std::vector<DeltaClient*> clients =
        nobody_first ? std::vector<DeltaClient*>{nobody.get(), a.client()}
                     : std::vector<DeltaClient*>{a.client(), nobody.get()};
    size_t failed = 99;
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<ReceivedDelta>> each =
        DeltaClient::GetDeltaFromEach(clients, read, &failed);
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    EXPECT_EQ(each.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(each.status().message().find(kNobody), std::string::npos)
        << each.status();
    EXPECT_EQ(failed, nobody_first ? 0u : 1u);
    // The cancelled read's handler on a notices the cancel and withdraws
    // its cut (it no longer waits out the deadline).
    const absl::Time cancelled = absl::Now();
    while (!cuts.Waiting().empty() &&
           absl::Now() - cancelled < absl::Seconds(10)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(cuts.Waiting().empty()) << "cut " << read.cut();
    read.set_cut(read.cut() + 1);
  }
}

constexpr absl::Duration kIdleTimeout = absl::Milliseconds(300);

// A client of `address` whose reads give up after kIdleTimeout of silence.
std::unique_ptr<DeltaClient> ImpatientClient(const std::string& address) {
  ClientOptions options;
  options.stream_idle_timeout = absl::ToChronoMilliseconds(kIdleTimeout);
  return DeltaClient::Create(address, options);
}

// A read that failed `took` after it started because `address` sent nothing
// for kIdleTimeout.
void ExpectIdleTimeout(const absl::Status& status, absl::Duration took,
                       const std::string& address) {
  EXPECT_GE(took, kIdleTimeout);
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find(address + " sent nothing for"),
            std::string::npos)
      << status;
}

TEST(GetDeltaFromEachTest, AStreamSilentForItsIdleTimeoutFailsTheRead) {
  // Server a's trainer steps and never opens the cut: its stream sends
  // nothing, as a stopped rank's would, while b answers at once.
  StepCuts cuts(/*stepping=*/true);
  Served a(&cuts), b;
  a.Record(1, 10, 100);
  b.Record(2, 500, 800);
  std::unique_ptr<DeltaClient> quiet = ImpatientClient(a.address());
  v1::GetDeltaRequest read = Read("each");
  read.set_cut(7);
  size_t failed = 99;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<ReceivedDelta>> each =
      DeltaClient::GetDeltaFromEach({b.client(), quiet.get()}, read, &failed);
  ExpectIdleTimeout(each.status(), absl::Now() - start, a.address());
  EXPECT_EQ(each.status().message().find(b.client()->target()),
            std::string::npos)
      << each.status();
  EXPECT_EQ(failed, 1u);
  const absl::Time cancelled = absl::Now();
  while (!cuts.Waiting().empty() &&
         absl::Now() - cancelled < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(cuts.Waiting().empty());
}

TEST(GetDeltaTest, AReadSilentForItsIdleTimeoutFails) {
  // A one-process trainer that steps and never opens the cut: GetDelta,
  // which reads one server as GetDeltaFromEach does, gives up after the idle
  // timeout instead of the stream's 10 minutes.
  StepCuts cuts(/*stepping=*/true);
  Served a(&cuts);
  a.Record(1, 10, 100);
  std::unique_ptr<DeltaClient> quiet = ImpatientClient(a.address());
  v1::GetDeltaRequest read = Read("one");
  read.set_cut(7);
  const absl::Time start = absl::Now();
  absl::StatusOr<ReceivedDelta> delta = quiet->GetDelta(read);
  ExpectIdleTimeout(delta.status(), absl::Now() - start, a.address());
  // The same server, read without a cut, answers as before (through a
  // client with the usual idle timeout: under a sanitizer on a loaded
  // machine a first chunk may take longer than the impatient one's).
  read.clear_cut();
  absl::StatusOr<ReceivedDelta> answered = a.client()->GetDelta(read);
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->tables.count(kTable), 1u);
}

// A read cancelled from another thread (a predictor or checkpoint job told
// to stop) ends within about 100 ms, Cancelled, instead of waiting for the
// server (here a cut that never opens) or the idle timeout; the server
// withdraws the cut.
TEST(GetDeltaTest, AReadCancelledFromAnotherThreadEndsAtOnce) {
  StepCuts cuts(/*stepping=*/true);
  Served a(&cuts), b;
  a.Record(1, 10, 100);
  b.Record(1, 10, 100);
  v1::GetDeltaRequest read = Read("each");
  read.set_cut(7);
  for (const bool each : {false, true}) {
    SCOPED_TRACE(each ? "GetDeltaFromEach" : "GetDelta");
    CallCanceller cancel;
    std::thread canceller([&cancel] {
      absl::SleepFor(absl::Milliseconds(300));
      cancel.Cancel();
    });
    const absl::Time start = absl::Now();
    const absl::Status status =
        each ? DeltaClient::GetDeltaFromEach({b.client(), a.client()}, read,
                                             nullptr, &cancel)
                   .status()
             : a.client()->GetDelta(read, &cancel).status();
    const absl::Duration took = absl::Now() - start;
    canceller.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
    EXPECT_GE(took, absl::Milliseconds(300));
    EXPECT_LT(took, absl::Seconds(3));
    const absl::Time cancelled = absl::Now();
    while (!cuts.Waiting().empty() &&
           absl::Now() - cancelled < absl::Seconds(10)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(cuts.Waiting().empty());
  }
}

// A server that answers every call with one chunk of a delta (a header, no
// `last`) and then ends the stream OK: a delta cut short.
class CutShortReactor : public grpc::ServerGenericBidiReactor {
 public:
  CutShortReactor() { StartRead(&request_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    v1::DeltaChunk chunk;
    chunk.mutable_header()->set_end_batch(5);
    const std::string bytes = chunk.SerializeAsString();
    grpc::Slice slice(bytes);
    response_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&response_);
  }
  void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer request_, response_;
};

class CutShortService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    return new CutShortReactor;
  }
};

TEST(GetDeltaFromEachTest, AStreamEndedBeforeItsLastChunkIsDataLoss) {
  CutShortService cut_short;
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&cut_short);
  absl::StatusOr<StartedServer> started =
      StartServer(builder, "127.0.0.1:0", grpc::InsecureServerCredentials());
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<DeltaClient> short_client =
      DeltaClient::Create(started->address);
  Served b;
  b.Record(2, 50, 80);
  size_t failed = 99;
  absl::StatusOr<std::vector<ReceivedDelta>> each =
      DeltaClient::GetDeltaFromEach({b.client(), short_client.get()},
                                    Read("each"), &failed);
  EXPECT_EQ(each.status().code(), absl::StatusCode::kDataLoss) << each.status();
  EXPECT_NE(each.status().message().find(started->address), std::string::npos)
      << each.status();
  EXPECT_EQ(failed, 1u);
  absl::StatusOr<ReceivedDelta> one = short_client->GetDelta(Read("one"));
  EXPECT_EQ(one.status().code(), absl::StatusCode::kDataLoss) << one.status();
  started->server->Shutdown();
}

}  // namespace
}  // namespace deltastream
