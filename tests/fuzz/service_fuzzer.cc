// libFuzzer target: arbitrary bytes as requests to the tracker's gRPC
// handlers (tracker_service/delta_tracker_service.h). Built and run by
// tests/fuzz/fuzz_service_test.sh; any status code is fine, a crash, hang,
// leak or sanitizer report is not.
//
// Each input gets fresh trackers behind an in-process server (no port), so an
// input replays the same way on its own. Input layout (read from the front;
// past its end every read is 0):
//   byte 0 < 0xE0: raw mode. The method is methods[byte 0 % n], in the order
//     of the service's descriptor (so methods added later are fuzzed too).
//     byte 1: the tracker configuration (low 3 bits) and the message count
//     (high 5 bits: client streams 1 + c % 8 messages; others 1, or 0 when
//     c == 31, 2 when c == 30). Then one 16-bit cut position per extra
//     message, then the payload: the rest of the input, cut into the
//     messages and sent verbatim as serialized requests.
//   byte 0 >= 0xE0: structured mode with configuration byte 0 % 8: up to
//     kMaxOps operations, each an op byte and its fields, built with the
//     generated classes (records of valid tensors, steps, reads with top-k,
//     commits, consumers, subscriptions, ...), raw messages, or requests of
//     any method filled through protobuf reflection.
// tests/fuzz/make_corpus.py writes seeds in this layout.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/tracker.grpc.pb.h"
#include "proto/tracker.pb.h"
#include "tracker_service/delta_tracker_service.h"
#include "tracker_service/live_rows_reader.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracking_mode.h"

