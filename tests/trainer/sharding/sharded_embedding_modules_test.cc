// Sharded collections on real processes (Gloo on loopback, 2 and 4 ranks)
// against the unsharded modules: every rank also trains the unsharded module
// on the global batch (N ranks x B examples) with the same seed, and after
// every step compares its output slice and, at the end, its shards' weights
// and optimizer states with the same slices of the unsharded tables.
//
// Tolerance: table-wise and data-parallel tables must match bit for bit (the
// owning rank sums the same values in the same order; the gradient division
// by N is exact for a power of two). Row-, column- and table-row-wise shards
// sum partial pools and per-row gradients in another order: 1e-5 absolute
// (float32 values of order 1, a few additions).
#include "trainer/sharding/sharded_embedding_modules.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "tests/trainer/sharding/shard_states.h"
#include "tests/trainer/sharding/table_configs.h"
#include "trainer/sharding/sharding_plan.h"

namespace deltastream {
namespace {

using ::deltastream::testing::ExpectRanksPassed;
using ::deltastream::testing::MaxDiff;
using ::deltastream::testing::PlanOfKind;
using ::deltastream::testing::RankResult;
using ::deltastream::testing::RunRanks;
using ::deltastream::testing::ShardStateDiff;
using ::deltastream::testing::ShardStateDiffs;
using ::deltastream::testing::Table;

constexpr int64_t kBatch = 4;  // per rank
constexpr int kSteps = 6;
constexpr double kTolerance = 1e-5;

std::vector<EmbeddingTableConfig> Tables(bool pooled, bool weighted) {
  const Pooling mean = weighted ? Pooling::kSum : Pooling::kMean;
  std::vector<EmbeddingTableConfig> tables = {
      Table("t0", 40, 8, {"f0", "f1"}),
      Table("t1", 33, 6, {"f2"}, pooled ? mean : Pooling::kSum),
      Table("t2", 17, 4, {"f3"}),
      Table("t3", 21, 5, {"f4"}, pooled ? mean : Pooling::kSum)};
  return tables;
}

struct Case {
  std::string name;
  SparseOptimizerType optimizer;
  bool exact;  // bit for bit
  bool weighted = false;
};

// The global batch of a step: per feature and example, 0-3 IDs.
struct GlobalBatch {
  std::vector<std::string> keys;
  std::vector<std::vector<std::vector<int64_t>>> ids;  // [feature][example]
  std::vector<std::vector<std::vector<float>>> weights;
};

GlobalBatch MakeBatch(const std::vector<EmbeddingTableConfig>& tables,
                      int64_t examples, int step) {
  std::mt19937 rng(1234 + step);
  GlobalBatch batch;
  for (const EmbeddingTableConfig& table : tables) {
    for (const std::string& f : table.feature_names) {
      batch.keys.push_back(f);
      batch.ids.emplace_back(examples);
      batch.weights.emplace_back(examples);
      for (int64_t e = 0; e < examples; ++e) {
        const int n = static_cast<int>(rng() % 4);
        for (int i = 0; i < n; ++i) {
          batch.ids.back()[e].push_back(
              static_cast<int64_t>(rng() % table.num_embeddings));
          batch.weights.back()[e].push_back(0.5f + (rng() % 100) / 100.0f);
        }
      }
    }
  }
  return batch;
}

// Examples [begin, end) of every feature.
KeyedJaggedTensor Slice(const GlobalBatch& batch, int64_t begin, int64_t end,
                        bool weighted) {
  std::vector<int64_t> values, lengths;
  std::vector<float> weights;
  for (size_t f = 0; f < batch.keys.size(); ++f) {
    for (int64_t e = begin; e < end; ++e) {
      lengths.push_back(static_cast<int64_t>(batch.ids[f][e].size()));
      values.insert(values.end(), batch.ids[f][e].begin(),
                    batch.ids[f][e].end());
      weights.insert(weights.end(), batch.weights[f][e].begin(),
                     batch.weights[f][e].end());
    }
  }
  std::optional<at::Tensor> w;
  if (weighted) w = at::tensor(weights, at::kFloat);
  return *KeyedJaggedTensor::FromLengths(batch.keys,
                                         at::tensor(values, at::kLong),
                                         at::tensor(lengths, at::kLong), w);
}

// The features of `kjt` as a dict in reverse key order, with a feature the
// module does not use: the input distribution picks and orders them.
FeatureDict ReversedDict(const KeyedJaggedTensor& kjt) {
  FeatureDict dict;
  for (int64_t k = kjt.num_keys() - 1; k >= 0; --k) {
    EXPECT_TRUE(dict.Add(kjt.keys()[k], kjt.At(k)).ok());
  }
  EXPECT_TRUE(dict.Add("unused", kjt.At(0)).ok());
  return dict;
}

// A non-linear loss, a mean over the batch's examples.
at::Tensor Loss(const std::vector<at::Tensor>& outputs, int64_t examples) {
  at::Tensor loss = at::zeros({}, at::kFloat);
  for (const at::Tensor& out : outputs) {
    at::Tensor w = at::linspace(-1.0, 1.0, out.size(1), at::kFloat);
    loss = loss + (out * w + 0.5 * out * out).sum();
  }
  return loss / static_cast<double>(examples);
}

int RunCase(ProcessGroup& group, bool pooled, const Case& c) {
  const int world = group.world_size();
  const int me = group.rank();
  EmbeddingModuleOptions options;
  options.path = "sparse.ebc";
  options.tables = Tables(pooled, c.weighted);
  options.optimizer.type = c.optimizer;
  options.optimizer.learning_rate = 0.05;
  options.seed = 7;
  options.is_weighted = c.weighted;
  ShardedModuleOptions sharded_options;
  sharded_options.module = options;
  sharded_options.plan = PlanOfKind(c.name, options.tables, world);

  std::unique_ptr<EmbeddingModule> reference;
  std::unique_ptr<ShardedEmbeddingModule> sharded;
  if (pooled) {
    auto r = EmbeddingBagCollection::Create(options);
    auto s = ShardedEmbeddingBagCollection::Create(sharded_options, &group);
    RANK_OK(r.status());
    RANK_OK(s.status());
    reference = *std::move(r);
    sharded = *std::move(s);
  } else {
    auto r = EmbeddingCollection::Create(options);
    auto s = ShardedEmbeddingCollection::Create(sharded_options, &group);
    RANK_OK(r.status());
    RANK_OK(s.status());
    reference = *std::move(r);
    sharded = *std::move(s);
  }
  int lookups = 0;  // the local module's post-lookup hook fires
  sharded->AddPostLookupHook([&](const EmbeddingModule&, const ModuleLookup&) {
    ++lookups;
    return absl::OkStatus();
  });
  // One rank holds every table whole: bit for bit whatever the type.
  const double tolerance = c.exact || world == 1 ? 0.0 : kTolerance;
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    GlobalBatch global = MakeBatch(options.tables, world * kBatch, step);
    KeyedJaggedTensor all = Slice(global, 0, world * kBatch, c.weighted);
    KeyedJaggedTensor mine =
        Slice(global, me * kBatch, (me + 1) * kBatch, c.weighted);
    // Feature-dict input (in another order) on odd steps.
    const bool as_dict = step % 2 == 1;
    std::vector<at::Tensor> ref_out, out;
    if (pooled) {
      auto* ref = static_cast<EmbeddingBagCollection*>(reference.get());
      auto* shd = static_cast<ShardedEmbeddingBagCollection*>(sharded.get());
      absl::StatusOr<KeyedTensor> r = ref->Forward(all);
      absl::StatusOr<KeyedTensor> s =
          as_dict ? shd->Forward(ReversedDict(mine)) : shd->Forward(mine);
      RANK_OK(r.status());
      RANK_OK(s.status());
      ref_out.push_back(r->values());
      out.push_back(s->values());
      const double diff =
          MaxDiff(s->values(), r->values().narrow(0, me * kBatch, kBatch));
      worst = std::max(worst, diff);
      RANK_EXPECT(diff <= tolerance, c.name, " step ", step,
                  " pooled output differs by ", diff);
    } else {
      auto* ref = static_cast<EmbeddingCollection*>(reference.get());
      auto* shd = static_cast<ShardedEmbeddingCollection*>(sharded.get());
      absl::StatusOr<FeatureDict> r = ref->Forward(all);
      absl::StatusOr<FeatureDict> s =
          as_dict ? shd->Forward(ReversedDict(mine)) : shd->Forward(mine);
      RANK_OK(r.status());
      RANK_OK(s.status());
      for (int64_t f = 0; f < r->size(); ++f) {
        ref_out.push_back(r->At(f).values());
        out.push_back(s->At(f).values());
        // This rank's IDs start after those of lower ranks' examples.
        int64_t before = 0;
        for (int64_t e = 0; e < me * kBatch; ++e) {
          before += static_cast<int64_t>(global.ids[f][e].size());
        }
        const double diff = MaxDiff(
            s->At(f).values(),
            r->At(f).values().narrow(0, before, s->At(f).values().size(0)));
        worst = std::max(worst, diff);
        RANK_EXPECT(diff <= tolerance, c.name, " step ", step, " feature ", f,
                    " rows differ by ", diff);
      }
    }
    Loss(ref_out, world * kBatch).backward();
    Loss(out, kBatch).backward();
  }
  // Every shard's weights and optimizer states against the same slice of
  // the unsharded module's.
  absl::StatusOr<std::vector<ShardStateDiff>> states =
      ShardStateDiffs(*reference, *sharded, /*with_step=*/true);
  RANK_OK(states);
  for (const ShardStateDiff& state : *states) {
    worst = std::max(worst, state.diff);
    RANK_EXPECT(state.diff <= tolerance, c.name, " ", state.state,
                " differs by ", state.diff, " after ", kSteps, " steps");
  }
  RANK_EXPECT(sharded->local_shards().empty() || !states->empty(), c.name,
              " compared no state");
  RANK_EXPECT(sharded->local_shards().empty() || lookups == kSteps, c.name,
              " post-lookup hook fired ", lookups, " times");
  std::printf("rank %d %s %s: max difference %g over %d steps\n", me,
              pooled ? "pooled" : "sequence", c.name.c_str(), worst, kSteps);
  return 0;
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {"table_wise", SparseOptimizerType::kAdam, true},
      {"data_parallel", SparseOptimizerType::kAdagrad, true},
      {"all_on_last_rank", SparseOptimizerType::kRowwiseAdagrad, true},
      {"row_wise", SparseOptimizerType::kRowwiseAdagrad, false},
      {"column_wise", SparseOptimizerType::kAdagrad, false},
      {"table_row_wise", SparseOptimizerType::kSgd, false},
      {"mixed", SparseOptimizerType::kAdagrad, false},
      {"mixed", SparseOptimizerType::kSgd, false, /*weighted=*/true},
  };
  return cases;
}

