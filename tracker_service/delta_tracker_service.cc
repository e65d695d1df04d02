#include "tracker_service/delta_tracker_service.h"

#include <ATen/core/Tensor.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/support/method_handler.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/subscription_schedule.h"
#include "base/torch_status.h"
#include "proto/tensor_codec.h"
#include "tracker_service/names.h"

namespace deltastream {

// Where WriteDelta's chunks go: protobuf messages (tensors copied into them)
// or bytes (tensors sent from where they lie). Both put the same messages on
// the wire.
class ChunkSink {
 public:
  // A tensor field of a chunk: its number in v1::DeltaChunk and its rows.
  struct Part {
    int field_number;
    at::Tensor rows;
  };

  virtual ~ChunkSink() = default;
  // Writes `chunk`, which holds no tensor field, with `parts` as its tensor
  // fields. false when the client went away; an error for rows the wire
  // cannot carry.
  virtual absl::StatusOr<bool> Write(v1::DeltaChunk& chunk,
                                     const std::vector<Part>& parts) = 0;
};

namespace {

// GetDelta's full name in proto/tracker.proto.
constexpr char kGetDeltaName[] = "deltastream.v1.DeltaTracker.GetDelta";

// The handler the generated service installs for GetDelta.
using GeneratedGetDelta =
    grpc::internal::ServerStreamingHandler<v1::DeltaTracker::Service,
                                           v1::GetDeltaRequest, v1::DeltaChunk>;

// GetDelta's index in the generated service's method table, looked up by its
// full name: the gRPC code generator adds a service's methods in the order of
// its descriptor, so the index follows the proto when methods are added or
// reordered. -1 when the proto has no such method.
int GetDeltaMethodIndex() {
  const google::protobuf::MethodDescriptor* method =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
          kGetDeltaName);
  return method == nullptr ? -1 : method->index();
}

class MessageSink final : public ChunkSink {
 public:
  explicit MessageSink(grpc::ServerWriterInterface<v1::DeltaChunk>* writer)
      : writer_(writer) {
    for (auto& buffer : buffers_) buffer = std::make_unique<v1::Tensor>();
  }

  absl::StatusOr<bool> Write(v1::DeltaChunk& chunk,
                             const std::vector<Part>& parts) override {
    // Each field's rows are encoded into this sink's buffer for that field,
    // lent to `chunk` for the write: buffers keep their capacity from chunk
    // to chunk and `chunk` holds no tensor field afterwards.
    for (const Part& part : parts) {
      const Field& field = kFields[part.field_number - kFields[0].number];
      std::unique_ptr<v1::Tensor>& buffer = buffers_[&field - kFields];
      if (absl::Status s = EncodeTensor(part.rows, buffer.get()); !s.ok()) {
        return s;
      }
      (chunk.*field.lend)(buffer.release());
    }
    const bool written = writer_->Write(chunk);
    for (const Part& part : parts) {
      const Field& field = kFields[part.field_number - kFields[0].number];
      buffers_[&field - kFields].reset((chunk.*field.take_back)());
    }
    return written;
  }

 private:
  struct Field {
    int number;
    void (v1::DeltaChunk::*lend)(v1::Tensor*);
    v1::Tensor* (v1::DeltaChunk::*take_back)();
  };
  // The tensor fields, by consecutive field number.
  static constexpr Field kFields[] = {
      {v1::DeltaChunk::kIdsFieldNumber, &v1::DeltaChunk::set_allocated_ids,
       &v1::DeltaChunk::release_ids},
      {v1::DeltaChunk::kStatesFieldNumber,
       &v1::DeltaChunk::set_allocated_states, &v1::DeltaChunk::release_states},
      {v1::DeltaChunk::kValuesFieldNumber,
       &v1::DeltaChunk::set_allocated_values, &v1::DeltaChunk::release_values},
      {v1::DeltaChunk::kScoresFieldNumber,
       &v1::DeltaChunk::set_allocated_scores, &v1::DeltaChunk::release_scores}};

