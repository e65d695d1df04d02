// The planner CLI, run as a user runs it: plans printed as tables and as
// JSON, the plan file, exit 1 with the reasons when nothing fits, exit 2
// for bad flags or input; never a stack trace.
#include <gmock/gmock.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/integration/server_process.h"
#include "trainer/planner/model_spec.h"
#include "trainer/planner/planner.h"

namespace deltastream::planner {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Planner(const std::string& flags) {
  return "timeout 60 " + RunfilePath("trainer/planner/planner") + " " + flags;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TestTempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Tables of one dim, dense_arch's last width: a model the trainer builds.
constexpr char kConfig[] = R"(
model {
  dense_arch: [256, 128]
  tables { name: "users" num_embeddings: 2000000 embedding_dim: 128 }
  tables { name: "items" num_embeddings: 500000 embedding_dim: 128 }
  tables { name: "tiny" num_embeddings: 100 embedding_dim: 128 }
  sparse_optimizer { type: "adam" }
}
data { batch_size: 1024 }
)";

void ExpectNoCrash(const CommandResult& result) {
  EXPECT_THAT(result.err, Not(HasSubstr("terminate")));
  EXPECT_THAT(result.err, Not(HasSubstr("Aborted")));
  EXPECT_THAT(result.err, Not(HasSubstr("Check failed")));
}

TEST(PlannerCli, DefaultModelPrintsTheTables) {
  const CommandResult result = RunCommand(Planner("--world_size=2 --ddr_gb=4"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("Sharding plan: 8 tables on 2 ranks"));
  EXPECT_THAT(result.out, HasSubstr("Rank  DDR GiB  DDR %  Cost ms"));
  EXPECT_THAT(result.out, HasSubstr("t7"));
  EXPECT_THAT(result.out, HasSubstr("imbalance (max / mean)"));
}

TEST(PlannerCli, WritesAValidPlanFileAndJson) {
  const std::string config = WriteFile("config.textproto", kConfig);
  const std::string out = TestTempDir() + "/plan.textproto";
  const CommandResult result =
      RunCommand(Planner("--config=" + config +
                         " --world_size=4 --local_world_size=2 "
                         "--ddr_gb=4 --out=" +
                         out + " --json"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["world_size"], 4);
  EXPECT_EQ(json["ranks"].size(), 4u);
  EXPECT_EQ(json["tables"].size(), 3u);
  EXPECT_GE(json["imbalance"].get<double>(), 1.0);
  EXPECT_GT(json["max_cost_ms"].get<double>(), 0);

  v1::ShardingPlan plan;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(ReadText(out), &plan));
  EXPECT_EQ(plan.world_size(), 4);
  EXPECT_EQ(plan.local_world_size(), 2);
  absl::StatusOr<ModelSpec> spec =
      ModelSpecFromConfig(*ParseConfigText(kConfig));
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(ValidatePlan(plan, spec->tables).ok())
      << ValidatePlan(plan, spec->tables);
}

TEST(PlannerCli, EveryProposerAndGpus) {
  const std::string config = WriteFile("config.textproto", kConfig);
  for (const char* proposer : {"dp", "greedy", "uniform", "all"}) {
    const CommandResult result =
        RunCommand(Planner("--config=" + config +
                           " --world_size=8 --ddr_gb=2 "
                           "--proposer=" +
                           proposer));
    EXPECT_EQ(result.exit_code, 0) << proposer << ": " << result.err;
  }
  const CommandResult gpu = RunCommand(
      Planner("--config=" + config +
              " --world_size=8 --local_world_size=4 --device=cuda --hbm_gb=1 "
              "--ddr_gb=16"));
  ASSERT_EQ(gpu.exit_code, 0) << gpu.err;
  EXPECT_THAT(gpu.out, HasSubstr("HBM GiB"));
  EXPECT_THAT(gpu.out, HasSubstr("(GPU, 4 per host)"));
}

TEST(PlannerCli, NothingFitsExitsOneWithTheReasons) {
  const std::string config = WriteFile("huge.textproto", R"(
model { dense_arch: [64, 128]
        tables { name: "huge" num_embeddings: 400000000 embedding_dim: 128 }
        tables { name: "small" num_embeddings: 1000 embedding_dim: 128 } })");
  const CommandResult result =
      RunCommand(Planner("--config=" + config + " --world_size=2 --ddr_gb=8"));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("no plan fits"));
  EXPECT_THAT(result.err, HasSubstr("table 'huge'"));
  // The report keeps its lines (docs/planner.md), the first one prefixed.
  EXPECT_THAT(result.err, HasSubstr("\n  table 'huge'"));
  EXPECT_EQ(result.err.rfind("planner: no plan fits: ", 0), 0u) << result.err;
  EXPECT_THAT(result.err, HasSubstr("missing (its shards need"));
  EXPECT_THAT(result.err, HasSubstr("more ranks"));
  EXPECT_THAT(result.err, Not(HasSubstr("'small'")));
  EXPECT_TRUE(result.out.empty());
  ExpectNoCrash(result);

  // A constraint that forbids the row-wise split that would fit.
  const std::string wide = WriteFile("wide.textproto", R"(
model { dense_arch: [64]
        tables { name: "wide" num_embeddings: 30000000 embedding_dim: 64 } })");
  const std::string constraints =
      WriteFile("constraints.textproto",
                R"(tables { table: "wide" sharding_types: [TABLE_WISE] })");
  const CommandResult constrained =
      RunCommand(Planner("--config=" + wide +
                         " --world_size=4 --ddr_gb=4 "
                         "--constraints=" +
                         constraints));
  EXPECT_EQ(constrained.exit_code, 1);
  EXPECT_THAT(constrained.err, HasSubstr("fewer constraints"));
  EXPECT_EQ(
      RunCommand(Planner("--config=" + wide + " --world_size=4 --ddr_gb=4"))
          .exit_code,
      0);
}

// A problem larger than the memory the planner may use (here 1 GB of
// address space: 1,000 tables on the largest world take more): one line and
// exit 1, not an abort.
TEST(PlannerCli, AProblemLargerThanMemoryExitsOne) {
  std::string tables = "model {\n  dense_arch: [64, 16]\n";
  for (int t = 0; t < 1000; ++t) {
    tables += "  tables { name: \"t" + std::to_string(t) +
              "\" num_embeddings: 1000000 embedding_dim: 16 }\n";
  }
  const std::string config = WriteFile("many.textproto", tables + "}\n");
  const CommandResult result =
      RunCommand("ulimit -v 1000000; exec " +
                 Planner("--config=" + config + " --world_size=" +
                         std::to_string(kMaxWorldSize) + " --ddr_gb=64"));
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_THAT(result.err, HasSubstr("out of memory"));
  ExpectNoCrash(result);
}

// The sizes that drive the planner's work and memory have a documented
// maximum (docs/planner.md): past it, one line and exit 2 at once (a world of
// 10^8 ranks used to plan until killed, 10^6 for 54 s and 2.9 GB); at it, a
// plan.
TEST(PlannerCli, WorldAndBinsPastTheirMaximumAreRefusedAtOnce) {
  struct Case {
    std::string flags;
    std::string message;
  };
  const Case cases[] = {
      {"--world_size=100000000", "--world_size must be in [1, 4096]"},
      {"--world_size=2147483647", "--world_size must be in [1, 4096]"},
      {"--world_size=" + std::to_string(kMaxWorldSize + 1),
       "--world_size must be in [1, 4096], got 4097"},
      {"--world_size=-3", "--world_size must be in [1, 4096], got -3"},
      {"--world_size=2 --dp_bins_per_device=1001",
       "--dp_bins_per_device must be in [1, 1000], got 1001"},
      {"--world_size=2 --dp_bins_per_device=2000000000",
       "--dp_bins_per_device must be in [1, 1000]"},
      // Before anything is read: a missing config is not reached.
      {"--world_size=5000 --config=/nonexistent/c.textproto",
       "--world_size must be in [1, 4096], got 5000"},
      {"--world_size=2 --dp_bins_per_device=0 "
       "--config=/nonexistent/c.textproto",
       "--dp_bins_per_device must be in [1, 1000], got 0"},
  };
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    const CommandResult result = RunCommand(Planner(c.flags + " --ddr_gb=4"));
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              std::chrono::seconds(10))
        << c.flags;
    EXPECT_EQ(result.exit_code, 2) << c.flags << "\n" << result.err;
    EXPECT_THAT(result.err, HasSubstr(c.message)) << c.flags;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
        << result.err;
    EXPECT_TRUE(result.out.empty()) << result.out;
    ExpectNoCrash(result);
  }
  const CommandResult largest = RunCommand(
      Planner("--world_size=" + std::to_string(kMaxWorldSize) +
              " --local_world_size=8 --ddr_gb=4 --dp_bins_per_device=" +
              std::to_string(kMaxDpBinsPerDevice)));
  EXPECT_EQ(largest.exit_code, 0) << largest.err;
  EXPECT_THAT(largest.out, HasSubstr("on 4096 ranks"));
}

