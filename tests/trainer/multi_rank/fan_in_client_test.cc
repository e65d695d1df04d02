// FanInClient (clients/fan_in_client.h) against a real sharded trainer: two
// ranks (processes, Gloo and gRPC on loopback) train a plan mixing
// row-wise, column-wise, data-parallel, table-wise and (pooled)
// table-row-wise tables. Rank 0 reads every rank's own part (DeltaClient,
// consumer "parts") and the merged delta (FanInClient given rank 1's
// address, consumer "merged"), and checks that the merged delta's IDs are
// the union of the parts' IDs, ascending and unique, its rows full width,
// and its values and states each part's, exactly (data-parallel copies:
// 1e-6), at the part's columns; the header's end_batch is the parts'
// minimum; reads while the ranks train are consistent cuts (each rank's part
// ends at the same batch, later each time, with the dense parameters); a
// Commit reaches every rank (the next read starts where the
// committed one ended), and a consumer whose commit reached one rank only
// resumes without a resync when it subscribes on from the version it holds
// (continue_from); a read of one chosen table, of every sharding type,
// is that table of the merged read; a polling subscription whose next push
// is an hour away keeps its consumer (added at run time) past the ranks'
// consumer expiry while they train, and ends within about a second,
// NOT_FOUND naming the rank, once its consumer is removed from one rank.
// Then, in one process: a one-process trainer
// is read through FanInClient as through a DeltaClient, MergeRankDeltas
// refuses parts that do not fit together, and MergeStatuses gives a
// consumer's lowest and highest cursor.
#include "clients/fan_in_client.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_unique.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "clients/delta_client.h"
#include "clients/delta_continuity.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "tests/trainer/multi_rank/small_trainer.h"
#include "trainer/comm/process_group.h"
#include "trainer/config.h"
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
constexpr int64_t kSteps = 4;
constexpr int64_t kTableCols = 8;
// The ranks' consumer expiry (consumers added at run time only).
constexpr int64_t kExpireAfterSeconds = 2;

std::string Config(const std::string& kind, const std::string& mode) {
  SmallModel model;
  model.kind = kind;
  model.batch = kBatch;
  model.fifth_table = true;
  model.tracker = absl::StrCat("mode: \"", mode, R"(" listen: "127.0.0.1:0"
  consumers: ["parts", "merged", "cuts", "resumed"]
  acknowledged_reads: true
  expire_consumers_after_seconds: )",
                               kExpireAfterSeconds);
  return SmallModelConfig(model);
}

v1::GetDeltaRequest Read(const std::string& consumer) {
  v1::GetDeltaRequest request;
  request.set_consumer(consumer);
  request.set_max_chunk_bytes(256);  // several chunks per table
  return request;
}

// A subscription of `consumer` through `fan_in` (several ranks: a polling
// one), on a thread of its own, whose next push after the first is an hour
// away, by time and by steps. Cancelled when destroyed.
class HourlySubscription {
 public:
  HourlySubscription(FanInClient& fan_in, const std::string& consumer) {
    v1::SubscribeRequest request;
    *request.mutable_read() = Read(consumer);
    request.set_every_steps(int64_t{1} << 30);
    request.set_every_ms(3600 * 1000);
    thread_ = std::thread([this, &fan_in, request] {
      status_ = fan_in.Subscribe(
          request,
          [this](ReceivedDelta&&) {
            if (!first_push_.HasBeenNotified()) first_push_.Notify();
            return true;
          },
          &subscription_);
      ended_.Notify();
    });
  }
  ~HourlySubscription() {
    subscription_.Cancel();
    thread_.join();
  }

  bool WaitForFirstPush(absl::Duration timeout) {
    return first_push_.WaitForNotificationWithTimeout(timeout);
  }
  // Whether it ended within `timeout` (then status() is how).
  bool WaitForEnd(absl::Duration timeout) {
    return ended_.WaitForNotificationWithTimeout(timeout);
  }
  const absl::Status& status() const { return status_; }

 private:
  CallCanceller subscription_;
  absl::Notification first_push_;
  absl::Notification ended_;
  absl::Status status_;
  std::thread thread_;
};