  static_assert(v1::DeltaChunk::kScoresFieldNumber -
                        v1::DeltaChunk::kIdsFieldNumber ==
                    3,
                "the tensor fields are numbered consecutively");

  grpc::ServerWriterInterface<v1::DeltaChunk>* const writer_;
  std::unique_ptr<v1::Tensor> buffers_[4];
};

// Bytes out: the chunk's other fields serialised, each tensor field's header
// (TensorFieldPrefix), and its rows as a slice of the tensor's own memory,
// which the slice keeps alive until gRPC has sent it.
class ByteSink final : public ChunkSink {
 public:
  explicit ByteSink(
      grpc::ServerSplitStreamer<v1::GetDeltaRequest, grpc::ByteBuffer>* stream)
      : stream_(stream) {}

  absl::StatusOr<bool> Write(v1::DeltaChunk& chunk,
                             const std::vector<Part>& parts) override {
    std::vector<grpc::Slice> slices;
    std::string bytes = chunk.SerializeAsString();
    for (const Part& part : parts) {
      at::Tensor host = part.rows.cpu().contiguous();
      absl::StatusOr<std::string> prefix =
          TensorFieldPrefix(part.field_number, host);
      if (!prefix.ok()) return prefix.status();
      bytes += *prefix;
      if (host.nbytes() == 0) continue;
      slices.emplace_back(bytes);
      bytes.clear();
      void* data = host.data_ptr();
      const size_t size = host.nbytes();
      slices.emplace_back(
          data, size, [](void* held) { delete static_cast<at::Tensor*>(held); },
          new at::Tensor(std::move(host)));
    }
    if (!bytes.empty()) slices.emplace_back(bytes);
    grpc::ByteBuffer buffer(slices.data(), slices.size());
    return stream_->Write(buffer);
  }

 private:
  grpc::ServerSplitStreamer<v1::GetDeltaRequest, grpc::ByteBuffer>* const
      stream_;
};

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

absl::StatusOr<DeltaRequest> ToDeltaRequest(
    const v1::GetDeltaRequest& request) {
  if (absl::Status s = ValidateName("consumer name", request.consumer());
      !s.ok()) {
    return s;
  }
  if (request.max_chunk_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_chunk_bytes must be 0 (the server's default) or more, got ",
        request.max_chunk_bytes()));
  }
  DeltaRequest delta_request;
  delta_request.consumer = request.consumer();
  delta_request.through_current_batch = false;
  delta_request.include_scores = request.include_scores();
  delta_request.all_rows = request.all_rows();
  delta_request.include_dense = request.include_dense();
  if (request.has_continue_from()) {
    delta_request.continue_from = request.continue_from();
  }
  // Each table once, in the order first named, before the tracker's lock:
  // a list naming one table millions of times (a 64 MiB request) would be
  // checked under the lock recording waits on and kept with every pending
  // read.
  absl::flat_hash_set<absl::string_view> named;
  for (const std::string& fqn : request.fqns()) {
    if (absl::Status s = ValidateName("table FQN", fqn); !s.ok()) return s;
    if (named.insert(fqn).second) delta_request.fqns.push_back(fqn);
  }
  if (request.has_top_k()) {
    absl::StatusOr<TopK> top_k = ToTopK(request.top_k());
    if (!top_k.ok()) return top_k.status();
    delta_request.top_k = *top_k;
  }
  for (const auto& [fqn, spec] : request.per_table_top_k()) {
    if (absl::Status s = ValidateName("table FQN", fqn); !s.ok()) return s;
    absl::StatusOr<TopK> top_k = ToTopK(spec);
    if (!top_k.ok()) return top_k.status();
    delta_request.per_table_top_k[fqn] = *top_k;
  }
  return delta_request;
}

