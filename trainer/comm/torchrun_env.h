#ifndef DELTASTREAM_TRAINER_COMM_TORCHRUN_ENV_H_
#define DELTASTREAM_TRAINER_COMM_TORCHRUN_ENV_H_

#include <string>

#include "absl/status/statusor.h"

namespace deltastream {

// Where a rank is and how it meets the others, as torchrun (or a Kubernetes
// manifest imitating it) tells it through the environment.
struct TorchrunEnvironment {
  int rank = 0;              // RANK
  int world_size = 1;        // WORLD_SIZE
  int local_rank = 0;        // LOCAL_RANK (default: rank)
  int local_world_size = 1;  // LOCAL_WORLD_SIZE (default: world_size)
  // The c10d TCPStore's address: rank 0 hosts it, unless use_agent_store.
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR
  int master_port = 0;  // MASTER_PORT; 0 (world size 1 only): any free port
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store and
  // every rank is a client; keys live under
  // "/worker/attempt_<restart_count>" (TORCHELASTIC_RESTART_COUNT).
  bool use_agent_store = false;
  int restart_count = 0;
};

// Reads the variables above. With none of RANK, WORLD_SIZE and MASTER_PORT
// set, a one-process group (the defaults). InvalidArgument, naming the
// variable, for a value that is not a number, out of range (rank outside
// [0, world_size), local_rank outside [0, local_world_size), a port outside
// [0, 65535], port 0 with world_size > 1), or a partial set (RANK without
// WORLD_SIZE, or the reverse).
absl::StatusOr<TorchrunEnvironment> TorchrunEnvironmentFromEnv();

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_COMM_TORCHRUN_ENV_H_
