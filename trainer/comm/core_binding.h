#ifndef DELTASTREAM_TRAINER_COMM_CORE_BINDING_H_
#define DELTASTREAM_TRAINER_COMM_CORE_BINDING_H_

#include <vector>

#include "absl/status/statusor.h"

namespace deltastream {

// Binding each local rank of a node to cores of its own (the trainer's
// --bind_cores), so that a rank's threads (training, input distribution,
// c10d's, the tracker service's) stay where their caches are and do not
// preempt another rank's training thread. Like torchrun's NUMA binding, but
// by core: the node's cores are split, not its memory nodes.

// The cores local rank `local_rank` of `local_world_size` gets from
// `allowed` (the cores the process may run on, ascending): `allowed` split
// into local_world_size contiguous groups as evenly as can be (the first
// allowed.size() % local_world_size groups one core larger), group
// `local_rank`. With fewer cores than ranks, rank r gets core
// allowed[r % allowed.size()] and ranks share. Empty when `allowed` is.
std::vector<int> LocalRankCores(const std::vector<int>& allowed, int local_rank,
                                int local_world_size);

// The cores this thread may run on now (sched_getaffinity), ascending.
absl::StatusOr<std::vector<int>> AllowedCores();

// Binds the calling thread, and every thread it starts afterwards, to
// LocalRankCores(AllowedCores(), local_rank, local_world_size); returns
// those cores. A rank of several (local_world_size > 1) also gets one
// LibTorch intra-op thread per bound core unless the environment sets
// OMP_NUM_THREADS (torchrun sets 1; the trainer's own launcher leaves it to
// this): the cores are the rank's own, and one thread would leave the rest
// idle. (The one rank of a node is bound to every allowed core, and keeps
// LibTorch's default.) Threads started before keep their affinity: call it
// first thing in main. InvalidArgument for local_rank outside
// [0, local_world_size); Internal when the kernel refuses.
absl::StatusOr<std::vector<int>> BindToLocalRankCores(int local_rank,
                                                      int local_world_size);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_COMM_CORE_BINDING_H_
