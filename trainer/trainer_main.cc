// The trainer: trains a recommendation model (DLRM or a sequence model) on
// synthetic or Criteo data, records every embedding lookup into the tracker,
// and serves the deltas in-process over gRPC.
//
//   trainer [--config=FILE] [--steps=N] [--listen=HOST:PORT] [--device=D]
//           [--checkpoint_dir=DIR] [--mode=M] [--consumers=a,b]
//           [--nproc_per_node=N] [--plan=FILE] [--bind_cores]
//
// Several ranks: under torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: torchrun, a Kubernetes
// manifest, or --nproc_per_node=N, which starts N local ranks of this binary
// itself as `torchrun --standalone` would) the process is one rank of a
// sharded run: its tables sharded by --plan (default: table-wise round
// robin), rank r training its share of each global batch of
// N x data.batch_size examples, so the run trains what one process of that
// global batch would. Rank 0 prints the progress lines (figures over all
// ranks); every rank serves its tracker at PORT + LOCAL_RANK. --bind_cores
// gives each local rank cores of its own.
//
// Without --config it runs the embedded defaults (proto/trainer_config.proto:
// DLRM, 8 tables of 100000 x 16, synthetic Zipf data, CPU, 300 steps); flags
// override the config's fields. Prints "listening on HOST:PORT" on stdout
// once the service is up (port 0 picks a free one), progress lines on
// stderr, and a summary on stdout at the end. SIGTERM or SIGINT ends the run
// after the current step, with a final snapshot and checkpoint (before
// training has started: at once, exit code 128 + the signal). Exit codes:
// 0 done (or stopped, everything saved), 1 training failed (or its start,
// for what a restart may not meet: an I/O error, memory), 2 bad config, flags
// or inputs (base/process.h, StartFailureExitCode); --stopped_exit_code gives a
// stop before the run's end a code of its own, for schedulers that must not
// count it as the run's completion (a Kubernetes Job, deploy/k8s/trainer.yaml),
// and --peer_failure_exit_code a rank that failed only because another rank did
// (died, hung, or left with a failure of its own), for schedulers that count
// failures per rank.
#include <ATen/Parallel.h>
#include <google/protobuf/text_format.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/command_line.h"
#include "base/grpc_server.h"
#include "base/host_memory.h"
#include "base/host_port.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/process.h"
#include "base/rpc_metrics.h"
#include "tracker_service/names.h"
#include "tracker_service/tracker_metrics.h"
#include "trainer/comm/core_binding.h"
#include "trainer/comm/local_launcher.h"
#include "trainer/comm/process_group.h"
#include "trainer/comm/torchrun_env.h"
#include "trainer/config.h"
#include "trainer/config_defaults.h"
#include "trainer/planner/topology.h"
#include "trainer/sharding/sharding_plan.h"
#include "trainer/trainer.h"
#include "trainer/trainer_metrics.h"

ABSL_FLAG(std::string, config, "",
          "trainer config, protobuf text format (empty: embedded defaults)");
ABSL_FLAG(int64_t, steps, 0, "override: steps to train (-1: until stopped)");
ABSL_FLAG(std::string, listen, "",
          "override: tracker service address, HOST:PORT");
ABSL_FLAG(std::string, device, "", "override: cpu, cuda or cuda:N");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "override: snapshots and checkpoints directory");
ABSL_FLAG(std::string, mode, "", "override: tracking mode (or off)");
ABSL_FLAG(std::string, consumers, "",
          "override: comma-separated consumer names, no empty one (empty: "
          "the config's)");
ABSL_FLAG(double, drain_s, -1,
          "override: seconds to keep serving after training until every "
          "consumer has read the final batch");
ABSL_FLAG(int, nproc_per_node, 0,
          "start this many local ranks of this binary (torchrun --standalone "
          "--nproc_per_node), at most the planner's largest world "
          "(trainer/planner/topology.h); 0: run as the one process (or the "
          "rank) that the environment says");
