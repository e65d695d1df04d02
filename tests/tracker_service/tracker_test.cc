// The tracker: feature map, options, modes, scores and top-k, reads.
#include <ATen/TensorIndexing.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "absl/time/clock.h"
#include "tests/tracker_service/tracker_fixture.h"

namespace deltastream {
namespace {

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
  // "e" is not a component of "sparse.ec": an entry that skips nothing is
  // refused (a misspelling, or a whole FQN where a component is meant).
  for (const std::string entry : {"e", "sparse.ebc"}) {
    map = BuildFeatureMap(Model(), {"t2", entry});
    EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(map.status().message().find("'" + entry + "' skips nothing"),
              std::string::npos)
        << map.status();
  }
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
  // One batch: t1's features f1 [5, 1] and f2 [1, 3] as the module's hook
  // records them (one lookup of t1), and t2's f3 [9].
  ASSERT_TRUE(
      tracker->RecordTables({{kT1, Ids({5, 1, 1, 3})}, {kT2, Ids({9})}}).ok());
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
  auto tracker = MakeTracker(EmbeddingOptions());
  // Batch 0: row 1 = 10. Batch 1: row 1 = 11, row 2 = 20.
  ASSERT_TRUE(
      tracker->RecordTables({{kT1, Ids({1}), at::full({1, 2}, 10.0)}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker
                  ->RecordTables(
                      {{kT1, at::cat({Ids({1}), Ids({2})}),
                        at::tensor({11.f, 11.f, 20.f, 20.f}).reshape({2, 2})}})
                  .ok());
  Delta delta = Read(*tracker);
  EXPECT_EQ(IdsOf(delta, kT1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ToFloats(delta.tables[kT1].states),
            (std::vector<float>{10, 10, 20, 20}));
  tracker->Step();
  ASSERT_TRUE(
      tracker->RecordTables({{kT1, Ids({1}), at::full({1, 2}, 12.0)}}).ok());
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
      tracker->RecordTables({{kT1, Ids({1, 2, 3, 4}), at::zeros({4, 2})}})
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
  TrackerOptions options = EmbeddingOptions();
  auto tracker = MakeTracker(options, &reader);
  ASSERT_TRUE(tracker
                  ->RecordTables({{kT1, Ids({1, 5, 7}), at::zeros({3, 2})},
                                  {kT2, Ids({2, 3}), at::zeros({2, 2})}})
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
  bad.top_k = TopK::Count(-1);
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

  // Any count the wire holds is taken, exactly: the largest keeps every row
  // (a count held as a double lost whole numbers past 2^53).
  EXPECT_TRUE(TopK::Count(std::numeric_limits<int64_t>::max()).Validate().ok());
  EXPECT_EQ(TopK::Count(std::numeric_limits<int64_t>::max()).RowsKept(10), 10);
  EXPECT_EQ(TopK::Count((int64_t{1} << 53) + 1).RowsKept(int64_t{1} << 60),
            (int64_t{1} << 53) + 1);
}

TEST(TrackerTest, ScoresNeedWhatTheModeNeeds) {
  auto id_only = MakeTracker({});
  DeltaRequest request;
  request.include_scores = true;
  EXPECT_EQ(id_only->GetDelta(request).status().code(),
            absl::StatusCode::kFailedPrecondition);
  TrackerOptions options = EmbeddingOptions();
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
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  reader.optimizer_states(kT1).index_put_({1}, at::tensor({6.f, 8.f}));
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
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
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
    tracker->Step();
    reader.optimizer_states(kT1).index_put_(
        {2}, rowwise ? at::tensor(5.f) : at::tensor({4.f, 5.f}));
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());  // not first
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
  EXPECT_EQ(tracker->RecordTables({{kT1, Ids({2})}}).code(),
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
      ASSERT_TRUE(
          tracker->RecordTables({{kT2, Ids({7}), states[0].unsqueeze(0)}})
              .ok());
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
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker, "a"), kT1), std::vector<int64_t>{1});
  // b has not read batch 0: it is kept.
  EXPECT_EQ(tracker->Status().usage.total.lookups, 1);
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker, "b"), kT1), (std::vector<int64_t>{1, 2}));
  // a still needs batch 1.
  EXPECT_EQ(tracker->Status().usage.total.ids, 1);
  EXPECT_EQ(IdsOf(Read(*tracker, "a"), kT1), std::vector<int64_t>{2});
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
}

