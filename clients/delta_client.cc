#include "clients/delta_client.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "proto/tensor_codec.h"

namespace deltastream {

std::unique_ptr<DeltaClient> DeltaClient::Create(const std::string& target,
                                                 ClientOptions options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  auto channel = grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<DeltaClient>(
      new DeltaClient(target, options, std::move(channel)));
}

DeltaClient::DeltaClient(std::string target, ClientOptions options,
                         std::shared_ptr<grpc::Channel> channel)
    : target_(std::move(target)),
      options_(options),
      stub_(v1::DeltaTracker::NewStub(channel)) {}

void DeltaClient::SetDeadline(grpc::ClientContext& context, bool stream) const {
  context.set_deadline(std::chrono::system_clock::now() +
                       (stream ? options_.stream_timeout : options_.timeout));
}

absl::Status DeltaClient::ToStatus(const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnavailable ||
      code == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(code, absl::StrCat("cannot reach ", target_, ": ",
                                           status.error_message()));
  }
  return absl::Status(code, status.error_message());
}

absl::StatusOr<int64_t> DeltaClient::Record(
    const std::vector<std::vector<RecordTable>>& records) {
  grpc::ClientContext context;
  SetDeadline(context, /*stream=*/true);
  v1::RecordResponse response;
  auto writer = stub_->Record(&context, &response);
  for (const std::vector<RecordTable>& record : records) {
    v1::RecordRequest request;
    for (const RecordTable& table : record) {
      v1::TableRows* rows = request.add_tables();
      rows->set_fqn(table.fqn);
      if (absl::Status s = EncodeTensor(table.ids, rows->mutable_ids());
          !s.ok()) {
        return s;
      }
      if (table.states.defined()) {
        if (absl::Status s = EncodeTensor(table.states, rows->mutable_states());
            !s.ok()) {
          return s;
        }
      }
    }
    if (!writer->Write(request)) break;  // the status says why
  }
  writer->WritesDone();
  if (absl::Status s = ToStatus(writer->Finish()); !s.ok()) return s;
  return response.batch();
}

absl::StatusOr<int64_t> DeltaClient::Step() {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::StepResponse response;
  if (absl::Status s = ToStatus(stub_->Step(&context, {}, &response));
      !s.ok()) {
    return s;
  }
  return response.batch();
}

absl::StatusOr<ReceivedDelta> DeltaClient::GetDelta(
    const v1::GetDeltaRequest& request) {
  grpc::ClientContext context;
  SetDeadline(context, true);
  auto reader = stub_->GetDelta(&context, request);
  ReceivedDelta delta;
  v1::DeltaChunk chunk;
  while (reader->Read(&chunk)) {
    if (chunk.has_header()) delta.header = chunk.header();
    if (chunk.fqn().empty()) continue;
    ReceivedTable& table = delta.tables[chunk.fqn()];
    for (auto [wire, out] : {std::pair{&chunk.ids(), &table.ids},
                             std::pair{&chunk.states(), &table.states},
                             std::pair{&chunk.values(), &table.values},
                             std::pair{&chunk.scores(), &table.scores}}) {
      if (wire->dtype() == v1::Tensor::DTYPE_UNSPECIFIED) continue;
      absl::Status decoded =
          DecodeRowsInto(*wire, chunk.row_offset(), chunk.table_rows(), out);
      if (!decoded.ok()) {
        context.TryCancel();
        return absl::DataLossError(absl::StrCat(
            "bad chunk of table '", chunk.fqn(), "': ", decoded.message()));
      }
    }
  }
  if (absl::Status s = ToStatus(reader->Finish()); !s.ok()) return s;
  return delta;
}

absl::Status DeltaClient::Commit(const std::string& consumer,
                                 int64_t end_batch) {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::CommitRequest request;
  request.set_consumer(consumer);
  request.set_end_batch(end_batch);
  v1::CommitResponse response;
  return ToStatus(stub_->Commit(&context, request, &response));
}

absl::StatusOr<std::vector<std::string>> DeltaClient::ListConsumers() {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::ListConsumersResponse response;
  if (absl::Status s = ToStatus(stub_->ListConsumers(&context, {}, &response));
      !s.ok()) {
    return s;
  }
  return std::vector<std::string>(response.consumers().begin(),
                                  response.consumers().end());
}

absl::StatusOr<std::vector<std::string>> DeltaClient::AddConsumer(
    const std::string& consumer) {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::ConsumerRequest request;
  request.set_consumer(consumer);
  v1::ConsumersResponse response;
  if (absl::Status s =
          ToStatus(stub_->AddConsumer(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return std::vector<std::string>(response.consumers().begin(),
                                  response.consumers().end());
}

absl::StatusOr<std::vector<std::string>> DeltaClient::RemoveConsumer(
    const std::string& consumer) {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::ConsumerRequest request;
  request.set_consumer(consumer);
  v1::ConsumersResponse response;
  if (absl::Status s =
          ToStatus(stub_->RemoveConsumer(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return std::vector<std::string>(response.consumers().begin(),
                                  response.consumers().end());
}

absl::StatusOr<v1::StatusResponse> DeltaClient::Compact() {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::StatusResponse response;
  if (absl::Status s = ToStatus(stub_->Compact(&context, {}, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<v1::StatusResponse> DeltaClient::Clear(
    const std::string& consumer) {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::ClearRequest request;
  request.set_consumer(consumer);
  v1::StatusResponse response;
  if (absl::Status s = ToStatus(stub_->Clear(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<v1::StatusResponse> DeltaClient::Status() {
  grpc::ClientContext context;
  SetDeadline(context, false);
  v1::StatusResponse response;
  if (absl::Status s = ToStatus(stub_->Status(&context, {}, &response));
      !s.ok()) {
    return s;
  }
  return response;
}

}  // namespace deltastream
