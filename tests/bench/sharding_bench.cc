// Sharded embedding collections: forward + backward step time at 1, 2 and 4
// ranks per sharding type (Gloo on loopback, one process per rank), the
// bytes each collective moves per step against the analytic minimum, and the
// sharded module at world size 1 against the unsharded one, measured side by
// side (alternating steps) in one run.
//
//   bazel run //tests/bench:sharding_bench -- --ranks=1,2,4
//
// Each rank: a ShardedEmbeddingBagCollection of --tables tables (--rows x
// --dim, one feature each, --pooling IDs per example, uniform IDs), batch
// --batch per rank, loss = mean of the pooled outputs' squares. Step time is
// rank 0's median over --steps after 3 warm-up steps.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/bench/timing.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/sharding/sharding_plan.h"

ABSL_FLAG(std::string, ranks, "1,2,4", "world sizes to measure");
ABSL_FLAG(std::string, types,
          "table_wise,row_wise,column_wise,table_row_wise,data_parallel",
          "sharding types to measure");
ABSL_FLAG(int64_t, tables, 4, "tables");
ABSL_FLAG(int64_t, rows, 100000, "rows per table");
ABSL_FLAG(int64_t, dim, 64, "embedding dim");
ABSL_FLAG(int64_t, batch, 512, "examples per rank per step");
ABSL_FLAG(int64_t, pooling, 8, "IDs per example per feature");
ABSL_FLAG(int64_t, steps, 20, "measured steps");

