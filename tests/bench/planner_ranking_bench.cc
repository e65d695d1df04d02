// Does the planner's cost model rank plans as the sharded trainer's step
// times do? For one small model (tables of different sizes and pooling
// factors) and a set of plans (hand-made: table-wise round robin,
// everything on rank 0, row-wise, column-wise, table-row-wise,
// data-parallel; the planner's: dp, greedy, uniform), it prints the
// planner's estimate of each plan's step (the largest rank cost,
// EstimateRankCosts) next to the measured step of the real sharded module
// (ShardedEmbeddingBagCollection over Gloo on loopback, one process per
// rank; forward, backward and the fused row-wise Adagrad update, which runs
// in backward), both ranks and Spearman's rank correlation.
//
//   bazel run -c opt //tests/bench:planner_ranking_bench -- [--ranks=2]
//       [--steps=30] [--tables=name:rows:dim:pooling,...] [--batch=512]
//   bazel run -c opt //tests/bench:planner_ranking_bench -- --calibrate
//
// All plans live in the same rank processes and take turns step by step
// (the order rotating), so that the machine's noise falls on all of them
// alike. Every measured step starts at a barrier; a plan's step time is the
// slowest rank's, its figure the median over the steps. The CPU time of the
// busiest rank is reported too: where the ranks share too few cores to run
// in parallel (the 2-core development machines), it, not the wall time, is
// what the slowest-rank estimate predicts. The estimate with TorchRec's
// constants is printed alongside.
//
// --calibrate measures what the cost model's constants stand for on this
// machine: the all-to-all bandwidth of Gloo on loopback between the ranks
// (a least-squares line through several sizes: time = latency + bytes /
// bandwidth) and the lookup throughput of the embedding kernels (forward and
// backward with the fused optimizer, in the bytes the cost model counts),
// and prints them as the planner's environment variables
// (ApplyTopologyEnvironment). docs/planner.md has the figures.
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/tensor.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/bench/timing.h"
#include "tests/testing/test_dirs.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "trainer/planner/planner.h"
#include "trainer/planner/sharding_option.h"
#include "trainer/planner/storage_estimator.h"
#include "trainer/planner/topology.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/sharding/sharding_plan.h"

ABSL_FLAG(int, ranks, 2, "world size");
ABSL_FLAG(std::string, tables,
          "big:200000:64:2,mid:50000:64:8,wide:20000:128:4,hot:5000:32:24,"
          "tiny:1000:16:1",
          "the model: name:rows:dim:pooling (IDs per example), comma "
          "separated");
ABSL_FLAG(int64_t, batch, 512, "examples per rank per step");
ABSL_FLAG(int64_t, steps, 30, "measured steps per plan");
ABSL_FLAG(int, threads, 1, "intra-op threads per rank");
ABSL_FLAG(bool, calibrate, false,
          "measure Gloo bandwidth and lookup throughput and print the "
          "planner's environment variables instead");

namespace deltastream {
namespace {

using planner::Cost;
using planner::TableSpec;
using planner::Topology;

constexpr int kWarmup = 3;
constexpr int kPhases = 3;  // input dist, lookup + output dist, backward

struct Model {
  std::vector<TableSpec> specs;              // the planner's view
  std::vector<EmbeddingTableConfig> tables;  // the modules'
  std::vector<int64_t> pooling;              // IDs per example
};

absl::StatusOr<Model> ParseModel(absl::string_view text) {
  Model model;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    int64_t rows = 0, dim = 0, pooling = 0;
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[1], &rows) ||
        !absl::SimpleAtoi(parts[2], &dim) ||
        !absl::SimpleAtoi(parts[3], &pooling) || rows < 1 || dim < 1 ||
        pooling < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tables: '", item, "' is not name:rows:dim:pooling"));
    }
    TableSpec spec;
    spec.name = parts[0];
    spec.rows = rows;
    spec.dim = dim;
    spec.pooling_factor = static_cast<double>(pooling);
    model.specs.push_back(spec);
    model.tables.push_back({parts[0], rows, dim, {parts[0]}});
    model.pooling.push_back(pooling);
  }
  if (model.specs.empty()) return absl::InvalidArgumentError("--tables: none");
  return model;
}

int64_t EnvInt(const char* name) {
  int64_t v = 0;
  const char* s = std::getenv(name);
  if (s == nullptr || !absl::SimpleAtoi(s, &v)) return 0;
  return v;
}