// Refusals that every rank agrees on must come at once, not after the
// collective timeout (kRefusalTimeoutS, TEST_COLLECTIVE_TIMEOUT_S) that a rank
// waiting for another would wait out.
constexpr absl::Duration kPrompt = absl::Seconds(10);
constexpr int kRefusalTimeoutS = 30;

// A forward's status and how long it took.
template <typename F>
std::pair<absl::Status, absl::Duration> Timed(F&& forward) {
  const absl::Time start = absl::Now();
  absl::Status status = forward().status();
  return {status, absl::Now() - start};
}

// Returns non-zero (as RANK_EXPECT) unless `status` is `code`, came within
// kPrompt and says every one of `words`.
int ExpectRefused(const std::pair<absl::Status, absl::Duration>& result,
                  absl::StatusCode code, const std::vector<std::string>& words,
                  const std::string& what) {
  const auto& [status, took] = result;
  std::printf("%s: %s after %s\n", what.c_str(), status.ToString().c_str(),
              absl::FormatDuration(took).c_str());
  RANK_EXPECT(status.code() == code, what, ": ", status.ToString());
  RANK_EXPECT(took < kPrompt, what, " took ", absl::FormatDuration(took), ": ",
              status.ToString());
  for (const std::string& word : words) {
    RANK_EXPECT(absl::StrContains(status.message(), word), what, ": '", word,
                "' missing from ", status.ToString());
  }
  return 0;
}