TEST(PlannerCli, BadInputExitsTwo) {
  struct Case {
    std::string flags;
    std::string message;
  };
  const std::string bad = WriteFile("bad.textproto", "model { tabels {} }");
  const std::string config = WriteFile("config.textproto", kConfig);
  const Case cases[] = {
      {"", "--world_size"},
      {"--world_size=2 --config=/nonexistent/c.textproto", "cannot read"},
      {"--world_size=2 --config=" + bad, "line 1"},
      {"--world_size=2 --proposer=best", "--proposer"},
      {"--world_size=3 --local_world_size=2", "local_world_size"},
      {"--world_size=2 --device=tpu", "--device"},
      {"--world_size=2 --config=" + config + " --constraints=" +
           WriteFile("c.textproto", "tables { table: \"nope\" }"),
       "'nope'"},
      {"--world_size=2 --out=/nonexistent/dir/plan.textproto", "cannot write"},
      {"--world_size=2 --batch_size=-5", "--batch_size must be >= 0"},
      {"--world_size=2 --dp_bins_per_device=0", "--dp_bins_per_device"},
      {"--world_size=2 --local_world_size=-1", "--local_world_size must be"},
      {"--world_size=2 --device=cuda --hbm_gb=-1", "--hbm_gb must be"},
      // A model the trainer would not build (ValidateArchitecture).
      {"--world_size=2 --config=" +
           WriteFile("mismatch.textproto",
                     "model { dense_arch: [64, 8] tables { name: \"t0\" "
                     "num_embeddings: 1000 embedding_dim: 16 } }"),
       "dense_arch ends in 8"},
  };
  for (const Case& c : cases) {
    const CommandResult result = RunCommand(Planner(c.flags + " --ddr_gb=4"));
    EXPECT_EQ(result.exit_code, 2) << c.flags;
    EXPECT_THAT(result.err, HasSubstr(c.message)) << c.flags;
    ExpectNoCrash(result);
  }
  for (const char* ddr : {"-1", "nan"}) {
    const CommandResult result =
        RunCommand(Planner(std::string("--world_size=2 --ddr_gb=") + ddr));
    EXPECT_EQ(result.exit_code, 2) << ddr;
    EXPECT_THAT(result.err, HasSubstr("--ddr_gb must be")) << ddr;
  }
  const CommandResult env = RunCommand("STORAGE_RESERVE_PERCENT=lots " +
                                       Planner("--world_size=2 --ddr_gb=4"));
  EXPECT_EQ(env.exit_code, 2);
  EXPECT_THAT(env.err, HasSubstr("STORAGE_RESERVE_PERCENT"));
  const CommandResult reserve = RunCommand(
      "STORAGE_RESERVE_PERCENT=0.5 " + Planner("--world_size=2 --ddr_gb=4"));
  EXPECT_EQ(reserve.exit_code, 0) << reserve.err;
  EXPECT_THAT(reserve.out, HasSubstr("(50% + dense"));
}