int64_t ChunkBytes(const v1::GetDeltaRequest& request) {
  return request.max_chunk_bytes() > 0
             ? std::min<int64_t>(request.max_chunk_bytes(),
                                 16 * DeltaTrackerService::kDefaultChunkBytes)
             : DeltaTrackerService::kDefaultChunkBytes;
}

void FillSnapshotInfo(const SnapshotInfo& info, v1::SnapshotInfo* out) {
  out->set_generation(info.generation);
  out->set_written_unix_micros(absl::ToUnixMicros(info.written_at));
  out->set_payload_bytes(info.payload_bytes);
  out->set_seconds(absl::ToDoubleSeconds(info.elapsed));
  out->set_batch(info.owner_batch);
}

const grpc::Status kClientGone(grpc::StatusCode::CANCELLED, "client went away");

// Runs a handler's body so that no exception leaves it: what LibTorch throws
// becomes the status of base/torch_status.h's mapping (never UNKNOWN).
template <typename Body>
grpc::Status Guarded(Body&& body) {
  grpc::Status result;
  const absl::Status caught = CatchTorchErrors([&]() -> absl::Status {
    result = body();
    return absl::OkStatus();
  });
  return caught.ok() ? result : ToGrpcStatus(caught);
}

}  // namespace

DeltaTrackerService::DeltaTrackerService(Tracker* tracker,
                                         ServiceOptions options)
    : tracker_(tracker), options_(options) {
  // GetDelta is served as split streaming (one request read, then any number
  // of writes: what the generated WithSplitStreamingMethod_GetDelta does)
  // with bytes out, so that its rows go out without a copy; clients see the
  // same server stream of DeltaChunk messages. The slot is swapped only once
  // it is known to hold the generated GetDelta handler; otherwise that handler
  // stays (the same messages, copied into protobuf).
  const int index = GetDeltaMethodIndex();
  if (index < 0 ||
      dynamic_cast<GeneratedGetDelta*>(GetHandler(index)) == nullptr) {
    return;
  }
  MarkMethodStreamed(
      index,
      new grpc::internal::SplitServerStreamingHandler<v1::GetDeltaRequest,
                                                      grpc::ByteBuffer>(
          [this](
              grpc::ServerContext* context,
              grpc::ServerSplitStreamer<v1::GetDeltaRequest, grpc::ByteBuffer>*
                  stream) { return StreamDelta(context, stream); }));
  get_delta_method_ = index;
}

grpc::Status DeltaTrackerService::Authorize(const grpc::ServerContext* context,
                                            Action action,
                                            absl::string_view consumer) const {
  if (options_.auth != nullptr) {
    if (grpc::Status s = options_.auth->Check(*context, action, consumer);
        !s.ok()) {
      return s;
    }
  }
  if (action == Action::kRecord && !options_.network_producers) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this tracker records its own process's lookups (a "
                        "trainer's): Record and Step are not served");
  }
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::Record(
    grpc::ServerContext* context, grpc::ServerReader<v1::RecordRequest>* reader,
    v1::RecordResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kRecord); !s.ok()) return s;
    v1::RecordRequest request;
    int64_t records = 0;
    while (reader->Read(&request)) {
      absl::StatusOr<std::vector<TableLookup>> tables = ToTableLookups(request);
      absl::Status status = tables.ok()
                                ? tracker_->RecordTables(*std::move(tables),
                                                         /*check_values=*/true)
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
  });
}

grpc::Status DeltaTrackerService::Step(grpc::ServerContext* context,
                                       const v1::StepRequest*,
                                       v1::StepResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kRecord); !s.ok()) return s;
    response->set_batch(tracker_->Step());
    tracker_->TriggerCompaction();
    return grpc::Status::OK;
  });
}