// Rank-local faults of the input (an ID outside its table, a negative ID, a
// missing feature from a dict or a KJT) on one rank: every rank refuses the
// batch at once, naming that rank and the feature, and the next batch trains.
int RunBadInput(ProcessGroup& group) {
  const int me = group.rank();
  ShardedModuleOptions options;
  options.module.path = "sparse.ebc";
  options.module.tables = Tables(true, false);
  options.module.seed = 7;
  auto module = ShardedEmbeddingBagCollection::Create(options, &group);
  RANK_OK(module.status());
  ShardedEmbeddingBagCollection& ebc = **module;
  const GlobalBatch global =
      MakeBatch(options.module.tables, group.world_size() * kBatch, 0);
  const KeyedJaggedTensor good =
      Slice(global, me * kBatch, (me + 1) * kBatch, false);
  // The batch with one more ID in feature `f` of this rank's first example.
  auto with_id = [&](int64_t f, int64_t id) {
    GlobalBatch bad = global;
    bad.ids[f][me * kBatch].push_back(id);
    return Slice(bad, me * kBatch, (me + 1) * kBatch, false);
  };
  // Rank 1: ID 33 in f2, whose table t1 has 33 rows.
  const KeyedJaggedTensor rows_id = me == 1 ? with_id(2, 33) : good;
  if (int rc = ExpectRefused(Timed([&] { return ebc.Forward(rows_id); }),
                             absl::StatusCode::kInvalidArgument,
                             {"rank 1's input", "'f2'", "outside [0, 33)"},
                             "ID == rows on rank 1");
      rc != 0) {
    return rc;
  }
  // Rank 0: ID -1 in f4.
  const KeyedJaggedTensor negative = me == 0 ? with_id(4, -1) : good;
  if (int rc = ExpectRefused(Timed([&] { return ebc.Forward(negative); }),
                             absl::StatusCode::kInvalidArgument,
                             {"rank 0's input", "'f4'"}, "ID -1 on rank 0");
      rc != 0) {
    return rc;
  }
  // Rank 1: a dict without f3.
  FeatureDict dict = ReversedDict(good);
  if (me == 1) {
    FeatureDict partial;
    for (const std::string& key : good.keys()) {
      if (key != "f3") RANK_OK(partial.Add(key, *dict.Get(key)));
    }
    dict = partial;
  }
  if (int rc = ExpectRefused(
          Timed([&] { return ebc.Forward(dict); }), absl::StatusCode::kNotFound,
          {"rank 1's input", "'f3'"}, "dict without f3 on rank 1");
      rc != 0) {
    return rc;
  }
  // Rank 0: a KJT without f0.
  KeyedJaggedTensor no_f0 = good;
  if (me == 0) {
    const std::vector<std::vector<std::string>> keys = {
        {"f1", "f2", "f3", "f4"}};
    absl::StatusOr<std::vector<KeyedJaggedTensor>> parts =
        good.SplitByKeys(keys);
    RANK_OK(parts.status());
    no_f0 = (*parts)[0];
  }
  if (int rc =
          ExpectRefused(Timed([&] { return ebc.Forward(no_f0); }),
                        absl::StatusCode::kNotFound, {"rank 0's input", "'f0'"},
                        "KJT without f0 on rank 0");
      rc != 0) {
    return rc;
  }
  // The group is still in step: a good batch trains.
  absl::StatusOr<KeyedTensor> out = ebc.Forward(good);
  RANK_OK(out.status());
  Loss({out->values()}, kBatch).backward();
  return 0;
}