// Consumers added and removed through `fan_in` change on every rank: a
// repeat is refused as by one rank (AlreadyExists, NotFound), and a change
// an earlier call left made on rank 1 only (`rank1`) is completed.
int CheckConsumerChanges(FanInClient& fan_in, const std::string& rank1,
                         const std::string& name) {
  auto listed = [](const std::vector<std::string>& list,
                   const std::string& consumer) {
    return std::count(list.begin(), list.end(), consumer) == 1;
  };
  absl::StatusOr<std::vector<std::string>> added = fan_in.AddConsumer("later");
  RANK_OK(added);
  RANK_EXPECT(listed(*added, "later"), name, " added 'later' is not listed");
  absl::StatusOr<std::vector<std::string>> on_rank1 =
      DeltaClient::Create(rank1)->ListConsumers();
  RANK_OK(on_rank1);
  RANK_EXPECT(listed(*on_rank1, "later"), name, " rank 1 lacks 'later'");
  RANK_EXPECT(fan_in.AddConsumer("later").status().code() ==
                  absl::StatusCode::kAlreadyExists,
              name, " a second AddConsumer was not refused");
  absl::StatusOr<std::vector<std::string>> removed =
      fan_in.RemoveConsumer("later");
  RANK_OK(removed);
  RANK_EXPECT(!listed(*removed, "later"), name, " 'later' is still listed");
  RANK_EXPECT(fan_in.RemoveConsumer("later").status().code() ==
                  absl::StatusCode::kNotFound,
              name, " a second RemoveConsumer was not refused");
  RANK_OK(DeltaClient::Create(rank1)->AddConsumer("half"));
  added = fan_in.AddConsumer("half");
  RANK_OK(added);
  RANK_EXPECT(listed(*added, "half"), name, " 'half' is not listed");
  RANK_OK(fan_in.RemoveConsumer("half"));
  return 0;
}

// A consumer that died between its commit's ranks (consumer "resumed": the
// commit of its first read reached rank 1, address `rank1`, only): a read
// from its cursors starts at two batches, and the column-wise table's blocks
// do not join (a resync); a subscription on from the version it holds
// (read.continue_from, as a predictor resumes) starts every rank there,
// with no resync.
int CheckResumeAfterAHalfCommit(FanInClient& fan_in, const std::string& rank1,
                                const std::string& name) {
  absl::StatusOr<ReceivedDelta> held = fan_in.GetDelta(Read("resumed"));
  RANK_OK(held);
  const int64_t end = held->header.end_batch();
  RANK_EXPECT(!held->header.resync_required() && !held->tables.empty(), name,
              " first read of 'resumed': ", held->header.ShortDebugString());
  RANK_OK(DeltaClient::Create(rank1)->Commit("resumed", end));
  absl::StatusOr<ReceivedDelta> from_cursors = fan_in.GetDelta(Read("resumed"));
  RANK_OK(from_cursors);
  RANK_EXPECT(from_cursors->header.resync_required(), name,
              " the ranks' cursors differ, yet no resync: ",
              from_cursors->header.ShortDebugString());
  v1::SubscribeRequest resume;
  *resume.mutable_read() = Read("resumed");
  resume.mutable_read()->set_continue_from(end);
  std::vector<v1::DeltaHeader> pushes;
  RANK_OK(fan_in.Subscribe(resume, [&](ReceivedDelta&& push) {
    pushes.push_back(push.header);
    return false;  // the first push is the one that matters
  }));
  RANK_EXPECT(pushes.size() == 1 && !pushes[0].resync_required() &&
                  pushes[0].start_batch() == end &&
                  pushes[0].end_batch() == end,
              name, " the resumed subscription's first push: ",
              pushes.empty() ? "none" : pushes[0].ShortDebugString());
  return 0;
}

