#include "clients/replica_lookup_service.h"

#include <string>

#include "base/grpc_server.h"
#include "proto/tensor_codec.h"

namespace deltastream {
grpc::Status ReplicaLookupService::Authorize(
    const grpc::ServerContext& context) const {
  if (auth_ == nullptr) return grpc::Status::OK;
  return auth_->Check(context, Action::kInspect);
}

grpc::Status ReplicaLookupService::Lookup(grpc::ServerContext* context,
                                          const v1::LookupRequest* request,
                                          v1::LookupResponse* response) {
  if (grpc::Status allowed = Authorize(*context); !allowed.ok()) {
    return allowed;
  }
  const Replica& replica = predictor_->replica();
  if (replica.Version() < 0) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the replica holds no version yet");
  }
  absl::StatusOr<at::Tensor> ids = DecodeTensor(request->ids());
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  absl::StatusOr<ReplicaRows> rows = replica.Lookup(request->fqn(), *ids);
  if (!rows.ok()) return ToGrpcStatus(rows.status());
  response->set_version(rows->version);
  response->set_run_id(rows->run_id);  // read with the rows: one version
  if (absl::Status s = EncodeTensor(rows->rows, response->mutable_rows());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  const bool* found = rows->found.data_ptr<bool>();
  const int64_t* id = ids->data_ptr<int64_t>();
  for (int64_t i = 0; i < rows->found.numel(); ++i) {
    if (!found[i]) response->add_missing_ids(id[i]);
  }
  return grpc::Status::OK;
}

grpc::Status ReplicaLookupService::GetDense(grpc::ServerContext* context,
                                            const v1::GetDenseRequest*,
                                            v1::GetDenseResponse* response) {
  if (grpc::Status allowed = Authorize(*context); !allowed.ok()) {
    return allowed;
  }
  const ReplicaDense dense = predictor_->replica().Dense();
  response->set_version(dense.version);
  for (const auto& [name, tensor] : dense.parameters) {
    v1::NamedTensor* named = response->add_parameters();
    named->set_name(name);
    if (absl::Status s = EncodeTensor(tensor, named->mutable_tensor());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  return grpc::Status::OK;
}

grpc::Status ReplicaLookupService::Status(grpc::ServerContext* context,
                                          const v1::PredictorStatusRequest*,
                                          v1::PredictorStatus* response) {
  if (grpc::Status allowed = Authorize(*context); !allowed.ok()) {
    return allowed;
  }
  *response = predictor_->Status();
  return grpc::Status::OK;
}

}  // namespace deltastream