ABSL_FLAG(int, master_port, 0,
          "with --nproc_per_node: the c10d store's port (0: a free one)");
ABSL_FLAG(int, max_restarts, 0,
          "with --nproc_per_node: restarts of the group after a rank fails");
ABSL_FLAG(std::string, plan, "",
          "override: sharding plan file (protobuf text) for several ranks");
ABSL_FLAG(double, collective_timeout_s, 60,
          "several ranks: how long a collective waits for the other ranks "
          "before the run fails, naming the missing one");
ABSL_FLAG(bool, bind_cores, false,
          "several ranks: bind each local rank (and its threads) to its own "
          "1/LOCAL_WORLD_SIZE of the cores the process may use "
          "(trainer/comm/core_binding.h); with --nproc_per_node each rank "
          "also gets one intra-op thread per core of its own");
ABSL_FLAG(int, stopped_exit_code, 0,
          "exit status of a run that a stop request (SIGTERM or SIGINT, on "
          "any rank) ended before its step budget and the data's end, with "
          "everything saved: 0, or 3..125 for a scheduler that must restart "
          "the run rather than count it done (deploy/k8s/trainer.yaml)");
ABSL_FLAG(int, peer_failure_exit_code, 0,
          "several ranks: exit status of a rank whose run failed because of "
          "another rank (one that died, hung or left the group with a "
          "failure of its own), so that a scheduler counts only the rank at "
          "fault: 0 (exit 1 as any failure), or 3..125 and not "
          "--stopped_exit_code (deploy/k8s/trainer.yaml)");
ABSL_FLAG(std::string, restore_chain, "",
          "override: checkpoint chain to start from when the checkpoint dir "
          "has no checkpoint of its own");

namespace deltastream {
namespace {

// `address` (a listen flag's value, `what` naming it) as the `ranks` local
// ranks each serve it, on its port plus their local rank: every one must
// exist and be free now. OK for an empty address or port 0 (each rank picks
// a free port).
absl::Status CheckRankPorts(absl::string_view what, const std::string& address,
                            int ranks) {
  absl::StatusOr<HostPort> listen = SplitHostPort(address);
  if (address.empty() || !listen.ok() || listen->port == 0) {
    return absl::OkStatus();
  }
  if (listen->port + ranks - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " address ", address, " leaves no port for local rank ",
        65536 - listen->port, " (each rank serves on the port plus its local ",
        "rank)"));
  }
  for (int r = 0; r < ranks; ++r) {
    if (absl::Status free = CheckCanListen(OffsetPort(address, r));
        !free.ok()) {
      return absl::Status(
          free.code(),
          absl::StrCat("local rank ", r, "'s ", what, ": ", free.message()));
    }
  }
  return absl::OkStatus();
}

// What --nproc_per_node's ranks would each refuse, refused once by the
// launcher: every local rank's service and metrics ports (PORT + local rank)
// must exist and be free now (a port taken after this check is still found
// by the rank that binds it), and a plan file must be a valid plan of the
// model's tables for that many ranks.
absl::Status CheckLaunch(const TrainerSettings& settings) {
  const int ranks = absl::GetFlag(FLAGS_nproc_per_node);
  if (settings.serve) {
    if (absl::Status s =
            CheckRankPorts("service", settings.service.listen, ranks);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckRankPorts(
          "--metrics_listen", absl::GetFlag(FLAGS_metrics_listen), ranks);
      !s.ok()) {
    return s;
  }
  if (ranks > 1 && settings.device.is_cuda() && settings.device_index_given) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", settings.device.str(), " for each of ", ranks,
        " ranks: NCCL needs a GPU per rank; device \"cuda\" gives each rank "
        "cuda:LOCAL_RANK"));
  }
  if (!settings.plan_path.empty()) {
    absl::StatusOr<v1::ShardingPlan> plan =
        ReadShardingPlan(settings.plan_path);
    if (!plan.ok()) return plan.status();
    if (plan->world_size() != ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharding plan '", settings.plan_path, "' is for world size ",
          plan->world_size(), ", --nproc_per_node starts ", ranks, " ranks"));
    }
    // The check each rank's sharded collection makes (DLRM's is pooled).
    if (absl::Status valid = ValidateShardingPlan(
            *plan, settings.tables, ranks,
            /*pooled=*/settings.model_kind == ModelKind::kDlrm);
        !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad sharding plan '", settings.plan_path, "': ", valid.message()));
    }
  }
  return absl::OkStatus();
}