grpc::Status DeltaTrackerService::WriteDelta(grpc::ServerContext* context,
                                             const Delta& delta,
                                             const v1::GetDeltaRequest& request,
                                             ChunkSink& sink,
                                             StatesFill* fill) {
  grpc::Status status = WriteChunks(context, delta, request, sink, fill);
  // Without acknowledged reads the read was delivered (its cursor moved)
  // before its chunks went out: if they did not all reach the consumer, its
  // next read says so (resync_required) instead of leaving them out.
  if (!status.ok() && !tracker_->options().acknowledged_reads) {
    tracker_->RequireResyncOf(delta.consumer);
  }
  return status;
}

grpc::Status DeltaTrackerService::WriteChunks(
    grpc::ServerContext* context, const Delta& delta,
    const v1::GetDeltaRequest& request, ChunkSink& sink, StatesFill* fill) {
  const int64_t chunk_bytes = ChunkBytes(request);
  v1::DeltaChunk chunk;
  v1::DeltaHeader* header = chunk.mutable_header();
  header->set_consumer(delta.consumer);
  header->set_start_batch(delta.start_batch);
  header->set_end_batch(delta.end_batch);
  header->set_resync_required(delta.resync_required);
  header->set_lost_rows(delta.lost_rows);
  for (const auto& [fqn, table] : delta.tables) header->add_fqns(fqn);
  if (delta.oldest_change != absl::InfinitePast()) {
    header->set_oldest_change_unix_micros(
        absl::ToUnixMicros(delta.oldest_change));
    header->set_newest_change_unix_micros(
        absl::ToUnixMicros(delta.newest_change));
  }
  header->set_all_rows(delta.all_rows);
  header->set_dense_parameters(static_cast<int64_t>(delta.dense.size()));
  header->set_run_id(delta.run_id);
  header->set_run_start_batch(delta.run_start_batch);
  // Writes `message` with `parts`: OK, or why not.
  auto write = [&sink](v1::DeltaChunk& message,
                       const std::vector<ChunkSink::Part>& parts) {
    absl::StatusOr<bool> written = sink.Write(message, parts);
    if (!written.ok()) return ToGrpcStatus(written.status());
    return *written ? grpc::Status::OK : kClientGone;
  };
  if (delta.tables.empty() && delta.dense.empty()) {
    chunk.set_last(true);
    return write(chunk, {});
  }
  // Tables, then dense parameters; `last` marks the final chunk of all.
  size_t tables_left = delta.tables.size() + delta.dense.size();
  std::vector<ChunkSink::Part> parts;
  for (const auto& [fqn, full_table] : delta.tables) {
    --tables_left;
    TableDelta table = full_table;  // tensor handles: no copy
    if (request.omit_states()) table.states = at::Tensor();
    if (request.omit_values()) table.values = at::Tensor();
    const int64_t rows = table.ids.size(0);
    const int64_t rows_per_chunk =
        std::max<int64_t>(1, chunk_bytes / RowBytes(table));
    const Columns columns = ColumnsOf(fqn);
    int64_t offset = 0;
    do {
      if (context->IsCancelled()) return kClientGone;
      const int64_t n = std::min(rows_per_chunk, rows - offset);
      if (fill != nullptr) {
        // A read that failed while copying: nothing unwritten goes out.
        if (absl::Status s = fill->AwaitRows(fqn, offset + n); !s.ok()) {
          return ToGrpcStatus(s);
        }
      }
      chunk.set_fqn(fqn);
      chunk.set_row_offset(offset);
      chunk.set_table_rows(rows);
      chunk.set_col_offset(columns.offset);
      chunk.set_table_cols(columns.table_cols);
      chunk.set_last(tables_left == 0 && offset + n >= rows);
      parts.clear();
      for (auto [tensor, field] :
           {std::pair<const at::Tensor*, int>{&table.ids,
                                              v1::DeltaChunk::kIdsFieldNumber},
            {&table.states, v1::DeltaChunk::kStatesFieldNumber},
            {&table.values, v1::DeltaChunk::kValuesFieldNumber},
            {&table.scores, v1::DeltaChunk::kScoresFieldNumber}}) {
        if (!tensor->defined()) continue;  // the mode provides none
        parts.push_back({field, tensor->narrow(0, offset, n)});
      }
      if (grpc::Status s = write(chunk, parts); !s.ok()) return s;
      chunk.clear_header();
      offset += n;
    } while (offset < rows);
  }
  // One dense parameter per chunk, or one piece of a parameter larger than
  // kWholeDenseBytes: elements of the row-major parameter, in order.
  v1::DeltaChunk dense_chunk;
  if (chunk.has_header()) dense_chunk.mutable_header()->Swap(header);
  for (const auto& [name, tensor] : delta.dense) {
    --tables_left;
    const at::Tensor host = tensor.cpu().contiguous();
    const bool whole = static_cast<int64_t>(host.nbytes()) <= kWholeDenseBytes;
    const int64_t elements = host.numel();
    const int64_t per_piece =
        whole ? elements
              : std::max<int64_t>(1, chunk_bytes / host.element_size());
    int64_t offset = 0;
    do {
      if (context->IsCancelled()) return kClientGone;
      const int64_t n = std::min(per_piece, elements - offset);
      v1::NamedTensor* dense = dense_chunk.mutable_dense();
      dense->set_name(name);
      if (!whole) {
        dense->set_piece_offset(offset);
        for (int64_t size : host.sizes()) dense->add_piece_of(size);
      }
      if (absl::Status s =
              EncodeTensor(whole ? host : host.view(-1).narrow(0, offset, n),
                           dense->mutable_tensor());
          !s.ok()) {
        return ToGrpcStatus(s);
      }
      offset += n;
      dense_chunk.set_last(tables_left == 0 && offset >= elements);
      if (grpc::Status s = write(dense_chunk, {}); !s.ok()) return s;
      dense_chunk.Clear();
    } while (offset < elements);
  }
  return grpc::Status::OK;
}

