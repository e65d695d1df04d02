#include "trainer/planner/topology.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace deltastream::planner {

Topology DefaultTopology(int world_size, bool gpu) {
  Topology topology;
  topology.world_size = world_size;
  topology.gpu = gpu;
  if (!gpu) {
    // Measured by tests/bench:planner_ranking_bench --calibrate on the 2-core
    // development machines (docs/planner.md): Gloo's all-to-all on loopback
    // and the CPU lookup kernels (forward; backward with the fused
    // optimizer). Across hosts: 10 GbE.
    topology.intra_host_bw = 1.7e9;
    topology.inter_host_bw = 1.25e9;
    topology.ddr_bw = 20e9;
    topology.lookup_seconds_per_id = 20e-9;
    topology.bwd_compute_multiplier = 30;
  }
  return topology;
}

absl::Status ValidateWorldSize(absl::string_view what, int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be in [1, ", kMaxWorldSize, "], got ", world_size));
  }
  return absl::OkStatus();
}

absl::Status ValidateTopology(const Topology& topology) {
  auto invalid = [](absl::string_view field, absl::string_view message) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology: ", field, " ", message));
  };
  if (absl::Status status =
          ValidateWorldSize("topology: world_size", topology.world_size);
      !status.ok()) {
    return status;
  }
  if (topology.local_world_size < 0 ||
      (topology.local_world_size > 0 &&
       topology.world_size % topology.local_world_size != 0)) {
    return invalid(
        "local_world_size",
        absl::StrCat("must divide the world size ", topology.world_size,
                     ", got ", topology.local_world_size));
  }
  if (topology.gpu && topology.hbm_bytes <= 0) {
    return invalid("hbm", "must be positive on GPUs");
  }
  if (topology.ddr_bytes <= 0) return invalid("ddr", "must be positive");
  if (!(topology.hbm_bw > 0) || !(topology.ddr_bw > 0) ||
      !(topology.intra_host_bw > 0) || !(topology.inter_host_bw > 0)) {
    return invalid("bandwidth", "must be positive");
  }
  if (!(topology.storage_reserve_percent >= 0 &&
        topology.storage_reserve_percent < 1)) {
    return invalid("storage_reserve_percent", "must be in [0, 1)");
  }
  if (topology.batch_size < 1) return invalid("batch_size", "must be >= 1");
  if (!(topology.bwd_compute_multiplier >= 0)) {
    return invalid("bwd_compute_multiplier", "must be >= 0");
  }
  if (!(topology.lookup_seconds_per_id >= 0)) {
    return invalid("lookup_seconds_per_id", "must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ApplyTopologyEnvironment(Topology* topology) {
  // TorchRec's unit for bandwidths: bytes per millisecond.
  struct Variable {
    const char* name;
    double* field;
    double scale;  // field = value x scale
  };
  const Variable variables[] = {
      {"INTRA_NODE_BANDWIDTH", &topology->intra_host_bw, 1e3},
      {"CROSS_NODE_BANDWIDTH", &topology->inter_host_bw, 1e3},
      {"HBM_MEM_BW", &topology->hbm_bw, 1e3},
      {"DDR_MEM_BW", &topology->ddr_bw, 1e3},
      {"BWD_COMPUTE_MULTIPLIER", &topology->bwd_compute_multiplier, 1},
      {"STORAGE_RESERVE_PERCENT", &topology->storage_reserve_percent, 1},
      {"LOOKUP_NS_PER_ID", &topology->lookup_seconds_per_id, 1e-9},
  };
  for (const Variable& variable : variables) {
    const char* value = std::getenv(variable.name);
    if (value == nullptr || *value == '\0') continue;
    double parsed = 0;
    if (!absl::SimpleAtod(value, &parsed)) {
      return absl::InvalidArgumentError(
          absl::StrCat(variable.name, "='", value, "' is not a number"));
    }
    *variable.field = parsed * variable.scale;
  }
  return absl::OkStatus();
}

int64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

}  // namespace deltastream::planner
