#include "clients/delta_client.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <future>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/auth.h"
#include "base/file_io.h"
#include "base/grpc_server.h"
#include "proto/tensor_codec.h"

namespace deltastream {

absl::Status ReadCredentialFiles(const std::string& token_file,
                                 const std::string& tls_ca_file,
                                 ClientOptions& options) {
  if (!token_file.empty()) {
    absl::StatusOr<std::string> text = ReadSmallFile(token_file);
    if (!text.ok()) return text.status();
    std::string token(absl::StripAsciiWhitespace(
        absl::string_view(*text).substr(0, text->find('\n'))));
    if (absl::Status valid = CheckToken(token); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token_file '", token_file, "': ", valid.message()));
    }
    options.auth_token = std::move(token);
  }
  if (!tls_ca_file.empty()) {
    absl::StatusOr<std::string> pem = ReadSmallFile(tls_ca_file);
    if (!pem.ok()) return pem.status();
    if (absl::Status valid = CheckPemCertificates(
            *pem, absl::StrCat("--tls_ca '", tls_ca_file, "'"));
        !valid.ok()) {
      return valid;
    }
    options.tls_root_certs_pem = *pem;
  }
  return absl::OkStatus();
}

void CallCanceller::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  context_.TryCancel();
}

bool CallCanceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool CallCanceller::Sleep(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&cancelled_), duration);
  return !cancelled_;
}

std::unique_ptr<DeltaClient> DeltaClient::Create(const std::string& target,
                                                 ClientOptions options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  const int max_backoff_ms =
      static_cast<int>(options.max_reconnect_backoff.count());
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              std::min(100, max_backoff_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
              static_cast<int>(options.keepalive_time.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(options.keepalive_timeout.count()));
  // Keep pinging a subscription with no deltas to send (gRPC stops after 2
  // pings without data by default).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the time
  // one connection attempt may take (default 20 s). At 100 ms, a handshake
  // on a loaded machine failed with "connection attempt timed out before
  // receiving SETTINGS frame" (seen at load 10 in the integration tests).
  auto credentials = options.tls_root_certs_pem.empty()
                         ? grpc::InsecureChannelCredentials()
                         : grpc::SslCredentials(grpc::SslCredentialsOptions{
                               options.tls_root_certs_pem, "", ""});
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  return std::unique_ptr<DeltaClient>(
      new DeltaClient(target, options, std::move(channel)));
}

DeltaClient::DeltaClient(std::string target, ClientOptions options,
                         std::shared_ptr<grpc::Channel> channel)
    : target_(std::move(target)),
      options_(options),
      channel_(channel),
      stub_(v1::DeltaTracker::NewStub(channel)) {}

void DeltaClient::Prepare(grpc::ClientContext& context, CallKind kind) const {
  if (kind != CallKind::kSubscription) {
    context.set_deadline(std::chrono::system_clock::now() +
                         (kind == CallKind::kStream ? options_.stream_timeout
                                                    : options_.timeout));
  }
  if (!options_.auth_token.empty()) {
    context.AddMetadata("authorization",
                        absl::StrCat("Bearer ", options_.auth_token));
  }
}

absl::Status DeltaClient::ToStatus(const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnavailable ||
      code == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(code, absl::StrCat("cannot reach ", target_, ": ",
                                           status.error_message()));
  }
  if (code == absl::StatusCode::kUnimplemented &&
      status.error_message().empty()) {
    // gRPC's answer for a method the server does not have.
    return absl::Status(code, absl::StrCat(target_,
                                           " does not serve this call (not a "
                                           "delta tracker service?)"));
  }
  return absl::Status(code, status.error_message());
}

