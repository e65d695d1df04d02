#include "trainer/comm/core_binding.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deltastream {

std::vector<int> LocalRankCores(const std::vector<int>& allowed, int local_rank,
                                int local_world_size) {
  const int cores = static_cast<int>(allowed.size());
  if (cores == 0 || local_world_size <= 0) return {};
  if (cores < local_world_size) return {allowed[local_rank % cores]};
  const int size = cores / local_world_size;
  const int larger = cores % local_world_size;  // groups of size + 1 first
  const int begin = local_rank * size + std::min(local_rank, larger);
  const int end = begin + size + (local_rank < larger ? 1 : 0);
  return std::vector<int>(allowed.begin() + begin, allowed.begin() + end);
}

absl::StatusOr<std::vector<int>> AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(
        absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  std::vector<int> cores;
  for (int core = 0; core < CPU_SETSIZE; ++core) {
    if (CPU_ISSET(core, &set)) cores.push_back(core);
  }
  return cores;
}

absl::StatusOr<std::vector<int>> BindToLocalRankCores(int local_rank,
                                                      int local_world_size) {
  if (local_world_size < 1 || local_rank < 0 ||
      local_rank >= local_world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local rank ", local_rank, " is not one of ",
                     local_world_size, " local ranks"));
  }
  absl::StatusOr<std::vector<int>> allowed = AllowedCores();
  if (!allowed.ok()) return allowed.status();
  std::vector<int> cores =
      LocalRankCores(*allowed, local_rank, local_world_size);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int core : cores) CPU_SET(core, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InternalError(
        absl::StrCat("sched_setaffinity: ", std::strerror(errno)));
  }
  if (local_world_size > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    at::set_num_threads(static_cast<int>(cores.size()));
  }
  return cores;
}

}  // namespace deltastream
