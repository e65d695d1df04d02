#include "tracker_service/tracker.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "absl/time/clock.h"
#include "proto/snapshot.pb.h"
#include "tests/tracker_service/tracker_test_util.h"
#include "tracker_service/tracker_snapshots.h"

namespace deltastream {
namespace {

constexpr char kT1[] = "sparse.ec.embeddings.t1";
constexpr char kT2[] = "sparse.ec.embeddings.t2";
constexpr char kT3[] = "sparse.ebc.embedding_bags.t3";

std::vector<TrackedModule> Model() {
  return {
      {"_dmp_wrapped_module.module.sparse.ec",
       /*pooled=*/false,
       {{"t1", {"f1", "f2"}}, {"t2", {"f3"}}}},
      {"module.sparse.ebc", /*pooled=*/true, {{"t3", {"f4"}}}},
  };
}

std::unique_ptr<Tracker> MakeTracker(TrackerOptions options,
                                     LiveRowsReader* reader = nullptr) {
  if (options.modules.empty()) options.modules = Model();
  auto tracker = Tracker::Create(std::move(options), reader);
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return *std::move(tracker);
}

Delta Read(Tracker& tracker, const std::string& consumer = "default") {
  DeltaRequest request;
  request.consumer = consumer;
  auto delta = tracker.GetDelta(request);
  EXPECT_TRUE(delta.ok()) << delta.status();
  return *std::move(delta);
}

std::vector<int64_t> IdsOf(const Delta& delta, const std::string& fqn) {
  auto it = delta.tables.find(fqn);
  return it == delta.tables.end() ? std::vector<int64_t>{}
                                  : ToIds(it->second.ids);
}

TEST(FeatureMapTest, CleansPrefixesMapsFeaturesAndSkips) {
  EXPECT_EQ(CleanFqn("_dmp_wrapped_module.module.a.b"), "a.b");
  EXPECT_EQ(CleanFqn("module.a.b"), "a.b");
  EXPECT_EQ(CleanFqn("a.module.b"), "a.module.b");

  auto map = BuildFeatureMap(Model(), {});
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->fqn_of_feature.at("f1"), kT1);
  EXPECT_EQ(map->fqn_of_feature.at("f2"), kT1);
  EXPECT_EQ(map->fqn_of_feature.at("f3"), kT2);
  EXPECT_EQ(map->fqn_of_feature.at("f4"), kT3);
  EXPECT_EQ(map->fqns, (std::vector<std::string>{kT1, kT2, kT3}));

  // A module whose path holds a skipped component, and a skipped table name.
  map = BuildFeatureMap(Model(), {"ebc", "t2"});
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->fqns, std::vector<std::string>{kT1});
  EXPECT_TRUE(map->skipped_features.contains("f3"));
  EXPECT_TRUE(map->skipped_features.contains("f4"));
  // "sparse.e" is not a component of "sparse.ec": nothing is skipped by it.
  map = BuildFeatureMap(Model(), {"e"});
  EXPECT_EQ(map->fqns.size(), 3u);
}

TEST(FeatureMapTest, DuplicateFeatureKeepsFirstTableWithWarning) {
  std::vector<TrackedModule> modules = {
      {"ec", false, {{"a", {"f"}}, {"b", {"f", "g"}}}}};
  auto map = BuildFeatureMap(modules, {});
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->fqn_of_feature.at("f"), "ec.embeddings.a");
  ASSERT_EQ(map->warnings.size(), 1u);
  EXPECT_NE(map->warnings[0].find("'f'"), std::string::npos);
}