// A polling subscription whose consumer is removed from one rank (rank 1,
// address `rank1`) while its next push is an hour away ends within about a
// second, NOT_FOUND naming that rank and the consumer (it waited for that
// push before).
int CheckRemovedConsumerEndsSubscription(FanInClient& fan_in,
                                         const std::string& rank1,
                                         const std::string& name) {
  RANK_OK(fan_in.AddConsumer("watched"));
  {
    HourlySubscription watched(fan_in, "watched");
    RANK_EXPECT(watched.WaitForFirstPush(absl::Seconds(60)), name,
                " no first push of 'watched'");
    RANK_OK(DeltaClient::Create(rank1)->RemoveConsumer("watched"));
    const absl::Time removed = absl::Now();
    const bool ended = watched.WaitForEnd(absl::Seconds(5));
    const std::string took = absl::FormatDuration(absl::Now() - removed);
    RANK_EXPECT(ended, name,
                " the subscription of 'watched', removed from rank 1, still "
                "waited after ",
                took);
    const absl::Status& status = watched.status();
    RANK_EXPECT(status.code() == absl::StatusCode::kNotFound &&
                    absl::StrContains(status.message(), "rank 1") &&
                    absl::StrContains(status.message(), "'watched'"),
                name, " the subscription of 'watched' ended after ", took,
                " with ", status.ToString());
    std::printf("%s: a removed consumer's subscription ended after %s: %s\n",
                name.c_str(), took.c_str(), status.ToString().c_str());
  }
  RANK_OK(fan_in.RemoveConsumer("watched"));  // rank 0's
  return 0;
}

