// trainer:planner — plans where the embedding tables of a trainer config go
// on a world of ranks, prints the plan and writes the file the trainer's
// --plan reads. See docs/planner.md.
//
//   planner --config=F --world_size=N [--local_world_size=L] [--hbm_gb=G]
//           [--ddr_gb=G] [--proposer=dp|greedy|uniform|all]
//           [--out=plan.textproto] [--json] [--constraints=F]
//
// Exit status: 0 a plan; 1 nothing fits (the reason on stderr), or no
// memory to plan in; 2 bad flags or input.
#include <google/protobuf/text_format.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/file_io.h"
#include "base/process.h"
#include "trainer/planner/model_spec.h"
#include "trainer/planner/plan_report.h"
#include "trainer/planner/planner.h"
#include "trainer/planner/storage_estimator.h"
#include "trainer/planner/topology.h"

ABSL_FLAG(std::string, config, "",
          "the trainer's config (protobuf text); empty: the trainer's "
          "embedded defaults");
ABSL_FLAG(int, world_size, 0, "ranks to plan for (required), at most 4096");
ABSL_FLAG(int, local_world_size, 0, "ranks per host; 0: world_size");
ABSL_FLAG(double, hbm_gb, 0,
          "GPU memory per rank, GiB (GPU ranks only); 0: the first GPU's "
          "(nvidia-smi)");
ABSL_FLAG(double, ddr_gb, 0,
          "host memory per rank, GiB; 0: this machine's / local_world_size");
ABSL_FLAG(std::string, device, "", "cpu or cuda; empty: the config's device");
ABSL_FLAG(std::string, proposer, "all", "dp, greedy, uniform or all");
ABSL_FLAG(int64_t, batch_size, 0, "examples per rank; 0: the config's");
ABSL_FLAG(std::string, constraints, "",
          "per-table constraints, a deltastream.v1.PlannerConstraints in "
          "protobuf text");
ABSL_FLAG(int, dp_bins_per_device, 100,
          "memory bins per rank of the dynamic-programming proposer, 1 to "
          "1000");
ABSL_FLAG(std::string, out, "", "write the plan here (protobuf text)");
ABSL_FLAG(bool, json, false, "print one JSON object instead of tables");

namespace deltastream::planner {
namespace {

// The flags' help above says these bounds.
static_assert(kMaxWorldSize == 4096 && kMaxDpBinsPerDevice == 1000,
              "update --world_size's and --dp_bins_per_device's help");

constexpr int kNothingFits = 1;
constexpr int kBadInput = 2;

// The first GPU's memory through nvidia-smi (no CUDA link needed).
absl::StatusOr<int64_t> GpuMemoryBytes() {
  FILE* pipe = popen(
      "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits "
      "2>/dev/null",
      "r");
  if (pipe == nullptr) return absl::UnavailableError("cannot run nvidia-smi");
  char line[128] = {0};
  const bool read = std::fgets(line, sizeof(line), pipe) != nullptr;
  pclose(pipe);
  int64_t mib = 0;
  if (!read || !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &mib) ||
      mib <= 0) {
    return absl::UnavailableError(
        "no GPU memory size: nvidia-smi found no GPU; pass --hbm_gb");
  }
  return mib << 20;
}

// The most GiB --hbm_gb and --ddr_gb take: 1 PiB per rank, far inside
// int64 bytes (and the planner's sums of them).
constexpr int kMaxGib = 1 << 20;

// The flags' own ranges (0 keeps a default where the help says so).
absl::Status CheckFlags() {
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"hbm_gb", absl::GetFlag(FLAGS_hbm_gb)},
        {"ddr_gb", absl::GetFlag(FLAGS_ddr_gb)}}) {
    if (!(value >= 0 && value <= kMaxGib)) {  // NaN fails too
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " must be a number of GiB in [0, ", kMaxGib,
                       "] (0: found on this machine)"));
    }
  }
  if (absl::GetFlag(FLAGS_batch_size) < 0) {
    return absl::InvalidArgumentError(
        "--batch_size must be >= 0 (0: the config's)");
  }
  if (absl::GetFlag(FLAGS_local_world_size) < 0) {
    return absl::InvalidArgumentError(
        "--local_world_size must be >= 0 (0: world_size)");
  }
  return ValidateDpBinsPerDevice("--dp_bins_per_device",
                                 absl::GetFlag(FLAGS_dp_bins_per_device));
}