TEST(TrackerCreateTest, EmbeddingModeOnPooledModuleIsRefused) {
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.modules = Model();
  auto tracker = Tracker::Create(options);
  EXPECT_EQ(tracker.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(tracker.status().message().find("sparse.ebc"), std::string::npos);
  options.fqns_to_skip = {"ebc"};
  EXPECT_TRUE(Tracker::Create(options).ok());
}

TEST(TrackerCreateTest, BadOptionsAreRefused) {
  TrackerOptions options;
  options.consumers = {"a", "a"};
  EXPECT_EQ(Tracker::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.consumers = {"bad name"};
  EXPECT_EQ(Tracker::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.consumers = {};
  options.memory_cap_bytes = -1;
  EXPECT_EQ(Tracker::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TrackerTest, IdOnlyGroupsFeaturesPerTableAndReadsOnce) {
  auto tracker = MakeTracker({});
  std::vector<FeatureIds> lookup = {
      {"f1", Ids({5, 1})}, {"f2", Ids({1, 3})}, {"f3", Ids({9})}};
  ASSERT_TRUE(tracker->RecordLookup(lookup).ok());
  // f1 and f2 of one batch are one lookup of t1.
  EXPECT_EQ(tracker->Status().usage.tables[kT1].lookups, 1);

  Delta delta = Read(*tracker);
  EXPECT_EQ(delta.start_batch, -1);
  EXPECT_EQ(delta.end_batch, 1);
  EXPECT_EQ(IdsOf(delta, kT1), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(IdsOf(delta, kT2), (std::vector<int64_t>{9}));
  EXPECT_FALSE(delta.tables[kT1].states.defined());
  EXPECT_FALSE(delta.tables[kT1].values.defined());
  // Delete-on-read with one consumer: nothing is held any more.
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);

  // Reading again with nothing new in between: the tables, empty.
  delta = Read(*tracker);
  EXPECT_TRUE(IdsOf(delta, kT1).empty());
  EXPECT_TRUE(IdsOf(delta, kT2).empty());
}

TEST(TrackerTest, EmbeddingModeKeepsFirstValueSinceLastRead) {
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  // Batch 0: row 1 = 10. Batch 1: row 1 = 11, row 2 = 20.
  ASSERT_TRUE(
      tracker->RecordLookup({{"f1", Ids({1})}}, at::full({1, 2}, 10.0)).ok());
  tracker->Step();
  ASSERT_TRUE(tracker
                  ->RecordLookup({{"f1", Ids({1})}, {"f2", Ids({2})}},
                                 at::tensor({11.f, 11.f, 20.f, 20.f}))
                  .ok());
  Delta delta = Read(*tracker);
  EXPECT_EQ(IdsOf(delta, kT1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ToFloats(delta.tables[kT1].states),
            (std::vector<float>{10, 10, 20, 20}));
  tracker->Step();
  ASSERT_TRUE(
      tracker->RecordLookup({{"f1", Ids({1})}}, at::full({1, 2}, 12.0)).ok());
  delta = Read(*tracker);
  EXPECT_EQ(ToFloats(delta.tables[kT1].states), (std::vector<float>{12, 12}));
}

TEST(TrackerTest, EmbeddingModeWithLiveRowsGivesValuesAndTopK) {
  TensorRowsReader reader;
  reader.SetTable(kT1, at::zeros({10, 2}));
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc", "t2"};
  auto tracker = MakeTracker(options, &reader);
  ASSERT_TRUE(
      tracker->RecordLookup({{"f1", Ids({1, 2, 3, 4})}}, at::zeros({4, 2}))
          .ok());
  // The optimizer moves row r by r (row 4 most), row 2 by 10.
  reader.embeddings(kT1).index_put_({1}, at::full({2}, 1.0));
  reader.embeddings(kT1).index_put_({2}, at::full({2}, 10.0));
  reader.embeddings(kT1).index_put_({3}, at::full({2}, 3.0));
  reader.embeddings(kT1).index_put_({4}, at::full({2}, 4.0));

  DeltaRequest request;
  request.top_k = TopK::Percentage(50);
  auto delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok()) << delta.status();
  const TableDelta& t1 = delta->tables[kT1];
  EXPECT_EQ(ToIds(t1.ids), (std::vector<int64_t>{2, 4}));  // ascending
  EXPECT_EQ(ToFloats(t1.values), (std::vector<float>{10, 10, 4, 4}));
  EXPECT_EQ(ToFloats(t1.states), (std::vector<float>{0, 0, 0, 0}));
  ASSERT_TRUE(t1.scores.defined());
  EXPECT_NEAR(ToFloats(t1.scores)[0], std::sqrt(200.f), 1e-4);
  EXPECT_NEAR(ToFloats(t1.scores)[1], std::sqrt(32.f), 1e-4);
}

TEST(TrackerTest, TopKByCountPerTableAndItsErrors) {
  TensorRowsReader reader;
  reader.SetTable(kT1, at::arange(20, at::kFloat).reshape({10, 2}));
  reader.SetTable(kT2, at::arange(20, at::kFloat).reshape({10, 2}));
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options, &reader);
  ASSERT_TRUE(tracker
                  ->RecordLookup({{"f1", Ids({1, 5, 7})}, {"f3", Ids({2, 3})}},
                                 at::zeros({5, 2}))
                  .ok());

  DeltaRequest bad;
  bad.top_k = TopK::Percentage(0);
  EXPECT_EQ(tracker->GetDelta(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.top_k = TopK::Percentage(100.5);
  EXPECT_EQ(tracker->GetDelta(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.top_k = TopK::Count(0);
  EXPECT_EQ(tracker->GetDelta(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.top_k.reset();
  bad.per_table_top_k[kT1] = TopK::Count(1);
  bad.fqns = {kT2};  // top-k for a table that is not read
  EXPECT_EQ(tracker->GetDelta(bad).status().code(),
            absl::StatusCode::kNotFound);

  // Refused reads moved no cursor: everything is still there.
  DeltaRequest request;
  request.per_table_top_k[kT1] = TopK::Count(2);
  auto delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(IdsOf(*delta, kT1), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(IdsOf(*delta, kT2), (std::vector<int64_t>{2, 3}));  // all kept
  EXPECT_EQ(delta->tables[kT1].scores.numel(), 2);
}

TEST(TrackerTest, ScoresNeedWhatTheModeNeeds) {
  auto id_only = MakeTracker({});
  DeltaRequest request;
  request.include_scores = true;
  EXPECT_EQ(id_only->GetDelta(request).status().code(),
            absl::StatusCode::kFailedPrecondition);
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc"};
  auto no_reader = MakeTracker(options);
  request.top_k = TopK::Percentage(10);
  auto status = no_reader->GetDelta(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("LiveRowsReader"), std::string::npos);
}

TEST(TrackerTest, MomentumLastKeepsLatestNorm) {
  TensorRowsReader reader;
  reader.SetTable(kT1, at::zeros({4, 2}), at::zeros({4, 2}));
  TrackerOptions options;
  options.mode = TrackingMode::kMomentumLast;
  auto tracker = MakeTracker(options, &reader);
  reader.optimizer_states(kT1).index_put_({1}, at::tensor({3.f, 4.f}));
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  tracker->Step();
  reader.optimizer_states(kT1).index_put_({1}, at::tensor({6.f, 8.f}));
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  DeltaRequest request;
  request.include_scores = true;
  request.fqns = {kT1};
  auto delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(ToFloats(delta->tables[kT1].states), std::vector<float>{10});
  EXPECT_EQ(ToFloats(delta->tables[kT1].scores), std::vector<float>{10});
}

TEST(TrackerTest, MomentumDiffAndRowwiseAdagradReturnLatestMinusFirst) {
  for (TrackingMode mode :
       {TrackingMode::kMomentumDiff, TrackingMode::kRowwiseAdagrad}) {
    TensorRowsReader reader;
    const bool rowwise = mode == TrackingMode::kRowwiseAdagrad;
    reader.SetTable(kT1, at::zeros({4, 2}),
                    rowwise ? at::ones({4}) : at::ones({4, 2}));
    TrackerOptions options;
    options.mode = mode;
    auto tracker = MakeTracker(options, &reader);
    ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
    tracker->Step();
    reader.optimizer_states(kT1).index_put_(
        {2}, rowwise ? at::tensor(5.f) : at::tensor({4.f, 5.f}));
    ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());  // not first
    DeltaRequest request;
    request.top_k = TopK::Count(1);
    request.fqns = {kT1};
    auto delta = tracker->GetDelta(request);
    ASSERT_TRUE(delta.ok()) << delta.status();
    const TableDelta& t1 = delta->tables[kT1];
    if (rowwise) {
      EXPECT_EQ(ToFloats(t1.states), std::vector<float>{4});
      EXPECT_EQ(ToFloats(t1.scores), std::vector<float>{4});
    } else {
      EXPECT_EQ(ToFloats(t1.states), (std::vector<float>{3, 4}));
      EXPECT_EQ(ToFloats(t1.scores), std::vector<float>{5});
    }
    EXPECT_EQ(ToFloats(t1.values), (std::vector<float>{0, 0}));
  }
}

TEST(TrackerTest, OptimizerModesWithoutReaderNeedStates) {
  TrackerOptions options;
  options.mode = TrackingMode::kMomentumDiff;
  auto tracker = MakeTracker(options);
  EXPECT_EQ(tracker->RecordLookup({{"f1", Ids({2})}}).code(),
            absl::StatusCode::kFailedPrecondition);
  // A remote producer passes them.
  EXPECT_TRUE(tracker->RecordTables({{kT1, Ids({2}), at::ones({1, 3})}}).ok());
}

TEST(TrackerTest, Float64StatesAreKeptAsFloat32) {
  // A "double" table's rows (kEmbedding) or optimizer states: the store
  // keeps them as float32, in every mode that keeps states.
  for (TrackingMode mode :
       {TrackingMode::kEmbedding, TrackingMode::kMomentumLast,
        TrackingMode::kMomentumDiff}) {
    SCOPED_TRACE(TrackingModeName(mode));
    TrackerOptions options;
    options.mode = mode;
    options.fqns_to_skip = {"ebc"};  // pooled: not in embedding mode
    auto tracker = MakeTracker(options);
    const at::Tensor states =
        at::tensor({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, at::kDouble).reshape({2, 3});
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({4, 2}), states}}).ok());
    if (mode == TrackingMode::kEmbedding) {
      ASSERT_TRUE(tracker->RecordLookup({{"f3", Ids({7})}}, states[0]).ok());
    }
    const Delta delta = Read(*tracker);
    EXPECT_EQ(IdsOf(delta, kT1), (std::vector<int64_t>{2, 4}));
    const TableDelta& table = delta.tables.at(kT1);
    ASSERT_TRUE(table.states.defined());
    EXPECT_EQ(table.states.scalar_type(), at::kFloat);
    if (mode == TrackingMode::kEmbedding) {
      EXPECT_TRUE(at::equal(
          table.states, states.index_select(0, Ids({1, 0})).to(at::kFloat)));
      EXPECT_EQ(IdsOf(delta, kT2), std::vector<int64_t>{7});
    }
  }
}

TEST(TrackerTest, TwoConsumersWithDeleteOnRead) {
  TrackerOptions options;
  options.consumers = {"a", "b"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker, "a"), kT1), std::vector<int64_t>{1});
  // b has not read batch 0: it is kept.
  EXPECT_EQ(tracker->Status().usage.total.lookups, 1);
  tracker->Step();
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker, "b"), kT1), (std::vector<int64_t>{1, 2}));
  // a still needs batch 1.
  EXPECT_EQ(tracker->Status().usage.total.ids, 1);
  EXPECT_EQ(IdsOf(Read(*tracker, "a"), kT1), std::vector<int64_t>{2});
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
}

TEST(TrackerTest, WithoutDeleteOnReadRowsStayButCursorsMove) {
  TrackerOptions options;
  options.delete_on_read = false;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1, 2})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker), kT1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);
  tracker->Step();
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({3})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker), kT1), std::vector<int64_t>{3});
}