grpc::Status DeltaTrackerService::ServeDelta(grpc::ServerContext* context,
                                             const v1::GetDeltaRequest& request,
                                             ChunkSink& sink,
                                             bool fill_while_sending) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kRead, request.consumer());
        !s.ok()) {
      return s;
    }
    absl::StatusOr<DeltaRequest> read = ToDeltaRequest(request);
    if (!read.ok()) return ToGrpcStatus(read.status());
    std::unique_ptr<StatesFill> fill;
    absl::StatusOr<Delta> delta = ReadAtCut(
        context, request.cut(), *read, fill_while_sending ? &fill : nullptr);
    if (!delta.ok()) return ToGrpcStatus(delta.status());
    const grpc::Status written =
        WriteDelta(context, *delta, request, sink, fill.get());
    // A transfer may outlast the consumer expiry's silence (a large delta to
    // a slow client): its end is contact too (a consumer removed meanwhile
    // has nothing to keep).
    tracker_->Touch(read->consumer).IgnoreError();
    return written;
  });
}

absl::StatusOr<Delta> DeltaTrackerService::ReadAtCut(
    grpc::ServerContext* context, int64_t cut, const DeltaRequest& read,
    std::unique_ptr<StatesFill>* fill) {
  auto get_delta = [&] {
    return fill != nullptr ? tracker_->GetDeltaFilling(read, fill)
                           : tracker_->GetDelta(read);
  };
  if (cut == 0 || options_.step_cuts == nullptr) return get_delta();
  const absl::Time deadline = std::min(absl::FromChrono(context->deadline()),
                                       absl::Now() + kCutWaitWithoutDeadline);
  if (absl::Status s = options_.step_cuts->Await(
          cut, deadline, [context] { return context->IsCancelled(); });
      !s.ok()) {
    return s;
  }
  // Released whatever the read does (a throw included): the trainer's step
  // holding for the cut goes on.
  absl::Cleanup finish = [&] { options_.step_cuts->Finish(cut); };
  return get_delta();
}

