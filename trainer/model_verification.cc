#include "trainer/model_verification.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/predictor.grpc.pb.h"
#include "proto/tensor_codec.h"
#include "store/checkpoint_chain.h"

namespace deltastream {
namespace {

// Rows per Lookup call: at most 65536 and 16 MiB, under the predictor's
// limit (64 MiB) and any message limit.
int64_t LookupRows(const at::Tensor& weight) {
  const int64_t row_bytes =
      std::max<int64_t>(1, weight.size(1) * weight.element_size());
  return std::clamp<int64_t>((int64_t{16} << 20) / row_bytes, 1, 65536);
}

// OK when `copy` equals `trainer` bit for bit; else what differs.
absl::Status Compare(const std::string& what, const at::Tensor& copy,
                     const at::Tensor& trainer) {
  if (!copy.defined() || !copy.sizes().equals(trainer.sizes()) ||
      copy.scalar_type() != trainer.scalar_type()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is ",
        copy.defined() ? absl::StrCat(c10::toString(copy.scalar_type()),
                                      c10::str(copy.sizes()))
                       : "missing",
        ", the trainer's ", c10::toString(trainer.scalar_type()),
        c10::str(trainer.sizes())));
  }
  if (!at::equal(copy, trainer)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", (copy != trainer).sum().item<int64_t>(),
                     " of ", trainer.numel(), " elements differ"));
  }
  return absl::OkStatus();
}

absl::Status CompareDense(const std::string& whose,
                          const std::map<std::string, at::Tensor>& dense,
                          const CheckpointModel& model) {
  if (dense.size() != model.dense.size()) {
    return absl::FailedPreconditionError(absl::StrCat(whose, " has ",
                                                      dense.size(),
                                                      " dense parameters, the "
                                                      "trainer ",
                                                      model.dense.size()));
  }
  for (const auto& [name, tensor] : model.dense) {
    auto it = dense.find(name);
    absl::Status same =
        Compare(absl::StrCat(whose, " dense '", name, "'"),
                it != dense.end() ? it->second : at::Tensor(), tensor);
    if (!same.ok()) return same;
  }
  return absl::OkStatus();
}

absl::Status Unreachable(const std::string& target, const grpc::Status& s) {
  return absl::UnavailableError(
      absl::StrCat("predictor ", target, ": ", s.error_message()));
}

// Every call to the predictor ends within a minute (a few MiB at most): a
// predictor that accepts calls and never answers is an error, not a hang.
void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
}

}  // namespace

