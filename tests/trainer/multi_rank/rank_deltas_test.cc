// Deltas of a sharded trainer (issue 16, "each rank serves its shards"): two
// ranks (real processes, Gloo and gRPC on loopback) train a plan that mixes
// row-wise, column-wise, table-wise and data-parallel tables (and, for the
// pooled model, table-row-wise), each rank serving its tracker. What each
// rank serves is checked against a one-process trainer of the same global
// batch and seed (run by every rank, as multi_rank_trainer_test does):
//   - IDs are GLOBAL and lie in the shard's rows; for every table but a
//     data-parallel one they are exactly the one-process tracker's IDs in
//     that range (the shard sees every lookup of its rows); a data-parallel
//     table's are a subset (each rank records its own examples' lookups);
//   - values are the one-process table's rows at those IDs (the shard's
//     columns: the chunks say which, col_offset / table_cols), within the
//     tolerance multi_rank_trainer_test argues for (1e-4); EMBEDDING states
//     (the sequence model) are the initial rows at those IDs, bit for bit;
//   - an all_rows read streams exactly the shard's global row range;
//   - Topology answers the same on both ranks (but `rank`), with both
//     endpoints and every shard of the plan.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/isin.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "proto/tensor_codec.h"
#include "proto/tracker.grpc.pb.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "tests/trainer/multi_rank/small_trainer.h"
#include "trainer/comm/process_group.h"
#include "trainer/config.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/sharding/sharding_plan.h"
#include "trainer/trainer.h"

namespace deltastream {
namespace {

using ::deltastream::testing::ExpectRanksPassed;
using ::deltastream::testing::MakeMixedTrainer;
using ::deltastream::testing::MakeTrainer;
using ::deltastream::testing::MaxDiff;
using ::deltastream::testing::RankResult;
using ::deltastream::testing::RunRanks;
using ::deltastream::testing::SmallModel;
using ::deltastream::testing::SmallModelConfig;

constexpr int64_t kBatch = 8;  // per rank
constexpr int64_t kSteps = 6;
constexpr double kTolerance = 1e-4;

std::string Config(const std::string& kind, const std::string& mode,
                   int64_t batch, bool serve) {
  SmallModel model;
  model.kind = kind;
  model.batch = batch;
  model.fifth_table = true;
  model.tracker = absl::StrCat("mode: \"", mode, "\"",
                               serve ? " listen: \"127.0.0.1:0\"" : "");
  return SmallModelConfig(model);
}

// One table of a delta read over gRPC, its chunks joined.
struct ServedTable {
  at::Tensor ids, states, values;
  int64_t col_offset = 0, table_cols = 0;
};

absl::StatusOr<std::map<std::string, ServedTable>> ReadDelta(
    v1::DeltaTracker::Stub& stub, bool all_rows) {
  v1::GetDeltaRequest request;
  request.set_consumer("default");
  request.set_all_rows(all_rows);
  request.set_max_chunk_bytes(256);  // several chunks per table
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  std::unique_ptr<grpc::ClientReader<v1::DeltaChunk>> reader =
      stub.GetDelta(&context, request);
  std::map<std::string, std::vector<ServedTable>> parts;
  v1::DeltaChunk chunk;
  while (reader->Read(&chunk)) {
    if (chunk.fqn().empty()) continue;
    ServedTable part;
    part.col_offset = chunk.col_offset();
    part.table_cols = chunk.table_cols();
    for (auto [field, out] :
         {std::pair<const v1::Tensor*, at::Tensor*>{&chunk.ids(), &part.ids},
          {&chunk.states(), &part.states},
          {&chunk.values(), &part.values}}) {
      if (field->shape_size() == 0) continue;
      absl::StatusOr<at::Tensor> decoded = DecodeTensor(*field);
      if (!decoded.ok()) return decoded.status();
      *out = *decoded;
    }
    parts[chunk.fqn()].push_back(std::move(part));
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("GetDelta: ", status.error_message()));
  }
  std::map<std::string, ServedTable> tables;
  for (auto& [fqn, pieces] : parts) {
    ServedTable& table = tables[fqn];
    table.col_offset = pieces[0].col_offset;
    table.table_cols = pieces[0].table_cols;
    for (at::Tensor ServedTable::*member :
         {&ServedTable::ids, &ServedTable::states, &ServedTable::values}) {
      std::vector<at::Tensor> list;
      for (const ServedTable& piece : pieces) {
        if ((piece.*member).defined()) list.push_back(piece.*member);
      }
      if (!list.empty()) table.*member = at::cat(list);
    }
  }
  return tables;
}

// "<model kind>/<mode>".
int RunCase(ProcessGroup& group, const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '/');
  const std::string &kind = parts[0], &mode = parts[1];
  const int me = group.rank();
  const std::atomic<bool> stop{false};
  const bool embedding = mode == "embedding";

