// DeltaTrackerService over a real gRPC server on loopback. GetDelta is served
// from the delta's tensors (bytes out) in the slot the generated service gives
// it, found by name; the messages it puts on the wire are those Subscribe
// writes through protobuf for the same rows.

#include "tracker_service/delta_tracker_service.h"

#include <ATen/ATen.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/method_handler.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/grpc_server.h"
#include "proto/tensor_codec.h"
#include "proto/tracker.grpc.pb.h"
#include "tracker_service/tracker.h"

namespace deltastream {
namespace {

constexpr char kTable[] = "t";
constexpr auto kCallTimeout = std::chrono::seconds(10);

// The generated service with GetDelta split-streamed by the code generator's
// own WithSplitStreamingMethod_GetDelta, which knows GetDelta's slot.
class GeneratedSplitGetDelta final
    : public v1::DeltaTracker::WithSplitStreamingMethod_GetDelta<
          v1::DeltaTracker::Service> {
 public:
  grpc::Status StreamedGetDelta(
      grpc::ServerContext*,
      grpc::ServerSplitStreamer<v1::GetDeltaRequest, v1::DeltaChunk>*)
      override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
  }

  // The slots, of the first `methods`, that hold a split-streamed GetDelta.
  std::vector<int> SplitSlots(int methods) {
    std::vector<int> slots;
    for (int i = 0; i < methods; ++i) {
      if (dynamic_cast<grpc::internal::SplitServerStreamingHandler<
              v1::GetDeltaRequest, v1::DeltaChunk>*>(GetHandler(i)) !=
          nullptr) {
        slots.push_back(i);
      }
    }
    return slots;
  }
};

std::unique_ptr<Tracker> MakeTracker(bool acknowledged_reads = false) {
  TrackerOptions options;
  options.acknowledged_reads = acknowledged_reads;
  options.mode = TrackingMode::kEmbedding;
  options.consumers = {"bytes", "messages"};
  auto tracker = Tracker::Create(options);
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return *std::move(tracker);
}

// `tracker`'s DeltaTrackerService on a real gRPC server on loopback, and a
// stub of it (null when the server did not start: a failure is recorded).
// The server shuts down with it.
struct Served {
  explicit Served(Tracker* tracker) : service(tracker) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service);
    absl::StatusOr<StartedServer> started =
        StartServer(builder, "127.0.0.1:0", grpc::InsecureServerCredentials());
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    server = *std::move(started);
    stub = v1::DeltaTracker::NewStub(grpc::CreateChannel(
        server.address, grpc::InsecureChannelCredentials()));
  }
  ~Served() {
    if (server.server != nullptr) server.server->Shutdown();
  }

  DeltaTrackerService service;
  StartedServer server;
  std::unique_ptr<v1::DeltaTracker::Stub> stub;
};

TEST(DeltaTrackerServiceTest, GetDeltaIsSwappedInTheSlotTheGeneratorGaveIt) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "deltastream.v1.DeltaTracker");
  ASSERT_NE(service, nullptr);
  GeneratedSplitGetDelta generated;
  const std::vector<int> slots = generated.SplitSlots(service->method_count());
  ASSERT_EQ(slots.size(), 1u);

  std::unique_ptr<Tracker> tracker = MakeTracker();
  DeltaTrackerService delta_service(tracker.get());
  // -1 would mean GetDelta is served through protobuf copies: slower, and a
  // sign that the lookup no longer finds the generated method.
  EXPECT_EQ(delta_service.get_delta_method(), slots[0]);
}

// Reads every chunk of one server stream until the chunk marked last.
template <typename Reader>
std::vector<v1::DeltaChunk> ReadUntilLast(Reader& reader) {
  std::vector<v1::DeltaChunk> chunks;
  v1::DeltaChunk chunk;
  while (reader.Read(&chunk)) {
    chunks.push_back(chunk);
    if (chunk.last()) break;
  }
  return chunks;
}