// Reads the closed batches only, as a subscription on the service does.
absl::Status ReadClosed(Tracker& tracker, const std::string& consumer) {
  DeltaRequest request;
  request.consumer = consumer;
  request.through_current_batch = false;
  return tracker.GetDelta(request).status();
}

TEST(TrackerTest, ConsumersAddedAtRunTimeExpireWhenGone) {
  TrackerOptions options;
  options.consumers = {"fixed", "reader"};
  options.expire_consumers_after = absl::Milliseconds(200);
  std::vector<std::string> logged;
  options.log = [&](const std::string& line) { logged.push_back(line); };
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->AddConsumer("gone").ok());
  ASSERT_TRUE(tracker->AddConsumer("alive").ok());
  ASSERT_TRUE(tracker->AddConsumer("touched").ok());
  // "fixed" (declared) and "gone" never read; "reader" and "alive" read
  // every closed batch; "touched" never reads either, but is in contact (a
  // subscription waiting for a push due later, a long transfer: the
  // service's Touch).
  for (int64_t b = 0; b < 10; ++b) {
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({b})}}).ok());
    tracker->Step();
    ASSERT_TRUE(ReadClosed(*tracker, "reader").ok());
    ASSERT_TRUE(ReadClosed(*tracker, "alive").ok());
    EXPECT_TRUE(tracker->Touch("touched").ok());
    EXPECT_EQ(tracker->Touch("nobody").code(), absl::StatusCode::kNotFound);
    absl::SleepFor(absl::Milliseconds(50));
  }
  // A pause in training: "alive" and "reader", waiting for the next batch,
  // are silent meanwhile, but the batch they have not read was closed just
  // now.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(tracker->Touch("touched").ok());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({10})}}).ok());
  tracker->Step();

  TrackerStatus status = tracker->Status();
  std::vector<std::string> names;
  for (const ConsumerStatus& c : status.consumers) names.push_back(c.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"alive", "fixed", "reader", "touched"}));
  EXPECT_EQ(status.consumers_expired, 1);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("consumer 'gone' removed"), std::string::npos)
      << logged[0];
  EXPECT_EQ(ReadClosed(*tracker, "gone").code(), absl::StatusCode::kNotFound);
  // It may come back: added again, from the current batch.
  EXPECT_TRUE(tracker->AddConsumer("gone").ok());
}

// A consumer that never reads keeps the open time of every batch after its
// cursor wanted: at most about 2^16 are kept, the oldest exactly (its lag is
// still measured from the batch it has not read).
TEST(TrackerTest, BatchOpenTimesStayBoundedBehindAStuckConsumer) {
  TrackerOptions options;
  options.consumers = {"stuck"};
  const absl::Time start = absl::Now();
  auto tracker = MakeTracker(options);
  absl::SleepFor(absl::Milliseconds(20));
  constexpr int64_t kSteps = (int64_t{1} << 16) + 5000;
  for (int64_t b = 0; b < kSteps; ++b) tracker->Step();
  const TrackerStatus status = tracker->Status();
  EXPECT_EQ(status.current_batch, kSteps);
  EXPECT_LE(status.opened_batches, int64_t{1} << 16);
  EXPECT_GT(status.opened_batches, int64_t{1} << 14);
  ASSERT_EQ(status.consumers.size(), 1u);
  EXPECT_GE(status.consumers[0].lag_steps, kSteps);
  EXPECT_GE(status.consumers[0].lag, absl::Milliseconds(20));
  EXPECT_LE(status.consumers[0].lag, absl::Now() - start);
}

TEST(TrackerTest, AnExpiredConsumersRowsAreDeletedOnRead) {
  TrackerOptions options;
  options.consumers = {"fixed"};
  options.expire_consumers_after = absl::Milliseconds(100);
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->AddConsumer("gone").ok());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1, 2})}}).ok());
  tracker->Step();
  ASSERT_TRUE(ReadClosed(*tracker, "fixed").ok());
  // Batch 0 is held for "gone" alone.
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);
  absl::SleepFor(absl::Milliseconds(150));
  tracker->Step();
  EXPECT_EQ(tracker->Status().usage.total.ids, 0);
  // Without expiry (the default) it would be held for good.
  options.expire_consumers_after = absl::ZeroDuration();
  tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->AddConsumer("gone").ok());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1, 2})}}).ok());
  tracker->Step();
  ASSERT_TRUE(ReadClosed(*tracker, "fixed").ok());
  absl::SleepFor(absl::Milliseconds(150));
  tracker->Step();
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);
  options.expire_consumers_after = -absl::Seconds(1);
  EXPECT_EQ(Tracker::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TrackerTest, WithoutDeleteOnReadRowsStayButCursorsMove) {
  TrackerOptions options;
  options.delete_on_read = false;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1, 2})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker), kT1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({3})}}).ok());
  EXPECT_EQ(IdsOf(Read(*tracker), kT1), std::vector<int64_t>{3});
}

