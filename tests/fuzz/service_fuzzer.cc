// libFuzzer target: arbitrary bytes as requests to the tracker's gRPC
// handlers (tracker_service/delta_tracker_service.h). Built and run by
// tests/fuzz/fuzz_service_test.sh; any status code is fine, a crash, hang,
// leak or sanitizer report is not.
//
// Each input gets fresh trackers behind an in-process server (no port), so an
// input replays the same way on its own. Configurations 2 and 7 add a snapshot
// database in a temporary directory (after the input, its state is
// snapshotted and restored into a fresh tracker, which is read); 5 and 7 a
// token authorizer (calls carry each role's token, an unknown one and none in
// turn). An UNKNOWN status (an exception that left a handler) is a finding.
// Input layout (read from the front; past its end every read is 0):
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
//
// The pieces: fuzz_input.h (the input), fuzz_fixture.h (configurations and
// the server), fuzz_calls.h (methods, one call, raw mode); this file holds
// the structured mode and libFuzzer's entry points.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/stubs/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/tracker.pb.h"
#include "tests/fuzz/fuzz_calls.h"
#include "tests/fuzz/fuzz_fixture.h"
#include "tests/fuzz/fuzz_input.h"

namespace deltastream {
namespace service_fuzz {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr int kMaxOps = 32;
// Rows one input may record in all (dims are at most 64).
constexpr int64_t kRowBudget = 4096;
constexpr uint8_t kStructured = 0xE0;

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
}  // namespace service_fuzz
}  // namespace deltastream

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One thread per tensor op: inputs stay fast and replay alike.
  at::set_num_threads(1);
  // Protobuf logs every string field of invalid UTF-8 it parses: noise here.
  google::protobuf::SetLogHandler(nullptr);
  deltastream::service_fuzz::Methods();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  deltastream::service_fuzz::RunOne(data, size);
  return 0;
}
