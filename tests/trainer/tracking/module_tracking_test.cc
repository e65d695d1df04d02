// The tracker on the real embedding modules: after N training steps the IDs
// of a delta are exactly the rows the fused optimizers changed; EMBEDDING
// states are the rows' values before their first change since the last read;
// MOMENTUM_DIFF / ROWWISE_ADAGRAD states are the change of the optimizer's
// row state; values are the live rows; skipped modules record nothing.
#include "trainer/tracking/module_tracking.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "tests/testing/tensor_values.h"
#include "trainer/modules/embedding_modules.h"

namespace deltastream {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kBatch = 16;

EmbeddingModuleOptions ModuleOptions(std::string path, SparseOptimizerType type,
                                     uint64_t seed) {
  EmbeddingModuleOptions options;
  options.path = std::move(path);
  options.tables = {{"user", 200, 8, {"user_id"}},
                    {"item", 50, 4, {"item_id", "item_history"}}};
  options.optimizer.type = type;
  options.optimizer.learning_rate = 0.1;
  options.seed = seed;
  return options;
}

// A random batch: one user, one item and 0..3 history items per example.
KeyedJaggedTensor RandomInput(int64_t step) {
  at::manual_seed(1000 + step);
  at::Tensor history_lengths = at::randint(0, 4, {kBatch}, at::kLong);
  const int64_t history = history_lengths.sum().item<int64_t>();
  at::Tensor values = at::cat({at::randint(0, 200, {kBatch}, at::kLong),
                               at::randint(0, 50, {kBatch}, at::kLong),
                               at::randint(0, 50, {history}, at::kLong)});
  at::Tensor lengths =
      at::cat({at::ones({2 * kBatch}, at::kLong), history_lengths});
  return *KeyedJaggedTensor::FromLengths({"user_id", "item_id", "item_history"},
                                         values, lengths);
}

std::vector<int64_t> ChangedRows(const at::Tensor& before,
                                 const at::Tensor& after) {
  at::Tensor changed = (before != after).any(1).nonzero().reshape({-1});
  return {changed.data_ptr<int64_t>(),
          changed.data_ptr<int64_t>() + changed.numel()};
}

// A training loop over one module of either kind: loss = sum of outputs
// times a fixed random mix, backward under the reader's update guard.
class Harness {
 public:
  Harness(bool pooled, TrackingMode mode, SparseOptimizerType optimizer,
          std::vector<std::string> fqns_to_skip = {},
          const RowOffsets& row_offsets = {}) {
    if (pooled) {
      ebc_ = *EmbeddingBagCollection::Create(
          ModuleOptions("sparse.ebc", optimizer, 1));
      modules_.push_back(ebc_.get());
    } else {
      ec_ = *EmbeddingCollection::Create(
          ModuleOptions("sparse.ec", optimizer, 1));
      modules_.push_back(ec_.get());
    }
    reader_ = std::make_unique<ModuleRowsReader>(modules_, row_offsets);
    TrackerOptions options;
    options.mode = mode;
    options.consumers = {"predictor", "checkpoint"};
    options.auto_compact = true;
    options.fqns_to_skip = std::move(fqns_to_skip);
    options.modules = DescribeModules(modules_);
    tracker_ = *Tracker::Create(options, reader_.get());
    EXPECT_TRUE(AttachTracker(*tracker_, modules_, row_offsets).ok());
  }

  void Train(int64_t step) {
    const KeyedJaggedTensor input = RandomInput(step);
    at::Tensor loss;
    if (ebc_) {
      at::Tensor out = ebc_->Forward(input)->values();
      loss = (out * at::linspace(-1, 1, out.size(1))).sum();
    } else {
      FeatureDict out = *ec_->Forward(input);
      loss = at::zeros({});
      for (int64_t k = 0; k < out.size(); ++k) {
        at::Tensor v = out.At(k).values();
        loss = loss + (v * at::linspace(-1, 1, v.size(1))).sum();
      }
    }
    {
      ModuleRowsReader::UpdateGuard guard(*reader_);
      loss.backward();
    }
    tracker_->Step();
  }

  EmbeddingModule& module() { return *modules_[0]; }
  Tracker& tracker() { return *tracker_; }
  ModuleRowsReader& reader() { return *reader_; }