namespace {

// Adds rows [offset, offset + rows) of `table` to `request`.
absl::Status AddRows(const RecordTable& table, int64_t offset, int64_t rows,
                     v1::RecordRequest& request) {
  v1::TableRows* out = request.add_tables();
  out->set_fqn(table.fqn);
  if (absl::Status s =
          EncodeTensor(table.ids.narrow(0, offset, rows), out->mutable_ids());
      !s.ok()) {
    return s;
  }
  if (!table.states.defined()) return absl::OkStatus();
  return EncodeTensor(table.states.narrow(0, offset, rows),
                      out->mutable_states());
}

// The messages that carry one record: one, unless a table is over
// `max_bytes`, which then goes in slices of rows on messages of its own.
absl::StatusOr<std::vector<v1::RecordRequest>> RecordMessages(
    const std::vector<RecordTable>& record, int64_t max_bytes) {
  std::vector<v1::RecordRequest> messages(1);
  for (const RecordTable& table : record) {
    if (!table.ids.defined() || table.ids.dim() != 1 ||
        (table.states.defined() &&
         (table.states.dim() == 0 ||
          table.states.size(0) != table.ids.size(0)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.fqn, "': IDs must be 1-D and states one row each"));
    }
    const int64_t rows = table.ids.numel();
    const int64_t row_bytes =
        table.ids.element_size() +
        (table.states.defined() && rows > 0 ? table.states.nbytes() / rows : 0);
    if (rows * row_bytes <= max_bytes) {
      if (absl::Status s = AddRows(table, 0, rows, messages[0]); !s.ok()) {
        return s;
      }
      continue;
    }
    const int64_t slice = std::max<int64_t>(1, max_bytes / row_bytes);
    for (int64_t offset = 0; offset < rows; offset += slice) {
      messages.emplace_back();
      if (absl::Status s = AddRows(
              table, offset, std::min(slice, rows - offset), messages.back());
          !s.ok()) {
        return s;
      }
    }
  }
  if (messages[0].tables().empty() && messages.size() > 1) {
    messages.erase(messages.begin());
  }
  return messages;
}

}  // namespace

absl::StatusOr<int64_t> DeltaClient::Record(
    const std::vector<std::vector<RecordTable>>& records) {
  std::vector<v1::RecordRequest> messages;
  for (const std::vector<RecordTable>& record : records) {
    auto split = RecordMessages(record, options_.record_message_bytes);
    if (!split.ok()) return split.status();
    for (v1::RecordRequest& m : *split) messages.push_back(std::move(m));
  }
  grpc::ClientContext context;
  Prepare(context, CallKind::kStream);
  v1::RecordResponse response;
  auto writer = stub_->Record(&context, &response);
  for (const v1::RecordRequest& message : messages) {
    if (!writer->Write(message)) break;  // Finish() says why
  }
  writer->WritesDone();
  if (absl::Status s = ToStatus(writer->Finish()); !s.ok()) return s;
  // gRPC's sync server ends a stream quietly at a message it cannot parse:
  // the count tells.
  if (response.records() != static_cast<int64_t>(messages.size())) {
    return absl::DataLossError(absl::StrCat(
        target_, " recorded ", response.records(), " of ", messages.size(),
        " messages; the rest were not received whole"));
  }
  return response.batch();
}