// --nproc_per_node: this process launches the ranks and trains nothing.
int LaunchRanks(int argc, char** argv, const sigset_t& signals) {
  LocalLaunchOptions options;
  options.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.bind_cores = absl::GetFlag(FLAGS_bind_cores);
  options.stopped_exit_code = absl::GetFlag(FLAGS_stopped_exit_code);
  options.peer_failure_exit_code = absl::GetFlag(FLAGS_peer_failure_exit_code);
  // This very binary, under the name it was started by (the ranks' lines
  // begin with it).
  options.executable = "/proc/self/exe";
  options.argv.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) options.argv.push_back(argv[i]);
  options.log = [](const std::string& line) {
    std::fprintf(stderr, "trainer launcher: %s\n", line.c_str());
  };
  // The ranks inherit our stdout; flush what we printed before forking.
  std::fflush(stdout);
  std::fflush(stderr);
  return RunLocalRanks(options, signals);
}

// Watches for SIGTERM and SIGINT (blocked by BlockTerminationSignals) from
// construction to destruction. Once training has started a signal asks the
// run to stop after the current step (stop()), and a second one ends the
// process at once (TerminationWatch): the user will not wait for the stop to
// finish (the final checkpoint, the consumers' drain), as the launcher
// SIGKILLs its ranks on a second one. Before training a signal ends the
// process at once with 128 + the signal, as the signal's default action
// would: nothing is trained and nothing needs saving yet, and a rank
// waiting for a group that will never form (another rank failed to start)
// must not hold its launcher until the grace period ends.
class SignalWatch {
 public:
  explicit SignalWatch(const sigset_t& signals)
      : watch_(
            signals, [this](int signal) { First(signal); },
            [this](int signal) {
              log_(absl::StrFormat(
                  "signal %d again: exiting now, without finishing the stop",
                  signal));
            }) {}

  void TrainingStarted(std::function<void(const std::string&)> log) {
    log_ = std::move(log);
    training_.store(true);
  }
  const std::atomic<bool>& stop() const { return stop_; }

 private:
  void First(int signal) {
    if (!training_.load()) {
      std::fprintf(stderr,
                   "trainer: signal %d before training started: exiting\n",
                   signal);
      std::fflush(stderr);
      std::_Exit(128 + signal);
    }
    log_(absl::StrFormat("signal %d: stopping after this step", signal));
    stop_.store(true);
  }

  std::atomic<bool> training_{false}, stop_{false};
  // Set before training_ and read only after it.
  std::function<void(const std::string&)> log_;
  // Last: its thread starts once the members above exist.
  TerminationWatch watch_;
};