int Run() {
  if (!FlagGiven("world_size")) {
    return Fail(kBadInput, "--world_size=N is required");
  }
  // The planner's work and memory grow with the world and the DP's bins:
  // the library's checks of their bounds (which MakePlan applies too) refuse
  // them here, before anything is read or planned.
  const int world_size = absl::GetFlag(FLAGS_world_size);
  if (absl::Status status = ValidateWorldSize("--world_size", world_size);
      !status.ok()) {
    return Fail(kBadInput, status);
  }
  if (absl::Status status = CheckFlags(); !status.ok()) {
    return Fail(kBadInput, status);
  }

  v1::TrainerConfig config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    absl::StatusOr<std::string> text =
        ReadSmallFile(absl::GetFlag(FLAGS_config));
    if (!text.ok()) return Fail(kBadInput, text.status().message());
    absl::StatusOr<v1::TrainerConfig> parsed = ParseConfigText(*text);
    if (!parsed.ok()) {
      return Fail(kBadInput, absl::StrCat(absl::GetFlag(FLAGS_config), ": ",
                                          parsed.status().message()));
    }
    config = *std::move(parsed);
  }
  absl::StatusOr<ModelSpec> model = ModelSpecFromConfig(config);
  if (!model.ok()) return Fail(kBadInput, model.status().message());

  const std::string device = absl::GetFlag(FLAGS_device);
  if (!device.empty() && device != "cpu" && !absl::StartsWith(device, "cuda")) {
    return Fail(kBadInput,
                absl::StrCat("--device: cpu or cuda, got '", device, "'"));
  }
  const bool gpu = device.empty() ? model->gpu : device != "cpu";
  if (!gpu && absl::GetFlag(FLAGS_hbm_gb) > 0) {
    return Fail(kBadInput,
                "--hbm_gb is GPU memory, but the ranks are CPUs (--device=cpu "
                "or the config's device); drop it or pass --device=cuda");
  }
  if (!absl::GetFlag(FLAGS_constraints).empty()) {
    absl::StatusOr<std::string> text =
        ReadSmallFile(absl::GetFlag(FLAGS_constraints));
    if (!text.ok()) return Fail(kBadInput, text.status().message());
    absl::StatusOr<v1::PlannerConstraints> constraints =
        ParseConstraintsText(*text);
    if (!constraints.ok()) {
      return Fail(kBadInput,
                  absl::StrCat(absl::GetFlag(FLAGS_constraints), ": ",
                               constraints.status().message()));
    }
    if (absl::Status status = ApplyConstraints(*constraints, &model->tables);
        !status.ok()) {
      return Fail(kBadInput, status.message());
    }
  }

  Topology topology = DefaultTopology(world_size, gpu);
  topology.local_world_size = absl::GetFlag(FLAGS_local_world_size);
  topology.batch_size = absl::GetFlag(FLAGS_batch_size) > 0
                            ? absl::GetFlag(FLAGS_batch_size)
                            : model->batch_size;
  const double gib = static_cast<double>(int64_t{1} << 30);
  if (absl::GetFlag(FLAGS_ddr_gb) > 0) {
    topology.ddr_bytes =
        static_cast<int64_t>(absl::GetFlag(FLAGS_ddr_gb) * gib);
  } else {
    topology.ddr_bytes = HostMemoryBytes() / topology.ranks_per_host();
  }
  if (gpu) {
    if (absl::GetFlag(FLAGS_hbm_gb) > 0) {
      topology.hbm_bytes =
          static_cast<int64_t>(absl::GetFlag(FLAGS_hbm_gb) * gib);
    } else {
      absl::StatusOr<int64_t> hbm = GpuMemoryBytes();
      if (!hbm.ok()) return Fail(kBadInput, hbm.status().message());
      topology.hbm_bytes = *hbm;
    }
  }
  if (absl::Status status = ApplyTopologyEnvironment(&topology); !status.ok()) {
    return Fail(kBadInput, status.message());
  }
  if (absl::Status status = ValidateTopology(topology); !status.ok()) {
    return Fail(kBadInput, status.message());
  }

  PlannerOptions options;
  options.dp_bins_per_device = absl::GetFlag(FLAGS_dp_bins_per_device);
  const std::string proposer = absl::GetFlag(FLAGS_proposer);
  if (proposer != "all") {
    if (proposer != "dp" && proposer != "greedy" && proposer != "uniform") {
      return Fail(kBadInput, absl::StrCat("--proposer: dp, greedy, uniform or "
                                          "all, got '",
                                          proposer, "'"));
    }
    options.proposers = {proposer};
  }

  const StorageReservation reservation =
      ReserveStorage(topology, model->tables, model->dense_parameter_bytes,
                     model->dense_state_copies);
  absl::StatusOr<Plan> plan =
      MakePlan(model->tables, model->optimizer, topology, reservation, options);
  if (!plan.ok()) {
    if (plan.status().code() == absl::StatusCode::kResourceExhausted) {
      // The report keeps its lines; its first is "planner: no plan fits:".
      std::fprintf(stderr, "%s: %s\n", program_invocation_short_name,
                   std::string(plan.status().message()).c_str());
      return kNothingFits;
    }
    return Fail(kBadInput, plan.status().message());
  }

  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(
        ToProto(*plan, model->tables, topology), &text);
    if (absl::Status written = WriteFileDurably(
            out,
            absl::StrCat("# Written by trainer:planner; the trainer's --plan "
                         "reads it.\n",
                         text));
        !written.ok()) {
      return Fail(kBadInput, written.message());
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << FormatPlanJson(*plan, model->tables, topology) << "\n";
  } else {
    std::cout << FormatPlanReport(*plan, model->tables, topology);
    if (!out.empty()) std::cout << "Plan written to " << out << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace deltastream::planner

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "planner --config=F --world_size=N [--local_world_size=L] [--hbm_gb=G] "
      "[--ddr_gb=G] [--proposer=dp|greedy|uniform|all] [--out=plan.textproto] "
      "[--json] [--constraints=F]");
  if (std::optional<int> exit_code =
          deltastream::HandleCommandLine(argc, argv)) {
    return *exit_code;
  }
  // A model too large for this machine's memory (many tables on many
  // ranks): one line and exit 1, not an abort.
  try {
    return deltastream::planner::Run();
  } catch (const std::bad_alloc&) {
    return deltastream::Fail(
        deltastream::kExitFailure,
        "out of memory: the planning problem does not fit in this machine's "
        "memory (the config's tables, --world_size, --dp_bins_per_device)");
  }
}