template <typename Request, typename Response>
absl::StatusOr<Response> DeltaClient::Call(
    grpc::Status (v1::DeltaTracker::Stub::*method)(grpc::ClientContext*,
                                                   const Request&, Response*),
    const Request& request) {
  grpc::ClientContext context;
  Prepare(context, CallKind::kUnary);
  Response response;
  if (absl::Status s =
          ToStatus((stub_.get()->*method)(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<int64_t> DeltaClient::Step() {
  auto response = Call(&v1::DeltaTracker::Stub::Step, v1::StepRequest());
  if (!response.ok()) return response.status();
  return response->batch();
}

namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

constexpr char kGetDelta[] = "/deltastream.v1.DeltaTracker/GetDelta";
constexpr char kSubscribe[] = "/deltastream.v1.DeltaTracker/Subscribe";

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("malformed delta chunk: ", what));
}

// Why RowsDestination found no place for a chunk's rows: a table that
// does not fit in memory as it is (ResourceExhausted), else a malformed chunk.
absl::Status Unplaced(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted
             ? status
             : Malformed(status.message());
}

// Reads one v1::Tensor message holding rows [row_offset, ...) of a table of
// `table_rows` rows: its data goes from the received bytes straight into
// `*table` (allocated on the first chunk). `*received` rows of it came
// before: the chunk must start there, and adds its rows.
absl::Status ReadRowsInto(CodedInputStream& in, int64_t row_offset,
                          int64_t table_rows, at::Tensor* table,
                          int64_t* received) {
  uint32_t length = 0;
  if (!in.ReadVarint32(&length)) return Malformed("tensor length");
  const CodedInputStream::Limit limit = in.PushLimit(length);
  uint64_t dtype = 0;
  std::vector<int64_t> shape;
  bool has_data = false;
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto wire = WireFormatLite::GetTagWireType(tag);
    if (field == 1 && wire == WireFormatLite::WIRETYPE_VARINT) {
      if (!in.ReadVarint64(&dtype)) return Malformed("dtype");
    } else if (field == 2 &&
               wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t packed = 0;
      if (!in.ReadVarint32(&packed)) return Malformed("shape");
      const CodedInputStream::Limit shape_limit = in.PushLimit(packed);
      while (in.BytesUntilLimit() > 0) {
        uint64_t size = 0;
        if (!in.ReadVarint64(&size)) return Malformed("shape");
        shape.push_back(static_cast<int64_t>(size));
      }
      in.PopLimit(shape_limit);
    } else if (field == 2 && wire == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t size = 0;
      if (!in.ReadVarint64(&size)) return Malformed("shape");
      shape.push_back(static_cast<int64_t>(size));
    } else if (field == 3 &&
               wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t bytes = 0;
      if (!in.ReadVarint32(&bytes)) return Malformed("data length");
      // Before anything is allocated for them, the bytes must be there: a
      // length past the message (2^31 and more would read as a negative
      // size) is refused, not read.
      if (bytes > static_cast<uint32_t>(std::max(0, in.BytesUntilLimit()))) {
        return Malformed(
            absl::StrCat("data of ", bytes, " bytes past the tensor's end"));
      }
      absl::StatusOr<WireLayout> layout =
          CheckLayout(static_cast<int>(dtype), shape);
      if (!layout.ok()) return Malformed(layout.status().message());
      if (layout->bytes != bytes) {
        return Malformed(absl::StrCat("data of ", bytes,
                                      " bytes for a shape of ", layout->bytes));
      }
      absl::StatusOr<char*> destination =
          RowsDestination(*layout, row_offset, table_rows, table);
      if (!destination.ok()) return Unplaced(destination.status());
      if (bytes > 0 && !in.ReadRaw(*destination, static_cast<int>(bytes))) {
        return Malformed("data");
      }
      has_data = true;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return Malformed("unknown tensor field");
    }
  }
  if (!in.ConsumedEntireMessage()) return Malformed("tensor");
  in.PopLimit(limit);
  if (!has_data) {  // proto3 leaves out empty data: a chunk of no rows
    absl::StatusOr<WireLayout> layout =
        CheckLayout(static_cast<int>(dtype), shape);
    if (!layout.ok()) return Malformed(layout.status().message());
    if (layout->bytes != 0) return Malformed("data missing");
    absl::StatusOr<char*> destination =
        RowsDestination(*layout, row_offset, table_rows, table);
    if (!destination.ok()) return Unplaced(destination.status());
  }
  if (row_offset != *received) {
    return Malformed(absl::StrCat("rows from ", row_offset, " where row ",
                                  *received, " came next"));
  }
  *received += shape[0];  // RowsDestination checked it has a first dim
  return absl::OkStatus();
}

// OK when every table of `delta` came with its IDs and every tensor of it
// holds all its rows, one per ID.
absl::Status CheckRowsCovered(const ReceivedDelta& delta) {
  constexpr const char* kFields[] = {"ids", "states", "values", "scores"};
  for (const auto& [fqn, table] : delta.tables) {
    const at::Tensor* tensors[] = {&table.ids, &table.states, &table.values,
                                   &table.scores};
    for (int f = 0; f < 4; ++f) {
      if (!tensors[f]->defined()) continue;
      const int64_t rows = tensors[f]->size(0);
      if (table.rows_received[f] != rows) {
        return Malformed(absl::StrCat(
            "table '", fqn, "': the delta ended with ", table.rows_received[f],
            " of its ", rows, " rows of ", kFields[f]));
      }
      if (!table.ids.defined() || rows != table.ids.size(0)) {
        return Malformed(absl::StrCat(
            "table '", fqn, "': ", rows, " rows of ", kFields[f], " for ",
            table.ids.defined() ? table.ids.size(0) : 0, " ids"));
      }
    }
  }
  for (const std::string& fqn : delta.header.fqns()) {
    if (delta.tables.count(fqn) == 0) {
      return Malformed(
          absl::StrCat("table '", fqn, "' named in the header never came"));
    }
  }
  return absl::OkStatus();
}

// Adds a dense parameter, or a piece of one (NamedTensor.piece_of), to
// `delta`: pieces in order, each continuing the last parameter; a name
// once per delta.
absl::Status AddDenseParameter(const v1::NamedTensor& named,
                               ReceivedDelta& delta) {
  const std::string& name = named.name();
  auto bad = [&name](absl::string_view what) {
    return Malformed(absl::StrCat("dense parameter '", name, "': ", what));
  };
  absl::StatusOr<at::Tensor> tensor = DecodeTensor(named.tensor());
  if (!tensor.ok()) return bad(tensor.status().message());
  const int64_t received = delta.dense_elements_received;
  const bool starts = named.piece_of_size() == 0 || named.piece_offset() == 0;
  if (starts &&
      std::any_of(delta.dense.begin(), delta.dense.end(),
                  [&name](const auto& p) { return p.first == name; })) {
    return bad("sent twice");
  }
  if (named.piece_of_size() == 0) {
    if (received > 0) return bad("a whole parameter within another's pieces");
    delta.dense.emplace_back(name, *std::move(tensor));
    return absl::OkStatus();
  }
  const int64_t offset = named.piece_offset();
  if (offset != received) {
    return bad(absl::StrCat("a piece at element ", offset, " where ", received,
                            " came next"));
  }
  if (offset == 0) {
    absl::StatusOr<WireLayout> layout = CheckLayout(
        named.tensor().dtype(),
        std::vector<int64_t>(named.piece_of().begin(), named.piece_of().end()));
    if (!layout.ok()) return bad(layout.status().message());
    try {
      delta.dense.emplace_back(name, at::empty(layout->shape, layout->dtype));
    } catch (const c10::Error&) {  // a shape no memory holds
      return bad(absl::StrCat("no memory for ", layout->bytes, " bytes"));
    }
  } else if (delta.dense.empty() || delta.dense.back().first != name) {
    return bad("a piece of a parameter that did not start");
  }
  at::Tensor& whole = delta.dense.back().second;
  const int64_t n = tensor->numel();
  if (tensor->dim() != 1 || n == 0 || offset + n > whole.numel() ||
      tensor->scalar_type() != whole.scalar_type()) {
    return bad(absl::StrCat(
        "a piece of ", n, " ", c10::toString(tensor->scalar_type()),
        " elements at ", offset, " of a parameter of ", whole.numel(), " ",
        c10::toString(whole.scalar_type())));
  }
  whole.view(-1).narrow(0, offset, n).copy_(*tensor);
  delta.dense_elements_received = offset + n == whole.numel() ? 0 : offset + n;
  return absl::OkStatus();
}

}  // namespace

