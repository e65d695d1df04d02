#ifndef DELTASTREAM_TRAINER_COMM_LOCAL_LAUNCHER_H_
#define DELTASTREAM_TRAINER_COMM_LOCAL_LAUNCHER_H_

#include <csignal>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace deltastream {

// What `torchrun --standalone --nproc_per_node=N` does, for a binary that
// launches its own ranks (the trainer's --nproc_per_node).
struct LocalLaunchOptions {
  // Ranks to start, >= 1. Each is a process forked at once and waited for:
  // the caller bounds it (the trainer's --nproc_per_node, at most the
  // planner's kMaxWorldSize, is refused past it before anything starts).
  int nproc_per_node = 1;
  // The command every rank runs, argv[0] included, and the file it
  // executes (empty: argv[0]).
  std::vector<std::string> argv;
  std::string executable;
  // Rank 0 hosts the c10d store here; port 0: a port free at each launch.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // After a rank fails, the group is stopped and started again this many
  // times (torchrun's --max_restarts; TORCHELASTIC_RESTART_COUNT counts).
  int max_restarts = 0;
  // How long ranks get to exit after SIGTERM before SIGKILL.
  absl::Duration grace = absl::Seconds(30);
  // Receives the launcher's lines ("rank 1 exited with code 1").
  std::function<void(const std::string&)> log;
  // The ranks bind themselves to cores of their own (the trainer's
  // --bind_cores) and size their intra-op threads to them
  // (BindToLocalRankCores): the launcher sets no OMP_NUM_THREADS.
  bool bind_cores = false;
  // A rank's exit status for "stopped before the run's end, everything
  // saved" (the trainer's --stopped_exit_code; 0: none of its own). Not a
  // failure: the group is not restarted, and the launcher exits with it.
  int stopped_exit_code = 0;
  // A rank's exit status for "failed because another rank did" (the
  // trainer's --peer_failure_exit_code; 0: none of its own). A failure like
  // any other, except for which code the launcher returns.
  int peer_failure_exit_code = 0;
};

// A TCP port of the IPv4 `address` (not one: 127.0.0.1) that was free a
// moment ago, as `torchrun --standalone` picks its store's; 0 when none
// could be bound.
int FreeTcpPort(const std::string& address = "127.0.0.1");

// torchrun's default for a rank's intra-op threads: with more than one rank
// per node, each rank gets OMP_NUM_THREADS=1 unless the launcher's own
// environment sets OMP_NUM_THREADS (`inherited`, getenv's value, may be
// null), which the ranks then inherit. LibTorch sizes its intra-op pool
// (at::get_num_threads) from OMP_NUM_THREADS when a process starts; left to
// its default of one thread per core, N ranks would run N threads per core
// in every parallel op, whose regions then wait for each other's preempted
// threads. Ranks that bind themselves to cores of their own (`bind_cores`)
// get nothing set: each runs one thread per core it is bound to
// (BindToLocalRankCores), where one would leave the rest idle. Returns the
// value each rank gets, or nullopt to set nothing.
std::optional<std::string> RankOmpNumThreads(int nproc_per_node,
                                             const char* inherited,
                                             bool bind_cores = false);

// Starts nproc_per_node processes of `argv`, each with torchrun's
// environment (RANK = LOCAL_RANK = r, WORLD_SIZE = LOCAL_WORLD_SIZE = N,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, OMP_NUM_THREADS as
// RankOmpNumThreads says, logged once; the rest of the environment
// inherited, the signal mask cleared), and waits for them.
//
// - Every rank exits 0 or `stopped_exit_code`: returns 0, or that code when
//   a rank exited with it (the ranks stop together).
// - A rank fails (non-zero exit, or killed by a signal): the others get
//   SIGTERM, then SIGKILL after `grace`. When a rank exited 2 (it refused
//   its command line, config or files) returns 2, with no restart (the same
//   input would be refused again; the others' failures follow from its
//   leaving, whichever exited first). Otherwise, with restarts left, the
//   group is started again; else returns the exit code of the attempt's
//   first failed rank (1 when it was killed by a signal), passing over
//   ranks that exited `peer_failure_exit_code` unless every failed rank
//   did (then that code: the fault lies with ranks of another launcher).
//   A rank killed by a signal counts as at fault, even the launcher's own
//   SIGKILL after the grace period (a hung rank is the likelier fault than
//   one slow to follow another's failure).
// - A signal in `signals` (blocked by the caller: BlockTerminationSignals)
//   is forwarded to every rank, which then stops as it would alone; a
//   second one SIGKILLs them. Returns 0 when they then all exit 0 (no
//   restart after a requested stop).
// - The launcher itself dies (SIGKILL, a crash): the kernel SIGKILLs every
//   rank (PR_SET_PDEATHSIG); no rank outlives its launcher.
//
// Call from the main thread, before any other thread is started: it forks.
int RunLocalRanks(const LocalLaunchOptions& options, const sigset_t& signals);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_COMM_LOCAL_LAUNCHER_H_