// This rank's batch at `step`: uniform IDs, a fixed number per example and
// table.
KeyedJaggedTensor Batch(const Model& model, int64_t batch, int rank, int step) {
  std::mt19937_64 rng(step * 1000 + rank);
  std::vector<std::string> keys;
  std::vector<int64_t> ids, lengths;
  for (size_t t = 0; t < model.tables.size(); ++t) {
    keys.push_back(model.tables[t].name);
    for (int64_t i = 0; i < batch * model.pooling[t]; ++i) {
      ids.push_back(
          static_cast<int64_t>(rng() % model.tables[t].num_embeddings));
    }
    lengths.insert(lengths.end(), batch, model.pooling[t]);
  }
  return *KeyedJaggedTensor::FromLengths(keys, at::tensor(ids, at::kLong),
                                         at::tensor(lengths, at::kLong));
}

// CPU time of this process (all its threads: Gloo's too), ms.
double CpuMs() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 +
         static_cast<double>(t.tv_nsec) / 1e6;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  return 1;
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> Group() {
  at::set_num_threads(static_cast<int>(EnvInt("BENCH_THREADS")));
  return testing::RankGroupFromEnv(absl::Seconds(120));
}

// ---------------------------------------------------------------------------
// Ranks.

// Every plan as a module; step by step each takes its turn. Prints, per
// plan, "TIMES <plan> <phase> <ms>,<ms>,..." for the phases input
// distribution, lookup + output distribution, backward (wall time), and
// as phase 3 the CPU time of the whole step.
int RunPlansRank() {
  absl::StatusOr<Model> model = ParseModel(std::getenv("BENCH_TABLES"));
  if (!model.ok()) return Fail(model.status());
  const int64_t batch = EnvInt("BENCH_BATCH");
  const int64_t steps = EnvInt("BENCH_STEPS");
  const int64_t plans = EnvInt("BENCH_PLANS");
  const std::string dir = std::getenv("BENCH_DIR");
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group = Group();
  if (!group.ok()) return Fail(group.status());
  const int me = (*group)->rank();
  std::vector<std::unique_ptr<ShardedEmbeddingBagCollection>> modules;
  for (int64_t p = 0; p < plans; ++p) {
    absl::StatusOr<v1::ShardingPlan> plan =
        ReadShardingPlan(absl::StrCat(dir, "/plan_", p, ".textproto"));
    if (!plan.ok()) return Fail(plan.status());
    ShardedModuleOptions options;
    options.module.path = "sparse.ebc";
    options.module.tables = model->tables;
    options.module.optimizer.type = SparseOptimizerType::kRowwiseAdagrad;
    options.plan = *std::move(plan);
    auto module = ShardedEmbeddingBagCollection::Create(options, group->get());
    if (!module.ok()) return Fail(module.status());
    modules.push_back(*std::move(module));
  }
  // times[p][phase][step]
  std::vector<std::vector<std::vector<double>>> times(
      plans, std::vector<std::vector<double>>(kPhases + 1));
  for (int step = 0; step < kWarmup + steps; ++step) {
    const KeyedJaggedTensor input = Batch(*model, batch, me, step);
    for (int64_t i = 0; i < plans; ++i) {
      const int64_t p = (i + step) % plans;
      if (absl::Status s = (*group)->Barrier("bench"); !s.ok()) return Fail(s);
      const double cpu = CpuMs();
      auto start = bench::Clock::now();
      absl::StatusOr<DistributedBatch> distributed =
          modules[p]->DistributeInput(input);
      if (!distributed.ok()) return Fail(distributed.status());
      const double dist = bench::Seconds(start);
      absl::StatusOr<KeyedTensor> out =
          modules[p]->ComputeAndDistribute(*distributed);
      if (!out.ok()) return Fail(out.status());
      const double forward = bench::Seconds(start);
      (out->values().pow(2).sum() / static_cast<double>(batch)).backward();
      const double total = bench::Seconds(start);
      if (step < kWarmup) continue;
      times[p][0].push_back(dist * 1e3);
      times[p][1].push_back((forward - dist) * 1e3);
      times[p][2].push_back((total - forward) * 1e3);
      times[p][3].push_back(CpuMs() - cpu);
    }
  }
  for (int64_t p = 0; p < plans; ++p) {
    for (int phase = 0; phase <= kPhases; ++phase) {
      std::printf("TIMES %lld %d %s\n", static_cast<long long>(p), phase,
                  absl::StrJoin(times[p][phase], ",").c_str());
    }
  }
  return 0;
}