absl::Status AddDeltaChunk(grpc::ByteBuffer& buffer, ReceivedDelta& delta,
                           bool* last) {
  grpc::ProtoBufferReader stream(&buffer);
  CodedInputStream in(&stream);
  in.SetTotalBytesLimit(INT_MAX);
  std::string fqn;
  int64_t row_offset = 0;
  int64_t table_rows = 0;
  *last = false;
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto wire = WireFormatLite::GetTagWireType(tag);
    const bool delimited = wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    const bool varint = wire == WireFormatLite::WIRETYPE_VARINT;
    uint64_t value = 0;
    if (field == 1 && delimited) {
      uint32_t length = 0;
      if (!in.ReadVarint32(&length)) return Malformed("header");
      const CodedInputStream::Limit limit = in.PushLimit(length);
      if (!delta.header.ParseFromCodedStream(&in)) return Malformed("header");
      in.PopLimit(limit);
    } else if (field == 2 && delimited) {
      if (!WireFormatLite::ReadString(&in, &fqn)) return Malformed("fqn");
    } else if ((field == 3 || field == 4 || field == 9) && varint) {
      if (!in.ReadVarint64(&value)) return Malformed("number");
      if (field == 3) row_offset = static_cast<int64_t>(value);
      if (field == 4) table_rows = static_cast<int64_t>(value);
      if (field == 9) *last = value != 0;
    } else if (field >= 5 && field <= 8 && delimited) {
      if (fqn.empty()) return Malformed("rows before their table's name");
      ReceivedTable& table = delta.tables[fqn];
      at::Tensor* target[] = {&table.ids, &table.states, &table.values,
                              &table.scores};
      if (absl::Status s =
              ReadRowsInto(in, row_offset, table_rows, target[field - 5],
                           &table.rows_received[field - 5]);
          !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("table '", fqn, "': ", s.message()));
      }
    } else if ((field == 11 || field == 12) && varint && !fqn.empty()) {
      if (!in.ReadVarint64(&value)) return Malformed("number");
      ReceivedTable& table = delta.tables[fqn];
      (field == 11 ? table.col_offset : table.table_cols) =
          static_cast<int64_t>(value);
    } else if (field == 10 && delimited) {
      // A dense parameter: small next to the rows, parsed as a message.
      uint32_t length = 0;
      if (!in.ReadVarint32(&length)) return Malformed("dense parameter");
      const CodedInputStream::Limit limit = in.PushLimit(length);
      v1::NamedTensor named;
      if (!named.ParseFromCodedStream(&in) || named.name().empty()) {
        return Malformed("dense parameter");
      }
      in.PopLimit(limit);
      if (absl::Status s = AddDenseParameter(named, delta); !s.ok()) return s;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return Malformed("unknown field");
    }
  }
  if (!in.ConsumedEntireMessage()) return Malformed("truncated");
  if (!fqn.empty()) delta.tables[fqn];  // a table with no rows
  if (*last && delta.dense_elements_received > 0) {
    return Malformed(absl::StrCat("the delta ended within dense parameter '",
                                  delta.dense.back().first, "'"));
  }
  if (*last && static_cast<int64_t>(delta.dense.size()) !=
                   delta.header.dense_parameters()) {
    return Malformed(absl::StrCat("the delta ended with ", delta.dense.size(),
                                  " of its ", delta.header.dense_parameters(),
                                  " dense parameters"));
  }
  return *last ? CheckRowsCovered(delta) : absl::OkStatus();
}