grpc::Status DeltaTrackerService::GetDelta(
    grpc::ServerContext* context, const v1::GetDeltaRequest* request,
    grpc::ServerWriter<v1::DeltaChunk>* writer) {
  MessageSink sink(writer);
  return ServeDelta(context, *request, sink, /*fill_while_sending=*/false);
}

grpc::Status DeltaTrackerService::StreamDelta(
    grpc::ServerContext* context,
    grpc::ServerSplitStreamer<v1::GetDeltaRequest, grpc::ByteBuffer>* stream) {
  v1::GetDeltaRequest request;
  if (!stream->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "no readable GetDelta request");
  }
  ByteSink sink(stream);
  return ServeDelta(context, request, sink, /*fill_while_sending=*/true);
}

grpc::Status DeltaTrackerService::Subscribe(
    grpc::ServerContext* context, const v1::SubscribeRequest* request,
    grpc::ServerWriter<v1::DeltaChunk>* writer) {
  return Guarded([&]() -> grpc::Status {
    const v1::GetDeltaRequest& read_request = request->read();
    if (grpc::Status s =
            Authorize(context, Action::kRead, read_request.consumer());
        !s.ok()) {
      return s;
    }
    if (read_request.cut() != 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a subscription's pushes read no cut (read.cut "
                          "is for one GetDelta of a sharded trainer)");
    }
    absl::StatusOr<DeltaRequest> read = ToDeltaRequest(read_request);
    if (!read.ok()) return ToGrpcStatus(read.status());
    absl::StatusOr<SubscriptionSchedule> schedule =
        SubscriptionSchedule::Create(
            {request->every_steps(), request->every_ms(),
             request->dense_every_steps(), request->dense_every_ms()},
            absl::Now(), read->continue_from);
    if (!schedule.ok()) return ToGrpcStatus(schedule.status());
    MessageSink sink(writer);
    // A subscription waiting for its next push, and one whose push took long
    // to send, is a consumer in contact (consumer expiry): touched at most
    // every kTouchEvery while it waits, and after every push. A consumer
    // removed (or expired) meanwhile ends it then, NOT_FOUND, rather than
    // at its next push, which may be an hour away.
    constexpr absl::Duration kTouchEvery = absl::Seconds(1);
    absl::Time touched = absl::Now();
    while (true) {
      if (context->IsCancelled()) return kClientGone;
      if (stopping_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the server is shutting down");
      }
      const int64_t current = tracker_->current_batch();
      const absl::Time now = absl::Now();
      if (now - touched >= kTouchEvery) {
        if (absl::Status s = tracker_->Touch(read->consumer); !s.ok()) {
          return ToGrpcStatus(s);
        }
        touched = now;
      }
      if (!schedule->Due(current, now)) {
        const SubscriptionSchedule::Wake wake =
            schedule->NextWake(now, absl::Milliseconds(100));
        tracker_->WaitForBatchAfter(wake.after_batch, wake.deadline);
        continue;
      }
      const SubscriptionSchedule::Push next =
          schedule->NextPush(read->all_rows, read->include_dense, current, now);
      DeltaRequest push = *read;
      push.all_rows = next.all_rows;
      push.continue_from = next.continue_from;
      push.include_dense = next.include_dense;
      // As a streamed GetDelta: sent while its rows are copied, with the
      // tracker's lock released (Tracker::GetDeltaFilling).
      std::unique_ptr<StatesFill> fill;
      absl::StatusOr<Delta> delta = tracker_->GetDeltaFilling(push, &fill);
      if (!delta.ok()) return ToGrpcStatus(delta.status());
      if (grpc::Status s =
              WriteDelta(context, *delta, read_request, sink, fill.get());
          !s.ok()) {
        return s;
      }
      if (absl::Status s = tracker_->Touch(read->consumer); !s.ok()) {
        return ToGrpcStatus(s);
      }
      touched = absl::Now();
      schedule->Pushed(next, delta->end_batch, now);
    }
  });
}