// A weighted module fed inputs without weights, 3 tables on 4 ranks (rank 3
// holds none, so no local module would refuse its input): every rank refuses
// at once, whether every rank's input or rank 3's alone lacks them.
int RunMissingWeights(ProcessGroup& group) {
  const int me = group.rank();
  ShardedModuleOptions options;
  options.module.path = "sparse.ebc";
  options.module.tables = Tables(true, /*weighted=*/true);
  options.module.tables.resize(3);
  options.module.seed = 7;
  options.module.is_weighted = true;
  auto module = ShardedEmbeddingBagCollection::Create(options, &group);
  RANK_OK(module.status());
  ShardedEmbeddingBagCollection& ebc = **module;
  RANK_EXPECT(me != 3 || ebc.local_module() == nullptr,
              "rank 3 holds shards: the case needs a rank without");
  const GlobalBatch global =
      MakeBatch(options.module.tables, group.world_size() * kBatch, 0);
  const KeyedJaggedTensor weighted =
      Slice(global, me * kBatch, (me + 1) * kBatch, true);
  const KeyedJaggedTensor unweighted =
      Slice(global, me * kBatch, (me + 1) * kBatch, false);
  if (int rc = ExpectRefused(
          Timed([&] { return ebc.Forward(unweighted); }),
          absl::StatusCode::kInvalidArgument,
          {absl::StrCat("rank ", me, "'s input"), "no per-ID weights"},
          "no rank's input weighted");
      rc != 0) {
    return rc;
  }
  if (int rc = ExpectRefused(
          Timed([&] { return ebc.Forward(me == 3 ? unweighted : weighted); }),
          absl::StatusCode::kInvalidArgument,
          {"rank 3's input", "no per-ID weights"},
          "rank 3's input not weighted");
      rc != 0) {
    return rc;
  }
  absl::StatusOr<KeyedTensor> out = ebc.Forward(weighted);
  RANK_OK(out.status());
  Loss({out->values()}, kBatch).backward();
  return 0;
}