  absl::StatusOr<std::unique_ptr<Trainer>> reference =
      MakeTrainer(Config(kind, mode, 2 * kBatch, false));
  RANK_OK(reference);
  EmbeddingModule& whole = *(*reference)->model().embedding_modules().at(0);
  std::map<std::string, at::Tensor> initial, final_rows;
  for (const auto& [state, tensor] : whole.StateTensors()) {
    initial[state] = tensor.clone();
  }
  RANK_OK((*reference)->Run(stop, kSteps));
  for (const auto& [state, tensor] : whole.StateTensors()) {
    final_rows[state] = tensor;
  }
  DeltaRequest everything;
  everything.consumer = "default";
  absl::StatusOr<Delta> expected =
      (*reference)->tracker()->GetDelta(everything);
  RANK_OK(expected);

  const bool pooled = kind == "dlrm";
  absl::StatusOr<std::unique_ptr<Trainer>> sharded =
      MakeMixedTrainer(Config(kind, mode, kBatch, true), &group, pooled);
  RANK_OK(sharded);
  RANK_OK((*sharded)->Run(stop, kSteps));
  ShardedEmbeddingModule& module = *(*sharded)->model().sharded_modules().at(0);

  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      (*sharded)->service_address(), grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::DeltaTracker::Stub> stub =
      v1::DeltaTracker::NewStub(channel);
  absl::StatusOr<std::map<std::string, ServedTable>> served =
      ReadDelta(*stub, /*all_rows=*/false);
  RANK_OK(served);
  absl::StatusOr<std::map<std::string, ServedTable>> whole_shards =
      ReadDelta(*stub, /*all_rows=*/true);
  RANK_OK(whole_shards);