grpc::Status DeltaTrackerService::AuthorizeConsumerCall(
    const grpc::ServerContext* context, absl::string_view consumer) const {
  if (grpc::Status s = Authorize(context, Action::kRead, consumer); !s.ok()) {
    return s;
  }
  return ToGrpcStatus(ValidateName("consumer name", consumer));
}

grpc::Status DeltaTrackerService::Commit(grpc::ServerContext* context,
                                         const v1::CommitRequest* request,
                                         v1::CommitResponse*) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = AuthorizeConsumerCall(context, request->consumer());
        !s.ok()) {
      return s;
    }
    return ToGrpcStatus(
        tracker_->Commit(request->consumer(), request->end_batch()));
  });
}

grpc::Status DeltaTrackerService::Touch(grpc::ServerContext* context,
                                        const v1::ConsumerRequest* request,
                                        v1::TouchResponse*) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = AuthorizeConsumerCall(context, request->consumer());
        !s.ok()) {
      return s;
    }
    return ToGrpcStatus(tracker_->Touch(request->consumer()));
  });
}

grpc::Status DeltaTrackerService::ListConsumers(
    grpc::ServerContext* context, const v1::ListConsumersRequest*,
    v1::ListConsumersResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kInspect); !s.ok())
      return s;
    for (std::string& name : tracker_->Consumers()) {
      response->add_consumers(std::move(name));
    }
    return grpc::Status::OK;
  });
}

grpc::Status DeltaTrackerService::AddConsumer(
    grpc::ServerContext* context, const v1::ConsumerRequest* request,
    v1::ListConsumersResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kAdminister); !s.ok()) {
      return s;
    }
    if (absl::Status s = tracker_->AddConsumer(request->consumer()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    return ListConsumers(context, nullptr, response);
  });
}

grpc::Status DeltaTrackerService::RemoveConsumer(
    grpc::ServerContext* context, const v1::ConsumerRequest* request,
    v1::ListConsumersResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kAdminister); !s.ok()) {
      return s;
    }
    if (absl::Status s = tracker_->RemoveConsumer(request->consumer());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    return ListConsumers(context, nullptr, response);
  });
}

grpc::Status DeltaTrackerService::Compact(grpc::ServerContext* context,
                                          const v1::CompactRequest*,
                                          v1::StatusResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kAdminister); !s.ok()) {
      return s;
    }
    tracker_->CompactAll();
    FillStatus(response);
    return grpc::Status::OK;
  });
}

grpc::Status DeltaTrackerService::Clear(grpc::ServerContext* context,
                                        const v1::ClearRequest* request,
                                        v1::StatusResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kAdminister); !s.ok()) {
      return s;
    }
    if (request->consumer().empty()) {
      tracker_->ClearAll();
    } else if (absl::Status s = tracker_->Clear(request->consumer()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    FillStatus(response);
    return grpc::Status::OK;
  });
}

grpc::Status DeltaTrackerService::Snapshot(grpc::ServerContext* context,
                                           const v1::SnapshotRequest*,
                                           v1::SnapshotResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kAdminister); !s.ok()) {
      return s;
    }
    if (options_.snapshots == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this server has no snapshot database (start it "
                          "with --db=PATH)");
    }
    absl::StatusOr<SnapshotInfo> info = options_.snapshots->Snapshot();
    if (!info.ok()) return ToGrpcStatus(info.status());
    FillSnapshotInfo(*info, response->mutable_snapshot());
    return grpc::Status::OK;
  });
}

grpc::Status DeltaTrackerService::Status(grpc::ServerContext* context,
                                         const v1::StatusRequest*,
                                         v1::StatusResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kInspect); !s.ok())
      return s;
    FillStatus(response);
    return grpc::Status::OK;
  });
}