// Options the unsharded module refuses are refused by every rank's Create,
// also where the local module would accept them (row blocks pool sums) ...
int RunWeightedMeanPooling(ProcessGroup& group) {
  const int world = group.world_size();
  // Per-ID weights with mean pooling (t1, t3), every table row-wise.
  ShardedModuleOptions weighted_mean;
  weighted_mean.module.path = "sparse.ebc";
  weighted_mean.module.tables = Tables(true, /*weighted=*/false);
  weighted_mean.module.seed = 7;
  weighted_mean.module.is_weighted = true;
  weighted_mean.plan =
      PlanOfKind("row_wise", weighted_mean.module.tables, world);
  absl::Status status =
      ShardedEmbeddingBagCollection::Create(weighted_mean, &group).status();
  std::printf("weighted mean pooling: %s\n", status.ToString().c_str());
  RANK_EXPECT(status.code() == absl::StatusCode::kInvalidArgument,
              "weighted mean pooling row-wise: ", status.ToString());
  RANK_EXPECT(absl::StrContains(status.message(), "sum pooling"),
              status.ToString());
  return 0;
}

// ... or a rank builds none: a negative learning rate, one table on two
// ranks (rank 1 holds nothing).
int RunNegativeLearningRate(ProcessGroup& group) {
  absl::Status status;
  ShardedModuleOptions negative_rate;
  negative_rate.module.path = "sparse.ebc";
  negative_rate.module.tables = {Table("t0", 40, 8, {"f0"})};
  negative_rate.module.optimizer.learning_rate = -1;
  for (bool pooled : {true, false}) {
    status = pooled
                 ? ShardedEmbeddingBagCollection::Create(negative_rate, &group)
                       .status()
                 : ShardedEmbeddingCollection::Create(negative_rate, &group)
                       .status();
    std::printf("learning_rate -1: %s\n", status.ToString().c_str());
    RANK_EXPECT(status.code() == absl::StatusCode::kInvalidArgument,
                "learning_rate -1: ", status.ToString());
    RANK_EXPECT(absl::StrContains(status.message(), "learning_rate"),
                status.ToString());
  }
  return 0;
}

// Rank 1's post-lookup hook fails (as the tracker's RecordTables may); rank
// 1 returns the hook's error and exits, rank 0, bound for the output
// distribution, fails at once naming rank 1 and its reason.
int RunHookError(ProcessGroup& group) {
  const int me = group.rank();
  ShardedModuleOptions options;
  options.module.path = "sparse.ebc";
  options.module.tables = Tables(true, false);
  options.module.seed = 7;
  auto module = ShardedEmbeddingBagCollection::Create(options, &group);
  RANK_OK(module.status());
  RANK_EXPECT((*module)->local_module() != nullptr, "rank ", me,
              " holds no shard");
  if (me == 1) {
    (*module)->AddPostLookupHook(
        [](const EmbeddingModule&, const ModuleLookup&) {
          return absl::InternalError("tracker refused the records");
        });
  }
  const GlobalBatch global =
      MakeBatch(options.module.tables, group.world_size() * kBatch, 0);
  const KeyedJaggedTensor mine =
      Slice(global, me * kBatch, (me + 1) * kBatch, false);
  auto result = Timed([&] { return (*module)->Forward(mine); });
  if (me == 1) {
    return ExpectRefused(result, absl::StatusCode::kInternal,
                         {"tracker refused the records"}, "rank 1's hook");
  }
  return ExpectRefused(result, result.first.code(),
                       {"rank 1 left the group", "tracker refused the records"},
                       "rank 0");
}

