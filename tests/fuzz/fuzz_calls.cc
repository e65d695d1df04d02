#include "tests/fuzz/fuzz_calls.h"

#include <google/protobuf/message.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "proto/tracker.grpc.pb.h"
#include "proto/tracker.pb.h"

namespace deltastream {
namespace service_fuzz {

using google::protobuf::Message;

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

CallResult Call(Fixture& fixture, const Method& method,
                const std::vector<std::string>& requests, int cancel_after) {
  const bool finite = !method.server_streaming || method.name == "GetDelta";
  size_t max_reads = finite ? std::numeric_limits<size_t>::max() : 4;
  if (cancel_after >= 0) {
    max_reads = std::min(max_reads, static_cast<size_t>(cancel_after));
  }
  grpc::ClientContext context;
  if (const std::string token = fixture.NextToken(); !token.empty()) {
    context.AddMetadata("authorization", "Bearer " + token);
  }
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
  // UNKNOWN is what gRPC answers when an exception leaves a handler; the
  // service maps every error to a documented code (docs/service.md).
  if (result.status.error_code() == grpc::StatusCode::UNKNOWN) {
    std::fprintf(stderr, "%s answered UNKNOWN: %s\n", method.name.c_str(),
                 result.status.error_message().c_str());
    std::abort();
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

}  // namespace service_fuzz
}  // namespace deltastream