// The flags' own checks (those that override the config are checked when
// given, whatever the value), then the config with the overrides (resolved
// by ResolveTrainerConfig: everything a bad command line or config can be
// refused for before any rank starts). InvalidArgument (or the config
// file's error) as one line.
absl::StatusOr<v1::TrainerConfig> ConfigFromCommandLine() {
  if (FlagGiven("steps")) {
    const int64_t steps = absl::GetFlag(FLAGS_steps);
    if (steps == 0 || steps < -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--steps must be >= 1, or -1 to train until stopped; got ", steps));
    }
  }
  if (FlagGiven("drain_s") && (!(absl::GetFlag(FLAGS_drain_s) >= 0) ||
                               !std::isfinite(absl::GetFlag(FLAGS_drain_s)))) {
    return absl::InvalidArgumentError("--drain_s must be finite and >= 0");
  }
  const double timeout = absl::GetFlag(FLAGS_collective_timeout_s);
  if (!(timeout > 0) || !std::isfinite(timeout)) {
    return absl::InvalidArgumentError(
        "--collective_timeout_s must be a number of seconds > 0");
  }
  // Every local rank is forked at once: bounded by the largest world a
  // sharding plan is for, refused before any rank starts.
  if (const int ranks = absl::GetFlag(FLAGS_nproc_per_node);
      ranks < 0 || ranks > planner::kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nproc_per_node must be in [0, ", planner::kMaxWorldSize,
                     "] (the planner's largest world), got ", ranks));
  }
  if (absl::GetFlag(FLAGS_max_restarts) < 0) {
    return absl::InvalidArgumentError("--max_restarts must be >= 0");
  }
  // 1 and 2 already say "failed" and "refused"; above 125 the shells' own
  // codes and 128 + a signal.
  for (const auto& [name, code] :
       {std::pair{"stopped_exit_code", absl::GetFlag(FLAGS_stopped_exit_code)},
        std::pair{"peer_failure_exit_code",
                  absl::GetFlag(FLAGS_peer_failure_exit_code)}}) {
    if (code != 0 && (code < 3 || code > 125)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " must be 0 or in 3..125; got ", code));
    }
  }
  if (const int code = absl::GetFlag(FLAGS_stopped_exit_code);
      code != 0 && code == absl::GetFlag(FLAGS_peer_failure_exit_code)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stopped_exit_code and --peer_failure_exit_code must differ (a "
        "stop saved everything, a peer's failure did not); both are ",
        code));
  }
  if (const int port = absl::GetFlag(FLAGS_master_port);
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError("--master_port must be in 0..65535");
  }
  v1::TrainerConfig config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<v1::TrainerConfig> read = ReadTrainerConfig(path);
    if (!read.ok()) return read.status();
    config = *std::move(read);
  }
  if (FlagGiven("steps")) config.set_steps(absl::GetFlag(FLAGS_steps));
  if (std::string listen = absl::GetFlag(FLAGS_listen); !listen.empty()) {
    config.mutable_tracker()->set_listen(listen);
  }
  if (std::string device = absl::GetFlag(FLAGS_device); !device.empty()) {
    config.set_device(device);
  }
  if (std::string dir = absl::GetFlag(FLAGS_checkpoint_dir); !dir.empty()) {
    config.mutable_checkpoints()->set_dir(dir);
  }
  if (std::string mode = absl::GetFlag(FLAGS_mode); !mode.empty()) {
    config.mutable_tracker()->set_mode(mode);
  }
  if (std::string consumers = absl::GetFlag(FLAGS_consumers);
      !consumers.empty()) {
    config.mutable_tracker()->clear_consumers();
    // Every name counts, as in tracker_server's --consumers: "a,,b" is
    // refused by the name rule (tracker_service/names.h), not read as a,b.
    for (absl::string_view name : absl::StrSplit(consumers, ',')) {
      if (absl::Status valid = ValidateName("consumer name", name);
          !valid.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--consumers: ", valid.message()));
      }
      config.mutable_tracker()->add_consumers(std::string(name));
    }
  }
  if (FlagGiven("drain_s")) {
    config.mutable_tracker()->set_drain_seconds(absl::GetFlag(FLAGS_drain_s));
  }
  if (std::string chain = absl::GetFlag(FLAGS_restore_chain); !chain.empty()) {
    config.mutable_checkpoints()->set_restore_chain(chain);
  }
  if (std::string plan = absl::GetFlag(FLAGS_plan); !plan.empty()) {
    config.mutable_sharding()->set_plan(plan);
  }
  return config;
}