TEST(TrackerTest, AutoCompactionOncePerStepKeepsOneLookupPerTable) {
  TrackerOptions options;
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  for (int64_t b = 0; b < 5; ++b) {
    ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({b, b + 1})}}).ok());
    tracker->TriggerCompaction();
    tracker->TriggerCompaction();  // a second call in a step does nothing
    tracker->Step();
  }
  // Batches 0-3 are one lookup; batch 4 was recorded after the last trigger.
  EXPECT_EQ(tracker->Status().usage.tables[kT1].lookups, 2);
  EXPECT_EQ(IdsOf(Read(*tracker), kT1),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(TrackerTest, ReadingTablesSeparatelyLosesNothing) {
  auto tracker = MakeTracker({});
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}, {"f3", Ids({7})}}).ok());
  DeltaRequest only_t1;
  only_t1.fqns = {kT1};
  auto delta = tracker->GetDelta(only_t1);
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(delta->tables.size(), 1u);
  tracker->Step();
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  Delta rest = Read(*tracker);
  EXPECT_EQ(IdsOf(rest, kT1), std::vector<int64_t>{2});
  EXPECT_EQ(IdsOf(rest, kT2), std::vector<int64_t>{7});
  DeltaRequest unknown;
  unknown.fqns = {"no.such.table"};
  EXPECT_EQ(tracker->GetDelta(unknown).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TrackerTest, ConcurrentStyleReadSeesOnlyClosedBatches) {
  auto tracker = MakeTracker({});
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  DeltaRequest request;
  request.through_current_batch = false;
  auto delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(IdsOf(*delta, kT1), std::vector<int64_t>{1});
  EXPECT_EQ(delta->end_batch, 1);
  // More of batch 1 arrives after the read: the next read has all of it.
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({3})}}).ok());
  tracker->Step();
  delta = tracker->GetDelta(request);
  EXPECT_EQ(IdsOf(*delta, kT1), (std::vector<int64_t>{2, 3}));
}