// Rank 0 checks the merged delta against the ranks' parts.
int CheckFanIn(Trainer& trainer, const std::string& name) {
  std::unique_ptr<DeltaClient> own =
      DeltaClient::Create(trainer.service_address());
  absl::StatusOr<v1::TopologyResponse> topology = own->Topology();
  RANK_OK(topology);
  RANK_EXPECT(topology->world_size() == 2, name, " world size ",
              topology->world_size());
  std::map<std::string, std::string> sharding;
  for (const v1::TableShard& shard : topology->shards()) {
    sharding[shard.fqn()] = shard.sharding_type();
  }

  std::vector<ReceivedDelta> parts;
  for (const v1::RankEndpoint& endpoint : topology->endpoints()) {
    absl::StatusOr<ReceivedDelta> part =
        DeltaClient::Create(endpoint.address())->GetDelta(Read("parts"));
    RANK_OK(part);
    parts.push_back(*std::move(part));
  }
  // Discovered from the other rank's address.
  absl::StatusOr<std::unique_ptr<FanInClient>> fan_in =
      FanInClient::Create(topology->endpoints(1).address());
  RANK_OK(fan_in);
  const absl::StatusOr<int> world_size = (*fan_in)->WorldSize();
  RANK_OK(world_size);
  RANK_EXPECT(*world_size == 2, name, " fan-in world size ", *world_size);
  absl::StatusOr<ReceivedDelta> merged = (*fan_in)->GetDelta(Read("merged"));
  RANK_OK(merged);

  const int64_t end_batch =
      std::min(parts[0].header.end_batch(), parts[1].header.end_batch());
  RANK_EXPECT(merged->header.end_batch() == end_batch && end_batch >= kSteps &&
                  !merged->header.resync_required() &&
                  merged->header.lost_rows() == 0,
              name, " merged header ", merged->header.ShortDebugString());

  std::map<std::string, int> checked_types;
  for (const auto& [fqn, type] : sharding) {
    std::vector<at::Tensor> part_ids;
    for (const ReceivedDelta& part : parts) {
      if (part.tables.count(fqn) > 0) {
        part_ids.push_back(part.tables.at(fqn).ids);
      }
    }
    RANK_EXPECT(!part_ids.empty() && merged->tables.count(fqn) > 0, name, " ",
                fqn, " served by ", part_ids.size(), " ranks, merged ",
                merged->tables.count(fqn));
    const ReceivedTable& table = merged->tables.at(fqn);
    const at::Tensor union_ids =
        std::get<0>(at::_unique(at::cat(part_ids), /*sorted=*/true));
    RANK_EXPECT(table.ids.numel() > 0 && table.ids.equal(union_ids), name, " ",
                fqn, " merged ", table.ids.numel(),
                " IDs, the ranks' union is ", union_ids.numel());
    RANK_EXPECT(table.values.defined() && table.values.dim() == 2 &&
                    table.values.size(1) == kTableCols &&
                    table.values.size(0) == table.ids.size(0) &&
                    table.col_offset == 0 && table.table_cols == 0,
                name, " ", fqn, " rows are not full width");
    const double tolerance = type == "DATA_PARALLEL" ? 1e-6 : 0;
    int pieces = 0;
    for (const ReceivedDelta& part : parts) {
      if (part.tables.count(fqn) == 0) continue;
      const ReceivedTable& piece = part.tables.at(fqn);
      RANK_EXPECT((type == "COLUMN_WISE") == (piece.table_cols == kTableCols),
                  name, " ", fqn, " (", type, ") chunks say table_cols ",
                  piece.table_cols);
      const at::Tensor rows = at::searchsorted(table.ids, piece.ids);
      auto at_piece = [&](const at::Tensor& full) {
        return full.index_select(0, rows).narrow(1, piece.col_offset,
                                                 piece.values.size(1));
      };
      const double diff = MaxDiff(at_piece(table.values), piece.values);
      RANK_EXPECT(diff <= tolerance, name, " ", fqn, " values differ by ", diff,
                  " from a rank's part");
      if (piece.states.defined()) {
        const double states = MaxDiff(at_piece(table.states), piece.states);
        RANK_EXPECT(states <= tolerance, name, " ", fqn, " states differ by ",
                    states);
      }
      ++pieces;
    }
    RANK_EXPECT(pieces == (type == "TABLE_WISE" ? 1 : 2), name, " ", fqn, " (",
                type, ") came from ", pieces, " ranks");
    ++checked_types[type];
  }
  RANK_EXPECT(checked_types["ROW_WISE"] >= 1 &&
                  checked_types["COLUMN_WISE"] == 1 &&
                  checked_types["DATA_PARALLEL"] == 1 &&
                  checked_types["TABLE_WISE"] == 1,
              name, " checked too few sharding types");

  // A read of one chosen table, of any sharding type (a table-wise one too,
  // which one rank holds and the other answers with no rows), is that table
  // of the merged read: the same batches (nothing committed yet), the same
  // rows.
  for (const auto& [fqn, type] : sharding) {
    v1::GetDeltaRequest chosen = Read("merged");
    chosen.add_fqns(fqn);
    absl::StatusOr<ReceivedDelta> one = (*fan_in)->GetDelta(chosen);
    RANK_OK(one);
    RANK_EXPECT(one->tables.size() == 1 && one->tables.count(fqn) == 1 &&
                    one->header.end_batch() == merged->header.end_batch() &&
                    one->header.start_batch() == merged->header.start_batch(),
                name, " ", fqn, " (", type,
                ") chosen read: ", one->tables.size(), " tables, ",
                one->header.ShortDebugString());
    const ReceivedTable& got = one->tables.at(fqn);
    const ReceivedTable& want = merged->tables.at(fqn);
    RANK_EXPECT(got.ids.equal(want.ids) && got.values.equal(want.values) &&
                    got.states.defined() == want.states.defined() &&
                    (!want.states.defined() || got.states.equal(want.states)),
                name, " ", fqn, " (", type, ") chosen read: ", got.ids.numel(),
                " rows, the merged read's ", want.ids.numel());
  }
  // Top-k of a column-wise table is refused before any rank reads (each
  // would score its own columns); of the other tables it is read.
  for (const auto& [fqn, type] : sharding) {
    v1::GetDeltaRequest top = Read("parts");
    top.add_fqns(fqn);
    top.mutable_top_k()->set_count(2);
    absl::StatusOr<ReceivedDelta> picked = (*fan_in)->GetDelta(top);
    if (type == "COLUMN_WISE") {
      RANK_EXPECT(picked.status().code() == absl::StatusCode::kInvalidArgument,
                  name, " ", fqn,
                  " top-k of column blocks: ", picked.status().ToString());
    } else if (!picked.ok()) {  // only id_only refuses it, as one rank does
      RANK_EXPECT(absl::StrContains(picked.status().message(), "no scores"),
                  name, " ", fqn, " (", type,
                  ") top-k: ", picked.status().ToString());
    }
  }
  if (int rc = CheckResumeAfterAHalfCommit(
          **fan_in, topology->endpoints(1).address(), name);
      rc != 0) {
    return rc;
  }
  // The commit below is of the newest read ending at that batch: every table.
  merged = (*fan_in)->GetDelta(Read("merged"));
  RANK_OK(merged);
  // A commit reaches every rank: the next read starts where this one ended.
  RANK_OK((*fan_in)->Commit("merged", merged->header.end_batch()));
  absl::StatusOr<ReceivedDelta> next = (*fan_in)->GetDelta(Read("merged"));
  RANK_OK(next);
  RANK_EXPECT(next->header.start_batch() == merged->header.end_batch(), name,
              " after the commit the next read starts at ",
              next->header.start_batch());
  if (int rc = CheckConsumerChanges(**fan_in, topology->endpoints(1).address(),
                                    name);
      rc != 0) {
    return rc;
  }
  if (int rc = CheckRemovedConsumerEndsSubscription(
          **fan_in, topology->endpoints(1).address(), name);
      rc != 0) {
    return rc;
  }
  std::printf("%s: merged %zu tables from 2 ranks\n", name.c_str(),
              merged->tables.size());
  return 0;
}