// What every rank of a run must share, as text: the config with its
// defaults, less what is each rank's own (its device, its service's
// address, files it reads by path), and with the plan's content for its
// path. Ranks that differ there run different collectives in the same
// slots (another step count, progress-line or checkpoint schedule, batch,
// model or plan): pairs of 8-byte all-reduces mix silently, others fail
// later with messages that never mention the config.
absl::StatusOr<std::string> SharedConfigText(v1::TrainerConfig config) {
  config = WithTrainerConfigDefaults(std::move(config));
  config.clear_device();
  v1::Tracker& tracker = *config.mutable_tracker();
  tracker.clear_listen();
  tracker.clear_auth_token_file();
  tracker.clear_tls_cert();
  tracker.clear_tls_key();
  v1::Checkpoints& checkpoints = *config.mutable_checkpoints();
  // Where they are is each rank's; whether there are some is the run's.
  if (!checkpoints.dir().empty()) checkpoints.set_dir("(set)");
  if (!checkpoints.restore_chain().empty()) {
    checkpoints.set_restore_chain("(set)");
  }
  if (const std::string path = config.sharding().plan(); !path.empty()) {
    absl::StatusOr<v1::ShardingPlan> plan = ReadShardingPlan(path);
    if (!plan.ok()) return plan.status();
    std::string text;
    google::protobuf::TextFormat::PrintToString(*plan, &text);
    config.mutable_sharding()->set_plan(text);
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  return text;
}

// The first line where `a` (rank `rank_a`'s) and `b` differ.
std::string FirstDifference(const std::string& a, int rank_a,
                            const std::string& b, int rank_b) {
  const std::vector<absl::string_view> lines_a = absl::StrSplit(a, '\n');
  const std::vector<absl::string_view> lines_b = absl::StrSplit(b, '\n');
  for (size_t i = 0;; ++i) {
    absl::string_view line_a = i < lines_a.size() ? lines_a[i] : "(end)";
    absl::string_view line_b = i < lines_b.size() ? lines_b[i] : "(end)";
    if (line_a != line_b || i >= lines_a.size()) {
      return absl::StrCat(
          "rank ", rank_a, " has '", absl::StripAsciiWhitespace(line_a),
          "', rank ", rank_b, " '", absl::StripAsciiWhitespace(line_b), "'");
    }
  }
}

// Every rank's SharedConfigText against rank 0's, through the group's store;
// InvalidArgument on every rank, naming the first rank that differs and how,
// when one does.
absl::Status AgreeOnConfig(const std::string& mine, ProcessGroup& group) {
  const std::string key = "trainer.config/";
  if (absl::Status set = group.StoreSet(absl::StrCat(key, group.rank()), mine);
      !set.ok()) {
    return set;
  }
  absl::StatusOr<std::string> first = group.StoreGet(absl::StrCat(key, 0));
  if (!first.ok()) return first.status();
  absl::StatusOr<int64_t> all_same =
      group.AllReduceMin(*first == mine ? 1 : 0, "config.agree");
  if (!all_same.ok()) return all_same.status();
  if (*all_same == 1) return absl::OkStatus();
  // Every rank set its config before the all-reduce: read at once.
  for (int q = 1; q < group.world_size(); ++q) {
    absl::StatusOr<std::string> theirs = group.StoreGet(absl::StrCat(key, q));
    if (!theirs.ok()) return theirs.status();
    if (*theirs != *first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ranks were given different configs (every rank must run the "
          "same one): ",
          FirstDifference(*first, 0, *theirs, q)));
    }
  }
  return absl::InternalError(
      "the ranks' configs differ, but none from rank 0's");
}