  int checked = 0;
  for (const EmbeddingShard& shard : module.local_shards()) {
    const std::string fqn =
        absl::StrCat(module.path(),
                     pooled ? ".embedding_bags." : ".embeddings.", shard.table);
    const bool column_wise = shard.sharding_type == v1::COLUMN_WISE;
    const int64_t table_cols =
        (*reference)->settings().tables[shard.table_index].embedding_dim;
    auto rows_of = [&](const at::Tensor& table, const at::Tensor& ids) {
      return table.index_select(0, ids).narrow(1, shard.col_offset, shard.cols);
    };
    // Changed rows.
    RANK_EXPECT(served->count(fqn) > 0, name, " rank ", me, " served no ", fqn);
    const ServedTable& got = served->at(fqn);
    const at::Tensor want_all = expected->tables.at(fqn).ids;
    const at::Tensor in_shard =
        want_all.masked_select((want_all >= shard.row_offset) &
                               (want_all < shard.row_offset + shard.rows));
    if (shard.sharding_type == v1::DATA_PARALLEL) {
      RANK_EXPECT(at::isin(got.ids, in_shard).all().item<bool>(), name, " ",
                  fqn, " serves IDs the one-process trainer did not change");
    } else {
      RANK_EXPECT(got.ids.equal(in_shard), name, " rank ", me, " ", fqn,
                  " served IDs ", got.ids.numel(), " vs ", in_shard.numel(),
                  " expected in rows [", shard.row_offset, ", ",
                  shard.row_offset + shard.rows, ")");
    }
    RANK_EXPECT(got.ids.numel() > 0, name, " ", fqn, " changed no row");
    RANK_EXPECT(got.col_offset == (column_wise ? shard.col_offset : 0) &&
                    got.table_cols == (column_wise ? table_cols : 0),
                name, " ", fqn, " chunks say columns from ", got.col_offset,
                " of ", got.table_cols);
    const std::string weight = absl::StrCat(shard.table, ".weight");
    const double diff =
        MaxDiff(got.values, rows_of(final_rows[weight], got.ids));
    RANK_EXPECT(diff <= kTolerance, name, " ", fqn, " values differ by ", diff);
    if (embedding) {
      RANK_EXPECT(got.states.defined() &&
                      got.states.equal(rows_of(initial[weight], got.ids)),
                  name, " ", fqn, " states are not the initial rows");
    }
    // The shard's whole row range.
    const ServedTable& all = whole_shards->at(fqn);
    RANK_EXPECT(
        all.ids.equal(at::arange(shard.row_offset,
                                 shard.row_offset + shard.rows, at::kLong)),
        name, " ", fqn, " all_rows read is not rows [", shard.row_offset, ", ",
        shard.row_offset + shard.rows, ")");
    const double all_diff =
        MaxDiff(all.values, rows_of(final_rows[weight], all.ids));
    RANK_EXPECT(all_diff <= kTolerance, name, " ", fqn,
                " all_rows values differ by ", all_diff);
    ++checked;
  }
  RANK_EXPECT(
      checked == static_cast<int>(module.local_shards().size()) && checked >= 3,
      name, " rank ", me, " checked ", checked, " shards");

  // Topology: the same on both ranks (but `rank`).
  v1::TopologyResponse topology;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::Status status =
        stub->Topology(&context, v1::TopologyRequest(), &topology);
    RANK_EXPECT(status.ok(), "Topology: ", status.error_message());
  }
  RANK_EXPECT(
      topology.world_size() == 2 && topology.rank() == me &&
          topology.endpoints_size() == 2 &&
          topology.endpoints(me).address() == (*sharded)->service_address() &&
          topology.shards_size() == static_cast<int>(module.shards().size()) &&
          !topology.plan().empty(),
      name, " topology ", topology.ShortDebugString());
  int data_parallel = 0;
  for (const v1::TableShard& shard : topology.shards()) {
    data_parallel += shard.sharding_type() == "DATA_PARALLEL";
    RANK_EXPECT(shard.table_rows() > 0 && shard.table_cols() == 8, name,
                " topology shard ", shard.ShortDebugString());
  }
  RANK_EXPECT(data_parallel == 2, name, " topology lists ", data_parallel,
              " data-parallel shards");
  const int other = 1 - me;
  {
    std::unique_ptr<v1::DeltaTracker::Stub> peer = v1::DeltaTracker::NewStub(
        grpc::CreateChannel(topology.endpoints(other).address(),
                            grpc::InsecureChannelCredentials()));
    v1::TopologyResponse theirs;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::Status status =
        peer->Topology(&context, v1::TopologyRequest(), &theirs);
    RANK_EXPECT(status.ok(), "peer Topology: ", status.error_message());
    RANK_EXPECT(theirs.rank() == other, name, " peer says rank ",
                theirs.rank());
    theirs.set_rank(me);
    RANK_EXPECT(theirs.SerializeAsString() == topology.SerializeAsString(),
                name, " topologies differ:\n", theirs.ShortDebugString(), "\n",
                topology.ShortDebugString());
  }
  // The peer's service stays up until both have asked.
  RANK_OK(group.Barrier("test.topology"));
  std::printf("rank %d %s: %d shards served with global IDs\n", me,
              name.c_str(), checked);
  return 0;
}

TEST(RankDeltasTest, TwoRanksServeGlobalRowIds) {
  const std::vector<RankResult> results =
      RunRanks("sequence/embedding,dlrm/id_only", 2, absl::Seconds(240));
  ExpectRanksPassed(results);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv, deltastream::RunCase);
}