// While the ranks train (and expire consumers added at run time after
// kExpireAfterSeconds): a consumer added at run time whose polling
// subscription waits for a push an hour away stays on every rank for three
// times the expiry, kept by its subscription (without, the ranks expired
// it). "" or what went wrong.
std::string CheckSubscriptionKeepsItsConsumer(FanInClient& fan_in) {
  absl::StatusOr<v1::TopologyResponse> topology = fan_in.Topology();
  if (!topology.ok()) return topology.status().ToString();
  if (absl::Status added = fan_in.AddConsumer("kept").status(); !added.ok()) {
    return added.ToString();
  }
  std::string error;
  {
    HourlySubscription kept(fan_in, "kept");
    if (!kept.WaitForFirstPush(absl::Seconds(60))) {
      error = "no first push of 'kept'";
    } else if (kept.WaitForEnd(absl::Seconds(3 * kExpireAfterSeconds))) {
      error = absl::StrCat("the subscription of 'kept' ended: ",
                           kept.status().ToString());
    }
  }
  for (const v1::RankEndpoint& endpoint : topology->endpoints()) {
    if (!error.empty()) break;
    absl::StatusOr<std::vector<std::string>> listed =
        DeltaClient::Create(endpoint.address())->ListConsumers();
    if (!listed.ok()) {
      error = listed.status().ToString();
    } else if (std::count(listed->begin(), listed->end(), "kept") != 1) {
      error = absl::StrCat("rank ", endpoint.rank(),
                           " expired 'kept' while its subscription waited "
                           "for its next push");
    }
  }
  fan_in.RemoveConsumer("kept").IgnoreError();  // NotFound where it expired
  return error;
}

// Rank 0, while the ranks train: kCutReads reads through FanInClient, each
// one consistent cut (every rank's part ends at the same batch, or the read
// fails), with the dense parameters of that step; each ends at a later
// step boundary than the one before. Then CheckSubscriptionKeepsItsConsumer,
// and sets `done`, which stops the ranks' training at the step they agree
// on.
constexpr int kCutReads = 5;
void ReadWhileTraining(const std::string& address, std::atomic<bool>& done,
                       std::string& error) {
  std::unique_ptr<FanInClient> fan_in = FanInClient::Connect(address);
  int64_t previous_end = -1;
  for (int read = 0; read < kCutReads && error.empty(); ++read) {
    v1::GetDeltaRequest request = Read("cuts");
    request.set_include_dense(true);
    absl::StatusOr<ReceivedDelta> delta = fan_in->GetDelta(request);
    if (!delta.ok()) {
      error = absl::StrCat("cut read ", read, ": ", delta.status().ToString());
    } else if (delta->header.end_batch() <= previous_end ||
               delta->dense.empty()) {
      error = absl::StrCat("cut read ", read, " ends at ",
                           delta->header.end_batch(), " after ", previous_end,
                           " with ", delta->dense.size(), " dense tensors");
    } else {
      previous_end = delta->header.end_batch();
    }
  }
  if (error.empty()) error = CheckSubscriptionKeepsItsConsumer(*fan_in);
  done = true;
}