// Numbers the planner cannot use, and memory flags for a device the ranks
// do not have: exit 2 with the flag or field named, never an undefined
// conversion or a silently ignored flag.
TEST(PlannerCli, BadNumbersAndMisplacedFlagsExitTwo) {
  const std::string config = WriteFile("config.textproto", kConfig);
  auto constraints = [](const std::string& name, const std::string& text) {
    return " --config=" + WriteFile("config.textproto", kConfig) +
           " --constraints=" + WriteFile(name, text);
  };
  struct Case {
    std::string flags;
    std::string message;
  };
  const Case cases[] = {
      // 1e10 GiB is more bytes than an int64 holds.
      {"--world_size=2 --ddr_gb=1e10", "--ddr_gb must be"},
      {"--world_size=2 --device=cuda --hbm_gb=1e10 --ddr_gb=4",
       "--hbm_gb must be"},
      // HBM on CPU ranks would be ignored.
      {"--world_size=2 --device=cpu --hbm_gb=16 --ddr_gb=4", "--hbm_gb"},
      {"--world_size=2 --config=" + config + " --hbm_gb=16 --ddr_gb=4",
       "--hbm_gb"},
      {"--world_size=2 --ddr_gb=4" +
           constraints("twice.textproto",
                       "tables { table: \"users\" }\n"
                       "tables { table: \"users\" min_partition: 64 }"),
       "table 'users' is constrained twice"},
      {"--world_size=2 --ddr_gb=4" +
           constraints("nan.textproto",
                       "tables { table: \"users\" pooling_factor: nan }"),
       "pooling_factor"},
      {"--world_size=2 --ddr_gb=4" +
           constraints("inf.textproto",
                       "tables { table: \"users\" pooling_factor: inf }"),
       "pooling_factor"},
      {"--world_size=2 --ddr_gb=4" +
           constraints("partition.textproto",
                       "tables { table: \"users\" sharding_types: "
                       "[COLUMN_WISE] min_partition: 9223372036854775807 }"),
       "min_partition"},
      {"--world_size=2 --device=cuda --hbm_gb=16 --ddr_gb=4" +
           constraints("host.textproto",
                       "tables { table: \"users\" placement: "
                       "PLACEMENT_HOST }"),
       "PLACEMENT_HOST"},
  };
  for (const Case& c : cases) {
    const CommandResult result = RunCommand(Planner(c.flags));
    EXPECT_EQ(result.exit_code, 2) << c.flags << "\n" << result.err;
    EXPECT_THAT(result.err, HasSubstr(c.message)) << c.flags;
    ExpectNoCrash(result);
  }
  // The largest memory flags accepted still plan.
  const CommandResult large =
      RunCommand(Planner("--world_size=2 --device=cuda --hbm_gb=1048576 "
                         "--ddr_gb=1048576 --config=" +
                         config));
  EXPECT_EQ(large.exit_code, 0) << large.err;
}

