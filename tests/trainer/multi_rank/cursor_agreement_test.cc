// Consumers' cursors agree across ranks after a restart (issue 16): two ranks
// (real processes, Gloo on loopback), each with its own tracker and RocksDB
// snapshot database, snapshot with deliberately different consumer states
// (a commit, a new consumer, a resync flag that reached one rank only before
// its snapshot), restart from those snapshots, agree (AgreeCursors), and
// read: every rank's read starts at the same batch, without a needless
// resync, and its rows equal bit for bit those of a tracker that never
// restarted.
#include "trainer/cursor_agreement.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"
#include "trainer/comm/process_group.h"

namespace deltastream {
namespace {

using ::deltastream::testing::ExpectRanksPassed;
using ::deltastream::testing::RankResult;
using ::deltastream::testing::RunRanks;

constexpr char kTable[] = "emb.t0";
constexpr int64_t kDim = 4;

std::unique_ptr<Tracker> NewTracker() {
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.consumers = {"predictor"};
  options.acknowledged_reads = true;
  options.delete_on_read = true;
  options.auto_compact = true;
  absl::StatusOr<std::unique_ptr<Tracker>> tracker = Tracker::Create(options);
  if (!tracker.ok()) {
    std::fprintf(stderr, "FAILED: %s\n", tracker.status().ToString().c_str());
    std::exit(3);
  }
  return *std::move(tracker);
}

// Batch `batch` of rank `rank`: IDs and rows that differ by rank and batch,
// some IDs repeated across batches (a kEmbedding read keeps the first row).
absl::Status RecordBatch(Tracker& tracker, int rank, int64_t batch) {
  const at::Tensor ids =
      at::arange(batch % 3, batch % 3 + 5, at::kLong) + 100 * rank;
  const at::Tensor rows =
      at::arange(5 * kDim, at::kFloat).reshape({5, kDim}) * 0.37f +
      static_cast<float>(batch * 10 + rank);
  if (absl::Status s = tracker.RecordTables({TableLookup{kTable, ids, rows}});
      !s.ok()) {
    return s;
  }
  tracker.Step();
  tracker.TriggerCompaction();
  return absl::OkStatus();
}

absl::Status RecordBatches(Tracker& tracker, int rank, int64_t from,
                           int64_t to) {
  for (int64_t b = from; b < to; ++b) {
    if (absl::Status s = RecordBatch(tracker, rank, b); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Delta> Read(Tracker& tracker, const std::string& consumer) {
  DeltaRequest request;
  request.consumer = consumer;
  request.through_current_batch = false;
  return tracker.GetDelta(request);
}

// A snapshot of `tracker` into a fresh RocksDB database, restored into a new
// tracker: the rank's restart.
absl::StatusOr<std::unique_ptr<Tracker>> Restart(Tracker& tracker, int rank,
                                                 const std::string& name) {
  const std::string dir =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, "_rank", rank);
  {
    absl::StatusOr<std::unique_ptr<TrackerSnapshots>> db =
        TrackerSnapshots::Open(dir, &tracker);
    if (!db.ok()) return db.status();
    if (absl::StatusOr<SnapshotInfo> s = (*db)->Snapshot(); !s.ok()) {
      return s.status();
    }
  }
  std::unique_ptr<Tracker> restarted = NewTracker();
  absl::StatusOr<std::unique_ptr<TrackerSnapshots>> db =
      TrackerSnapshots::Open(dir, restarted.get());
  if (!db.ok()) return db.status();
  absl::StatusOr<std::optional<SnapshotInfo>> restored = (*db)->Restore();
  if (!restored.ok()) return restored.status();
  if (!restored->has_value()) return absl::InternalError("nothing restored");
  return restarted;
}

// Every rank stands at the same `value`.
absl::StatusOr<bool> SameOnEveryRank(ProcessGroup& group, int64_t value,
                                     const char* label) {
  absl::StatusOr<int64_t> lowest = group.AllReduceMin(value, label);
  if (!lowest.ok()) return lowest.status();
  absl::StatusOr<int64_t> highest = group.AllReduceMin(-value, label);
  if (!highest.ok()) return highest.status();
  return *lowest == -*highest;
}

bool SameRows(const Delta& a, const Delta& b) {
  if (a.tables.size() != b.tables.size()) return false;
  for (const auto& [fqn, table] : a.tables) {
    auto it = b.tables.find(fqn);
    if (it == b.tables.end()) return false;
    if (!at::equal(table.ids, it->second.ids) ||
        !at::equal(table.states, it->second.states)) {
      return false;
    }
  }
  return true;
}

// A commit that reaches rank 0 before its snapshot and rank 1 after: the
// merged read resumes at the commit on both, no resync, rows bit for bit.
int CommitOnOneRank(ProcessGroup& group) {
  const int rank = group.rank();
  std::unique_ptr<Tracker> tracker = NewTracker();
  RANK_OK(RecordBatches(*tracker, rank, 0, 4));
  absl::StatusOr<Delta> first = Read(*tracker, "predictor");
  RANK_OK(first);
  RANK_EXPECT(first->end_batch == 4, "end ", first->end_batch);
  RANK_OK(RecordBatches(*tracker, rank, 4, 7));
  if (rank == 0) RANK_OK(tracker->Commit("predictor", 4));
  absl::StatusOr<std::unique_ptr<Tracker>> restarted =
      Restart(*tracker, rank, "commit");
  RANK_OK(restarted);
  if (rank == 1) RANK_OK(tracker->Commit("predictor", 4));  // after it
  // Without agreement the ranks' cursors stand a read apart.
  const int64_t cursor_before =
      (*restarted)->SaveConsumers().consumers.at(0).cursor;
  RANK_EXPECT(cursor_before == (rank == 0 ? 4 : -1), "cursor ", cursor_before);
  absl::StatusOr<CursorAgreement> agreed = AgreeCursors(**restarted, group);
  RANK_OK(agreed);
  RANK_EXPECT(agreed->moved == (rank == 0 ? 0 : 1), "moved ", agreed->moved);
  RANK_EXPECT(agreed->resync == 0, "resync ", agreed->resync);
  // The consumer's next read and the one of a tracker that never restarted.
  absl::StatusOr<Delta> after = Read(**restarted, "predictor");
  RANK_OK(after);
  absl::StatusOr<Delta> expected = Read(*tracker, "predictor");
  RANK_OK(expected);
  RANK_EXPECT(after->start_batch == 4 && after->end_batch == 7, "read ",
              after->start_batch, "..", after->end_batch);
  RANK_EXPECT(!after->resync_required, "a resync the restart did not need");
  RANK_EXPECT(SameRows(*after, *expected), "rows differ from a tracker that ",
              "never restarted");
  absl::StatusOr<bool> same =
      SameOnEveryRank(group, after->start_batch, "test.start");
  RANK_OK(same);
  RANK_EXPECT(*same, "the ranks' reads start at different batches");
  // Committing it works on every rank (the pending read is agreed too).
  RANK_OK((*restarted)->Commit("predictor", 7));
  return 0;
}

// A consumer added on rank 0 only before the snapshots: rank 1 gets it too.
// Added at the snapshot's batch ("late"), every rank serves it exactly; added
// earlier ("early", rank 1's store deleted and compacted past it), it must
// resync, on every rank.
int ConsumerOnOneRank(ProcessGroup& group) {
  const int rank = group.rank();
  std::unique_ptr<Tracker> tracker = NewTracker();
  RANK_OK(RecordBatches(*tracker, rank, 0, 2));
  if (rank == 0) RANK_OK(tracker->AddConsumer("early"));
  RANK_OK(RecordBatches(*tracker, rank, 2, 6));
  RANK_OK(Read(*tracker, "predictor"));
  RANK_OK(tracker->Commit("predictor", 6));
  RANK_OK(RecordBatches(*tracker, rank, 6, 8));
  if (rank == 0) RANK_OK(tracker->AddConsumer("late"));
  absl::StatusOr<std::unique_ptr<Tracker>> restarted =
      Restart(*tracker, rank, "consumer");
  RANK_OK(restarted);
  if (rank == 1) RANK_OK(tracker->AddConsumer("late"));  // after it
  absl::StatusOr<CursorAgreement> agreed = AgreeCursors(**restarted, group);
  RANK_OK(agreed);
  RANK_EXPECT(agreed->consumers == 3, "consumers ", agreed->consumers);
  RANK_EXPECT(agreed->added == (rank == 0 ? 0 : 2), "added ", agreed->added);
  RANK_EXPECT((*restarted)->Consumers().size() == 3, "consumers here ",
              (*restarted)->Consumers().size());
  RANK_OK(RecordBatches(**restarted, rank, 8, 10));
  RANK_OK(RecordBatches(*tracker, rank, 8, 10));
  absl::StatusOr<Delta> late = Read(**restarted, "late");
  RANK_OK(late);
  absl::StatusOr<Delta> expected = Read(*tracker, "late");
  RANK_OK(expected);
  RANK_EXPECT(late->start_batch == 8 && !late->resync_required, "late read ",
              late->start_batch, " resync ", late->resync_required);
  RANK_EXPECT(SameRows(*late, *expected), "late: rows differ");
  absl::StatusOr<Delta> early = Read(**restarted, "early");
  RANK_OK(early);
  RANK_EXPECT(early->resync_required, "early: rank ", rank,
              " cannot serve batch 2 exactly, yet no resync");
  absl::StatusOr<Delta> predictor = Read(**restarted, "predictor");
  RANK_OK(predictor);
  RANK_EXPECT(predictor->start_batch == 6 && !predictor->resync_required,
              "predictor read ", predictor->start_batch);
  return 0;
}

// A resync flag that rank 0 holds in its snapshot: every rank tells the
// consumer to resync.
int ResyncOnOneRank(ProcessGroup& group) {
  const int rank = group.rank();
  std::unique_ptr<Tracker> tracker = NewTracker();
  RANK_OK(RecordBatches(*tracker, rank, 0, 3));
  if (rank == 0) tracker->RequireResync();
  absl::StatusOr<std::unique_ptr<Tracker>> restarted =
      Restart(*tracker, rank, "resync");
  RANK_OK(restarted);
  absl::StatusOr<CursorAgreement> agreed = AgreeCursors(**restarted, group);
  RANK_OK(agreed);
  RANK_EXPECT(agreed->resync == (rank == 0 ? 0 : 1), "resync ", agreed->resync);
  absl::StatusOr<Delta> read = Read(**restarted, "predictor");
  RANK_OK(read);
  RANK_EXPECT(read->resync_required, "rank ", rank, ": no resync");
  return 0;
}

int RunCase(ProcessGroup& group, const std::string& name) {
  if (name == "commit") return CommitOnOneRank(group);
  if (name == "consumer") return ConsumerOnOneRank(group);
  if (name == "resync") return ResyncOnOneRank(group);
  std::fprintf(stderr, "FAILED: unknown case %s\n", name.c_str());
  return 3;
}

ConsumerState Consumer(const std::string& name, int64_t cursor,
                       std::vector<int64_t> pending_ends = {}) {
  ConsumerState c;
  c.name = name;
  c.cursor = cursor;
  for (int64_t end : pending_ends) c.pending_reads.push_back({end, {}});
  return c;
}

TrackerState Rank(int64_t current_batch, std::vector<ConsumerState> consumers) {
  TrackerState state;
  state.current_batch = current_batch;
  state.consumers = std::move(consumers);
  return state;
}

// The rule itself, without processes.
TEST(AgreeConsumersTest, FurthestServableCursorUnionOfReadsAnyResync) {
  // Rank 0 committed 4 and read on to 6; rank 1 has neither; "q" is on rank 1
  // only, at 2, which rank 0 cannot serve; "r" flagged on rank 1 only.
  ConsumerState r1 = Consumer("r", 7);
  r1.resync_required = true;
  r1.lost_ids = 5;
  const std::vector<TrackerState> ranks = {
      Rank(7, {Consumer("p", 4, {6}), Consumer("r", 7)}),
      Rank(7, {Consumer("p", -1, {4}), Consumer("q", 2), r1})};
  const std::vector<ConsumerState> agreed = AgreeConsumers(ranks);
  ASSERT_EQ(agreed.size(), 3u);
  const ConsumerState& p = agreed[0];
  EXPECT_EQ(p.name, "p");
  EXPECT_EQ(p.cursor, 4);
  EXPECT_FALSE(p.resync_required);
  // The read ending at 6 is no compaction bound on rank 1: dropped.
  EXPECT_TRUE(p.pending_reads.empty());
  const ConsumerState& q = agreed[1];
  EXPECT_EQ(q.cursor, 2);
  EXPECT_TRUE(q.resync_required);
  const ConsumerState& r = agreed[2];
  EXPECT_TRUE(r.resync_required);
  EXPECT_EQ(r.lost_ids, 5);

  // A table read on its own: the furthest per table; a read pending on both
  // ranks and past the cursors stays, once.
  ConsumerState a = Consumer("p", 4, {6});
  a.table_cursors["t"] = 6;
  const std::vector<ConsumerState> tables = AgreeConsumers(
      {Rank(8, {a}), Rank(8, {Consumer("p", 4, {6}), Consumer("s", 6)})});
  ASSERT_EQ(tables.size(), 2u);
  EXPECT_EQ(tables[0].cursor, 4);
  EXPECT_EQ(tables[0].table_cursors.at("t"), 6);
  ASSERT_EQ(tables[0].pending_reads.size(), 1u);
  EXPECT_EQ(tables[0].pending_reads[0].end, 6);
  EXPECT_FALSE(tables[0].resync_required);
  // "s" at 6, a bound on rank 0 too (p's pending end): no resync.
  EXPECT_FALSE(tables[1].resync_required);
}

TEST(SetConsumersTest, NeverMovesACursorBackAndAddsConsumers) {
  std::unique_ptr<Tracker> tracker = NewTracker();
  ASSERT_TRUE(RecordBatches(*tracker, 0, 0, 3).ok());
  ASSERT_TRUE(Read(*tracker, "predictor").ok());
  ASSERT_TRUE(tracker->Commit("predictor", 3).ok());
  ASSERT_TRUE(
      tracker->SetConsumers({Consumer("predictor", 1), Consumer("new", 2)})
          .ok());
  const TrackerState state = tracker->SaveConsumers();
  ASSERT_EQ(state.consumers.size(), 2u);
  EXPECT_EQ(state.consumers[0].name, "new");
  EXPECT_EQ(state.consumers[0].cursor, 2);
  EXPECT_EQ(state.consumers[1].cursor, 3);
  EXPECT_EQ(tracker->SetConsumers({Consumer("a b", 1)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker->SetConsumers({Consumer("x", 1), Consumer("x", 2)}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker->Consumers().size(), 2u);
}

TEST(CursorAgreementTest, RanksAgreeOnConsumersAfterRestart) {
  const std::vector<RankResult> results =
      RunRanks("commit,consumer,resync", 2, absl::Seconds(120));
  ExpectRanksPassed(results);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv, deltastream::RunCase);
}