TEST(TrackerTest, AutoCompactionOncePerStepKeepsOneLookupPerTable) {
  TrackerOptions options;
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  for (int64_t b = 0; b < 5; ++b) {
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({b, b + 1})}}).ok());
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
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}, {kT2, Ids({7})}}).ok());
  DeltaRequest only_t1;
  only_t1.fqns = {kT1};
  auto delta = tracker->GetDelta(only_t1);
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(delta->tables.size(), 1u);
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  Delta rest = Read(*tracker);
  EXPECT_EQ(IdsOf(rest, kT1), std::vector<int64_t>{2});
  EXPECT_EQ(IdsOf(rest, kT2), std::vector<int64_t>{7});
  DeltaRequest unknown;
  unknown.fqns = {"no.such.table"};
  EXPECT_EQ(tracker->GetDelta(unknown).status().code(),
            absl::StatusCode::kNotFound);
}

// A sharded trainer's rank: model_fqns lists a table only other ranks hold.
TEST(TrackerTest, ATableOnlyOtherRanksHoldIsReadWithNoRows) {
  constexpr char kElsewhere[] = "sparse.ec.embeddings.t9";
  TrackerOptions options = EmbeddingOptions();
  options.model_fqns = {kT1, kT2, kElsewhere};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker
                  ->RecordTables({{kT1, Ids({1}), at::ones({1, 2})},
                                  {kT2, Ids({7}), at::ones({1, 2})}})
                  .ok());
  tracker->Step();
  DeltaRequest chosen;
  chosen.fqns = {kT1, kElsewhere};
  absl::StatusOr<Delta> delta = tracker->GetDelta(chosen);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_EQ(delta->tables.size(), 2u);
  EXPECT_EQ(IdsOf(*delta, kT1), std::vector<int64_t>{1});
  const TableDelta& none = delta->tables.at(kElsewhere);
  EXPECT_EQ(none.ids.numel(), 0);
  EXPECT_EQ(none.states.size(0), 0);
  const int64_t first_end = delta->end_batch;

  // Its cursor moved as t1's did; reads of every table leave it out, and t2
  // (not read) still has its row.
  delta = tracker->GetDelta(chosen);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(delta->start_batch, first_end);
  Delta every = Read(*tracker);
  EXPECT_EQ(every.tables.count(kElsewhere), 0u);
  EXPECT_EQ(IdsOf(every, kT2), std::vector<int64_t>{7});
  // A table of no one's model is still unknown; so is recording into one
  // held elsewhere.
  DeltaRequest unknown;
  unknown.fqns = {"sparse.ec.embeddings.t8"};
  const absl::Status refused = tracker->GetDelta(unknown).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  // It lists every table of the model, whichever rank answers.
  EXPECT_NE(refused.message().find(kElsewhere), absl::string_view::npos)
      << refused;
  EXPECT_EQ(
      tracker->RecordTables({{kElsewhere, Ids({3}), at::ones({1, 2})}}).code(),
      absl::StatusCode::kNotFound);
}

TEST(TrackerTest, ConcurrentStyleReadSeesOnlyClosedBatches) {
  auto tracker = MakeTracker({});
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  DeltaRequest request;
  request.through_current_batch = false;
  auto delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok());
  EXPECT_EQ(IdsOf(*delta, kT1), std::vector<int64_t>{1});
  EXPECT_EQ(delta->end_batch, 1);
  // More of batch 1 arrives after the read: the next read has all of it.
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({3})}}).ok());
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
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({7})}}).ok());
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
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
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
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
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

// A NaN score (a row whose value is not finite) never wins top-k; infinity
// is the largest score (issue 21, defect 9).
TEST(TopKTest, NanScoresRankBelowEveryNumber) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor scores = at::tensor({1.f, nan, 3.f, -inf, nan, inf});
  EXPECT_EQ(ToIds(TopKPositions(scores, TopK::Count(2))),
            (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(ToIds(TopKPositions(scores, TopK::Count(4))),
            (std::vector<int64_t>{0, 2, 3, 5}));
}

}  // namespace
}  // namespace deltastream
