#include "tracker_service/delta_tracker_service.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

absl::Status ValidateName(absl::string_view what, const std::string& name) {
  if (name.empty() || name.size() > DeltaTrackerService::kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be 1 to ", DeltaTrackerService::kMaxNameBytes,
                     " bytes, got ", name.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<TopK> ToTopK(const v1::TopK& top_k) {
  TopK result;
  switch (top_k.rows_case()) {
    case v1::TopK::kPercentage:
      result = TopK::Percentage(top_k.percentage());
      break;
    case v1::TopK::kCount:
      result = TopK::Count(top_k.count());
      break;
    default:
      return absl::InvalidArgumentError("top-k needs a percentage or a count");
  }
  if (absl::Status status = result.Validate(); !status.ok()) return status;
  return result;
}

absl::StatusOr<std::vector<TableLookup>> ToTableLookups(
    const v1::RecordRequest& request) {
  std::vector<TableLookup> tables;
  for (const v1::TableRows& rows : request.tables()) {
    if (absl::Status s = ValidateName("table FQN", rows.fqn()); !s.ok()) {
      return s;
    }
    TableLookup lookup;
    lookup.fqn = rows.fqn();
    absl::StatusOr<at::Tensor> ids = DecodeTensor(rows.ids());
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", rows.fqn(), "' IDs: ", ids.status().message()));
    }
    lookup.ids = *std::move(ids);
    if (rows.has_states()) {
      absl::StatusOr<at::Tensor> states = DecodeTensor(rows.states());
      if (!states.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", rows.fqn(), "' states: ", states.status().message()));
      }
      lookup.states = *std::move(states);
    }
    tables.push_back(std::move(lookup));
  }
  return tables;
}

// Bytes one row takes in a chunk.
int64_t RowBytes(const TableDelta& table) {
  int64_t bytes = 0;
  for (const at::Tensor* t :
       {&table.ids, &table.states, &table.values, &table.scores}) {
    if (t->defined() && t->size(0) > 0) bytes += t->nbytes() / t->size(0);
  }
  return std::max<int64_t>(bytes, 1);
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status DeltaTrackerService::Record(
    grpc::ServerContext*, grpc::ServerReader<v1::RecordRequest>* reader,
    v1::RecordResponse* response) {
  v1::RecordRequest request;
  int64_t records = 0;
  while (reader->Read(&request)) {
    absl::StatusOr<std::vector<TableLookup>> tables = ToTableLookups(request);
    absl::Status status = tables.ok()
                              ? tracker_->RecordTables(*std::move(tables))
                              : tables.status();
    if (!status.ok()) {
      return ToGrpcStatus(absl::Status(
          status.code(),
          absl::StrCat("record ", records, " of this stream (", records,
                       " before it were recorded): ", status.message())));
    }
    ++records;
  }
  response->set_records(records);
  response->set_batch(tracker_->current_batch());
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::Step(grpc::ServerContext*,
                                       const v1::StepRequest*,
                                       v1::StepResponse* response) {
  response->set_batch(tracker_->Step());
  tracker_->TriggerCompaction();
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::GetDelta(
    grpc::ServerContext* context, const v1::GetDeltaRequest* request,
    grpc::ServerWriter<v1::DeltaChunk>* writer) {
  if (absl::Status s = ValidateName("consumer name", request->consumer());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  DeltaRequest delta_request;
  delta_request.consumer = request->consumer();
  delta_request.through_current_batch = false;
  delta_request.include_scores = request->include_scores();
  for (const std::string& fqn : request->fqns()) {
    if (absl::Status s = ValidateName("table FQN", fqn); !s.ok()) {
      return ToGrpcStatus(s);
    }
    delta_request.fqns.push_back(fqn);
  }
  if (request->has_top_k()) {
    absl::StatusOr<TopK> top_k = ToTopK(request->top_k());
    if (!top_k.ok()) return ToGrpcStatus(top_k.status());
    delta_request.top_k = *top_k;
  }
  for (const auto& [fqn, spec] : request->per_table_top_k()) {
    absl::StatusOr<TopK> top_k = ToTopK(spec);
    if (!top_k.ok()) return ToGrpcStatus(top_k.status());
    delta_request.per_table_top_k[fqn] = *top_k;
  }
  const int64_t chunk_bytes =
      request->max_chunk_bytes() > 0
          ? std::min<int64_t>(request->max_chunk_bytes(),
                              16 * kDefaultChunkBytes)
          : kDefaultChunkBytes;

  absl::StatusOr<Delta> delta = tracker_->GetDelta(delta_request);
  if (!delta.ok()) return ToGrpcStatus(delta.status());

  v1::DeltaChunk chunk;
  v1::DeltaHeader* header = chunk.mutable_header();
  header->set_consumer(delta->consumer);
  header->set_start_batch(delta->start_batch);
  header->set_end_batch(delta->end_batch);
  header->set_resync_required(delta->resync_required);
  header->set_lost_rows(delta->lost_rows);
  for (const auto& [fqn, table] : delta->tables) header->add_fqns(fqn);
  if (delta->tables.empty() && !writer->Write(chunk)) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  }
  for (const auto& [fqn, table] : delta->tables) {
    const int64_t rows = table.ids.size(0);
    const int64_t rows_per_chunk =
        std::max<int64_t>(1, chunk_bytes / RowBytes(table));
    int64_t offset = 0;
    do {
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      const int64_t n = std::min(rows_per_chunk, rows - offset);
      chunk.set_fqn(fqn);
      chunk.set_row_offset(offset);
      chunk.set_table_rows(rows);
      chunk.clear_ids();
      chunk.clear_states();
      chunk.clear_values();
      chunk.clear_scores();
      using Field = v1::Tensor* (v1::DeltaChunk::*)();
      for (auto [tensor, field] :
           {std::pair<const at::Tensor*, Field>{&table.ids,
                                                &v1::DeltaChunk::mutable_ids},
            {&table.states, &v1::DeltaChunk::mutable_states},
            {&table.values, &v1::DeltaChunk::mutable_values},
            {&table.scores, &v1::DeltaChunk::mutable_scores}}) {
        if (!tensor->defined()) continue;  // the mode provides none
        if (absl::Status s =
                EncodeTensor(tensor->narrow(0, offset, n), (chunk.*field)());
            !s.ok()) {
          return ToGrpcStatus(s);
        }
      }
      if (!writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      chunk.clear_header();
      offset += n;
    } while (offset < rows);
  }
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::Commit(grpc::ServerContext*,
                                         const v1::CommitRequest* request,
                                         v1::CommitResponse*) {
  if (absl::Status s = ValidateName("consumer name", request->consumer());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ToGrpcStatus(
      tracker_->Commit(request->consumer(), request->end_batch()));
}

grpc::Status DeltaTrackerService::ListConsumers(
    grpc::ServerContext*, const v1::ListConsumersRequest*,
    v1::ListConsumersResponse* response) {
  for (std::string& name : tracker_->Consumers()) {
    response->add_consumers(std::move(name));
  }
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::AddConsumer(
    grpc::ServerContext* context, const v1::ConsumerRequest* request,
    v1::ListConsumersResponse* response) {
  if (absl::Status s = tracker_->AddConsumer(request->consumer()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ListConsumers(context, nullptr, response);
}

grpc::Status DeltaTrackerService::RemoveConsumer(
    grpc::ServerContext* context, const v1::ConsumerRequest* request,
    v1::ListConsumersResponse* response) {
  if (absl::Status s = tracker_->RemoveConsumer(request->consumer()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  return ListConsumers(context, nullptr, response);
}

grpc::Status DeltaTrackerService::Compact(grpc::ServerContext*,
                                          const v1::CompactRequest*,
                                          v1::StatusResponse* response) {
  tracker_->CompactAll();
  FillStatus(response);
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::Clear(grpc::ServerContext*,
                                        const v1::ClearRequest* request,
                                        v1::StatusResponse* response) {
  if (request->consumer().empty()) {
    tracker_->ClearAll();
  } else if (absl::Status s = tracker_->Clear(request->consumer()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  FillStatus(response);
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::Status(grpc::ServerContext*,
                                         const v1::StatusRequest*,
                                         v1::StatusResponse* response) {
  FillStatus(response);
  return grpc::Status::OK;
}

void DeltaTrackerService::FillStatus(v1::StatusResponse* response) const {
  const TrackerStatus status = tracker_->Status();
  response->set_mode(std::string(TrackingModeName(status.mode)));
  response->set_current_batch(status.current_batch);
  response->set_delete_on_read(status.delete_on_read);
  response->set_auto_compact(status.auto_compact);
  response->set_acknowledged_reads(status.acknowledged_reads);
  for (const ConsumerStatus& c : status.consumers) {
    v1::ConsumerStatus* out = response->add_consumers();
    out->set_name(c.name);
    out->set_cursor(c.cursor);
    out->set_lag_steps(c.lag_steps);
    out->set_has_pending_read(c.pending_end.has_value());
    out->set_pending_end(c.pending_end.value_or(0));
    out->set_resync_required(c.resync_required);
  }
  for (const auto& [fqn, usage] : status.usage.tables) {
    v1::TableStatus* out = response->add_tables();
    out->set_fqn(fqn);
    out->set_lookups(usage.lookups);
    out->set_ids(usage.ids);
    out->set_bytes(usage.bytes);
  }
  response->set_bytes(status.usage.total.bytes);
  response->set_memory_cap_bytes(status.memory_cap_bytes);
  response->set_cap_compactions(status.cap_compactions);
  response->set_cap_drops(status.cap_drops);
  response->set_dropped_ids(status.dropped_ids);
  response->set_dropped_bytes(status.dropped_bytes);
}

}  // namespace deltastream
