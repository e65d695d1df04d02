// Planning time and plan quality of the sharding planner
// (trainer/planner/planner.h): random models of 10, 100, 1,000 and 10,000
// tables (rows log-uniform in [100, 1e6], dims 16-256, 1-20 IDs per
// example) on 8 and 64 ranks, CPU ranks (the DP over DDR) and GPU ranks
// (80 GiB HBM each: the DP over HBM). For
// each proposer alone and all together: the median planning time of
// --repeat runs (enumeration, proposals, partitions) and the estimated
// max-rank cost of the plan it returns. Goal: 1,000 tables on 64 ranks in
// under 1 s.
//
//   bazel run -c opt //tests/bench:planner_bench --
//   [--tables=10,100,1000,10000]
//       [--ranks=8,64] [--device=both] [--repeat=3] [--json]

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tests/bench/timing.h"
#include "trainer/planner/planner.h"
#include "trainer/planner/storage_estimator.h"

ABSL_FLAG(std::string, tables, "10,100,1000,10000", "table counts");
ABSL_FLAG(std::string, ranks, "8,64", "world sizes (8 ranks per host)");
ABSL_FLAG(std::string, device, "both", "cpu, gpu or both");
ABSL_FLAG(std::string, proposers, "dp,greedy,uniform,all", "proposers");
ABSL_FLAG(int, repeat, 3, "runs per case; the median is reported");
ABSL_FLAG(bool, json, false, "one JSON object per case, one per line");

namespace deltastream::planner {
namespace {

using bench::Clock;
using bench::Median;
using bench::Seconds;

std::vector<int> Counts(const std::string& list) {
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int value = 0;
    if (absl::SimpleAtoi(part, &value) && value > 0) counts.push_back(value);
  }
  return counts;
}

std::vector<TableSpec> RandomTables(int count) {
  std::mt19937_64 random(2026);
  std::uniform_real_distribution<double> log_rows(std::log(100.0),
                                                  std::log(1e6));
  std::uniform_int_distribution<int> dim(0, 4), pooling(1, 20);
  const int64_t dims[] = {16, 32, 64, 128, 256};
  std::vector<TableSpec> tables(count);
  for (int t = 0; t < count; ++t) {
    tables[t].name = absl::StrCat("t", t);
    tables[t].rows = static_cast<int64_t>(std::exp(log_rows(random)));
    tables[t].dim = dims[dim(random)];
    tables[t].pooling_factor = pooling(random);
  }
  return tables;
}

Topology MakeTopology(int world_size, bool gpu) {
  Topology topology = DefaultTopology(world_size, gpu);
  topology.local_world_size = std::min(world_size, 8);
  topology.hbm_bytes = int64_t{80} << 30;
  topology.ddr_bytes = int64_t{256} << 30;
  topology.batch_size = 512;
  return topology;
}

int Run() {
  std::vector<bool> devices;
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu" || device == "both") devices.push_back(false);
  if (device == "gpu" || device == "both") devices.push_back(true);
  const std::vector<std::string> proposers =
      absl::StrSplit(absl::GetFlag(FLAGS_proposers), ',', absl::SkipEmpty());
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("%-4s %7s %6s %-8s %11s %14s %10s %9s  %s\n", "dev", "tables",
                "ranks", "proposer", "median s", "max cost ms", "imbalance",
                "proposals", "plan");
  }
  for (bool gpu : devices) {
    for (int count : Counts(absl::GetFlag(FLAGS_tables))) {
      const std::vector<TableSpec> tables = RandomTables(count);
      for (int ranks : Counts(absl::GetFlag(FLAGS_ranks))) {
        const Topology topology = MakeTopology(ranks, gpu);
        const StorageReservation reservation =
            ReserveStorage(topology, tables, int64_t{64} << 20, 3);
        for (const std::string& proposer : proposers) {
          PlannerOptions options;
          if (proposer != "all") options.proposers = {proposer};
          std::vector<double> seconds;
          absl::StatusOr<Plan> plan;
          for (int run = 0; run < absl::GetFlag(FLAGS_repeat); ++run) {
            const Clock::time_point start = Clock::now();
            plan = MakePlan(tables, OptimizerKind::kRowwiseAdagrad, topology,
                            reservation, options);
            seconds.push_back(Seconds(start));
          }
          const double median = Median(seconds);
          const double cost = plan.ok() ? plan->max_cost : -1;
          const double imbalance = plan.ok() ? plan->imbalance() : 0;
          const std::string chosen =
              plan.ok() ? absl::StrCat(plan->proposer, "/", plan->partitioner)
                        : "nothing fits";
          if (absl::GetFlag(FLAGS_json)) {
            std::printf(
                "{\"device\": \"%s\", \"tables\": %d, \"ranks\": %d, "
                "\"proposer\": \"%s\", \"median_s\": %.6f, \"max_cost_ms\": "
                "%.6f, \"imbalance\": %.4f, \"proposals\": %d, \"plan\": "
                "\"%s\"}\n",
                gpu ? "gpu" : "cpu", count, ranks, proposer.c_str(), median,
                cost, imbalance, plan.ok() ? plan->proposals : 0,
                chosen.c_str());
          } else {
            std::printf("%-4s %7d %6d %-8s %11.4f %14.4f %10.3f %9d  %s\n",
                        gpu ? "gpu" : "cpu", count, ranks, proposer.c_str(),
                        median, cost, imbalance,
                        plan.ok() ? plan->proposals : 0, chosen.c_str());
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace deltastream::planner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deltastream::planner::Run();
}