std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>
DeltaClient::ReadSubscription(grpc::ClientContext* context,
                              const v1::SubscribeRequest& request) {
  return std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>>(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          channel_.get(),
          grpc::internal::RpcMethod(kSubscribe,
                                    grpc::internal::RpcMethod::SERVER_STREAMING,
                                    channel_),
          context, request));
}

absl::StatusOr<ReceivedDelta> DeltaClient::GetDelta(
    const v1::GetDeltaRequest& request, const CallCanceller* cancel) {
  DeltaClient* const self = this;
  absl::StatusOr<std::vector<ReceivedDelta>> deltas =
      GetDeltaFromEach(absl::MakeConstSpan(&self, 1), request, nullptr, cancel);
  if (!deltas.ok()) return deltas.status();
  return std::move(deltas->front());
}

namespace {

// gRPC takes deadlines of the system clock.
using Clock = std::chrono::system_clock;

// One stream of GetDeltaFromEach.
struct ReadOfEach {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncReader<grpc::ByteBuffer>> reader;
  grpc::ByteBuffer chunk;
  ReceivedDelta delta;
  bool last = false;
  bool ended = false;      // Finish completed
  absl::Status malformed;  // a chunk AddDeltaChunk refused
  grpc::Status finished;
  Clock::time_point idle_until;  // fails the read if nothing came by then
};

// How often a GetDeltaFromEach with a canceller looks at it.
constexpr std::chrono::milliseconds kCancelPoll{100};

// What completed on GetDeltaFromEach's queue: the tag is a stream's index
// times kSteps plus the step.
enum class ReadStep : uintptr_t { kStarted, kChunk, kFinished };
constexpr uintptr_t kSteps = 3;

void* Tag(size_t stream, ReadStep step) {
  return reinterpret_cast<void*>(stream * kSteps +
                                 static_cast<uintptr_t>(step));
}

}  // namespace