TEST(TrackerTest, AllRowsReadsEveryRowAndMovesTheCursor) {
  TensorRowsReader reader;
  reader.SetTable(kT1, at::arange(20, at::kFloat).reshape({10, 2}));
  reader.SetTable(kT2, at::arange(6, at::kFloat).reshape({3, 2}));
  TrackerOptions options;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options, &reader);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({7})}}).ok());
  tracker->Step();
  DeltaRequest request;
  request.all_rows = true;
  request.through_current_batch = false;
  auto delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_TRUE(delta->all_rows);
  EXPECT_EQ(delta->end_batch, 1);
  ASSERT_EQ(delta->tables.size(), 2u);  // every tracked table, read or not
  EXPECT_EQ(ToIds(delta->tables[kT1].ids).size(), 10u);
  EXPECT_TRUE(at::equal(delta->tables[kT1].values, reader.embeddings(kT1)));
  EXPECT_TRUE(at::equal(delta->tables[kT2].values, reader.embeddings(kT2)));
  EXPECT_FALSE(delta->tables[kT1].states.defined());
  // The cursor moved: nothing is left to read.
  request.all_rows = false;
  delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok());
  EXPECT_TRUE(IdsOf(*delta, kT1).empty());

  request.all_rows = true;
  request.top_k = TopK::Percentage(10);
  EXPECT_EQ(tracker->GetDelta(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A standalone tracker has no tables to read whole.
  auto standalone = MakeTracker({});
  request.top_k.reset();
  EXPECT_EQ(standalone->GetDelta(request).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TrackerTest, DenseParametersComeWithTheRowsOfTheSameStep) {
  TensorRowsReader reader;
  reader.SetTable(kT1, at::zeros({10, 2}));
  TrackerOptions options;
  options.fqns_to_skip = {"ebc", "t2"};
  auto tracker = MakeTracker(options, &reader);
  DeltaRequest request;
  request.include_dense = true;
  // No dense parameters given: refused, and the cursor stays.
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  EXPECT_EQ(tracker->GetDelta(request).status().code(),
            absl::StatusCode::kFailedPrecondition);
  reader.SetDense({{"bottom.weight", at::ones({2, 3})},
                   {"bottom.bias", at::full({2}, 5.0)}});
  auto delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(IdsOf(*delta, kT1), std::vector<int64_t>{1});
  ASSERT_EQ(delta->dense.size(), 2u);
  EXPECT_EQ(delta->dense[0].first, "bottom.weight");
  EXPECT_TRUE(at::equal(delta->dense[1].second, at::full({2}, 5.0)));
  request.include_dense = false;
  EXPECT_TRUE(tracker->GetDelta(request)->dense.empty());
  EXPECT_EQ(MakeTracker({})->GetDelta({}).status().code(),
            absl::StatusCode::kOk);
  DeltaRequest dense_only;
  dense_only.include_dense = true;
  EXPECT_EQ(MakeTracker({})->GetDelta(dense_only).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TrackerTest, DeltasSayWhenTheirBatchesClosedAndWhichRun) {
  auto tracker = MakeTracker({});
  auto other = MakeTracker({});
  EXPECT_EQ(tracker->run_id().size(), 16u);
  EXPECT_NE(tracker->run_id(), other->run_id());
  DeltaRequest request;
  request.through_current_batch = false;
  Delta delta = *tracker->GetDelta(request);
  EXPECT_EQ(delta.oldest_change, absl::InfinitePast());  // no batch read
  EXPECT_EQ(delta.run_id, tracker->run_id());
  EXPECT_EQ(delta.run_start_batch, 0);

  const absl::Time before = absl::Now();
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  tracker->Step();
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  tracker->Step();
  const absl::Time after = absl::Now();
  delta = *tracker->GetDelta(request);
  EXPECT_EQ(delta.start_batch, 0);
  EXPECT_EQ(delta.end_batch, 2);
  EXPECT_GE(delta.oldest_change, before);
  EXPECT_GE(delta.newest_change - delta.oldest_change, absl::Milliseconds(15));
  EXPECT_LE(delta.newest_change, after);

  // A restored state starts a run at its batch; an owner may mark another.
  ASSERT_TRUE(other->RestoreState(tracker->SaveState()).ok());
  EXPECT_EQ(other->Status().run_start_batch, 2);
  other->MarkRunStart(1);
  EXPECT_EQ(other->GetDelta(request)->run_start_batch, 1);
  EXPECT_FALSE(other->Status().serves_live_rows);
}

// Rows that change only under a writer lock, as the trainer's update guard
// changes them: reads pin them (a reader lock) before the tracker's lock.
class GuardedRowsReader : public TensorRowsReader {
 public:
  void PinRows() override { mu_.ReaderLock(); }
  void UnpinRows() override { mu_.ReaderUnlock(); }
  SharedMutex& mu() { return mu_; }

 private:
  SharedMutex mu_;
};

TEST(TrackerConcurrencyTest, ReadsSeeTheRowsOfTheirEndBatchExactly) {
  GuardedRowsReader reader;
  reader.SetTable(kT1, at::zeros({4, 1}));
  TrackerOptions options;
  options.fqns_to_skip = {"ebc", "t2"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options, &reader);
  constexpr int kSteps = 2000;
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({step % 4})}}).ok());
      tracker->TriggerCompaction();
      // Step s sets every row to s + 1, then closes the batch, under the
      // guard: a read ending at batch b must see b everywhere.
      WriterLock guard(&reader.mu());
      reader.embeddings(kT1).fill_(step + 1);
      tracker->Step();
    }
    done.store(true);
  });
  DeltaRequest request;
  request.through_current_batch = false;
  request.all_rows = true;
  int reads = 0, wrong = 0;
  while (!done.load() || reads == 0) {
    auto delta = tracker->GetDelta(request);
    ASSERT_TRUE(delta.ok()) << delta.status();
    const at::Tensor& rows = delta->tables[kT1].values;
    const std::vector<float> values =
        rows.defined() ? ToFloats(rows) : std::vector<float>{};
    for (float v : values) {
      if (v != delta->end_batch && wrong++ < 5) {
        ADD_FAILURE() << "read " << reads << " through batch "
                      << delta->end_batch << " saw a row of step " << v;
      }
    }
    request.all_rows = (++reads % 2) == 0;
  }
  trainer.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(reads, 1);
}

TEST(TrackerTest, ClearOneConsumerMovesItToThePresent) {
  TrackerOptions options;
  options.consumers = {"a", "b"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->Clear("a").ok());
  EXPECT_EQ(tracker->Status().usage.total.lookups, 1);  // b needs it
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->Clear("b").ok());
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
  EXPECT_TRUE(IdsOf(Read(*tracker, "a"), kT1).empty());
  EXPECT_EQ(tracker->Clear("zz").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({3})}}).ok());
  tracker->ClearAll();
  EXPECT_TRUE(IdsOf(Read(*tracker, "b"), kT1).empty());
}