int Main(int argc, char** argv) {
  KeepHostMemoryForReuse();
  const sigset_t signals = BlockTerminationSignals();
  // For the lines its libraries log (snapshots, the tracker, the service);
  // the trainer's own "trainer: ..." lines keep their form.
  if (absl::Status logging = InitLogging("trainer"); !logging.ok()) {
    return Fail(kExitUsage, logging.message());
  }
  absl::StatusOr<v1::TrainerConfig> config = ConfigFromCommandLine();
  if (!config.ok()) {
    return FailStart(config.status());
  }
  absl::StatusOr<TrainerSettings> settings = ResolveTrainerConfig(*config);
  if (!settings.ok()) return Fail(kExitUsage, settings.status());
  if (absl::GetFlag(FLAGS_nproc_per_node) > 0 &&
      std::getenv("RANK") == nullptr) {
    if (absl::Status status = CheckLaunch(*settings); !status.ok()) {
      return FailStart(status);
    }
    return LaunchRanks(argc, argv, signals);
  }
  // One rank of several (torchrun's environment), or one process.
  absl::StatusOr<TorchrunEnvironment> env = TorchrunEnvironmentFromEnv();
  if (!env.ok()) return Fail(kExitUsage, env.status());
  // A world no sharding plan is for is refused before the rendezvous, which
  // would wait its whole timeout for ranks that never come.
  if (absl::Status status =
          planner::ValidateWorldSize("WORLD_SIZE", env->world_size);
      !status.ok()) {
    return Fail(kExitUsage, status);
  }
  // Before any thread starts: threads inherit the binding.
  if (absl::GetFlag(FLAGS_bind_cores)) {
    absl::StatusOr<std::vector<int>> cores =
        BindToLocalRankCores(env->local_rank, env->local_world_size);
    if (!cores.ok()) return Fail(kExitFailure, cores.status());
    // The intra-op pool starts here, on the bound cores.
    const int threads = at::get_num_threads();
    const std::string hint =
        env->local_world_size > 1 && threads < static_cast<int>(cores->size())
            ? absl::StrCat(" (OMP_NUM_THREADS=", cores->size(),
                           " would use every one)")
            : "";
    std::fprintf(stderr,
                 "trainer: local rank %d of %d bound to cores %s, %d intra-op "
                 "thread(s)%s\n",
                 env->local_rank, env->local_world_size,
                 absl::StrJoin(*cores, ",").c_str(), threads, hint.c_str());
  }
  SignalWatch signal_watch(signals);

  std::unique_ptr<ProcessGroup> group;
  // A failed run's exit status: --peer_failure_exit_code when the group
  // failed because of another rank, else 1.
  const auto failure_code = [&group] {
    const int peer_code = absl::GetFlag(FLAGS_peer_failure_exit_code);
    return peer_code != 0 && group != nullptr && group->failed_elsewhere()
               ? peer_code
               : kExitFailure;
  };
  const bool ranked = std::getenv("RANK") != nullptr;
  if (ranked) {
    settings->device = LocalRankDevice(*settings, env->local_rank);
    ProcessGroupOptions options;
    options.env = *env;
    options.device = settings->device;
    options.timeout = absl::Seconds(absl::GetFlag(FLAGS_collective_timeout_s));
    absl::StatusOr<std::unique_ptr<ProcessGroup>> made =
        ProcessGroup::Create(options);
    if (!made.ok()) {
      // Ranks launched so that they cannot form a group (different
      // WORLD_SIZEs, one RANK twice) are refused: a restart would be too.
      // A rendezvous that timed out or lost its store is a failure.
      return FailStart(made.status());
    }
    group = *std::move(made);
    absl::StatusOr<std::string> shared = SharedConfigText(*config);
    absl::Status agreed =
        shared.ok() ? AgreeOnConfig(*shared, *group) : shared.status();
    if (!agreed.ok()) {
      // A plan it cannot read as its error says (a missing or bad one is
      // refused, 2; a read error is not); refused for configs the ranks do
      // not share; a store or collective that failed (a peer lost while the
      // ranks started) is a failure as any other, not the config's.
      const int code = !shared.ok() ? StartFailureExitCode(shared.status())
                       : agreed.code() == absl::StatusCode::kInvalidArgument &&
                               !group->failed()
                           ? kExitUsage
                           : failure_code();
      return Fail(code,
                  absl::StrCat("rank ", env->rank, ": ", agreed.message()));
    }
    settings->group = group.get();
    settings->service.listen =
        OffsetPort(settings->service.listen, env->local_rank);
  } else if (!settings->plan_path.empty()) {
    return Fail(kExitUsage,
                "--plan needs several ranks (--nproc_per_node or torchrun)");
  }
  const int rank = ranked ? env->rank : 0;
  // Metrics (--metrics_listen): the trainer's steps, its service's RPCs and
  // its tracker. Declared before the trainer, so they outlive it.
  auto registry = std::make_shared<prometheus::Registry>();
  RpcMetrics rpc_metrics(*registry);
  TrainerMetrics trainer_metrics(*registry);
  settings->service.rpc_metrics = &rpc_metrics;
  settings->metrics = &trainer_metrics;

  // Rank 0 speaks for the run (its figures are the run's); the others
  // report only their failures.
  auto log = [rank](const std::string& line) {
    if (rank == 0) std::fprintf(stderr, "trainer: %s\n", line.c_str());
  };
  // A rank that fails on its own tells the others why before it exits (they
  // would otherwise wait out the collective timeout for a rank they take for
  // dead or hung).
  const auto fail = [&group, rank](int exit_code, const absl::Status& status) {
    if (group == nullptr) return Fail(exit_code, status);
    group->Leave(status);
    return Fail(exit_code, absl::StrCat("rank ", rank, ": ", status.message()));
  };
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(*std::move(settings), log);
  if (!trainer.ok()) {
    // Refused (2) for what it was given (a bad checkpoint, an address in
    // use), a failure (1) for what a restart may not meet (an I/O error, out
    // of memory), and a collective's failure as the group's: the fault is
    // then another rank's, or the network's.
    const bool group_failed = group != nullptr && group->failed();
    return fail(
        group_failed ? failure_code() : StartFailureExitCode(trainer.status()),
        trainer.status());
  }
  std::shared_ptr<TrackerMetrics> tracker_metrics;
  if ((*trainer)->tracker() != nullptr) {
    tracker_metrics = std::make_shared<TrackerMetrics>((*trainer)->tracker(),
                                                       (*trainer)->snapshots());
  }
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
      StartMetricsFromFlags(registry, ranked ? env->local_rank : 0);
  if (!metrics.ok()) {
    return fail(StartFailureExitCode(metrics.status()), metrics.status());
  }
  if (*metrics != nullptr) {
    if (tracker_metrics != nullptr) (*metrics)->Add(tracker_metrics);
    // Every rank's: with port 0 each has a port of its own.
    std::fprintf(stderr, "trainer: %smetrics on http://%s/metrics\n",
                 ranked ? absl::StrCat("rank ", rank, ": ").c_str() : "",
                 (*metrics)->address().c_str());
  }
  if (std::string address = (*trainer)->service_address(); !address.empty()) {
    std::printf("listening on %s\n", address.c_str());
    std::fflush(stdout);
  }

  signal_watch.TrainingStarted(log);
  absl::StatusOr<TrainerProgress> progress =
      (*trainer)->Run(signal_watch.stop(), (*trainer)->settings().steps);
  (*trainer)->StopService();
  if (!progress.ok()) return fail(failure_code(), progress.status());
  const int exit_code =
      progress->stopped ? absl::GetFlag(FLAGS_stopped_exit_code) : 0;
  if (rank != 0) return exit_code;

  const double seconds = absl::ToDoubleSeconds(progress->elapsed);
  absl::PrintF(
      "trained %d steps (%d this run, %d examples in %.1f s, %.0f ex/s); "
      "final loss %.4f%s\n",
      progress->step, progress->steps_this_run, progress->examples_this_run,
      seconds, seconds > 0 ? progress->examples_this_run / seconds : 0.0,
      progress->loss,
      progress->eval_auc.has_value()
          ? absl::StrFormat(", eval auc %.4f", *progress->eval_auc)
          : "");
  return exit_code;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trains a recommendation model and serves its embedding deltas; see "
      "--helpfull");
  if (std::optional<int> exit_code =
          deltastream::HandleCommandLine(argc, argv)) {
    return *exit_code;
  }
  return deltastream::Main(argc, argv);
}