absl::StatusOr<std::vector<ReceivedDelta>> DeltaClient::GetDeltaFromEach(
    absl::Span<DeltaClient* const> clients, const v1::GetDeltaRequest& request,
    size_t* failed, const CallCanceller* cancel) {
  grpc::CompletionQueue queue;
  std::vector<ReadOfEach> reads(clients.size());
  for (size_t i = 0; i < clients.size(); ++i) {
    const DeltaClient& client = *clients[i];
    client.Prepare(reads[i].context, CallKind::kStream);
    reads[i].reader.reset(
        grpc::internal::ClientAsyncReaderFactory<grpc::ByteBuffer>::Create(
            client.channel_.get(), &queue,
            grpc::internal::RpcMethod(
                kGetDelta, grpc::internal::RpcMethod::SERVER_STREAMING,
                client.channel_),
            &reads[i].context, request, /*start=*/true,
            Tag(i, ReadStep::kStarted)));
  }
  absl::Status error;
  size_t streams_open = clients.size();
  void* tag = nullptr;
  bool ok = false;
  // Fails the read with `status` (the first failure only), naming stream i.
  const auto fail = [&](size_t i, absl::Status status) {
    if (!error.ok()) return;
    error = std::move(status);
    if (failed != nullptr) *failed = i;
    for (ReadOfEach& other : reads) other.context.TryCancel();
  };
  for (size_t i = 0; i < clients.size(); ++i) {
    reads[i].idle_until =
        Clock::now() + clients[i]->options_.stream_idle_timeout;
  }
  while (streams_open > 0) {
    // Once failed, the cancelled streams end without waiting for servers.
    Clock::time_point wake = Clock::time_point::max();
    for (size_t i = 0; i < reads.size() && error.ok(); ++i) {
      if (!reads[i].ended) wake = std::min(wake, reads[i].idle_until);
    }
    if (cancel != nullptr && error.ok()) {
      if (cancel->cancelled()) {
        fail(0, absl::CancelledError("the read was cancelled"));
        continue;
      }
      wake = std::min(wake, Clock::now() + kCancelPoll);
    }
    const grpc::CompletionQueue::NextStatus next =
        queue.AsyncNext(&tag, &ok, wake);
    if (next == grpc::CompletionQueue::SHUTDOWN) break;
    if (next == grpc::CompletionQueue::TIMEOUT) {
      // Every idle stream is named: when one rank hangs, the others stall
      // behind it at their next collective and go quiet too.
      std::vector<size_t> idle;
      for (size_t i = 0; i < reads.size(); ++i) {
        if (!reads[i].ended && Clock::now() >= reads[i].idle_until) {
          idle.push_back(i);
        }
      }
      if (idle.empty()) continue;
      std::string targets;
      for (size_t i : idle) {
        absl::StrAppend(&targets, targets.empty() ? "" : ", ",
                        clients[i]->target_);
      }
      fail(idle[0], absl::DeadlineExceededError(absl::StrCat(
                        targets, " sent nothing for ",
                        absl::FormatDuration(absl::FromChrono(
                            clients[idle[0]]->options_.stream_idle_timeout)),
                        " (a hung server, or a trainer stalled behind one)")));
      continue;
    }
    const uintptr_t value = reinterpret_cast<uintptr_t>(tag);
    const size_t i = value / kSteps;
    ReadOfEach& read = reads[i];
    read.idle_until = Clock::now() + clients[i]->options_.stream_idle_timeout;
    const ReadStep step = static_cast<ReadStep>(value % kSteps);
    if (step == ReadStep::kFinished) {
      --streams_open;
      read.ended = true;
      absl::Status status = read.malformed.ok()
                                ? clients[i]->ToStatus(read.finished)
                                : read.malformed;
      if (status.ok() && !read.last) {
        // A stream cut short is never taken for a whole delta.
        status = absl::DataLossError(
            absl::StrCat(clients[i]->target_,
                         " ended a delta's stream before its last chunk"));
      }
      if (!status.ok()) fail(i, std::move(status));
      continue;
    }
    if (step == ReadStep::kChunk && ok) {
      read.malformed = AddDeltaChunk(read.chunk, read.delta, &read.last);
      if (!read.malformed.ok()) {
        read.context.TryCancel();
        ok = false;
      }
    }
    if (ok) {
      read.reader->Read(&read.chunk, Tag(i, ReadStep::kChunk));
    } else {
      read.reader->Finish(&read.finished, Tag(i, ReadStep::kFinished));
    }
  }
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  if (!error.ok()) return error;
  std::vector<ReceivedDelta> deltas;
  deltas.reserve(reads.size());
  for (ReadOfEach& read : reads) deltas.push_back(std::move(read.delta));
  return deltas;
}