// "<model kind>/<mode>".
int RunCase(ProcessGroup& group, const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '/');
  const std::atomic<bool> stop{false};
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      MakeMixedTrainer(Config(parts[0], parts[1]), &group, parts[0] == "dlrm");
  RANK_OK(trainer);
  RANK_OK((*trainer)->Run(stop, kSteps));
  // Consistent cuts and a kept consumer while training (rank 0 reads; its
  // `done` stops both).
  std::atomic<bool> reads_done{false};
  std::string reader_error;
  std::thread reader;
  if (group.rank() == 0) {
    reader = std::thread(ReadWhileTraining, (*trainer)->service_address(),
                         std::ref(reads_done), std::ref(reader_error));
  }
  absl::StatusOr<TrainerProgress> trained =
      (*trainer)->Run(reads_done, /*steps=*/-1);
  if (reader.joinable()) reader.join();
  RANK_OK(trained);
  RANK_EXPECT(reader_error.empty(), name, " ", reader_error);
  if (group.rank() == 0) {
    if (int rc = CheckFanIn(**trainer, name); rc != 0) return rc;
  }
  // Every rank serves until rank 0 has read.
  RANK_OK(group.Barrier("test.fan_in"));
  return 0;
}

TEST(FanInClientTest, MergesTwoRanksIntoFullRows) {
  const std::vector<RankResult> results =
      RunRanks("sequence/embedding,dlrm/id_only", 2, absl::Seconds(240));
  ExpectRanksPassed(results);
}