// Medians of an all-to-all of each size (floats per rank pair), and of the
// embedding lookups: "A2A <bytes leaving the rank> <ms>" and
// "LOOKUP <model bytes> <ms>".
int RunCalibrateRank() {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group = Group();
  if (!group.ok()) return Fail(group.status());
  const int world = (*group)->world_size();
  const int reps = 15;
  for (int64_t floats : {1 << 8, 1 << 12, 1 << 15, 1 << 17, 1 << 19, 1 << 21}) {
    at::Tensor in = at::rand({world * floats});
    at::Tensor out = at::empty_like(in);
    std::vector<int64_t> splits(world, floats);
    std::vector<double> ms;
    for (int r = 0; r < kWarmup + reps; ++r) {
      if (absl::Status s = (*group)->Barrier("calibrate"); !s.ok()) {
        return Fail(s);
      }
      auto start = bench::Clock::now();
      if (absl::Status s =
              (*group)->AllToAll(in, splits, out, splits, "calibrate");
          !s.ok()) {
        return Fail(s);
      }
      if (r >= kWarmup) ms.push_back(bench::Seconds(start) * 1e3);
    }
    std::printf("A2A %lld %f\n",
                static_cast<long long>(4 * floats * (world - 1)),
                bench::Median(ms));
  }
  // Lookups: each rank alone (the others at the same time, as in training),
  // a table's forward, then backward with the fused row-wise Adagrad update.
  for (int64_t dim : {16, 64, 128}) {
    const int64_t rows = 100000, batch = 2048, pooling = 8;
    EmbeddingModuleOptions options;
    options.path = "calibrate";
    options.tables = {{"t", rows, dim, {"f"}}};
    options.optimizer.type = SparseOptimizerType::kRowwiseAdagrad;
    auto module = EmbeddingBagCollection::Create(options);
    if (!module.ok()) return Fail(module.status());
    std::vector<double> forward_ms, backward_ms;
    for (int r = 0; r < kWarmup + reps; ++r) {
      KeyedJaggedTensor input = *KeyedJaggedTensor::FromLengths(
          {"f"}, at::randint(rows, {batch * pooling}, at::kLong),
          at::full({batch}, pooling, at::kLong));
      auto start = bench::Clock::now();
      absl::StatusOr<KeyedTensor> out = (*module)->Forward(input);
      if (!out.ok()) return Fail(out.status());
      const double forward = bench::Seconds(start);
      out->values().sum().backward();
      if (r < kWarmup) continue;
      forward_ms.push_back(forward * 1e3);
      backward_ms.push_back((bench::Seconds(start) - forward) * 1e3);
    }
    // The bytes the cost model counts for a forward: IDs, the rows read and
    // the pooled rows written.
    const double ids = static_cast<double>(batch * pooling);
    const double bytes =
        ids * 8 + ids * dim * 4 + static_cast<double>(batch) * dim * 4;
    std::printf("LOOKUP %lld %f %f %f %f\n", static_cast<long long>(dim), ids,
                bytes, bench::Median(forward_ms), bench::Median(backward_ms));
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The parent.

struct Candidate {
  std::string name;
  v1::ShardingPlan plan;
  Cost cost;                     // the most expensive rank's
  double estimate = 0;           // its total: the planner's figure of merit
  double estimate_sum = 0;       // over all ranks
  double estimate_torchrec = 0;  // the slowest rank's, TorchRec's constants
  double measured = 0;
  double phases[kPhases] = {0, 0, 0};
  // CPU ms of a step: the busiest rank's, and all ranks' together.
  double cpu_max = 0;
  double cpu_sum = 0;
};

// A plan placing every table by `place`.
v1::ShardingPlan EveryTable(
    const Model& model, int world,
    const std::function<v1::TablePlan(const EmbeddingTableConfig&)>& place) {
  v1::ShardingPlan plan;
  plan.set_world_size(world);
  for (const EmbeddingTableConfig& table : model.tables) {
    *plan.add_tables() = place(table);
  }
  return plan;
}

std::vector<Candidate> Candidates(const Model& model, const Topology& topology,
                                  std::string* notes) {
  const int world = topology.world_size;
  std::vector<Candidate> out;
  std::vector<int> all(world);
  std::iota(all.begin(), all.end(), 0);
  using Table = const EmbeddingTableConfig&;
  out.push_back({"table_wise_rr", DefaultShardingPlan(model.tables, world)});
  out.push_back({"all_on_rank_0", EveryTable(model, world, [](Table t) {
                   return TableWisePlan(t, 0);
                 })});
  out.push_back({"row_wise", EveryTable(model, world, [&](Table t) {
                   return RowWisePlan(t, world);
                 })});
  out.push_back({"column_wise", EveryTable(model, world, [&](Table t) {
                   return ColumnWisePlan(t, all);
                 })});
  out.push_back({"table_row_wise", EveryTable(model, world, [&](Table t) {
                   return TableRowWisePlan(t, all);
                 })});
  out.push_back({"data_parallel", EveryTable(model, world, [&](Table t) {
                   return DataParallelPlan(t, world);
                 })});
  const planner::StorageReservation reservation =
      planner::ReserveStorage(topology, model.specs, 0, 3);
  for (const char* proposer : {"dp", "greedy", "uniform"}) {
    planner::PlannerOptions options;
    options.proposers = {proposer};
    absl::StatusOr<planner::Plan> plan =
        planner::MakePlan(model.specs, planner::OptimizerKind::kRowwiseAdagrad,
                          topology, reservation, options);
    if (!plan.ok()) {
      absl::StrAppend(notes, "planner ", proposer, ": ",
                      plan.status().message(), "\n");
      continue;
    }
    v1::ShardingPlan proto = planner::ToProto(*plan, model.specs, topology);
    // A plan already in the list is named, not measured twice.
    bool seen = false;
    for (Candidate& c : out) {
      v1::ShardingPlan a = c.plan, b = proto;
      a.clear_proposer();
      a.clear_local_world_size();
      b.clear_proposer();
      b.clear_local_world_size();
      for (auto* p : {&a, &b}) {
        for (v1::TablePlan& t : *p->mutable_tables()) {
          for (v1::Shard& s : *t.mutable_shards()) {
            s.clear_storage_bytes();
            s.clear_hbm_bytes();
            s.clear_ddr_bytes();
            s.clear_cost();
          }
        }
      }
      if (a.SerializeAsString() == b.SerializeAsString()) {
        absl::StrAppend(&c.name, "=planner_", proposer);
        seen = true;
        break;
      }
    }
    // What the planner chose, table by table.
    absl::StrAppend(notes, "planner ", proposer, ":");
    for (const v1::TablePlan& t : proto.tables()) {
      std::vector<int> ranks;
      for (const v1::Shard& shard : t.shards()) ranks.push_back(shard.rank());
      absl::StrAppend(notes, " ", t.table(), " ",
                      planner::ShardingTypeShortName(t.sharding_type()), "@",
                      absl::StrJoin(ranks, "+"));
    }
    absl::StrAppend(notes, "\n");
    if (!seen) out.push_back({absl::StrCat("planner_", proposer), proto});
  }
  return out;
}

// Ranks 1..n of `values` (ties share their mean rank).
std::vector<double> Ranks(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> ranks(values.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && values[order[j + 1]] == values[order[i]]) {
      ++j;
    }
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = (i + j) / 2.0 + 1;
    i = j + 1;
  }
  return ranks;
}

// Spearman's rank correlation: Pearson's over the ranks.
double Spearman(const std::vector<double>& x, const std::vector<double>& y) {
  const std::vector<double> rx = Ranks(x), ry = Ranks(y);
  const double n = static_cast<double>(x.size());
  const double mean = (n + 1) / 2;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (rx[i] - mean) * (ry[i] - mean);
    sxx += (rx[i] - mean) * (rx[i] - mean);
    syy += (ry[i] - mean) * (ry[i] - mean);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0;
}

std::map<std::string, std::string> BaseEnv() {
  return {{"BENCH_TABLES", absl::GetFlag(FLAGS_tables)},
          {"BENCH_BATCH", absl::StrCat(absl::GetFlag(FLAGS_batch))},
          {"BENCH_STEPS", absl::StrCat(absl::GetFlag(FLAGS_steps))},
          {"BENCH_THREADS", absl::StrCat(absl::GetFlag(FLAGS_threads))}};
}

// The output of every rank, or a failure printed.
bool RunAll(const std::string& scenario, int world,
            const std::map<std::string, std::string>& env,
            std::vector<std::string>* outputs) {
  std::vector<testing::RankResult> results =
      testing::RunRanks(scenario, world, absl::Minutes(10), env);
  bool ok = true;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].exit_code != 0) {
      std::printf("rank %zu failed (exit %d%s): %s\n", r, results[r].exit_code,
                  results[r].timed_out ? ", timed out" : "",
                  results[r].output.c_str());
      ok = false;
    }
    outputs->push_back(results[r].output);
  }
  return ok;
}