TEST(DeltaTrackerServiceTest, GetDeltaBytesAreTheMessagesSubscribeWrites) {
  std::unique_ptr<Tracker> tracker = MakeTracker();
  Served served(tracker.get());
  ASSERT_NE(served.stub, nullptr);
  v1::DeltaTracker::Stub* stub = served.stub.get();

  // Two batches of 600 rows over 1000 IDs: repeats, which the read keeps
  // once (its first state).
  at::manual_seed(7);
  std::vector<at::Tensor> ids, states;
  for (int batch = 0; batch < 2; ++batch) {
    ids.push_back(at::randint(1000, {600}, at::kLong));
    states.push_back(at::randn({600, 5}));
    ASSERT_TRUE(
        tracker->RecordTables({{kTable, ids.back(), states.back()}}).ok());
    tracker->Step();
  }

  v1::GetDeltaRequest read;
  read.set_consumer("bytes");
  read.set_max_chunk_bytes(1000);  // 21 rows of 48 bytes a chunk
  grpc::ClientContext get_context;
  get_context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  auto get_reader = stub->GetDelta(&get_context, read);
  std::vector<v1::DeltaChunk> got = ReadUntilLast(*get_reader);
  ASSERT_TRUE(get_reader->Finish().ok());

  v1::SubscribeRequest subscribe;
  *subscribe.mutable_read() = read;
  subscribe.mutable_read()->set_consumer("messages");
  subscribe.set_every_steps(1);
  grpc::ClientContext subscribe_context;
  subscribe_context.set_deadline(std::chrono::system_clock::now() +
                                 kCallTimeout);
  auto subscription = stub->Subscribe(&subscribe_context, subscribe);
  std::vector<v1::DeltaChunk> pushed = ReadUntilLast(*subscription);
  subscribe_context.TryCancel();
  subscription->Finish();

  ASSERT_GT(got.size(), 10u);
  ASSERT_EQ(got.size(), pushed.size());
  got[0].mutable_header()->clear_consumer();
  pushed[0].mutable_header()->clear_consumer();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(
        google::protobuf::util::MessageDifferencer::Equals(got[i], pushed[i]))
        << "chunk " << i << ":\n"
        << got[i].ShortDebugString() << "\nvs\n"
        << pushed[i].ShortDebugString();
  }

  // The rows themselves: each ID once, ascending, with its first state.
  at::Tensor got_ids, got_states;
  for (const v1::DeltaChunk& chunk : got) {
    ASSERT_EQ(chunk.fqn(), kTable);
    ASSERT_TRUE(DecodeRowsInto(chunk.ids(), chunk.row_offset(),
                               chunk.table_rows(), &got_ids)
                    .ok());
    ASSERT_TRUE(DecodeRowsInto(chunk.states(), chunk.row_offset(),
                               chunk.table_rows(), &got_states)
                    .ok());
  }
  const at::Tensor all_ids = at::cat(ids);
  const at::Tensor all_states = at::cat(states);
  const at::Tensor unique = std::get<0>(at::_unique(all_ids));
  ASSERT_TRUE(got_ids.equal(unique));
  for (int64_t row = 0; row < got_ids.size(0); ++row) {
    const int64_t first =
        at::nonzero(all_ids == got_ids[row]).flatten()[0].item<int64_t>();
    ASSERT_TRUE(got_states[row].equal(all_states[first])) << "row " << row;
  }

  // The other methods keep their slots.
  grpc::ClientContext status_context;
  status_context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  v1::StatusResponse status;
  ASSERT_TRUE(stub->Status(&status_context, v1::StatusRequest(), &status).ok());
  EXPECT_EQ(status.consumers_size(), 2);
}

// A client that goes away after the first chunk of a 64 MB read: without
// acknowledged reads the read was delivered (its cursor moved), so the
// consumer's next read says resync_required instead of leaving those rows
// out; with acknowledged reads nothing is lost and the next read brings them
// again.
TEST(DeltaTrackerServiceTest, AReadWhoseStreamFailsIsNotASilentLoss) {
  for (const bool acknowledged : {false, true}) {
    SCOPED_TRACE(acknowledged ? "acknowledged" : "not acknowledged");
    std::unique_ptr<Tracker> tracker = MakeTracker(acknowledged);
    Served served(tracker.get());
    ASSERT_NE(served.stub, nullptr);
    v1::DeltaTracker::Stub* stub = served.stub.get();
    constexpr int64_t kRows = 250000;
    ASSERT_TRUE(tracker
                    ->RecordTables({{kTable, at::arange(kRows, at::kLong),
                                     at::randn({kRows, 64})}})
                    .ok());
    tracker->Step();

    v1::GetDeltaRequest read;
    read.set_consumer("bytes");
    read.set_max_chunk_bytes(64 << 10);
    {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
      auto reader = stub->GetDelta(&context, read);
      v1::DeltaChunk chunk;
      ASSERT_TRUE(reader->Read(&chunk));
      context.TryCancel();
      EXPECT_FALSE(reader->Finish().ok());
    }
    // The server learns of it when its next write fails.
    const auto consumer_status = [&] {
      for (const ConsumerStatus& c : tracker->Status().consumers) {
        if (c.name == "bytes") return c;
      }
      return ConsumerStatus{};
    };
    const auto until = std::chrono::steady_clock::now() + kCallTimeout;
    while (!acknowledged && !consumer_status().resync_required &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(consumer_status().resync_required, !acknowledged);
    DeltaRequest closed;
    closed.consumer = "bytes";
    closed.through_current_batch = false;
    absl::StatusOr<Delta> next = tracker->GetDelta(closed);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->resync_required, !acknowledged);
    const int64_t rows =
        next->tables.count(kTable) ? next->tables.at(kTable).ids.numel() : 0;
    EXPECT_EQ(rows, acknowledged ? kRows : 0);
  }
}

}  // namespace
}  // namespace deltastream