// Constrained to column-wise on two ranks, a table of dim 128 is two
// shards on two ranks (not four blocks of 32 columns, two per rank).
TEST(PlannerCli, ColumnWiseOnlyOnTwoRanksOneShardPerRank) {
  const std::string config = WriteFile("config.textproto", kConfig);
  const std::string constraints =
      WriteFile("cw.textproto",
                "tables { table: \"users\" sharding_types: [COLUMN_WISE] }");
  const std::string out = TestTempDir() + "/cw_plan.textproto";
  const CommandResult result =
      RunCommand(Planner("--config=" + config + " --world_size=2 --ddr_gb=8 " +
                         "--constraints=" + constraints + " --out=" + out));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  v1::ShardingPlan plan;
  ASSERT_TRUE(
      google::protobuf::TextFormat::ParseFromString(ReadText(out), &plan));
  absl::StatusOr<ModelSpec> spec =
      ModelSpecFromConfig(*ParseConfigText(kConfig));
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(ValidatePlan(plan, spec->tables).ok())
      << ValidatePlan(plan, spec->tables);
  for (const v1::TablePlan& table : plan.tables()) {
    if (table.table() != "users") continue;
    EXPECT_EQ(table.sharding_type(), v1::COLUMN_WISE);
    ASSERT_EQ(table.shards_size(), 2);
    EXPECT_NE(table.shards(0).rank(), table.shards(1).rank());
  }
}

}  // namespace
}  // namespace deltastream::planner