// Least squares y = a + b x: {a, b}.
std::pair<double, double> Line(const std::vector<double>& x,
                               const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  const double b = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  return {(sy - b * sx) / n, b};
}

int Calibrate(int world) {
  std::vector<std::string> outputs;
  if (!RunAll("calibrate", world, BaseEnv(), &outputs)) return 1;
  // Rank 0's figures (the ranks ran the same work at the same time).
  std::vector<double> bytes, ms;
  std::vector<std::vector<double>> lookups;  // dim, ids, bytes, fwd, bwd
  std::istringstream lines(outputs[0]);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "A2A") {
      double b = 0, t = 0;
      in >> b >> t;
      bytes.push_back(b);
      ms.push_back(t);
    } else if (tag == "LOOKUP") {
      std::vector<double> l(5);
      for (double& v : l) in >> v;
      lookups.push_back(l);
    }
  }
  if (bytes.size() < 2 || lookups.size() < 2) {
    std::printf("no figures: %s\n", outputs[0].c_str());
    return 1;
  }
  const auto [latency, ms_per_byte] = Line(bytes, ms);
  std::printf("Gloo all-to-all on loopback, %d ranks (median of 15):\n", world);
  std::printf("  %14s %10s %12s\n", "bytes out", "ms", "GB/s");
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::printf("  %14.0f %10.3f %12.3f\n", bytes[i], ms[i],
                bytes[i] / ms[i] / 1e6);
  }
  std::printf("  fit: %.3f ms + bytes / %.3f GB/s\n", latency,
              1 / ms_per_byte / 1e6);
  std::printf(
      "Lookups, every rank at once (100000 rows, batch 2048 x 8 IDs; "
      "backward with the fused row-wise Adagrad update; medians of 15):\n");
  std::printf("  %6s %10s %10s %10s %10s\n", "dim", "model MB", "fwd ms",
              "bwd ms", "bwd/fwd");
  std::vector<double> model_bytes, ratios;
  for (const std::vector<double>& l : lookups) {
    std::printf("  %6.0f %10.3f %10.3f %10.3f %10.2f\n", l[0], l[2] / 1e6, l[3],
                l[4], l[4] / l[3]);
    model_bytes.push_back(l[2]);
    ratios.push_back(l[4] / l[3]);
  }
  // The cost model: forward = IDs x per-ID time + model bytes / bandwidth,
  // backward = multiplier x forward. The multiplier is the median ratio; the
  // other two come from the totals (forward + backward), so that the
  // model's total is right whatever the split: total = (1 + m) x forward,
  // and every run looks up the same IDs, so the intercept of the line
  // through (bytes, total) is the per-ID part.
  std::vector<double> total_ms;
  for (const std::vector<double>& l : lookups) total_ms.push_back(l[3] + l[4]);
  const double multiplier = bench::Median(ratios);
  const auto [intercept, ms_per_model_byte] = Line(model_bytes, total_ms);
  const double ids = lookups[0][1];
  const double ns_per_id =
      std::max(0.0, intercept) / (1 + multiplier) * 1e6 / ids;
  const double ddr_bytes_per_ms =
      ms_per_model_byte > 0 ? (1 + multiplier) / ms_per_model_byte : 0;
  std::printf(
      "  fit: forward = IDs x %.1f ns + bytes / %.3f GB/s; backward = %.2f x "
      "forward\n",
      ns_per_id, ddr_bytes_per_ms / 1e6, multiplier);
  std::printf(
      "\nThe planner's constants for this machine (ApplyTopologyEnvironment; "
      "bandwidths in bytes per ms):\n  export INTRA_NODE_BANDWIDTH=%.0f "
      "DDR_MEM_BW=%.0f LOOKUP_NS_PER_ID=%.1f BWD_COMPUTE_MULTIPLIER=%.2f\n",
      1 / ms_per_byte, ddr_bytes_per_ms, ns_per_id, multiplier);
  return 0;
}