TEST(TrackerTest, ConsumersAddedAndRemovedAtRunTime) {
  auto tracker = MakeTracker({});
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->AddConsumer("late").ok());
  EXPECT_EQ(tracker->AddConsumer("late").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(tracker->AddConsumer("").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker->AddConsumer(std::string(129, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  // The late consumer sees only what came after it joined.
  EXPECT_EQ(IdsOf(Read(*tracker, "late"), kT1), std::vector<int64_t>{2});
  EXPECT_EQ(tracker->Consumers(),
            (std::vector<std::string>{"default", "late"}));
  // Removing "default" frees what only it needed.
  EXPECT_EQ(tracker->Status().usage.total.lookups, 2);
  ASSERT_TRUE(tracker->RemoveConsumer("default").ok());
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
  EXPECT_EQ(tracker->RemoveConsumer("default").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(tracker->RemoveConsumer("late").code(),
            absl::StatusCode::kFailedPrecondition);
  DeltaRequest gone;
  gone.consumer = "default";
  EXPECT_EQ(tracker->GetDelta(gone).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TrackerTest, AcknowledgedReadIsRepeatedUntilCommitted) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  Delta first = Read(*tracker);
  EXPECT_EQ(IdsOf(first, kT1), std::vector<int64_t>{1});
  tracker->Step();
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  // The consumer crashed before committing: it gets batch 0 again, plus 1.
  Delta again = Read(*tracker);
  EXPECT_EQ(IdsOf(again, kT1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);  // nothing deleted yet
  ASSERT_TRUE(tracker->Commit("default", again.end_batch).ok());
  EXPECT_EQ(tracker->Status().usage.total.ids, 0);
  // The later commit made the first read final too.
  EXPECT_EQ(tracker->Commit("default", first.end_batch).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker->Commit("default", again.end_batch).code(),
            absl::StatusCode::kFailedPrecondition);  // nothing pending
  EXPECT_EQ(tracker->Commit("nobody", 1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IdsOf(Read(*tracker), kT1).empty());
}

TEST(TrackerTest, ReadsAheadOfCommitsAreCommittedInTurn) {
  // A subscriber applies one push while the next is in flight: each of its
  // commits lands after the tracker delivered a newer read.
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  std::vector<Delta> reads;
  for (int64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({id})}}).ok());
    reads.push_back(Read(*tracker));
    tracker->Step();
  }
  // Each read repeats the uncommitted ones: at least once, never lost.
  EXPECT_EQ(IdsOf(reads[2], kT1), (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(tracker->Status().consumers.size(), 1u);
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 3);
  EXPECT_EQ(tracker->Status().consumers[0].pending_end, reads[2].end_batch);

  ASSERT_TRUE(tracker->Commit("default", reads[0].end_batch).ok());
  EXPECT_EQ(tracker->Status().consumers[0].cursor, reads[0].end_batch);
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);  // batch 0 deleted
  ASSERT_TRUE(tracker->Commit("default", reads[1].end_batch).ok());
  EXPECT_EQ(tracker->Status().usage.total.ids, 1);
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 1);
  // A read after a commit starts at the committed end.
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({4})}}).ok());
  Delta next = Read(*tracker);
  EXPECT_EQ(next.start_batch, reads[1].end_batch);
  EXPECT_EQ(IdsOf(next, kT1), (std::vector<int64_t>{3, 4}));
  // Committing the newest makes the older one final: it is gone.
  ASSERT_TRUE(tracker->Commit("default", next.end_batch).ok());
  absl::Status stale = tracker->Commit("default", reads[2].end_batch);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("no read is pending"), std::string::npos)
      << stale;
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 0);
  EXPECT_EQ(tracker->Status().usage.total.ids, 0);
}

TEST(TrackerTest, ContinueFromReadsWhatFollowsAPendingRead) {
  // A subscription's pushes: each from the previous push's end, while the
  // consumer's commits lag behind; a new stream starts at the cursor again.
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.consumers = {"a", "b"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  DeltaRequest push;
  push.consumer = "a";
  push.through_current_batch = false;
  std::vector<Delta> pushes;
  for (int64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({id, 10})}}).ok());
    tracker->TriggerCompaction();
    tracker->Step();
    if (!pushes.empty()) push.continue_from = pushes.back().end_batch;
    auto delta = tracker->GetDelta(push);
    ASSERT_TRUE(delta.ok()) << delta.status();
    pushes.push_back(*std::move(delta));
    Read(*tracker, "b");  // compacts and reads past a's pending ends
  }
  EXPECT_EQ(IdsOf(pushes[0], kT1), (std::vector<int64_t>{1, 10}));
  EXPECT_EQ(pushes[1].start_batch, pushes[0].end_batch);
  EXPECT_EQ(IdsOf(pushes[1], kT1), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(IdsOf(pushes[2], kT1), (std::vector<int64_t>{3, 10}));

  // A stream that broke before any commit: everything again, from the cursor.
  DeltaRequest again = push;
  again.continue_from.reset();
  auto redelivered = tracker->GetDelta(again);
  ASSERT_TRUE(redelivered.ok());
  EXPECT_EQ(IdsOf(*redelivered, kT1), (std::vector<int64_t>{1, 2, 3, 10}));

  // continue_from that is no pending end reads from the cursor.
  ASSERT_TRUE(tracker->Commit("a", pushes[0].end_batch).ok());
  again.continue_from = pushes[0].end_batch - 1;
  auto from_cursor = tracker->GetDelta(again);
  ASSERT_TRUE(from_cursor.ok());
  EXPECT_EQ(from_cursor->start_batch, pushes[0].end_batch);
  EXPECT_EQ(IdsOf(*from_cursor, kT1), (std::vector<int64_t>{2, 3, 10}));
  // The newest commit makes every earlier push final.
  ASSERT_TRUE(tracker->Commit("a", pushes[2].end_batch).ok());
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 0);
}

TEST(TrackerTest, PendingReadsAreBounded) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  std::vector<int64_t> ends;
  for (int i = 0; i < Tracker::kMaxPendingReads + 2; ++i) {
    ends.push_back(Read(*tracker).end_batch);
    tracker->Step();
  }
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads,
            Tracker::kMaxPendingReads);
  // The oldest two are forgotten: their rows come again in any later read.
  EXPECT_EQ(tracker->Commit("default", ends[1]).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(tracker->Commit("default", ends[10]).ok());
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads,
            Tracker::kMaxPendingReads - 9);
  // Reading again with nothing new replaces the newest read, not adds one.
  Read(*tracker);
  Read(*tracker);
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads,
            Tracker::kMaxPendingReads - 8);
}