namespace deltastream {
namespace {

struct Config {
  std::string type;
  int64_t tables, rows, dim, batch, pooling, steps;
};

int64_t EnvInt(const char* name) {
  int64_t v = 0;
  const char* s = std::getenv(name);
  if (s == nullptr || !absl::SimpleAtoi(s, &v)) return 0;
  return v;
}

Config ConfigFromEnv() {
  return {std::getenv("BENCH_TYPE"), EnvInt("BENCH_TABLES"),
          EnvInt("BENCH_ROWS"),      EnvInt("BENCH_DIM"),
          EnvInt("BENCH_BATCH"),     EnvInt("BENCH_POOLING"),
          EnvInt("BENCH_STEPS")};
}

std::vector<EmbeddingTableConfig> Tables(const Config& c) {
  std::vector<EmbeddingTableConfig> tables;
  for (int64_t t = 0; t < c.tables; ++t) {
    tables.push_back(
        {absl::StrCat("t", t), c.rows, c.dim, {absl::StrCat("f", t)}});
  }
  return tables;
}

v1::ShardingPlan Plan(const Config& c, int world) {
  std::vector<EmbeddingTableConfig> tables = Tables(c);
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  v1::ShardingPlan plan;
  plan.set_world_size(world);
  for (size_t t = 0; t < tables.size(); ++t) {
    if (c.type == "table_wise") {
      *plan.add_tables() = TableWisePlan(tables[t], t % world);
    } else if (c.type == "row_wise") {
      *plan.add_tables() = RowWisePlan(tables[t], world);
    } else if (c.type == "column_wise") {
      *plan.add_tables() = ColumnWisePlan(tables[t], all);
    } else if (c.type == "table_row_wise") {
      *plan.add_tables() = TableRowWisePlan(tables[t], all);
    } else {
      *plan.add_tables() = DataParallelPlan(tables[t], world);
    }
  }
  return plan;
}

KeyedJaggedTensor Batch(const Config& c, int rank, int step) {
  std::mt19937_64 rng(step * 1000 + rank);
  std::vector<std::string> keys;
  std::vector<int64_t> ids(c.tables * c.batch * c.pooling);
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() % c.rows);
  for (int64_t t = 0; t < c.tables; ++t) keys.push_back(absl::StrCat("f", t));
  return *KeyedJaggedTensor::FromLengths(
      keys, at::tensor(ids, at::kLong),
      at::full({c.tables * c.batch}, c.pooling, at::kLong));
}

// Bytes rank `me` must send per step, from first principles: IDs (8 bytes)
// and lengths (8 bytes per example and feature) to every other rank that
// holds a shard they touch; pooled rows (4 bytes per value) back to the
// ranks whose examples they pool; a ring reduce-scatter for row-wise,
// (N - 1) / N of the rank's [N B, dim] partial sums per table.
std::map<std::string, int64_t> MinimumBytes(const Config& c, int world, int me,
                                            const KeyedJaggedTensor& input) {
  std::map<std::string, int64_t> bytes;
  if (world == 1) return bytes;
  v1::ShardingPlan plan = Plan(c, world);
  for (int64_t t = 0; t < c.tables; ++t) {
    at::Tensor ids = input.ValuesOf(t);
    for (const v1::Shard& s : plan.tables(t).shards()) {
      if (s.rank() == me || s.rows() == 0) continue;
      if (c.type == "data_parallel") continue;  // gradients, in backward
      const int64_t n =
          ((ids >= s.row_offset()) & (ids < s.row_offset() + s.rows()))
              .sum()
              .item<int64_t>();
      bytes["input_dist.values"] += 8 * n;
      bytes["input_dist.lengths"] += 8 * c.batch;
    }
    for (const v1::Shard& s : plan.tables(t).shards()) {
      if (s.rank() != me) continue;
      if (c.type == "row_wise") {
        bytes["output_dist.row_wise"] += 4 * (world - 1) * c.batch * c.dim;
      } else if (c.type != "data_parallel") {
        bytes["output_dist.pooled"] += 4 * (world - 1) * c.batch * s.cols();
      }
    }
  }
  if (c.type == "data_parallel") {
    bytes["output_dist.data_parallel.backward"] =
        4 * (world - 1) * c.batch * c.dim * c.tables;
  } else if (c.type == "row_wise") {
    bytes["output_dist.row_wise.backward"] =
        4 * (world - 1) * c.batch * c.dim * c.tables;
  } else {
    bytes["output_dist.pooled.backward"] = bytes["output_dist.pooled"];
  }
  return bytes;
}

at::Tensor Loss(const at::Tensor& pooled, int64_t batch) {
  return pooled.pow(2).sum() / static_cast<double>(batch);
}

int RunRank() {
  const Config c = ConfigFromEnv();
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      testing::RankGroupFromEnv(absl::Seconds(60));
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return 1;
  }
  const int world = (*group)->world_size();
  const int me = (*group)->rank();
  ShardedModuleOptions options;
  options.module.path = "sparse.ebc";
  options.module.tables = Tables(c);
  options.module.optimizer.type = SparseOptimizerType::kRowwiseAdagrad;
  options.plan = Plan(c, world);
  auto sharded = ShardedEmbeddingBagCollection::Create(options, group->get());
  if (!sharded.ok()) {
    std::fprintf(stderr, "%s\n", sharded.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<EmbeddingBagCollection> plain;
  if (world == 1) plain = *EmbeddingBagCollection::Create(options.module);
  std::vector<double> sharded_s, plain_s;
  std::map<std::string, int64_t> minimum;
  const int warmup = 3;
  for (int step = 0; step < warmup + c.steps; ++step) {
    KeyedJaggedTensor input = Batch(c, me, step);
    if (step == warmup) (*group)->ResetStats();
    if (step >= warmup) {
      for (const auto& [label, bytes] : MinimumBytes(c, world, me, input)) {
        minimum[label] += bytes;
      }
    }
    // At world size 1 the unsharded module runs on the same batch, first on
    // odd steps and second on even ones, so neither gains from order.
    auto time_plain = [&] {
      auto start = bench::Clock::now();
      Loss(plain->Forward(input)->values(), c.batch).backward();
      if (step >= warmup) plain_s.push_back(bench::Seconds(start));
    };
    if (plain && step % 2 == 1) time_plain();
    auto start = bench::Clock::now();
    absl::StatusOr<KeyedTensor> out = (*sharded)->Forward(input);
    if (!out.ok()) {
      std::fprintf(stderr, "%s\n", out.status().ToString().c_str());
      return 1;
    }
    Loss(out->values(), c.batch).backward();
    if (step >= warmup) sharded_s.push_back(bench::Seconds(start));
    if (plain && step % 2 == 0) time_plain();
  }
  if (me != 0) return 0;
  // Per step, averaged over the measured steps (IDs are random).
  // The ratio of each step's two timings, taken moments apart, is steadier
  // than the ratio of medians on a shared machine.
  std::vector<double> ratios;
  for (size_t i = 0; i < plain_s.size(); ++i) {
    ratios.push_back(sharded_s[i] / plain_s[i]);
  }
  std::printf("RESULT %f %f %f", bench::Median(sharded_s) * 1e3,
              plain ? bench::Median(plain_s) * 1e3 : -1.0,
              plain ? bench::Median(ratios) : -1.0);
  for (const auto& [label, stats] : (*group)->Stats()) {
    std::printf(" %s=%lld/%lld", label.c_str(),
                static_cast<long long>(stats.bytes_sent / c.steps),
                static_cast<long long>(
                    minimum.count(label) ? minimum[label] / c.steps : -1));
  }
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  using namespace deltastream;
  if (testing::ScenarioFromEnv()) return RunRank();
  absl::ParseCommandLine(argc, argv);
  std::printf(
      "tables %lld x %lld rows x dim %lld, batch %lld per rank, %lld IDs per "
      "example; median of %lld steps (forward + backward), Gloo on "
      "loopback\n",
      static_cast<long long>(absl::GetFlag(FLAGS_tables)),
      static_cast<long long>(absl::GetFlag(FLAGS_rows)),
      static_cast<long long>(absl::GetFlag(FLAGS_dim)),
      static_cast<long long>(absl::GetFlag(FLAGS_batch)),
      static_cast<long long>(absl::GetFlag(FLAGS_pooling)),
      static_cast<long long>(absl::GetFlag(FLAGS_steps)));
  std::printf("%-15s %5s %10s %12s  %s\n", "type", "ranks", "step ms",
              "examples/s", "bytes sent per step by rank 0 / analytic minimum");
  for (absl::string_view type :
       absl::StrSplit(absl::GetFlag(FLAGS_types), ',')) {
    for (absl::string_view ranks :
         absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
      int world = 0;
      if (!absl::SimpleAtoi(ranks, &world) || world < 1) continue;
      std::map<std::string, std::string> env = {
          {"BENCH_TYPE", std::string(type)},
          {"BENCH_TABLES", absl::StrCat(absl::GetFlag(FLAGS_tables))},
          {"BENCH_ROWS", absl::StrCat(absl::GetFlag(FLAGS_rows))},
          {"BENCH_DIM", absl::StrCat(absl::GetFlag(FLAGS_dim))},
          {"BENCH_BATCH", absl::StrCat(absl::GetFlag(FLAGS_batch))},
          {"BENCH_POOLING", absl::StrCat(absl::GetFlag(FLAGS_pooling))},
          {"BENCH_STEPS", absl::StrCat(absl::GetFlag(FLAGS_steps))}};
      std::vector<testing::RankResult> results =
          testing::RunRanks("bench", world, absl::Minutes(10), env);
      const std::string& out = results[0].output;
      const size_t at = out.find("RESULT ");
      if (results[0].exit_code != 0 || at == std::string::npos) {
        std::printf("%-15s %5d failed: %s\n", std::string(type).c_str(), world,
                    out.c_str());
        continue;
      }
      std::istringstream line(out.substr(at + 7));
      double step_ms = 0, plain_ms = 0, step_ratio = 0;
      line >> step_ms >> plain_ms >> step_ratio;
      std::string bytes;
      std::getline(line, bytes);
      const double examples =
          world * absl::GetFlag(FLAGS_batch) / (step_ms / 1e3);
      std::printf("%-15s %5d %10.2f %12.0f %s\n", std::string(type).c_str(),
                  world, step_ms, examples, bytes.c_str());
      if (plain_ms > 0) {
        std::printf(
            "%-15s %5s %10.2f %12s sharded / unsharded = %.3f (medians), "
            "%.3f (median of per-step ratios)\n",
            "  unsharded", "1", plain_ms, "", step_ms / plain_ms, step_ratio);
      }
    }
  }
  return 0;
}