absl::StatusOr<Verified> VerifyReplica(const CheckpointModel& model,
                                       const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // a few MiB per lookup (LookupRows)
  auto stub = v1::ReplicaLookup::NewStub(grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args));
  Verified verified;
  verified.version = model.step;
  grpc::ClientContext status_context;
  SetDeadline(status_context);
  v1::PredictorStatus& status = verified.predictor;
  if (grpc::Status s = stub->Status(&status_context, {}, &status); !s.ok()) {
    return Unreachable(target, s);
  }
  if (status.version() != model.step) {
    return absl::FailedPreconditionError(
        absl::StrCat("predictor ", target, " is at version ", status.version(),
                     ", the trainer's checkpoint at step ", model.step));
  }
  // Checkpoint table name -> FQN: checkpoints name tables by FQN, old
  // single-file ones by CheckpointTableName.
  std::map<std::string, std::string> fqn_of;
  for (const v1::TableRowCount& table : status.tables()) {
    fqn_of[table.fqn()] = table.fqn();
    fqn_of[CheckpointTableName(table.fqn())] = table.fqn();
  }
  for (const auto& [name, weight] : model.tables) {
    auto fqn = fqn_of.find(name);
    if (fqn == fqn_of.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "predictor ", target, " holds no table for '", name, "'"));
    }
    std::vector<at::Tensor> parts;
    const int64_t per_call = LookupRows(weight);
    for (int64_t first = 0; first < weight.size(0); first += per_call) {
      const int64_t n = std::min(per_call, weight.size(0) - first);
      v1::LookupRequest request;
      request.set_fqn(fqn->second);
      if (absl::Status s = EncodeTensor(at::arange(first, first + n, at::kLong),
                                        request.mutable_ids());
          !s.ok()) {
        return s;
      }
      grpc::ClientContext context;
      SetDeadline(context);
      v1::LookupResponse response;
      if (grpc::Status s = stub->Lookup(&context, request, &response);
          !s.ok()) {
        return Unreachable(target, s);
      }
      if (response.version() != model.step || response.missing_ids_size() > 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("predictor ", target, " table '", fqn->second,
                         "': version ", response.version(), ", ",
                         response.missing_ids_size(), " rows missing"));
      }
      absl::StatusOr<at::Tensor> rows = DecodeTensor(response.rows());
      if (!rows.ok()) return rows.status();
      parts.push_back(*std::move(rows));
    }
    if (absl::Status same = Compare(
            absl::StrCat("predictor ", target, " table '", fqn->second, "'"),
            at::cat(parts), weight);
        !same.ok()) {
      return same;
    }
    ++verified.tables;
    verified.rows += weight.size(0);
  }
  grpc::ClientContext dense_context;
  SetDeadline(dense_context);
  v1::GetDenseResponse dense_response;
  if (grpc::Status s = stub->GetDense(&dense_context, {}, &dense_response);
      !s.ok()) {
    return Unreachable(target, s);
  }
  std::map<std::string, at::Tensor> dense;
  for (const v1::NamedTensor& named : dense_response.parameters()) {
    absl::StatusOr<at::Tensor> tensor = DecodeTensor(named.tensor());
    if (!tensor.ok()) return tensor.status();
    dense[named.name()] = *tensor;
  }
  if (dense_response.version() != model.step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "predictor ", target, " serves dense parameters of version ",
        dense_response.version(), ", the trainer's are of step ", model.step));
  }
  if (absl::Status same =
          CompareDense(absl::StrCat("predictor ", target), dense, model);
      !same.ok()) {
    return same;
  }
  verified.dense_parameters = static_cast<int64_t>(dense.size());
  return verified;
}

absl::StatusOr<Verified> VerifyChain(const CheckpointModel& model,
                                     const std::string& dir) {
  absl::StatusOr<LoadedChain> chain = LoadChain(dir);
  if (!chain.ok()) return chain.status();
  const std::string whose = absl::StrCat("chain '", dir, "'");
  if (chain->end_batch != model.step) {
    return absl::FailedPreconditionError(
        absl::StrCat(whose, " ends at batch ", chain->end_batch,
                     ", the trainer's checkpoint is at step ", model.step));
  }
  Verified verified;
  verified.version = chain->end_batch;
  std::map<std::string, const ChainTable*> tables;
  for (const auto& [fqn, table] : chain->tables) {  // as fqn_of above
    tables[fqn] = &table;
    tables[CheckpointTableName(fqn)] = &table;
  }
  for (const auto& [name, weight] : model.tables) {
    auto it = tables.find(name);
    if (it == tables.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(whose, " has no table for '", name, "'"));
    }
    const ChainTable& table = *it->second;
    if (!at::equal(table.ids, at::arange(weight.size(0), at::kLong))) {
      return absl::FailedPreconditionError(
          absl::StrCat(whose, " table '", name, "' holds ", table.ids.numel(),
                       " of ", weight.size(0), " rows"));
    }
    if (absl::Status same = Compare(absl::StrCat(whose, " table '", name, "'"),
                                    table.values, weight);
        !same.ok()) {
      return same;
    }
    ++verified.tables;
    verified.rows += weight.size(0);
  }
  if (chain->dense_batch == chain->end_batch) {
    std::map<std::string, at::Tensor> dense(chain->dense.begin(),
                                            chain->dense.end());
    if (absl::Status same = CompareDense(whose, dense, model); !same.ok()) {
      return same;
    }
    verified.dense_parameters = static_cast<int64_t>(dense.size());
  }
  return verified;
}

}  // namespace deltastream