TEST(FanInClientTest, OneProcessTrainerReadsAsWithDeltaClient) {
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      MakeTrainer(Config("sequence", "embedding"));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const std::atomic<bool> stop{false};
  ASSERT_TRUE((*trainer)->Run(stop, kSteps).ok());
  const std::string address = (*trainer)->service_address();
  absl::StatusOr<std::unique_ptr<FanInClient>> fan_in =
      FanInClient::Create(address);
  ASSERT_TRUE(fan_in.ok()) << fan_in.status();
  EXPECT_EQ((*fan_in)->WorldSize().value_or(-1), 1);
  absl::StatusOr<ReceivedDelta> plain =
      DeltaClient::Create(address)->GetDelta(Read("parts"));
  absl::StatusOr<ReceivedDelta> through = (*fan_in)->GetDelta(Read("merged"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(through.ok()) << through.status();
  EXPECT_EQ(through->header.end_batch(), plain->header.end_batch());
  EXPECT_EQ(through->header.run_id(), plain->header.run_id());
  ASSERT_EQ(through->tables.size(), plain->tables.size());
  for (const auto& [fqn, table] : plain->tables) {
    const ReceivedTable& got = through->tables.at(fqn);
    EXPECT_TRUE(got.ids.equal(table.ids)) << fqn;
    EXPECT_TRUE(got.values.equal(table.values)) << fqn;
    EXPECT_TRUE(got.states.equal(table.states)) << fqn;
  }
  EXPECT_TRUE((*fan_in)->Commit("merged", through->header.end_batch()).ok());
  // A batch no read ended at: the server's error, passed through.
  EXPECT_EQ((*fan_in)->Commit("merged", 12345).code(),
            absl::StatusCode::kFailedPrecondition);
}

ReceivedTable Block(std::vector<int64_t> ids, int64_t col_offset,
                    int64_t cols) {
  ReceivedTable table;
  table.ids = at::tensor(ids, at::kLong);
  table.values = at::arange(static_cast<int64_t>(ids.size()) * cols, at::kFloat)
                     .reshape({static_cast<int64_t>(ids.size()), cols}) +
                 100 * col_offset;
  table.col_offset = col_offset;
  table.table_cols = 4;
  return table;
}

// Whole rows (no column block) of `ids`, valued as Block's.
ReceivedTable FullRows(std::vector<int64_t> ids, int64_t offset) {
  ReceivedTable table = Block(std::move(ids), offset, 4);
  table.col_offset = table.table_cols = 0;
  return table;
}

v1::TopologyResponse TwoRanks(const std::string& fqn, const std::string& type) {
  v1::TopologyResponse topology;
  topology.set_world_size(2);
  for (int r = 0; r < 2; ++r) {
    v1::TableShard* shard = topology.add_shards();
    shard->set_fqn(fqn);
    shard->set_sharding_type(type);
    shard->set_rank(r);
  }
  return topology;
}

std::vector<ReceivedDelta> Parts(ReceivedTable a, ReceivedTable b) {
  std::vector<ReceivedDelta> parts(2);
  parts[0].header.set_end_batch(5);
  parts[1].header.set_end_batch(4);
  parts[1].header.set_lost_rows(3);
  parts[0].tables["t"] = std::move(a);
  parts[1].tables["t"] = std::move(b);
  return parts;
}

// The status of a rank holding consumer "c" at `cursor`, `lag` steps behind.
v1::StatusResponse RankStatus(int64_t cursor, int64_t lag) {
  v1::StatusResponse status;
  status.set_current_batch(cursor + lag);
  v1::ConsumerStatus* consumer = status.add_consumers();
  consumer->set_name("c");
  consumer->set_cursor(cursor);
  consumer->set_highest_cursor(cursor);
  consumer->set_lag_steps(lag);
  return status;
}

TEST(MergeStatusesTest, AConsumersCursorsSpanTheRanks) {
  std::vector<v1::StatusResponse> ranks = {RankStatus(20, 1), RankStatus(10, 3),
                                           RankStatus(15, 2)};
  const v1::StatusResponse merged = MergeStatuses(std::move(ranks));
  ASSERT_EQ(merged.consumers_size(), 1);
  EXPECT_EQ(merged.consumers(0).cursor(), 10);
  EXPECT_EQ(merged.consumers(0).highest_cursor(), 20);
  EXPECT_EQ(merged.consumers(0).lag_steps(), 3);
  EXPECT_EQ(merged.current_batch(), 13);
}

TEST(MergeRankDeltasTest, JoinsColumnBlocksByIdInColumnOrder) {
  absl::StatusOr<ReceivedDelta> merged =
      MergeRankDeltas(TwoRanks("t", "COLUMN_WISE"),
                      Parts(Block({1, 5}, 2, 2), Block({1, 5}, 0, 2)));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->header.end_batch(), 4);
  EXPECT_EQ(merged->header.lost_rows(), 3);
  const ReceivedTable& t = merged->tables.at("t");
  EXPECT_TRUE(t.values.equal(
      at::tensor({0.f, 1.f, 200.f, 201.f, 2.f, 3.f, 202.f, 203.f})
          .reshape({2, 4})));
  EXPECT_EQ(t.table_cols, 0);
}

TEST(MergeRankDeltasTest, RefusesColumnBlocksOfOtherIdsOrMissingColumns) {
  EXPECT_EQ(MergeRankDeltas(TwoRanks("t", "COLUMN_WISE"),
                            Parts(Block({1, 5}, 0, 2), Block({1, 6}, 2, 2)))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(MergeRankDeltas(TwoRanks("t", "COLUMN_WISE"),
                            Parts(Block({1, 5}, 0, 2), Block({1, 5}, 0, 2)))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST(MergeRankDeltasTest, ColumnBlocksFromDifferentStartsAskForAResync) {
  // Cursors restored from snapshots of different steps: the blocks start at
  // other batches and carry other IDs. The consumer must read all rows.
  std::vector<ReceivedDelta> parts =
      Parts(Block({1, 5}, 0, 2), Block({1, 6}, 2, 2));
  parts[0].header.set_start_batch(40);
  parts[1].header.set_start_batch(35);
  absl::StatusOr<ReceivedDelta> merged =
      MergeRankDeltas(TwoRanks("t", "COLUMN_WISE"), std::move(parts));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_TRUE(merged->header.resync_required());
  EXPECT_TRUE(merged->tables.empty());
  EXPECT_EQ(merged->header.fqns_size(), 0);
}

TEST(MergeRankDeltasTest, AllRowsColumnBlocksThatDoNotJoinAreAnError) {
  // The read of all rows is the resync: no empty delta that would reset the
  // consumer's replica to nothing.
  std::vector<ReceivedDelta> parts =
      Parts(Block({1, 5}, 0, 2), Block({1, 6}, 2, 2));
  for (ReceivedDelta& part : parts) {
    part.header.set_all_rows(true);
    part.header.set_resync_required(true);
  }
  parts[1].header.set_start_batch(3);
  EXPECT_EQ(MergeRankDeltas(TwoRanks("t", "COLUMN_WISE"), std::move(parts))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

// Rank 0's cursor moved on a read the consumer never got (a cut rank 0
// served while rank 1 withdrew): the merged read starts where rank 0's part
// does, and the consumer at batch 5 sees the gap instead of missing rank 0's
// rows of batches 5..7.
TEST(MergeRankDeltasTest, APartThatStartsLaterIsAGapForTheConsumer) {
  std::vector<ReceivedDelta> parts =
      Parts(FullRows({3, 7}, 0), FullRows({1, 9}, 1));
  parts[0].header.set_start_batch(8);
  parts[1].header.set_start_batch(5);
  for (ReceivedDelta& part : parts) part.header.set_end_batch(12);
  absl::StatusOr<ReceivedDelta> merged =
      MergeRankDeltas(TwoRanks("t", "ROW_WISE"), std::move(parts));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->header.start_batch(), 8);
  EXPECT_EQ(ClassifyDelta({5, merged->header.run_id()}, 5, merged->header).fit,
            DeltaFit::kGap);
  // A consumer that holds batch 8 (rank 1's part redelivers 5..7: acknowledged
  // reads whose commit reached rank 0 only) continues.
  EXPECT_EQ(ClassifyDelta({8, merged->header.run_id()}, 8, merged->header).fit,
            DeltaFit::kContinues);
}

TEST(MergeRankDeltasTest, SortsRowsAndKeepsOneDataParallelRowPerId) {
  absl::StatusOr<ReceivedDelta> rows =
      MergeRankDeltas(TwoRanks("t", "ROW_WISE"),
                      Parts(FullRows({3, 7}, 0), FullRows({1, 9}, 1)));
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(rows->tables.at("t").ids.equal(at::tensor({1L, 3L, 7L, 9L})));
  EXPECT_TRUE(rows->tables.at("t").values[0].equal(
      at::tensor({100.f, 101.f, 102.f, 103.f})));
  // The same ID from two ranks: data-parallel keeps one, else an error.
  absl::StatusOr<ReceivedDelta> copies =
      MergeRankDeltas(TwoRanks("t", "DATA_PARALLEL"),
                      Parts(FullRows({3, 7}, 0), FullRows({3, 9}, 0)));
  ASSERT_TRUE(copies.ok()) << copies.status();
  EXPECT_TRUE(copies->tables.at("t").ids.equal(at::tensor({3L, 7L, 9L})));
  EXPECT_EQ(MergeRankDeltas(TwoRanks("t", "ROW_WISE"),
                            Parts(FullRows({3, 7}, 0), FullRows({3, 9}, 0)))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST(MergeRankDeltasTest, ConcatenatesDisjointRowBlocksInIdOrder) {
  // Rank 1 holds the lower block: its rows come first.
  absl::StatusOr<ReceivedDelta> blocks =
      MergeRankDeltas(TwoRanks("t", "ROW_WISE"),
                      Parts(FullRows({6, 8}, 0), FullRows({1, 2, 5}, 1)));
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  const ReceivedTable& t = blocks->tables.at("t");
  EXPECT_TRUE(t.ids.equal(at::tensor({1L, 2L, 5L, 6L, 8L})));
  EXPECT_TRUE(t.values.equal(
      at::cat({FullRows({1, 2, 5}, 1).values, FullRows({6, 8}, 0).values})));
  // A part whose IDs do not ascend is still merged sorted.
  absl::StatusOr<ReceivedDelta> unsorted =
      MergeRankDeltas(TwoRanks("t", "ROW_WISE"),
                      Parts(FullRows({9, 7}, 0), FullRows({1, 2}, 1)));
  ASSERT_TRUE(unsorted.ok()) << unsorted.status();
  const ReceivedTable& u = unsorted->tables.at("t");
  EXPECT_TRUE(u.ids.equal(at::tensor({1L, 2L, 7L, 9L})));
  EXPECT_TRUE(u.values[2].equal(FullRows({9, 7}, 0).values[1]));
  // Touching ranges (the same ID on both ranks) are refused, as before.
  EXPECT_EQ(MergeRankDeltas(TwoRanks("t", "ROW_WISE"),
                            Parts(FullRows({1, 3}, 0), FullRows({3, 9}, 0)))
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv, deltastream::RunCase);
}