 private:
  std::unique_ptr<EmbeddingBagCollection> ebc_;
  std::unique_ptr<EmbeddingCollection> ec_;
  std::vector<EmbeddingModule*> modules_;
  std::unique_ptr<ModuleRowsReader> reader_;
  std::unique_ptr<Tracker> tracker_;
};

DeltaRequest Read(const std::string& consumer) {
  DeltaRequest request;
  request.consumer = consumer;
  request.through_current_batch = false;
  return request;
}

TEST(ModuleTrackingTest, DeltaIdsAreExactlyTheRowsTheOptimizerChanged) {
  for (SparseOptimizerType optimizer :
       {SparseOptimizerType::kSgd, SparseOptimizerType::kAdagrad,
        SparseOptimizerType::kRowwiseAdagrad, SparseOptimizerType::kAdam}) {
    for (bool pooled : {true, false}) {
      Harness h(pooled, TrackingMode::kIdOnly, optimizer);
      std::vector<at::Tensor> before = {h.module().weight(0).clone(),
                                        h.module().weight(1).clone()};
      for (int64_t step = 0; step < 5; ++step) h.Train(step);
      Delta delta = *h.tracker().GetDelta(Read("predictor"));
      ASSERT_EQ(delta.tables.size(), 2u);
      for (int64_t t = 0; t < 2; ++t) {
        const TableDelta& table = delta.tables.at(h.module().TableFqn(t));
        EXPECT_EQ(Longs(table.ids),
                  ChangedRows(before[t], h.module().weight(t)))
            << SparseOptimizerName(optimizer) << " pooled=" << pooled
            << " table " << t;
        // Values are the live rows.
        EXPECT_TRUE(at::equal(table.values,
                              h.module().weight(t).index_select(0, table.ids)));
      }
      // The next read after 3 more steps holds exactly those steps' changes.
      before = {h.module().weight(0).clone(), h.module().weight(1).clone()};
      for (int64_t step = 5; step < 8; ++step) h.Train(step);
      delta = *h.tracker().GetDelta(Read("predictor"));
      for (int64_t t = 0; t < 2; ++t) {
        EXPECT_EQ(Longs(delta.tables.at(h.module().TableFqn(t)).ids),
                  ChangedRows(before[t], h.module().weight(t)));
      }
    }
  }
}

TEST(ModuleTrackingTest, EmbeddingStatesAreRowsBeforeTheirFirstChange) {
  Harness h(/*pooled=*/false, TrackingMode::kEmbedding,
            SparseOptimizerType::kAdagrad);
  std::vector<at::Tensor> at_last_read = {h.module().weight(0).clone(),
                                          h.module().weight(1).clone()};
  for (int round = 0; round < 2; ++round) {
    for (int64_t step = 0; step < 4; ++step) h.Train(round * 4 + step);
    Delta delta = *h.tracker().GetDelta(Read("predictor"));
    for (int64_t t = 0; t < 2; ++t) {
      const TableDelta& table = delta.tables.at(h.module().TableFqn(t));
      ASSERT_GT(table.ids.numel(), 0);
      EXPECT_TRUE(
          at::equal(table.states, at_last_read[t].index_select(0, table.ids)))
          << "round " << round << " table " << t;
      EXPECT_TRUE(at::equal(table.values,
                            h.module().weight(t).index_select(0, table.ids)));
    }
    at_last_read = {h.module().weight(0).clone(), h.module().weight(1).clone()};
  }
}

TEST(ModuleTrackingTest, TopKKeepsTheRowsThatChangedMost) {
  Harness h(/*pooled=*/false, TrackingMode::kEmbedding,
            SparseOptimizerType::kAdagrad);
  std::vector<at::Tensor> before = {h.module().weight(0).clone(),
                                    h.module().weight(1).clone()};
  for (int64_t step = 0; step < 4; ++step) h.Train(step);
  DeltaRequest request = Read("predictor");
  request.top_k = TopK::Count(5);
  Delta delta = *h.tracker().GetDelta(request);
  for (int64_t t = 0; t < 2; ++t) {
    const TableDelta& table = delta.tables.at(h.module().TableFqn(t));
    ASSERT_EQ(table.ids.numel(), 5);
    // Scores are ||current - first||_2 of the live rows...
    at::Tensor change =
        (h.module().weight(t) - before[t]).to(at::kFloat).norm(2, {1});
    EXPECT_TRUE(at::allclose(table.scores, change.index_select(0, table.ids),
                             1e-5, 1e-6));
    // ...and no row left out changed more than the least kept.
    at::Tensor left_out = change.clone();
    left_out.index_fill_(0, table.ids, 0);
    EXPECT_LE(left_out.max().item<float>(), table.scores.min().item<float>());
  }
}

TEST(ModuleTrackingTest, EmbeddingModeOnAPooledModuleIsRefused) {
  auto ebc = *EmbeddingBagCollection::Create(
      ModuleOptions("sparse.ebc", SparseOptimizerType::kSgd, 1));
  std::vector<EmbeddingModule*> modules = {ebc.get()};
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.modules = DescribeModules(modules);
  EXPECT_EQ(Tracker::Create(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

void CheckOptimizerStateDiff(TrackingMode mode, SparseOptimizerType optimizer) {
  Harness h(/*pooled=*/true, mode, optimizer);
  const at::Tensor all = at::arange(200, at::kLong);
  at::Tensor state_before = *h.module().ReadOptimizerStates(0, all);
  for (int64_t step = 0; step < 6; ++step) h.Train(step);
  Delta delta = *h.tracker().GetDelta(Read("predictor"));
  const TableDelta& table = delta.tables.at(h.module().TableFqn(0));
  at::Tensor state_now = *h.module().ReadOptimizerStates(0, all);
  at::Tensor expected = (state_now - state_before).index_select(0, table.ids);
  EXPECT_TRUE(
      at::allclose(table.states, expected.reshape_as(table.states), 1e-6, 1e-6))
      << TrackingModeName(mode);
  // The rows whose state changed are exactly the delta's.
  EXPECT_EQ(Longs(table.ids), ChangedRows(state_before, state_now));
}

TEST(ModuleTrackingTest, MomentumDiffIsTheChangeOfTheRowState) {
  CheckOptimizerStateDiff(TrackingMode::kMomentumDiff,
                          SparseOptimizerType::kAdagrad);
  CheckOptimizerStateDiff(TrackingMode::kMomentumDiff,
                          SparseOptimizerType::kAdam);
}

TEST(ModuleTrackingTest, RowwiseAdagradIsTheChangeOfTheRowwiseSum) {
  CheckOptimizerStateDiff(TrackingMode::kRowwiseAdagrad,
                          SparseOptimizerType::kRowwiseAdagrad);
}

TEST(ModuleTrackingTest, SkippedModulesRecordNothing) {
  // Two modules; the second's path has a skipped component.
  auto tracked = *EmbeddingBagCollection::Create(
      ModuleOptions("sparse.ebc", SparseOptimizerType::kSgd, 1));
  EmbeddingModuleOptions other =
      ModuleOptions("frozen.ebc", SparseOptimizerType::kSgd, 2);
  other.tables[0].feature_names = {"user_id_2"};
  other.tables[1].feature_names = {"item_id_2"};
  auto skipped = *EmbeddingBagCollection::Create(other);
  std::vector<EmbeddingModule*> modules = {tracked.get(), skipped.get()};
  ModuleRowsReader reader(modules);
  TrackerOptions options;
  options.fqns_to_skip = {"frozen"};
  options.modules = DescribeModules(modules);
  auto tracker = *Tracker::Create(options, &reader);
  ASSERT_TRUE(AttachTracker(*tracker, modules).ok());
  EXPECT_THAT(tracker->feature_map().fqns,
              ElementsAre("sparse.ebc.embedding_bags.user",
                          "sparse.ebc.embedding_bags.item"));
  // Skipped: the module got no hook, so a lookup of features the tracker
  // does not know is not even an error.
  auto input = *KeyedJaggedTensor::FromLengths({"user_id_2", "item_id_2"},
                                               at::tensor({3, 4}, at::kLong),
                                               at::tensor({1, 1}, at::kLong));
  ASSERT_TRUE(skipped->Forward(input).ok());
  tracker->Step();
  Delta delta = *tracker->GetDelta({});
  for (const auto& [fqn, table] : delta.tables) {
    EXPECT_EQ(table.ids.numel(), 0) << fqn;
  }
}

TEST(ModuleTrackingTest, ServiceThreadsReadWhileTraining) {
  Harness h(/*pooled=*/true, TrackingMode::kRowwiseAdagrad,
            SparseOptimizerType::kRowwiseAdagrad);
  std::atomic<bool> done{false};
  std::atomic<int64_t> rows_read{0};
  std::thread reader([&] {
    while (!done.load()) {
      absl::StatusOr<Delta> delta = h.tracker().GetDelta(Read("checkpoint"));
      ASSERT_TRUE(delta.ok()) << delta.status();
      for (const auto& [fqn, table] : delta->tables) {
        rows_read += table.ids.numel();
      }
    }
  });
  for (int64_t step = 0; step < 40; ++step) h.Train(step);
  done.store(true);
  reader.join();
  Delta last = *h.tracker().GetDelta(Read("checkpoint"));
  for (const auto& [fqn, table] : last.tables) rows_read += table.ids.numel();
  EXPECT_GT(rows_read.load(), 0);
}

// DESIGN.md's feature-to-FQN mapping through the one recording path (the
// modules' hook into Tracker::RecordTables): per feature, IDs go to the FQN of
// the table that owns the feature; the features of one table in one batch
// are one lookup; wrapping prefixes are stripped; a skipped table records
// nothing.
TEST(ModuleTrackingTest, FeaturesGoToTheirTablesCleanedFqnOneLookupPerBatch) {
  for (bool skip_user : {false, true}) {
    std::unique_ptr<EmbeddingCollection> ec = *EmbeddingCollection::Create(
        ModuleOptions("_dmp_wrapped_module.module.sparse.ec",
                      SparseOptimizerType::kSgd, 1));
    std::vector<EmbeddingModule*> modules = {ec.get()};
    TrackerOptions options;
    options.modules = DescribeModules(modules);
    if (skip_user) options.fqns_to_skip = {"user"};
    std::unique_ptr<Tracker> tracker = *Tracker::Create(options);
    ASSERT_TRUE(AttachTracker(*tracker, modules).ok());
    // user_id [7], [9]; item_id [3], [1]; item_history [3, 8], [].
    const KeyedJaggedTensor input = *KeyedJaggedTensor::FromLengths(
        {"user_id", "item_id", "item_history"},
        at::tensor({7, 9, 3, 1, 3, 8}, at::kLong),
        at::tensor({1, 1, 1, 1, 2, 0}, at::kLong));
    ASSERT_TRUE(ec->Forward(input).ok());

    const TrackerStatus status = tracker->Status();
    EXPECT_EQ(status.usage.tables.at("sparse.ec.embeddings.item").lookups, 1);
    EXPECT_EQ(status.usage.tables.count("sparse.ec.embeddings.user"),
              skip_user ? 0u : 1u);
    Delta delta = *tracker->GetDelta({});
    EXPECT_THAT(Longs(delta.tables.at("sparse.ec.embeddings.item").ids),
                ElementsAre(1, 3, 8));
    if (skip_user) {
      EXPECT_EQ(delta.tables.count("sparse.ec.embeddings.user"), 0u);
    } else {
      EXPECT_THAT(Longs(delta.tables.at("sparse.ec.embeddings.user").ids),
                  ElementsAre(7, 9));
    }
  }
}

// A row-wise shard of a sharded trainer: the module holds global rows
// 1000..1199 of "user" as local rows 0..199. The tracker records and serves
// global IDs; reads of rows and optimizer states map them back; a read of
// all rows streams the shard's global range; an ID outside it is refused.
TEST(ModuleTrackingTest, RowOffsetsMakeIdsGlobal) {
  constexpr int64_t kOffset = 1000;
  for (bool pooled : {true, false}) {
    const std::string user =
        pooled ? "sparse.ebc.embedding_bags.user" : "sparse.ec.embeddings.user";
    const std::string item =
        pooled ? "sparse.ebc.embedding_bags.item" : "sparse.ec.embeddings.item";
    Harness h(pooled, TrackingMode::kRowwiseAdagrad,
              SparseOptimizerType::kRowwiseAdagrad, {}, {{user, kOffset}});
    const at::Tensor before = h.module().weight(0).clone();
    const at::Tensor states_before =
        *h.module().ReadOptimizerStates(0, at::arange(200, at::kLong));
    for (int64_t step = 0; step < 3; ++step) h.Train(step);
    Delta delta = *h.tracker().GetDelta(Read("predictor"));
    const TableDelta& table = delta.tables.at(user);
    std::vector<int64_t> changed = ChangedRows(before, h.module().weight(0));
    for (int64_t& id : changed) id += kOffset;
    EXPECT_EQ(Longs(table.ids), changed);
    const at::Tensor local = table.ids - kOffset;
    EXPECT_TRUE(
        table.values.equal(h.module().weight(0).index_select(0, local)));
    // ROWWISE_ADAGRAD states: the change of the optimizer's row state, read
    // through the offset at recording and at the read.
    const at::Tensor after = *h.module().ReadOptimizerStates(0, local);
    EXPECT_TRUE(
        table.states.allclose((after - states_before.index_select(0, local))
                                  .reshape_as(table.states)));
    // The other table starts at 0.
    for (int64_t id : Longs(delta.tables.at(item).ids)) EXPECT_LT(id, 50);

    EXPECT_EQ(h.reader().FirstRow(user), kOffset);
    EXPECT_EQ(h.reader().FirstRow(item), 0);
    EXPECT_EQ(*h.reader().NumRows(user), 200);
    DeltaRequest all = Read("checkpoint");
    all.all_rows = true;
    Delta whole = *h.tracker().GetDelta(all);
    EXPECT_TRUE(whole.tables.at(user).ids.equal(
        at::arange(kOffset, kOffset + 200, at::kLong)));
    EXPECT_TRUE(whole.tables.at(user).values.equal(h.module().weight(0)));
    EXPECT_TRUE(whole.tables.at(item).ids.equal(at::arange(50, at::kLong)));

    for (int64_t outside : {kOffset - 1, kOffset + 200}) {
      absl::StatusOr<at::Tensor> refused = h.reader().ReadEmbeddings(
          user, at::tensor({kOffset, outside}, at::kLong));
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
          << outside;
      EXPECT_EQ(h.reader()
                    .ReadOptimizerStates(user, at::tensor({outside}, at::kLong))
                    .status()
                    .code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace deltastream
