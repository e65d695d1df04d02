// DeltaTrackerService over a real gRPC server on loopback. GetDelta is served
// from the delta's tensors (bytes out) in the slot the generated service gives
// it, found by name; the messages it puts on the wire are those Subscribe
// writes through protobuf for the same rows; a dense parameter larger than
// one message goes in pieces; a tracker fed by its own process (a trainer's)
// serves no Record or Step.

#include "tracker_service/delta_tracker_service.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_unique.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/method_handler.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/grpc_server.h"
#include "clients/delta_client.h"
#include "proto/tensor_codec.h"
#include "proto/tracker.grpc.pb.h"
#include "tracker_service/live_rows_reader.h"
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

// `reader`: where the tracker reads the model's dense parameters (null:
// none), as a trainer's does.
std::unique_ptr<Tracker> MakeTracker(bool acknowledged_reads = false,
                                     LiveRowsReader* reader = nullptr) {
  TrackerOptions options;
  options.acknowledged_reads = acknowledged_reads;
  options.mode = TrackingMode::kEmbedding;
  options.consumers = {"bytes", "messages"};
  auto tracker = Tracker::Create(options, reader);
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return *std::move(tracker);
}

// `tracker`'s DeltaTrackerService on a real gRPC server on loopback, and a
// stub of it (null when the server did not start: a failure is recorded).
// The server shuts down with it.
struct Served {
  explicit Served(Tracker* tracker, ServiceOptions options = {})
      : service(tracker, options) {
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
// Dense parameters from a trainer's model, as the tracker reads them.
class DenseReader final : public LiveRowsReader {
 public:
  explicit DenseReader(std::vector<std::pair<std::string, at::Tensor>> dense)
      : dense_(std::move(dense)) {}
  absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                            const at::Tensor&) override {
    return absl::NotFoundError(absl::StrCat("no table '", fqn, "'"));
  }
  absl::StatusOr<at::Tensor> ReadOptimizerStates(absl::string_view fqn,
                                                 const at::Tensor&) override {
    return ReadEmbeddings(fqn, at::Tensor());
  }
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadDense()
      override {
    return dense_;
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>> dense_;
};

TEST(DeltaTrackerServiceTest, ADenseParameterPastOneMessageComesInPieces) {
  // More than kWholeDenseBytes: in pieces of the read's chunk bytes, which a
  // client of 64 MiB messages reads (whole, it would be refused); a small
  // one whole, as before pieces existed.
  const at::Tensor big =
      at::randn({(DeltaTrackerService::kWholeDenseBytes >> 12) + 3, 1024});
  const at::Tensor small = at::randn({3, 2}).to(at::kBFloat16);
  DenseReader reader({{"big", big}, {"small", small}});
  std::unique_ptr<Tracker> tracker = MakeTracker(false, &reader);
  tracker->Step();
  Served served(tracker.get());
  ASSERT_NE(served.stub, nullptr);
  constexpr int64_t kChunkBytes = 2 << 20;  // the stub takes 4 MiB messages
  v1::GetDeltaRequest read;
  read.set_consumer("bytes");
  read.set_include_dense(true);
  read.set_max_chunk_bytes(kChunkBytes);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  std::vector<v1::DeltaChunk> chunks =
      ReadUntilLast(*served.stub->GetDelta(&context, read));
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0].header().dense_parameters(), 2);

  at::Tensor assembled = at::full_like(big, std::nanf(""));
  int64_t next = 0;
  int pieces = 0;
  for (const v1::DeltaChunk& chunk : chunks) {
    ASSERT_TRUE(chunk.has_dense());
    const v1::NamedTensor& dense = chunk.dense();
    absl::StatusOr<at::Tensor> tensor = DecodeTensor(dense.tensor());
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    if (dense.name() == "small") {
      EXPECT_EQ(dense.piece_of_size(), 0);
      EXPECT_TRUE(at::equal(*tensor, small));
      continue;
    }
    ASSERT_EQ(dense.name(), "big");
    ASSERT_EQ(
        std::vector<int64_t>(dense.piece_of().begin(), dense.piece_of().end()),
        big.sizes().vec());
    ASSERT_EQ(dense.piece_offset(), next);
    ASSERT_EQ(tensor->dim(), 1);
    EXPECT_LE(static_cast<int64_t>(tensor->nbytes()), kChunkBytes);
    assembled.view(-1).narrow(0, next, tensor->numel()).copy_(*tensor);
    next += tensor->numel();
    ++pieces;
  }
  EXPECT_EQ(next, big.numel());
  EXPECT_GE(pieces, DeltaTrackerService::kWholeDenseBytes / kChunkBytes);
  EXPECT_TRUE(at::equal(assembled, big));
  EXPECT_TRUE(chunks.back().last());
}

TEST(DeltaTrackerServiceTest, ADenseParameterPastAClientsMessageLimitArrives) {
  // 80 MiB: whole, it would pass DeltaClient's 64 MiB message limit and the
  // read would fail (RESOURCE_EXHAUSTED) however often it came again.
  const at::Tensor big = at::randn({20 << 10, 1024});
  DenseReader reader({{"big", big}});
  std::unique_ptr<Tracker> tracker = MakeTracker(false, &reader);
  tracker->Step();
  Served served(tracker.get());
  ASSERT_NE(served.stub, nullptr);
  v1::GetDeltaRequest read;
  read.set_consumer("bytes");
  read.set_include_dense(true);
  absl::StatusOr<ReceivedDelta> delta =
      DeltaClient::Create(served.server.address)->GetDelta(read);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_EQ(delta->dense.size(), 1u);
  EXPECT_EQ(delta->dense[0].first, "big");
  EXPECT_TRUE(at::equal(delta->dense[0].second, big));
}

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

namespace deltastream {
namespace {

TEST(DeltaTrackerServiceTest, ATrackerFedByItsOwnProcessServesNoRecordOrStep) {
  std::unique_ptr<Tracker> tracker = MakeTracker();
  ASSERT_TRUE(
      tracker
          ->RecordTables({{kTable, at::arange(3, at::kLong), at::ones({3, 2})}})
          .ok());
  tracker->Step();
  ServiceOptions options;
  options.network_producers = false;
  Served served(tracker.get(), options);
  ASSERT_NE(served.stub, nullptr);
  std::unique_ptr<DeltaClient> client =
      DeltaClient::Create(served.server.address);

  absl::StatusOr<int64_t> stepped = client->Step();
  EXPECT_EQ(stepped.status().code(), absl::StatusCode::kFailedPrecondition)
      << stepped.status();
  EXPECT_EQ(tracker->current_batch(), 1);
  absl::StatusOr<int64_t> recorded = client->Record(
      {{{kTable, at::arange(10, 13, at::kLong), at::zeros({3, 2})}}});
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kFailedPrecondition)
      << recorded.status();
  tracker->Step();

  // Only the process's own rows, and the reads are served as ever.
  v1::GetDeltaRequest read;
  read.set_consumer("bytes");
  absl::StatusOr<ReceivedDelta> delta = client->GetDelta(read);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_EQ(delta->tables.count(kTable), 1u);
  EXPECT_TRUE(
      at::equal(delta->tables.at(kTable).ids, at::arange(3, at::kLong)));
}

}  // namespace
}  // namespace deltastream