int RunScenario(const std::string& scenario) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      testing::RankGroupFromEnv();
  RANK_OK(group.status());
  if (scenario == "bad_input") return RunBadInput(**group);
  if (scenario == "missing_weights") return RunMissingWeights(**group);
  if (scenario == "weighted_mean") return RunWeightedMeanPooling(**group);
  if (scenario == "negative_rate") return RunNegativeLearningRate(**group);
  if (scenario == "hook_error") return RunHookError(**group);
  if (scenario == "dead") {
    // Rank 1 dies after one step; the others' next forward must fail.
    ShardedModuleOptions options;
    options.module.path = "sparse.ebc";
    options.module.tables = Tables(true, false);
    options.module.seed = 7;
    auto module = ShardedEmbeddingBagCollection::Create(options, group->get());
    RANK_OK(module.status());
    for (int step = 0; step < 100; ++step) {
      GlobalBatch global = MakeBatch(options.module.tables, kBatch, step);
      if (step == 1 && (*group)->rank() == 1) kill(getpid(), SIGKILL);
      RANK_OK((*module)->Forward(Slice(global, 0, kBatch, false)).status());
    }
    return 0;
  }
  const bool pooled = scenario == "pooled";
  for (const Case& c : Cases()) {
    if (!pooled && (c.name == "table_row_wise" || c.weighted)) continue;
    if (int rc = RunCase(**group, pooled, c); rc != 0) return rc;
  }
  return 0;
}

// World size 1 takes the path without collectives: equal bit for bit.
TEST(ShardedEmbeddingBagCollectionTest, EqualsUnshardedOnOneRank) {
  ExpectRanksPassed(RunRanks("pooled", 1, absl::Seconds(60)));
}

TEST(ShardedEmbeddingCollectionTest, EqualsUnshardedOnOneRank) {
  ExpectRanksPassed(RunRanks("sequence", 1, absl::Seconds(60)));
}

TEST(ShardedEmbeddingBagCollectionTest, EqualsUnshardedOnTwoRanks) {
  ExpectRanksPassed(RunRanks("pooled", 2, absl::Seconds(120)));
}

TEST(ShardedEmbeddingBagCollectionTest, EqualsUnshardedOnFourRanks) {
  ExpectRanksPassed(RunRanks("pooled", 4, absl::Seconds(120)));
}

TEST(ShardedEmbeddingCollectionTest, EqualsUnshardedOnTwoRanks) {
  ExpectRanksPassed(RunRanks("sequence", 2, absl::Seconds(120)));
}

TEST(ShardedEmbeddingCollectionTest, EqualsUnshardedOnFourRanks) {
  ExpectRanksPassed(RunRanks("sequence", 4, absl::Seconds(120)));
}

TEST(ShardedEmbeddingBagCollectionTest, DeadRankFailsTheForwardNamingIt) {
  std::vector<RankResult> results = RunRanks(
      "dead", 2, absl::Seconds(30), {{"TEST_COLLECTIVE_TIMEOUT_S", "2"}});
  EXPECT_FALSE(results[0].timed_out);
  EXPECT_EQ(results[0].exit_code, 3) << results[0].output;
  EXPECT_TRUE(absl::StrContains(results[0].output, "input_dist"))
      << results[0].output;
  EXPECT_TRUE(absl::StrContains(results[0].output, "rank 1 did not report"))
      << results[0].output;
}

TEST(ShardedEmbeddingBagCollectionTest, BadInputOnOneRankFailsEveryRankAtOnce) {
  ExpectRanksPassed(RunRanks(
      "bad_input", 2, absl::Seconds(90),
      {{"TEST_COLLECTIVE_TIMEOUT_S", std::to_string(kRefusalTimeoutS)}}));
}

TEST(ShardedEmbeddingBagCollectionTest,
     MissingWeightsFailEveryRankAlsoOneWithoutShards) {
  ExpectRanksPassed(RunRanks(
      "missing_weights", 4, absl::Seconds(90),
      {{"TEST_COLLECTIVE_TIMEOUT_S", std::to_string(kRefusalTimeoutS)}}));
}

TEST(ShardedEmbeddingModuleTest, EveryRankRefusesWeightedMeanPoolingRowWise) {
  ExpectRanksPassed(RunRanks("weighted_mean", 2, absl::Seconds(60)));
}

TEST(ShardedEmbeddingModuleTest,
     EveryRankRefusesABadOptimizerAlsoOneWithoutShards) {
  ExpectRanksPassed(RunRanks("negative_rate", 2, absl::Seconds(60)));
}

TEST(ShardedEmbeddingBagCollectionTest, HookErrorOnOneRankNamesItAtOnce) {
  ExpectRanksPassed(RunRanks(
      "hook_error", 2, absl::Seconds(90),
      {{"TEST_COLLECTIVE_TIMEOUT_S", std::to_string(kRefusalTimeoutS)}}));
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv,
                                            deltastream::RunScenario);
}