TEST(TrackerTest, PendingReadsOfTableSubsetsAreCommittedPerTable) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}, {"f3", Ids({2})}}).ok());
  DeltaRequest only_t1;
  only_t1.fqns = {kT1};
  auto t1 = tracker->GetDelta(only_t1);
  ASSERT_TRUE(t1.ok());
  tracker->Step();
  ASSERT_TRUE(tracker->RecordLookup({{"f3", Ids({3})}}).ok());
  DeltaRequest only_t2;
  only_t2.fqns = {kT2};
  auto t2 = tracker->GetDelta(only_t2);
  ASSERT_TRUE(t2.ok());
  // Committing t2's later read leaves t1's pending: it covers other tables.
  ASSERT_TRUE(tracker->Commit("default", t2->end_batch).ok());
  ASSERT_TRUE(tracker->Commit("default", t1->end_batch).ok());
  Delta all = Read(*tracker);
  EXPECT_TRUE(IdsOf(all, kT1).empty());
  EXPECT_TRUE(IdsOf(all, kT2).empty());
}

TEST(TrackerTest, AcknowledgedReadSurvivesCompactionByOthers) {
  // a reads (pending), b reads and compacts; a's commit must not hide rows.
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.consumers = {"a", "b"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({1})}}).ok());
  tracker->Step();
  DeltaRequest closed_batches;
  closed_batches.consumer = "a";
  closed_batches.through_current_batch = false;
  auto a1 = tracker->GetDelta(closed_batches);  // pending end 1
  ASSERT_TRUE(a1.ok());
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({2})}}).ok());
  tracker->TriggerCompaction();
  tracker->Step();
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({3})}}).ok());
  tracker->TriggerCompaction();
  tracker->Step();
  tracker->CompactAll();
  ASSERT_TRUE(tracker->Commit("a", a1->end_batch).ok());
  EXPECT_EQ(IdsOf(Read(*tracker, "a"), kT1), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(IdsOf(Read(*tracker, "b"), kT1), (std::vector<int64_t>{1, 2, 3}));
}

