#ifndef DELTASTREAM_TESTS_FUZZ_FUZZ_CALLS_H_
#define DELTASTREAM_TESTS_FUZZ_FUZZ_CALLS_H_

// The service fuzzer's calls: every method of the service from its
// descriptor, one call of any method with raw messages, and the raw mode.

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "tests/fuzz/fuzz_fixture.h"
#include "tests/fuzz/fuzz_input.h"

namespace deltastream {
namespace service_fuzz {

using google::protobuf::Descriptor;

struct Method {
  std::string name;  // "Record"
  std::string path;  // "/deltastream.v1.DeltaTracker/Record"
  bool client_streaming;
  bool server_streaming;
  const Descriptor* input;
  const Descriptor* output;
};

// Every method of the service, from its descriptor.
const std::vector<Method>& Methods();
const Method* FindMethod(absl::string_view name);
// The bytes of `buffer`.
std::string ToString(const grpc::ByteBuffer& buffer);

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
                int cancel_after = -1);

// Raw mode: the rest of the input, verbatim, as the messages of one call.
void RunRaw(uint8_t selector, Input& in);

}  // namespace service_fuzz
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_FUZZ_FUZZ_CALLS_H_