absl::Status DeltaClient::Subscribe(
    const v1::SubscribeRequest& request,
    const std::function<bool(ReceivedDelta&&)>& on_delta,
    CallCanceller* subscription) {
  CallCanceller own;
  grpc::ClientContext& context =
      subscription != nullptr ? subscription->context_ : own.context_;
  Prepare(context, CallKind::kSubscription);
  auto reader = ReadSubscription(&context, request);
  ReceivedDelta delta;
  grpc::ByteBuffer chunk;
  bool stopped = false;
  bool last = false;
  while (!stopped && reader->Read(&chunk)) {
    if (absl::Status s = AddDeltaChunk(chunk, delta, &last); !s.ok()) {
      context.TryCancel();
      reader->Finish();
      return s;
    }
    if (!last) continue;
    stopped = !on_delta(std::move(delta));
    delta = ReceivedDelta();
  }
  if (stopped) context.TryCancel();
  grpc::Status status = reader->Finish();
  // Ended as asked (both ways cancel the call); a cancel nobody here asked
  // for (a proxy's, the server's) is the stream failing.
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      (stopped || (subscription != nullptr && subscription->cancelled()))) {
    return absl::OkStatus();
  }
  return ToStatus(status);
}

absl::Status DeltaClient::Commit(const std::string& consumer,
                                 int64_t end_batch) {
  v1::CommitRequest request;
  request.set_consumer(consumer);
  request.set_end_batch(end_batch);
  return Call(&v1::DeltaTracker::Stub::Commit, request).status();
}

absl::Status DeltaClient::Touch(const std::string& consumer,
                                const CallCanceller* cancel) {
  v1::ConsumerRequest request;
  request.set_consumer(consumer);
  if (cancel == nullptr) {
    return Call(&v1::DeltaTracker::Stub::Touch, request).status();
  }
  // gRPC's callback form, so that this thread can look at `cancel` while
  // the call is in flight; the promise lives as long as the callback.
  grpc::ClientContext context;
  Prepare(context, CallKind::kUnary);
  v1::TouchResponse response;
  auto ended = std::make_shared<std::promise<grpc::Status>>();
  std::future<grpc::Status> status = ended->get_future();
  stub_->async()->Touch(&context, &request, &response,
                        [ended](grpc::Status s) { ended->set_value(s); });
  while (status.wait_for(kCancelPoll) != std::future_status::ready) {
    if (cancel->cancelled()) {
      context.TryCancel();
      status.wait();
      return absl::CancelledError(
          absl::StrCat("the touch of ", target_, " was cancelled"));
    }
  }
  return ToStatus(status.get());
}

namespace {

template <typename Response>
absl::StatusOr<std::vector<std::string>> ConsumerNames(
    const absl::StatusOr<Response>& response) {
  if (!response.ok()) return response.status();
  return std::vector<std::string>(response->consumers().begin(),
                                  response->consumers().end());
}

v1::ConsumerRequest ConsumerNamed(const std::string& consumer) {
  v1::ConsumerRequest request;
  request.set_consumer(consumer);
  return request;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> DeltaClient::ListConsumers() {
  return ConsumerNames(
      Call(&v1::DeltaTracker::Stub::ListConsumers, v1::ListConsumersRequest()));
}

absl::StatusOr<std::vector<std::string>> DeltaClient::AddConsumer(
    const std::string& consumer) {
  return ConsumerNames(
      Call(&v1::DeltaTracker::Stub::AddConsumer, ConsumerNamed(consumer)));
}

absl::StatusOr<std::vector<std::string>> DeltaClient::RemoveConsumer(
    const std::string& consumer) {
  return ConsumerNames(
      Call(&v1::DeltaTracker::Stub::RemoveConsumer, ConsumerNamed(consumer)));
}

absl::StatusOr<v1::StatusResponse> DeltaClient::Compact() {
  return Call(&v1::DeltaTracker::Stub::Compact, v1::CompactRequest());
}

absl::StatusOr<v1::StatusResponse> DeltaClient::Clear(
    const std::string& consumer) {
  v1::ClearRequest request;
  request.set_consumer(consumer);
  return Call(&v1::DeltaTracker::Stub::Clear, request);
}

absl::StatusOr<v1::StatusResponse> DeltaClient::Status() {
  return Call(&v1::DeltaTracker::Stub::Status, v1::StatusRequest());
}

absl::StatusOr<v1::TopologyResponse> DeltaClient::Topology() {
  return Call(&v1::DeltaTracker::Stub::Topology, v1::TopologyRequest());
}

absl::StatusOr<v1::SnapshotInfo> DeltaClient::Snapshot() {
  auto response =
      Call(&v1::DeltaTracker::Stub::Snapshot, v1::SnapshotRequest());
  if (!response.ok()) return response.status();
  return response->snapshot();
}

}  // namespace deltastream