TEST(TrackerTest, MisuseIsRefusedAndChangesNothing) {
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(
      tracker->RecordLookup({{"f1", Ids({1, 2})}}, at::ones({2, 4})).ok());
  const int64_t bytes = tracker->Status().usage.total.bytes;

  // IDs and states of different lengths.
  EXPECT_EQ(
      tracker->RecordLookup({{"f1", Ids({1, 2, 3})}}, at::ones({2, 4})).code(),
      absl::StatusCode::kInvalidArgument);
  // A state dim that changes.
  EXPECT_EQ(tracker->RecordLookup({{"f1", Ids({1})}}, at::ones({1, 8})).code(),
            absl::StatusCode::kInvalidArgument);
  // A feature no table owns; a good feature before it is not recorded either.
  auto status = tracker->RecordLookup({{"f3", Ids({1})}, {"nope", Ids({1})}},
                                      at::ones({2, 4}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'nope'"), std::string::npos);
  // Float IDs.
  EXPECT_EQ(
      tracker->RecordLookup({{"f1", at::ones({1})}}, at::ones({1, 4})).code(),
      absl::StatusCode::kInvalidArgument);
  // Missing embeddings.
  EXPECT_EQ(tracker->RecordLookup({{"f1", Ids({1})}}).code(),
            absl::StatusCode::kInvalidArgument);
  // A table that is not tracked, and one that is skipped (ignored).
  EXPECT_EQ(tracker->RecordTables({{"other.table", Ids({1}), at::ones({1, 4})}})
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(tracker->RecordTables({{kT3, Ids({1}), at::ones({1, 4})}}).ok());
  // Features of skipped tables are ignored, and their rows skipped over.
  ASSERT_TRUE(tracker
                  ->RecordLookup({{"f4", Ids({8})}, {"f1", Ids({9})}},
                                 at::cat({at::zeros({1, 4}), at::ones({1, 4})}))
                  .ok());
  DeltaRequest unknown;
  unknown.consumer = "nobody";
  EXPECT_EQ(tracker->GetDelta(unknown).status().code(),
            absl::StatusCode::kNotFound);

  Delta delta = Read(*tracker);
  EXPECT_EQ(IdsOf(delta, kT1), (std::vector<int64_t>{1, 2, 9}));
  EXPECT_EQ(ToFloats(delta.tables[kT1].states[2]),
            (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(delta.tables.count(kT3), 0u);
  EXPECT_GT(bytes, 0);
}

TEST(TrackerTest, MemoryCapCompactsFirst) {
  TrackerOptions options;
  options.consumers = {"a"};
  // Far below 10 raw lookups, above their compaction: compaction suffices.
  options.memory_cap_bytes = 4096;
  auto tracker = MakeTracker(options);
  for (int b = 0; b < 10; ++b) {
    ASSERT_TRUE(
        tracker->RecordLookup({{"f1", at::arange(64, at::kLong)}}).ok());
    tracker->Step();
  }
  TrackerStatus status = tracker->Status();
  EXPECT_LE(status.usage.total.bytes, 4096);
  EXPECT_GT(status.cap_compactions, 0);
  EXPECT_EQ(status.cap_drops, 0);
  Delta delta = Read(*tracker, "a");
  EXPECT_FALSE(delta.resync_required);
  EXPECT_EQ(IdsOf(delta, kT1).size(), 64u);
}

TEST(TrackerTest, MemoryCapDropsOldestAndTellsLaggingConsumers) {
  TrackerOptions options;
  options.consumers = {"fast", "slow"};
  options.memory_cap_bytes = 3 * 64 * 8 + 1;  // about three batches of IDs
  auto tracker = MakeTracker(options);
  for (int64_t b = 0; b < 10; ++b) {
    // Disjoint IDs far apart, so compaction cannot shrink them.
    ASSERT_TRUE(
        tracker
            ->RecordLookup(
                {{"f1", at::arange(b * 64, (b + 1) * 64, at::kLong) * 1000003}})
            .ok());
    Read(*tracker, "fast");
    tracker->Step();
  }
  TrackerStatus status = tracker->Status();
  EXPECT_LE(status.usage.total.bytes, options.memory_cap_bytes);
  EXPECT_GT(status.cap_drops, 0);
  EXPECT_GT(status.dropped_ids, 0);
  EXPECT_TRUE(std::find_if(status.consumers.begin(), status.consumers.end(),
                           [](const ConsumerStatus& c) {
                             return c.name == "slow" && c.resync_required;
                           }) != status.consumers.end());
  Delta slow = Read(*tracker, "slow");
  EXPECT_TRUE(slow.resync_required);
  EXPECT_GT(slow.lost_rows, 0);
  EXPECT_FALSE(IdsOf(slow, kT1).empty());  // what is left is still delivered
  EXPECT_FALSE(Read(*tracker, "slow").resync_required);  // told once
  EXPECT_FALSE(Read(*tracker, "fast").resync_required);
}

// Memory cap with acknowledged reads: a commit ends a resync only when no
// row the consumer lacks was dropped after the committed read was delivered.
struct CappedAcknowledgedTracker {
  std::unique_ptr<Tracker> tracker;
  int64_t next_batch = 0;

  CappedAcknowledgedTracker() {
    TrackerOptions options;
    options.acknowledged_reads = true;
    options.memory_cap_bytes = 3 * 64 * 8 + 1;  // about three batches of IDs
    tracker = MakeTracker(options);
  }
  // One batch of 64 IDs compaction cannot shrink.
  void RecordBatch() {
    const int64_t b = next_batch++;
    ASSERT_TRUE(
        tracker
            ->RecordLookup(
                {{"f1", at::arange(b * 64, (b + 1) * 64, at::kLong) * 1000003}})
            .ok());
    tracker->Step();
  }
  ConsumerStatus Consumer() { return tracker->Status().consumers.at(0); }
};

TEST(TrackerTest, CommitKeepsResyncForRowsDroppedAfterTheRead) {
  CappedAcknowledgedTracker t;
  t.RecordBatch();
  Delta read = Read(*t.tracker);
  EXPECT_FALSE(read.resync_required);
  // Ten more batches push the read's own range and later ones out.
  for (int i = 0; i < 10; ++i) t.RecordBatch();
  ASSERT_GT(t.tracker->Status().cap_drops, 0);
  ASSERT_TRUE(t.tracker->Commit("default", read.end_batch).ok());
  EXPECT_TRUE(t.Consumer().resync_required);  // rows after its end are gone
  Delta next = Read(*t.tracker);
  EXPECT_TRUE(next.resync_required);
  EXPECT_GT(next.lost_rows, 0);
  ASSERT_TRUE(t.tracker->Commit("default", next.end_batch).ok());
  EXPECT_FALSE(t.Consumer().resync_required);  // told, and committed
}

TEST(TrackerTest, CommitEndsResyncWhenOnlyRowsTheReadHeldWereDropped) {
  CappedAcknowledgedTracker t;
  t.RecordBatch();
  t.RecordBatch();
  Delta read = Read(*t.tracker);
  ASSERT_EQ(t.tracker->Status().cap_drops, 0);
  // Over the cap: the oldest batches go, which the read delivered.
  while (t.tracker->Status().cap_drops == 0) t.RecordBatch();
  ASSERT_LE(t.next_batch, 4);
  EXPECT_TRUE(t.Consumer().resync_required);
  ASSERT_TRUE(t.tracker->Commit("default", read.end_batch).ok());
  EXPECT_FALSE(t.Consumer().resync_required);
  EXPECT_FALSE(Read(*t.tracker).resync_required);
}

// An independent model of the semantics: every recorded (batch, id, state) in
// order; a consumer's delta is the first (or last) state of each ID recorded
// in [cursor, end). Compaction and deletion must never change an answer.
struct Event {
  int64_t batch;
  int64_t id;
  float value;
};

TEST(TrackerStateTest, RestoreRefusesAnotherModeOrUntrackedTables) {
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(
      tracker->RecordLookup({{"f1", Ids({1, 2})}}, at::ones({2, 3})).ok());
  tracker->Step();
  TrackerState state = tracker->SaveState();
  EXPECT_EQ(state.current_batch, 1);
  ASSERT_EQ(state.tables.size(), 1u);

  options.mode = TrackingMode::kIdOnly;
  auto id_only = MakeTracker(options);
  absl::Status status = id_only->RestoreState(state);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("taken in embedding mode"), std::string::npos)
      << status;

  options.mode = TrackingMode::kEmbedding;
  options.modules = {{"sparse.ec", false, {{"other", {"f9"}}}}};
  auto other_tables = MakeTracker(options);
  status = other_tables->RestoreState(state);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other_tables->current_batch(), 0);  // unchanged
}

TEST(TrackerStateTest, PendingReadsSurviveSnapshots) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  std::vector<int64_t> ends;
  for (int64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({id})}}).ok());
    ends.push_back(Read(*tracker).end_batch);
    tracker->Step();
  }
  DeltaRequest only_t1;
  only_t1.fqns = {kT1};
  ASSERT_TRUE(tracker->GetDelta(only_t1).ok());
  tracker->RequireResync();
  TrackerState saved = tracker->SaveState();
  ASSERT_EQ(saved.consumers.at(0).pending_reads.size(), 4u);

  TrackerState decoded;
  ASSERT_TRUE(
      DecodeTrackerState(EncodeTrackerState(saved, options), &decoded).ok());
  const std::vector<PendingRead>& reads = decoded.consumers.at(0).pending_reads;
  ASSERT_EQ(reads.size(), 4u);
  EXPECT_EQ(reads[3].fqns, std::vector<std::string>{kT1});
  for (const PendingRead& read : reads) {
    EXPECT_EQ(read.lost_through, INT64_MAX);
  }

  decoded.tables = std::move(saved.tables);  // stored beside the state
  auto restored = MakeTracker(options);
  ASSERT_TRUE(restored->RestoreState(std::move(decoded)).ok());
  ASSERT_TRUE(restored->Commit("default", ends[1]).ok());
  EXPECT_TRUE(restored->Status().consumers[0].resync_required);
  Delta next = Read(*restored);
  EXPECT_TRUE(next.resync_required);
  EXPECT_EQ(IdsOf(next, kT1), std::vector<int64_t>{3});
}

TEST(TrackerStateTest, OlderSnapshotsPendingReadIsRestored) {
  // Snapshots written before pending_reads held the newest read only.
  TrackerOptions options;
  options.acknowledged_reads = true;
  v1::TrackerState old;
  old.set_mode("id_only");
  old.set_current_batch(5);
  v1::ConsumerState* consumer = old.add_consumers();
  consumer->set_name("default");
  consumer->set_cursor(2);
  consumer->set_has_pending_read(true);
  consumer->set_pending_end(4);
  TrackerState decoded;
  ASSERT_TRUE(DecodeTrackerState(old.SerializeAsString(), &decoded).ok());
  auto restored = MakeTracker(options);
  ASSERT_TRUE(restored->RestoreState(std::move(decoded)).ok());
  EXPECT_EQ(restored->Status().consumers[0].pending_end, 4);
  ASSERT_TRUE(restored->Commit("default", 4).ok());
  EXPECT_EQ(restored->Status().consumers[0].cursor, 4);
}