int Main() {
  const int world = absl::GetFlag(FLAGS_ranks);
  if (world < 1) return Fail(absl::InvalidArgumentError("--ranks < 1"));
  if (absl::GetFlag(FLAGS_calibrate)) return Calibrate(world);
  absl::StatusOr<Model> model = ParseModel(absl::GetFlag(FLAGS_tables));
  if (!model.ok()) return Fail(model.status());

  Topology topology = planner::DefaultTopology(world, /*gpu=*/false);
  topology.batch_size = absl::GetFlag(FLAGS_batch);
  topology.ddr_bytes = planner::HostMemoryBytes() / world;
  if (absl::Status s = planner::ApplyTopologyEnvironment(&topology); !s.ok()) {
    return Fail(s);
  }
  if (absl::Status s = planner::ValidateTopology(topology); !s.ok()) {
    return Fail(s);
  }
  // The same model with TorchRec's constants (DDR_MEM_BW 51 GB/s, no
  // per-ID time, backward twice the forward), side by side.
  Topology torchrec = topology;
  torchrec.ddr_bw = 51e9;
  torchrec.lookup_seconds_per_id = 0;
  torchrec.bwd_compute_multiplier = 2;
  std::string notes;
  std::vector<Candidate> candidates = Candidates(*model, topology, &notes);
  const std::string dir = FreshDir("planner_ranking_bench");
  std::filesystem::create_directories(dir);
  for (size_t p = 0; p < candidates.size(); ++p) {
    Candidate& c = candidates[p];
    absl::StatusOr<std::vector<Cost>> costs =
        planner::EstimateRankCosts(c.plan, model->specs, topology);
    if (!costs.ok()) return Fail(costs.status());
    for (const Cost& cost : *costs) {
      c.estimate_sum += cost.total();
      if (cost.total() >= c.estimate) {
        c.estimate = cost.total();
        c.cost = cost;
      }
    }
    absl::StatusOr<std::vector<Cost>> torchrec_costs =
        planner::EstimateRankCosts(c.plan, model->specs, torchrec);
    if (!torchrec_costs.ok()) return Fail(torchrec_costs.status());
    for (const Cost& cost : *torchrec_costs) {
      c.estimate_torchrec = std::max(c.estimate_torchrec, cost.total());
    }
    if (absl::Status s = WriteShardingPlan(
            c.plan, absl::StrCat(dir, "/plan_", p, ".textproto"));
        !s.ok()) {
      return Fail(s);
    }
  }
  std::map<std::string, std::string> env = BaseEnv();
  env["BENCH_PLANS"] = absl::StrCat(candidates.size());
  env["BENCH_DIR"] = dir;
  std::vector<std::string> outputs;
  const bool ran = RunAll("plans", world, env, &outputs);
  std::filesystem::remove_all(dir);
  if (!ran) return 1;
  // times[p][phase][rank][step]; a step's time is the slowest rank's.
  std::vector<std::vector<std::vector<std::vector<double>>>> times(
      candidates.size(),
      std::vector<std::vector<std::vector<double>>>(kPhases + 1));
  for (const std::string& output : outputs) {
    std::istringstream lines(output);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream in(line);
      std::string tag, list;
      size_t p = 0;
      int phase = 0;
      if (!(in >> tag >> p >> phase >> list) || tag != "TIMES" ||
          p >= candidates.size() || phase < 0 || phase > kPhases) {
        continue;
      }
      std::vector<double> values;
      for (absl::string_view v : absl::StrSplit(list, ',')) {
        double d = 0;
        if (absl::SimpleAtod(v, &d)) values.push_back(d);
      }
      times[p][phase].push_back(values);
    }
  }
  std::vector<double> estimates, sums, torchrecs, measured, busiest;
  for (size_t p = 0; p < candidates.size(); ++p) {
    Candidate& c = candidates[p];
    if (times[p][0].size() != static_cast<size_t>(world)) {
      std::printf("plan %s: no times from every rank\n", c.name.c_str());
      return 1;
    }
    const size_t steps = times[p][0][0].size();
    std::vector<double> step_ms, cpu_max, cpu_sum;
    for (int phase = 0; phase < kPhases; ++phase) {
      std::vector<double> phase_ms;
      for (size_t s = 0; s < steps; ++s) {
        double slowest = 0;
        for (int r = 0; r < world; ++r) {
          slowest = std::max(slowest, times[p][phase][r][s]);
        }
        phase_ms.push_back(slowest);
      }
      c.phases[phase] = bench::Median(phase_ms);
    }
    for (size_t s = 0; s < steps; ++s) {
      double slowest = 0, busiest = 0, all = 0;
      for (int r = 0; r < world; ++r) {
        double total = 0;
        for (int phase = 0; phase < kPhases; ++phase) {
          total += times[p][phase][r][s];
        }
        slowest = std::max(slowest, total);
        busiest = std::max(busiest, times[p][kPhases][r][s]);
        all += times[p][kPhases][r][s];
      }
      step_ms.push_back(slowest);
      cpu_max.push_back(busiest);
      cpu_sum.push_back(all);
    }
    c.measured = bench::Median(step_ms);
    c.cpu_max = bench::Median(cpu_max);
    c.cpu_sum = bench::Median(cpu_sum);
    estimates.push_back(c.estimate);
    sums.push_back(c.estimate_sum);
    torchrecs.push_back(c.estimate_torchrec);
    measured.push_back(c.measured);
    busiest.push_back(c.cpu_max);
  }
  const std::vector<double> by_estimate = Ranks(estimates);
  const std::vector<double> by_cpu = Ranks(busiest);

  std::printf(
      "%d ranks (Gloo on loopback, %d intra-op thread(s) each), batch %lld "
      "per rank, row-wise Adagrad; tables (name:rows:dim:pooling) %s\n",
      world, absl::GetFlag(FLAGS_threads),
      static_cast<long long>(absl::GetFlag(FLAGS_batch)),
      absl::GetFlag(FLAGS_tables).c_str());
  std::printf(
      "cost model: DDR %.2f GB/s, %.1f ns per ID, backward x%.2f, "
      "intra-host %.3f GB/s; measured: median over %lld steps of the "
      "slowest rank\n",
      topology.ddr_bw / 1e9, topology.lookup_seconds_per_id * 1e9,
      topology.bwd_compute_multiplier, topology.intra_host_bw / 1e9,
      static_cast<long long>(absl::GetFlag(FLAGS_steps)));
  std::printf("%s", notes.c_str());
  std::printf("%-34s %8s %7s %7s %8s %8s | %8s %7s %7s %7s %7s %7s | %5s %5s\n",
              "plan", "est ms", "comp", "comms", "est sum", "torchrec",
              "meas ms", "in_dist", "fwd", "bwd", "cpu max", "cpu sum", "r_est",
              "r_cpu");
  for (size_t p = 0; p < candidates.size(); ++p) {
    const Candidate& c = candidates[p];
    std::printf(
        "%-34s %8.3f %7.3f %7.3f %8.3f %8.3f | %8.3f %7.3f %7.3f %7.3f %7.3f "
        "%7.3f | %5.1f %5.1f\n",
        c.name.c_str(), c.estimate, c.cost.fwd_compute + c.cost.bwd_compute,
        c.cost.fwd_comms + c.cost.bwd_comms, c.estimate_sum,
        c.estimate_torchrec, c.measured, c.phases[0], c.phases[1], c.phases[2],
        c.cpu_max, c.cpu_sum, by_estimate[p], by_cpu[p]);
  }
  std::printf(
      "est ms: the slowest rank's estimate (compute, comms), the planner's "
      "figure of merit; est sum: over all ranks; torchrec: est ms with "
      "TorchRec's constants; meas ms: the slowest rank's wall time (its "
      "phases); cpu max / sum: CPU ms of the busiest rank / of all ranks; "
      "r_est, r_cpu: ranks by est ms and by cpu max\n"
      "Spearman's rank correlation: est ms with cpu max %.3f, with meas ms "
      "%.3f; torchrec with cpu max %.3f, with meas ms %.3f; est sum with "
      "meas ms %.3f\n",
      Spearman(estimates, busiest), Spearman(estimates, measured),
      Spearman(torchrecs, busiest), Spearman(torchrecs, measured),
      Spearman(sums, measured));
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  using namespace deltastream;
  if (std::optional<std::string> scenario = testing::ScenarioFromEnv()) {
    return *scenario == "calibrate" ? RunCalibrateRank() : RunPlansRank();
  }
  absl::ParseCommandLine(argc, argv);
  return Main();
}