void DeltaTrackerService::SetTopology(ServiceTopology topology) {
  v1::TopologyResponse response;
  response.set_world_size(topology.world_size);
  response.set_rank(topology.rank);
  for (size_t r = 0; r < topology.endpoints.size(); ++r) {
    v1::RankEndpoint* endpoint = response.add_endpoints();
    endpoint->set_rank(static_cast<int32_t>(r));
    endpoint->set_address(topology.endpoints[r]);
  }
  absl::flat_hash_map<std::string, Columns> columns;
  for (const ServiceTopology::Shard& shard : topology.shards) {
    v1::TableShard* out = response.add_shards();
    out->set_fqn(shard.fqn);
    out->set_sharding_type(shard.sharding_type);
    out->set_rank(shard.rank);
    out->set_row_offset(shard.row_offset);
    out->set_rows(shard.rows);
    out->set_col_offset(shard.col_offset);
    out->set_cols(shard.cols);
    out->set_table_rows(shard.table_rows);
    out->set_table_cols(shard.table_cols);
    if (shard.rank == topology.rank && shard.table_cols > 0 &&
        shard.cols < shard.table_cols) {
      columns[shard.fqn] = {shard.col_offset, shard.table_cols};
    }
  }
  response.set_plan(std::move(topology.plan));
  absl::MutexLock lock(&topology_mu_);
  topology_ = std::move(response);
  columns_ = std::move(columns);
}

DeltaTrackerService::Columns DeltaTrackerService::ColumnsOf(
    const std::string& fqn) const {
  absl::MutexLock lock(&topology_mu_);
  auto it = columns_.find(fqn);
  return it == columns_.end() ? Columns{} : it->second;
}

grpc::Status DeltaTrackerService::Topology(grpc::ServerContext* context,
                                           const v1::TopologyRequest*,
                                           v1::TopologyResponse* response) {
  return Guarded([&]() -> grpc::Status {
    if (grpc::Status s = Authorize(context, Action::kInspect); !s.ok())
      return s;
    absl::MutexLock lock(&topology_mu_);
    if (!topology_.has_value()) {
      // A rank of a group before every rank's endpoint is known.
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "this rank's topology is not known yet (the ranks "
                          "are still exchanging endpoints): retry");
    }
    *response = *topology_;
    return grpc::Status::OK;
  });
}

void DeltaTrackerService::FillStatus(v1::StatusResponse* response) const {
  const TrackerStatus status = tracker_->Status();
  response->set_mode(std::string(TrackingModeName(status.mode)));
  response->set_current_batch(status.current_batch);
  response->set_delete_on_read(status.delete_on_read);
  response->set_auto_compact(status.auto_compact);
  response->set_acknowledged_reads(status.acknowledged_reads);
  response->set_run_id(status.run_id);
  response->set_run_start_batch(status.run_start_batch);
  response->set_serves_live_rows(status.serves_live_rows);
  for (const ConsumerStatus& c : status.consumers) {
    v1::ConsumerStatus* out = response->add_consumers();
    out->set_name(c.name);
    out->set_cursor(c.cursor);
    out->set_highest_cursor(c.cursor);
    out->set_lag_steps(c.lag_steps);
    out->set_has_pending_read(c.pending_end.has_value());
    out->set_pending_end(c.pending_end.value_or(0));
    out->set_pending_reads(c.pending_reads);
    out->set_resync_required(c.resync_required);
    out->set_lag_seconds(absl::ToDoubleSeconds(c.lag));
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
  response->set_consumers_expired(status.consumers_expired);
  response->set_dropped_ids(status.dropped_ids);
  response->set_dropped_bytes(status.dropped_bytes);
  if (options_.snapshots != nullptr) {
    response->set_db(options_.snapshots->path());
    if (std::optional<SnapshotInfo> last = options_.snapshots->latest()) {
      FillSnapshotInfo(*last, response->mutable_last_snapshot());
    }
  }
}

}  // namespace deltastream