TEST(TrackerStateTest, RestoreAddsConfiguredConsumersAtTheRestoredBatch) {
  TrackerOptions options;
  options.consumers = {"a"};
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids({4})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->AddConsumer("runtime").ok());
  TrackerState state = tracker->SaveState();

  options.consumers = {"a", "new"};
  auto restored = MakeTracker(options);
  ASSERT_TRUE(restored->RestoreState(std::move(state)).ok());
  EXPECT_EQ(restored->Consumers(),
            (std::vector<std::string>{"a", "new", "runtime"}));
  EXPECT_EQ(IdsOf(Read(*restored, "a"), kT1), std::vector<int64_t>{4});
  EXPECT_EQ(IdsOf(Read(*restored, "new"), kT1), std::vector<int64_t>{});
}

TEST(TrackerStateTest, WaitForBatchAfterWakesOnStepOrDeadline) {
  auto tracker = MakeTracker({});
  const absl::Time start = absl::Now();
  EXPECT_EQ(tracker->WaitForBatchAfter(0, start + absl::Milliseconds(50)), 0);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  std::thread stepper([&] {
    absl::SleepFor(absl::Milliseconds(20));
    tracker->Step();
  });
  EXPECT_EQ(tracker->WaitForBatchAfter(0, absl::InfiniteFuture()), 1);
  stepper.join();
}

TEST(TrackerModelTest, RandomRunsMatchTheEventModel) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 40; ++round) {
    TrackerOptions options;
    options.mode = round % 2 ? TrackingMode::kEmbedding : TrackingMode::kIdOnly;
    options.fqns_to_skip = {"ebc"};
    options.consumers = {"a", "b", "c"};
    options.delete_on_read = rng() % 2;
    options.auto_compact = rng() % 2;
    auto tracker = MakeTracker(options);
    std::vector<Event> events;
    std::map<std::string, int64_t> cursor = {{"a", -1}, {"b", -1}, {"c", -1}};
    int64_t batch = 0;
    for (int op = 0; op < 80; ++op) {
      const int kind = static_cast<int>(rng() % 11);
      if (kind == 10) {
        // A restart from a snapshot taken now changes nothing that follows.
        TrackerState state = tracker->SaveState();
        tracker = MakeTracker(options);
        ASSERT_TRUE(tracker->RestoreState(std::move(state)).ok());
        continue;
      }
      if (kind < 5) {
        const int64_t n = static_cast<int64_t>(rng() % 6);
        std::vector<int64_t> ids;
        std::vector<float> values;
        for (int64_t i = 0; i < n; ++i) {
          ids.push_back(static_cast<int64_t>(rng() % 12));
          values.push_back(static_cast<float>(events.size()));
          events.push_back({batch, ids.back(), values.back()});
        }
        at::Tensor states = at::tensor(values).reshape({n, 1});
        ASSERT_TRUE(tracker->RecordLookup({{"f1", Ids(ids)}}, states).ok());
      } else if (kind < 7) {
        tracker->TriggerCompaction();
        tracker->Step();
        ++batch;
      } else if (kind < 8) {
        tracker->CompactAll();
      } else {
        const std::string consumer(1, static_cast<char>('a' + rng() % 3));
        DeltaRequest request;
        request.consumer = consumer;
        request.through_current_batch = rng() % 2;
        auto delta = tracker->GetDelta(request);
        ASSERT_TRUE(delta.ok());
        const int64_t end = request.through_current_batch ? batch + 1 : batch;
        std::map<int64_t, float> expected;
        for (const Event& e : events) {
          if (e.batch >= cursor[consumer] && e.batch < end) {
            expected.emplace(e.id, e.value);  // first occurrence wins
          }
        }
        cursor[consumer] = std::max(cursor[consumer], end);
        std::vector<int64_t> expected_ids;
        std::vector<float> expected_values;
        for (auto& [id, value] : expected) {
          expected_ids.push_back(id);
          expected_values.push_back(value);
        }
        ASSERT_EQ(IdsOf(*delta, kT1), expected_ids)
            << "round " << round << " op " << op;
        if (options.mode == TrackingMode::kEmbedding && !expected_ids.empty()) {
          ASSERT_EQ(ToFloats(delta->tables[kT1].states), expected_values)
              << "round " << round << " op " << op;
        }
      }
    }
  }
}

// The training thread records, steps and compacts while two service threads
// read closed batches: together the reads hold every recorded ID, for each
// consumer, and no read ever holds an ID twice.
TEST(TrackerConcurrencyTest, ConcurrentReadersMissNothing) {
  TrackerOptions options;
  options.consumers = {"a", "b"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  constexpr int64_t kBatches = 300;
  std::atomic<bool> done{false};
  std::map<std::string, std::set<int64_t>> seen = {{"a", {}}, {"b", {}}};
  std::vector<std::thread> readers;
  for (const std::string consumer : {"a", "b"}) {
    readers.emplace_back([&, consumer] {
      DeltaRequest request;
      request.consumer = consumer;
      request.through_current_batch = false;
      std::set<int64_t>& mine = seen.at(consumer);
      bool last = false;
      while (!last) {
        last = done.load();
        auto delta = tracker->GetDelta(request);
        ASSERT_TRUE(delta.ok());
        for (int64_t id : IdsOf(*delta, kT1)) mine.insert(id);
      }
    });
  }
  std::thread trainer([&] {
    for (int64_t b = 0; b < kBatches; ++b) {
      ASSERT_TRUE(
          tracker
              ->RecordLookup({{"f1", Ids({2 * b})}, {"f2", Ids({2 * b + 1})}})
              .ok());
      tracker->TriggerCompaction();
      tracker->Step();
    }
    done = true;
  });
  trainer.join();
  for (std::thread& t : readers) t.join();
  for (const std::string consumer : {"a", "b"}) {
    EXPECT_EQ(seen[consumer].size(), static_cast<size_t>(2 * kBatches))
        << consumer;
  }
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
}

}  // namespace
}  // namespace deltastream
