#ifndef DELTASTREAM_TRAINER_PLANNER_TOPOLOGY_H_
#define DELTASTREAM_TRAINER_PLANNER_TOPOLOGY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "trainer/planner/sharding_option.h"

namespace deltastream::planner {

// The most ranks a plan is for (512 hosts of 8 GPUs): the planner's work and
// memory grow with tables x ranks (every row-wise option holds a shard per
// rank; the DP's bins are per rank), so a larger world is refused at once
// rather than planned for minutes in gigabytes (docs/planner.md).
inline constexpr int kMaxWorldSize = 4096;

// The one check of that bound: OK when `world_size` is in
// [1, kMaxWorldSize]; otherwise InvalidArgument, one line that starts with
// `what` (ValidateTopology's "topology: world_size", the planner CLI's
// "--world_size") and says the range and the value. For callers that must
// refuse a world before they hold a whole topology (the CLI, before it reads
// anything).
absl::Status ValidateWorldSize(absl::string_view what, int world_size);

// The machines a plan is for (TorchRec's Topology), with the storage
// reservation and the step's batch size. Bandwidths are bytes per second.
// A plain struct: copy it freely.
struct Topology {
  int world_size = 1;
  // Ranks per host; 0 means world_size (one host).
  int local_world_size = 0;
  // True: ranks compute on GPUs, every table in HBM. False: CPU ranks,
  // every table in DDR. (The trainer builds every shard on the rank's
  // device: no table lives in host memory behind a device cache.)
  bool gpu = false;
  int64_t hbm_bytes = 0;  // per rank (GPU only)
  int64_t ddr_bytes = 0;  // per rank: the host's memory / local_world_size

  // Memory bandwidths of a lookup (TorchRec's HBM_MEM_BW and DDR_MEM_BW).
  double hbm_bw = 897e9;
  double ddr_bw = 51e9;
  // Communication bandwidths (INTRA_NODE_BANDWIDTH, CROSS_NODE_BANDWIDTH).
  // Defaults: TorchRec's for GPUs (600 and 12.5 GB/s); for CPUs, see
  // DefaultTopology.
  double intra_host_bw = 600e9;
  double inter_host_bw = 12.5e9;

  // STORAGE_RESERVE_PERCENT: this share of every rank's memory is kept back
  // (TorchRec's HeuristicalStorageReservation, default 0.15), besides the
  // dense parameters and the KJT buffers (see StorageReservation).
  double storage_reserve_percent = 0.15;
  // Examples per rank and step (the trainer's data.batch_size).
  int64_t batch_size = 512;
  // Backward compute relative to forward (TorchRec's BWD_COMPUTE_MULTIPLIER;
  // backward includes the fused optimizer's update).
  double bwd_compute_multiplier = 2;
  // Forward time per ID looked up, on top of its bytes (0 in TorchRec's
  // model, where an ID costs its 8 bytes; CPU kernels spend far more per ID
  // than its bytes: sorting, gathering and scattering rows).
  double lookup_seconds_per_id = 0;

  int hosts() const {
    const int local = ranks_per_host();
    return (world_size + local - 1) / local;
  }
  int ranks_per_host() const {
    return local_world_size > 0 ? local_world_size : world_size;
  }
  int host_of(int rank) const { return rank / ranks_per_host(); }
  // The bandwidth of a collective among all ranks: inter-host when the
  // world spans hosts.
  double world_comms_bw() const {
    return hosts() > 1 ? inter_host_bw : intra_host_bw;
  }
  // What a rank offers in total, before any reservation.
  Storage capacity() const { return Storage{gpu ? hbm_bytes : 0, ddr_bytes}; }
};

// A topology of `world_size` ranks with the defaults for the device kind:
// GPUs keep TorchRec's constants; CPU ranks take what
// `tests/bench:planner_ranking_bench --calibrate` measured on the 2-core
// development machines (docs/planner.md): Gloo over TCP loopback within a
// host, 1.25 GB/s across hosts (10 GbE), and the lookup kernels' throughput
// per byte and per ID and their backward / forward ratio.
Topology DefaultTopology(int world_size, bool gpu);

// InvalidArgument naming the field: world size < 1 or > kMaxWorldSize,
// local world size < 0 or not dividing the world size, a capacity or
// bandwidth not positive (HBM on a GPU topology only), a reserve percentage
// outside [0, 1), a batch size < 1.
absl::Status ValidateTopology(const Topology& topology);

// Overrides from the environment, in TorchRec's unit (bytes per
// millisecond) and names: INTRA_NODE_BANDWIDTH, CROSS_NODE_BANDWIDTH,
// HBM_MEM_BW, DDR_MEM_BW; BWD_COMPUTE_MULTIPLIER, STORAGE_RESERVE_PERCENT
// (a fraction), and LOOKUP_NS_PER_ID (nanoseconds). Unset or
// empty variables leave the field alone. InvalidArgument naming the
// variable when one is not a number; the result is not validated (see
// ValidateTopology). `tests/bench:planner_ranking_bench --calibrate`
// measures the bandwidths of this machine and prints these variables.
absl::Status ApplyTopologyEnvironment(Topology* topology);

// The host's physical memory in bytes (sysconf), 0 when unknown.
int64_t HostMemoryBytes();

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_TOPOLOGY_H_