namespace deltastream {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr int kMaxOps = 32;
// Rows one input may record in all (dims are at most 64).
constexpr int64_t kRowBudget = 4096;
constexpr uint8_t kStructured = 0xE0;

bool Verbose() {
  static const bool verbose =
      std::getenv("DELTASTREAM_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// The fuzz input, read from the front; past its end every read yields zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // Little-endian (one statement per read: operands are unsequenced).
  uint16_t U16() {
    const uint16_t low = Byte();
    return static_cast<uint16_t>(low | Byte() << 8);
  }
  uint32_t U32() {
    const uint32_t low = U16();
    return low | static_cast<uint32_t>(U16()) << 16;
  }
  uint64_t U64() {
    const uint64_t low = U32();
    return low | static_cast<uint64_t>(U32()) << 32;
  }
  // Up to `n` bytes.
  std::string Bytes(size_t n) {
    n = std::min(n, remaining());
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  // A length byte, then that many bytes.
  std::string ShortString() { return Bytes(Byte()); }
  std::string Rest() { return Bytes(remaining()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Test tables "t0".."t7" have these dims.
constexpr int64_t kTableDims[8] = {4, 8, 1, 16, 64, 2, 3, 32};

// The dim of test table `fqn`, or -1 for any other name.
int64_t TableDim(absl::string_view fqn) {
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
};

// Memory caps are small: an input records at most kRowBudget rows (1 MiB of
// float states at dim 64) into fresh trackers, and the cap's compaction and
// drops should run.
constexpr Config kConfigs[8] = {
    {TrackingMode::kEmbedding, true, false, true, true, 768 << 10},
    {TrackingMode::kIdOnly, false, true, true, false, 16 << 10},
    {TrackingMode::kEmbedding, false, false, false, false, 512 << 10},
    {TrackingMode::kMomentumLast, false, false, true, true, 32 << 10},
    {TrackingMode::kMomentumDiff, true, true, true, false, 256 << 10},
    {TrackingMode::kRowwiseAdagrad, true, false, false, true, 64 << 10},
    {TrackingMode::kIdOnly, false, false, false, true, 8 << 10},
    {TrackingMode::kEmbedding, true, true, true, false, 0},
};

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
    service_ = std::make_unique<DeltaTrackerService>(tracker_.get());
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
  }

  grpc::GenericStub& stub() { return *stub_; }

 private:
  std::unique_ptr<FakeLiveRows> live_rows_;
  std::unique_ptr<Tracker> tracker_;
  std::unique_ptr<DeltaTrackerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

struct Method {
  std::string name;  // "Record"
  std::string path;  // "/deltastream.v1.DeltaTracker/Record"
  bool client_streaming;
  bool server_streaming;
  const Descriptor* input;
  const Descriptor* output;
};

// Every method of the service, from its descriptor.
const std::vector<Method>& Methods() {
  static const std::vector<Method>* const methods = [] {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            v1::DeltaTracker::service_full_name());
    if (service == nullptr || service->method_count() == 0) {
      std::fprintf(stderr, "no descriptor for %s\n",
                   v1::DeltaTracker::service_full_name());
      std::abort();
    }
    auto* out = new std::vector<Method>;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* m = service->method(i);
      out->push_back({m->name(),
                      absl::StrCat("/", service->full_name(), "/", m->name()),
                      m->client_streaming(), m->server_streaming(),
                      m->input_type(), m->output_type()});
    }
    return out;
  }();
  return *methods;
}

const Method* FindMethod(absl::string_view name) {
  for (const Method& m : Methods()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

struct CallResult {
  grpc::Status status;
  std::vector<std::string> responses;
};

// One call of `method` with `requests` as its messages, through the generic
// (bidi) stub whatever the method's kind. Server streams are read to the end,
// or cancelled after `cancel_after` messages when >= 0. Server streams other
// than GetDelta may never end (a subscription): at most 4 messages within a
// short deadline.
//
// Reads run alongside the writes: gRPC's in-process transport leaves a write
// pending until the deadline when the server ends the call without reading
// it (an error in the middle of a Record stream, a second message to a unary
// method), so once the server is done a pending write is cancelled.
CallResult Call(Fixture& fixture, const Method& method,
                const std::vector<std::string>& requests,
                int cancel_after = -1) {
  const bool finite = !method.server_streaming || method.name == "GetDelta";
  size_t max_reads = finite ? std::numeric_limits<size_t>::max() : 4;
  if (cancel_after >= 0) {
    max_reads = std::min(max_reads, static_cast<size_t>(cancel_after));
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       (finite ? std::chrono::milliseconds(10000)
                               : std::chrono::milliseconds(150)));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      fixture.stub().PrepareCall(&context, method.path, &cq);
  CallResult result;
  const auto start = std::chrono::steady_clock::now();

  void* const kStart = reinterpret_cast<void*>(1);
  void* const kWrite = reinterpret_cast<void*>(2);
  void* const kRead = reinterpret_cast<void*>(3);
  void* const kFinish = reinterpret_cast<void*>(4);
  grpc::ByteBuffer read_buffer;
  bool read_pending = false;
  bool write_pending = false;
  bool server_done = false;  // no more reads: the stream ended or was cut
  bool writes_done = false;
  auto post_read = [&] {
    if (server_done || read_pending) return;
    if (result.responses.size() >= max_reads) {
      if (!writes_done) return;  // cut the stream once the request is out
      context.TryCancel();
      server_done = true;
      return;
    }
    call->Read(&read_buffer, kRead);
    read_pending = true;
  };
  // When the server is done while a write is pending, the write gets a
  // moment to complete on its own (keeping the server's status) before the
  // call is cancelled.
  std::optional<std::chrono::system_clock::time_point> cancel_at;
  // Waits for the operation of tag `want`, handling the reads that complete
  // meanwhile; returns whether it succeeded.
  auto wait_for = [&](void* want) {
    for (;;) {
      void* got = nullptr;
      bool ok = false;
      if (cancel_at.has_value()) {
        const grpc::CompletionQueue::NextStatus next =
            cq.AsyncNext(&got, &ok, *cancel_at);
        if (next == grpc::CompletionQueue::SHUTDOWN) return false;
        if (next == grpc::CompletionQueue::TIMEOUT) {
          context.TryCancel();
          cancel_at.reset();
          continue;
        }
      } else if (!cq.Next(&got, &ok)) {
        return false;
      }
      if (got != kRead) {
        cancel_at.reset();
        return ok;
      }
      read_pending = false;
      if (ok) {
        result.responses.push_back(ToString(read_buffer));
        post_read();
      } else {
        server_done = true;
        if (write_pending) {
          cancel_at =
              std::chrono::system_clock::now() + std::chrono::milliseconds(20);
        }
      }
      if (want == kRead) return ok;
    }
  };

  call->StartCall(kStart);
  bool alive = wait_for(kStart);
  if (alive) post_read();
  size_t written = 0;
  for (const std::string& request : requests) {
    if (!alive || server_done) break;
    grpc::Slice slice(request.data(), request.size());
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, kWrite);
    write_pending = true;
    alive = wait_for(kWrite);
    write_pending = false;
    if (alive) ++written;
  }
  if (alive && !server_done) {
    call->WritesDone(kWrite);
    write_pending = true;
    wait_for(kWrite);
    write_pending = false;
  }
  writes_done = true;
  post_read();
  while (read_pending) wait_for(kRead);
  call->Finish(&result.status, kFinish);
  wait_for(kFinish);
  call.reset();
  cq.Shutdown();
  void* got = nullptr;
  bool ok = false;
  while (cq.Next(&got, &ok)) {
  }
  if (Verbose()) {
    std::fprintf(
        stderr,
        "  %s: %zu of %zu message(s) sent -> %d %s, %zu response(s), %.1f ms\n",
        method.name.c_str(), written, requests.size(),
        static_cast<int>(result.status.error_code()),
        result.status.error_message().substr(0, 120).c_str(),
        result.responses.size(),
        std::chrono::duration<double, std::milli>(
            std::chrono::steady_clock::now() - start)
            .count());
    const Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(
            method.output);
    if (!result.responses.empty() && prototype != nullptr) {
      std::unique_ptr<Message> response(prototype->New());
      if (response->ParseFromString(result.responses.front())) {
        std::fprintf(stderr, "    first: %s\n",
                     response->ShortDebugString().substr(0, 300).c_str());
      }
    }
  }
  return result;
}

// Raw mode: the rest of the input, verbatim, as the messages of one call.
void RunRaw(uint8_t selector, Input& in) {
  const std::vector<Method>& methods = Methods();
  const Method& method = methods[selector % methods.size()];
  const uint8_t layout = in.Byte();
  const Config& config = kConfigs[layout % 8];
  const int c = layout >> 3;
  int messages = 1;
  if (method.client_streaming) {
    messages = 1 + c % 8;
  } else if (c == 31) {
    messages = 0;
  } else if (c == 30) {
    messages = 2;
  }
  std::vector<uint16_t> cuts;
  for (int i = 1; i < messages; ++i) cuts.push_back(in.U16());
  const std::string payload = in.Rest();
  std::vector<size_t> positions;
  for (uint16_t cut : cuts) positions.push_back(cut % (payload.size() + 1));
  std::sort(positions.begin(), positions.end());
  std::vector<std::string> requests;
  size_t from = 0;
  for (size_t to : positions) {
    requests.push_back(payload.substr(from, to - from));
    from = to;
  }
  if (messages > 0) requests.push_back(payload.substr(from));
  if (Verbose()) {
    std::fprintf(stderr, "raw %s, config %d\n", method.name.c_str(),
                 layout % 8);
  }
  Fixture fixture(config);
  Call(fixture, method, requests);
}

// Structured mode: operations built with the generated classes.
class Session {
 public:
  Session(Fixture& fixture, Input& in) : fixture_(fixture), in_(in) {}

  void Run() {
    for (int op = 0; op < kMaxOps && in_.remaining() > 0; ++op) {
      switch (in_.Byte() % 13) {
        case 0:
          Record();
          break;
        case 1:
          Unary("Step", v1::StepRequest());
          break;
        case 2:
          GetDelta();
          break;
        case 3:
          Commit();
          break;
        case 4:
          Unary("ListConsumers", v1::ListConsumersRequest());
          break;
        case 5: {
          v1::ConsumerRequest request;
          request.set_consumer(ConsumerName());
          Unary("AddConsumer", request);
          break;
        }
        case 6: {
          v1::ConsumerRequest request;
          request.set_consumer(ConsumerName());
          Unary("RemoveConsumer", request);
          break;
        }
        case 7:
          Unary("Compact", v1::CompactRequest());
          break;
        case 8: {
          v1::ClearRequest request;
          if (in_.Byte() & 1) request.set_consumer(ConsumerName());
          Unary("Clear", request);
          break;
        }
        case 9:
          Unary("Status", v1::StatusRequest());
          break;
        case 10:
          Raw();
          break;
        case 11:
          Reflective();
          break;
        case 12:
          Stream();
          break;
      }
    }
  }

 private:
  CallResult Send(absl::string_view name, std::vector<std::string> requests,
                  int cancel_after = -1) {
    const Method* method = FindMethod(name);
    if (method == nullptr) return {};
    return Call(fixture_, *method, requests, cancel_after);
  }

  CallResult Unary(absl::string_view name, const Message& request) {
    return Send(name, {request.SerializeAsString()});
  }

  // Mostly the tracker's consumers and tables; sometimes names it must
  // refuse or does not know.
  std::string Name(absl::string_view stem) {
    const uint8_t b = in_.Byte();
    switch (b % 16) {
      case 12:
        return absl::StrCat(stem, in_.Byte());
      case 13:
        return "";
      case 14:
        return std::string(in_.Byte() & 1 ? 129 : 257, 'x');
      case 15:
        return in_.ShortString();
      default:
        return absl::StrCat(stem, b % 4);
    }
  }
  std::string ConsumerName() {
    const uint8_t b = in_.Byte();
    static const char* const kNames[] = {"a", "b",       "c",
                                         "d", "default", "a.b-c_d"};
    if (b < 240) return kNames[b % 6];
    return Name("c");
  }

  static void SetTensor(v1::Tensor* tensor, v1::Tensor::DType dtype,
                        const std::vector<int64_t>& shape, std::string data) {
    tensor->set_dtype(dtype);
    for (int64_t s : shape) tensor->add_shape(s);
    tensor->set_data(std::move(data));
  }

  template <typename T>
  static std::string BytesOf(const std::vector<T>& values) {
    return std::string(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(T));
  }

  void TableRows(v1::TableRows* rows) {
    const std::string fqn = Name("t");
    rows->set_fqn(fqn);
    const uint8_t size = in_.Byte();
    int64_t n = size < 200 ? size % 17 : in_.U16() % 2049;
    n = std::min(n, rows_left_);
    rows_left_ -= n;
    std::mt19937_64 rng(in_.U32());

    // IDs.
    std::vector<int64_t> ids(n);
    const uint8_t pattern = in_.Byte();
    const int64_t base = static_cast<int8_t>(in_.Byte());
    const uint64_t range = 1 + in_.U16();
    for (int64_t i = 0; i < n; ++i) {
      switch (pattern % 6) {
        case 0:
          ids[i] = base + i;
          break;
        case 1:
        case 2:
          ids[i] = static_cast<int64_t>(rng() % range);
          break;
        case 3:
          ids[i] = static_cast<int64_t>(rng());
          break;
        case 4:
          ids[i] = base;
          break;
        case 5:
          ids[i] = static_cast<int64_t>(rng() % range) - 8;
          break;
      }
    }
    SetTensor(rows->mutable_ids(), v1::Tensor::INT64, {n}, BytesOf(ids));
    const uint8_t corrupt = in_.Byte();
    if (corrupt >= 240) {
      switch (corrupt % 4) {
        case 0:
          rows->mutable_ids()->set_dtype(v1::Tensor::FLOAT32);
          break;
        case 1:
          rows->mutable_ids()->add_shape(1);
          break;
        case 2:
          rows->mutable_ids()->mutable_data()->append("x");
          break;
        case 3:
          rows->mutable_ids()->clear_shape();
          break;
      }
    }

    // States.
    const uint8_t kind = in_.Byte();
    const int64_t table_dim = TableDim(fqn);
    int64_t dim = table_dim > 0 && kind % 4 != 3 ? table_dim : in_.Byte() % 65;
    const uint8_t specials = in_.Byte();
    auto value = [&rng, specials](int64_t i) {
      if ((specials & 1) && i % 7 == 3) {
        return specials & 2 ? std::numeric_limits<float>::quiet_NaN()
                            : std::numeric_limits<float>::infinity();
      }
      return static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) /
             250.0f;
    };
    switch ((kind >> 2) % 8) {
      case 0:
        break;  // no states
      case 1:
      case 2:
      case 3:
      case 4: {  // [n, dim] float32
        std::vector<float> states(n * dim);
        for (size_t i = 0; i < states.size(); ++i) states[i] = value(i);
        SetTensor(rows->mutable_states(), v1::Tensor::FLOAT32, {n, dim},
                  BytesOf(states));
        break;
      }
      case 5: {  // [n, dim] float16 / bfloat16 bit patterns
        std::vector<uint16_t> states(n * dim);
        for (uint16_t& s : states) {
          s = specials & 4 ? static_cast<uint16_t>(rng())
                           : static_cast<uint16_t>(0x3C00 + rng() % 0x200);
        }
        SetTensor(rows->mutable_states(),
                  specials & 8 ? v1::Tensor::BFLOAT16 : v1::Tensor::FLOAT16,
                  {n, dim}, BytesOf(states));
        break;
      }
      case 6: {  // [n] float32 (row-wise state)
        std::vector<float> states(n);
        for (int64_t i = 0; i < n; ++i) states[i] = value(i);
        SetTensor(rows->mutable_states(), v1::Tensor::FLOAT32, {n},
                  BytesOf(states));
        break;
      }
      case 7: {  // rows that do not match the IDs
        const int64_t rows_count = specials & 16 ? n + 1 : 0;
        std::vector<float> states(rows_count * dim);
        for (size_t i = 0; i < states.size(); ++i) states[i] = value(i);
        SetTensor(rows->mutable_states(), v1::Tensor::FLOAT32,
                  {rows_count, dim}, BytesOf(states));
        break;
      }
    }
  }

  void Record() {
    const int messages = 1 + in_.Byte() % 3;
    std::vector<std::string> requests;
    for (int m = 0; m < messages; ++m) {
      v1::RecordRequest request;
      const int tables = in_.Byte() % 4;
      for (int t = 0; t < tables; ++t) TableRows(request.add_tables());
      requests.push_back(request.SerializeAsString());
    }
    Send("Record", std::move(requests));
  }

  void TopK(v1::TopK* top_k) {
    static constexpr double kPercentages[] = {
        0,
        1e-9,
        0.5,
        1,
        10,
        50,
        99.9,
        100,
        100.0001,
        -1,
        std::numeric_limits<double>::quiet_NaN(),
        std::numeric_limits<double>::infinity(),
        1e308,
        std::numeric_limits<double>::denorm_min(),
        33.3,
        2};
    static constexpr int64_t kCounts[] = {0,
                                          1,
                                          2,
                                          3,
                                          10,
                                          100,
                                          5000,
                                          -1,
                                          std::numeric_limits<int64_t>::max(),
                                          std::numeric_limits<int64_t>::min(),
                                          int64_t{1} << 53,
                                          (int64_t{1} << 53) + 1,
                                          7,
                                          4096,
                                          64,
                                          5};
    const uint8_t b = in_.Byte();
    switch (b % 4) {
      case 0:
        top_k->set_percentage(kPercentages[(b >> 2) % 16]);
        break;
      case 1:
        top_k->set_count(kCounts[(b >> 2) % 16]);
        break;
      case 2:
        break;  // neither
      case 3: {
        const uint64_t bits = in_.U64();
        double percentage;
        std::memcpy(&percentage, &bits, sizeof(percentage));
        top_k->set_percentage(percentage);
        break;
      }
    }
  }

  // A read request (for GetDelta, or inside a subscription's request);
  // `cancel_after` gets when to cut the stream (-1: never).
  v1::GetDeltaRequest ReadRequest(int* cancel_after) {
    v1::GetDeltaRequest request;
    request.set_consumer(ConsumerName());
    const uint8_t flags = in_.Byte();
    if (flags & 1) {
      const int fqns = 1 + in_.Byte() % 3;
      for (int i = 0; i < fqns; ++i) request.add_fqns(Name("t"));
    }
    if (flags & 2) TopK(request.mutable_top_k());
    if (flags & 4) {
      const int tables = 1 + in_.Byte() % 2;
      for (int i = 0; i < tables; ++i) {
        const std::string fqn = Name("t");
        TopK(&(*request.mutable_per_table_top_k())[fqn]);
      }
    }
    request.set_include_scores(flags & 8);
    if (flags & 16) {
      static constexpr int64_t kChunkBytes[] = {
          1,       7,
          64,      4096,
          1 << 20, int64_t{1} << 30,
          -5,      std::numeric_limits<int64_t>::max()};
      request.set_max_chunk_bytes(kChunkBytes[in_.Byte() % 8]);
    }
    *cancel_after = flags & 32 ? in_.Byte() % 4 : -1;
    return request;
  }

  void GetDelta() {
    int cancel_after = -1;
    const v1::GetDeltaRequest request = ReadRequest(&cancel_after);
    CallResult result =
        Send("GetDelta", {request.SerializeAsString()}, cancel_after);
    v1::DeltaChunk chunk;
    if (!result.responses.empty() &&
        chunk.ParseFromString(result.responses.front()) && chunk.has_header()) {
      last_end_[request.consumer()] = chunk.header().end_batch();
    }
  }

  // A server stream other than GetDelta (a subscription, which may never
  // end): its request's read request built as for GetDelta, its numbers
  // small (negative too).
  void Stream() {
    std::vector<const Method*> streams;
    for (const Method& m : Methods()) {
      if (m.server_streaming && m.name != "GetDelta") streams.push_back(&m);
    }
    if (streams.empty()) return;
    const Method& method = *streams[in_.Byte() % streams.size()];
    const Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(
            method.input);
    if (prototype == nullptr) return;
    std::unique_ptr<Message> request(prototype->New());
    const Descriptor* descriptor = request->GetDescriptor();
    const Reflection* reflection = request->GetReflection();
    for (int i = 0; i < descriptor->field_count(); ++i) {
      const FieldDescriptor* field = descriptor->field(i);
      if (field->is_repeated()) continue;
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
          field->message_type() == v1::GetDeltaRequest::descriptor()) {
        int cancel_after = -1;
        reflection->MutableMessage(request.get(), field)
            ->CopyFrom(ReadRequest(&cancel_after));
      } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
        reflection->SetInt64(request.get(), field,
                             static_cast<int8_t>(in_.Byte()));
      }
    }
    Call(fixture_, method, {request->SerializeAsString()});
  }

  void Commit() {
    v1::CommitRequest request;
    const std::string consumer = ConsumerName();
    request.set_consumer(consumer);
    const int64_t end = last_end_.count(consumer) ? last_end_[consumer] : 0;
    const uint8_t b = in_.Byte();
    switch (b % 4) {
      case 0:
        request.set_end_batch(end);
        break;
      case 1:
        request.set_end_batch(end + 1);
        break;
      case 2:
        request.set_end_batch(static_cast<int64_t>(in_.U64()));
        break;
      case 3:
        request.set_end_batch(static_cast<int64_t>(b >> 2) - 2);
        break;
    }
    Unary("Commit", request);
  }

  // Bytes, verbatim, as the messages of any method.
  void Raw() {
    const std::vector<Method>& methods = Methods();
    const Method& method = methods[in_.Byte() % methods.size()];
    const int messages = method.client_streaming ? 1 + in_.Byte() % 3 : 1;
    std::vector<std::string> requests;
    for (int i = 0; i < messages; ++i) requests.push_back(in_.ShortString());
    Call(fixture_, method, requests);
  }

  // A request of any method (those added later too), filled field by field
  // through reflection.
  void Reflective() {
    const std::vector<Method>& methods = Methods();
    const Method& method = methods[in_.Byte() % methods.size()];
    const Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(
            method.input);
    if (prototype == nullptr) return;
    const int messages = method.client_streaming ? 1 + in_.Byte() % 3 : 1;
    std::vector<std::string> requests;
    for (int i = 0; i < messages; ++i) {
      std::unique_ptr<Message> request(prototype->New());
      Fill(request.get(), 0);
      requests.push_back(request->SerializeAsString());
    }
    Call(fixture_, method, requests);
  }

  void Fill(Message* message, int depth) {
    const Descriptor* descriptor = message->GetDescriptor();
    const Reflection* reflection = message->GetReflection();
    for (int i = 0; i < descriptor->field_count(); ++i) {
      const FieldDescriptor* field = descriptor->field(i);
      if (!(in_.Byte() & 1)) continue;
      const bool repeated = field->is_repeated();
      const int count = repeated ? in_.Byte() % 4 : 1;
      for (int j = 0; j < count; ++j) {
        switch (field->cpp_type()) {
          case FieldDescriptor::CPPTYPE_INT32: {
            const auto v = static_cast<int32_t>(in_.U32());
            repeated ? reflection->AddInt32(message, field, v)
                     : reflection->SetInt32(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_INT64: {
            const uint8_t b = in_.Byte();
            const auto v = b < 128 ? static_cast<int64_t>(b) - 8
                                   : static_cast<int64_t>(in_.U64());
            repeated ? reflection->AddInt64(message, field, v)
                     : reflection->SetInt64(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_UINT32: {
            const uint32_t v = in_.U32();
            repeated ? reflection->AddUInt32(message, field, v)
                     : reflection->SetUInt32(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_UINT64: {
            const uint64_t v = in_.U64();
            repeated ? reflection->AddUInt64(message, field, v)
                     : reflection->SetUInt64(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_DOUBLE: {
            const double v = static_cast<int8_t>(in_.Byte()) * 1.5;
            repeated ? reflection->AddDouble(message, field, v)
                     : reflection->SetDouble(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_FLOAT: {
            const float v = static_cast<int8_t>(in_.Byte()) * 1.5f;
            repeated ? reflection->AddFloat(message, field, v)
                     : reflection->SetFloat(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_BOOL: {
            const bool v = in_.Byte() & 1;
            repeated ? reflection->AddBool(message, field, v)
                     : reflection->SetBool(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_ENUM: {
            const int v = static_cast<int8_t>(in_.Byte()) % 8;
            repeated ? reflection->AddEnumValue(message, field, v)
                     : reflection->SetEnumValue(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_STRING: {
            const uint8_t b = in_.Byte();
            const std::string v = b < 128   ? ConsumerName()
                                  : b < 192 ? Name("t")
                                            : in_.ShortString();
            repeated ? reflection->AddString(message, field, v)
                     : reflection->SetString(message, field, v);
            break;
          }
          case FieldDescriptor::CPPTYPE_MESSAGE:
            if (depth < 3) {
              Fill(repeated ? reflection->AddMessage(message, field)
                            : reflection->MutableMessage(message, field),
                   depth + 1);
            }
            break;
        }
      }
    }
  }

  Fixture& fixture_;
  Input& in_;
  int64_t rows_left_ = kRowBudget;
  std::map<std::string, int64_t> last_end_;
};

void RunOne(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t selector = in.Byte();
  if (selector < kStructured) {
    RunRaw(selector, in);
    return;
  }
  if (Verbose()) std::fprintf(stderr, "structured, config %d\n", selector % 8);
  Fixture fixture(kConfigs[selector % 8]);
  Session(fixture, in).Run();
}

}  // namespace
}  // namespace deltastream

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One thread per tensor op: inputs stay fast and replay alike.
  at::set_num_threads(1);
  // Protobuf logs every string field of invalid UTF-8 it parses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  deltastream::Methods();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  deltastream::RunOne(data, size);
  return 0;
}
