// The checkpoint job: pulls deltas on a schedule as its own consumer and
// writes incremental checkpoints (clients/checkpoint_chain.h) into a
// directory, one link per pull that brought new batches.
//
//   checkpoint_job --target=HOST:PORT --consumer=checkpoint --dir=D
//       [--every_ms=1000] [--count=0] [--compact_every=0] [--dense=true]
//       [--retry_s=60] [--token_file=F] [--tls_ca=F]
//       [--metrics_listen=HOST:PORT] [--log_format=text|json]
//       [--log_level=info]
//
// The first link is a full one, from a read of every row (all_rows): the
// trainer's whole tables at its end batch, whenever the consumer started.
// Then one increment per pull, continuing where the chain ends; every link
// carries the model's dense parameters unless --dense=false. With the
// tracker's acknowledged reads, a pull is committed only once its link is on
// disk: a job killed in between reads the same batches again and writes only
// the part its chain lacks, so nothing is missed and nothing applied twice.
//
// The chain starts again with a full read, said on stdout, when a read cannot
// continue it: the service dropped rows the job had not read
// (resync_required), or the read starts after the chain's end. When the
// trainer restarted from a snapshot older than the chain's end (a new run id
// whose start batch is before it), the links after that batch hold changes
// the trainer lost: they are removed (each printed) before going on.
// SIGTERM/SIGINT end it soon: a read in progress is cancelled (it was not
// committed), a link being written is finished first (a second signal: at
// once, with 128 + the signal). Exit codes, with one line: 0 done; 2 bad
// flags, a chain refused at start (its links broken: missing or
// overlapping), or a refusal a restart would meet again (a consumer name or
// token the trainer refuses, a chain the trainer's run cannot continue); 1
// any other failure (an unreachable service, a trainer restarting, and a
// stopped or hung one, each retried for --retry_s first: 60 s unless told;
// a stream cut short; a full disk); a chain that cannot be read at start is
// the OS error's code (StartFailureExitCode: EIO 1).
// --metrics_listen serves Prometheus metrics (clients/checkpoint_job_metrics.h;
// its address is logged: "metrics on http://HOST:PORT/metrics").
// The job itself: clients/checkpoint_job.h; this file holds flags and main.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/command_line.h"
#include "base/host_memory.h"
#include "base/host_port.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/process.h"
#include "clients/checkpoint_job.h"
#include "clients/checkpoint_job_metrics.h"
#include "clients/delta_client.h"
#include "clients/fan_in_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "tracker HOST:PORT");
ABSL_FLAG(std::string, consumer, "checkpoint", "the job's consumer name");
ABSL_FLAG(std::string, dir, "", "the checkpoint chain's directory");
ABSL_FLAG(int64_t, every_ms, 1000, "pull period");
ABSL_FLAG(int64_t, count, 0, "stop after N links (0: never)");
ABSL_FLAG(int64_t, compact_every, 0,
          "compact the chain into one full link every N links (0: never)");
ABSL_FLAG(bool, dense, true,
          "store the model's dense parameters in every link");
ABSL_FLAG(int64_t, retry_s, 60,
          "keep retrying an unreachable or silent service for this long (a "
          "trainer restarting, stopped or hung) before failing; 0: fail at "
          "once");
ABSL_FLAG(std::string, token_file, "", "bearer token (first line)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots: connect with TLS");

namespace deltastream {
namespace {

int Main() {
  // Received deltas reuse freed memory instead of faulting in fresh pages.
  KeepHostMemoryForReuse();
  // Before any thread (gRPC's, the metrics server's) exists.
  const sigset_t signals = BlockTerminationSignals();
  if (absl::Status logging = InitLogging("checkpoint_job"); !logging.ok()) {
    return Fail(kExitUsage, logging.message());
  }
  CheckpointJobOptions options;
  options.dir = absl::GetFlag(FLAGS_dir);
  options.consumer = absl::GetFlag(FLAGS_consumer);
  options.every_ms = absl::GetFlag(FLAGS_every_ms);
  options.count = absl::GetFlag(FLAGS_count);
  options.compact_every = absl::GetFlag(FLAGS_compact_every);
  options.dense = absl::GetFlag(FLAGS_dense);
  options.retry_s = absl::GetFlag(FLAGS_retry_s);
  if (absl::Status valid = ValidateCheckpointJobOptions(options); !valid.ok()) {
    return Fail(kExitUsage, valid);
  }
  const std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) return Fail(kExitUsage, "--target must not be empty");
  if (absl::Status valid = ValidateTarget(target); !valid.ok()) {
    return Fail(kExitUsage, valid);
  }
  ClientOptions client_options;
  if (absl::Status read =
          ReadCredentialFiles(absl::GetFlag(FLAGS_token_file),
                              absl::GetFlag(FLAGS_tls_ca), client_options);
      !read.ok()) {
    return FailStart(read);
  }
  CheckpointJob job(options, FanInClient::Connect(target, client_options),
                    stdout);
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = std::make_shared<CheckpointJobMetrics>(&job);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics_endpoint =
      StartMetricsFromFlags(registry);
  if (!metrics_endpoint.ok()) {
    return Fail(kExitUsage, metrics_endpoint.status().message());
  }
  if (*metrics_endpoint != nullptr) {
    (*metrics_endpoint)->Add(metrics);
    LogInfo(absl::StrCat("metrics on http://", (*metrics_endpoint)->address(),
                         "/metrics"));
  }
  // A signal while the chain is opened (its checksums read) stops the job
  // before its first pull.
  TerminationWatch watch(
      signals,
      [&job](int signal) {
        LogInfo(absl::StrCat("signal ", signal, ": stopping"));
        job.Stop();
      },
      [](int signal) {
        LogWarning(absl::StrCat("signal ", signal, " again: exiting now"));
      });
  // What the chain's directory holds decides the code, as any start-up's
  // error does: a broken chain is refused again on a restart (2), a read
  // error may not be (1).
  if (absl::Status opened = job.Open(); !opened.ok()) {
    return FailStart(opened);
  }
  // A refusal a restart would meet again (a consumer name or a token the
  // trainer refuses, a chain the trainer's run cannot continue) is 2, as at
  // start; any other failure 1 (a restart may well succeed: a stream cut
  // short, a full disk).
  const absl::Status run = job.Run();
  if (run.ok()) return 0;
  const bool refused =
      absl::IsInvalidArgument(run) || absl::IsFailedPrecondition(run) ||
      absl::IsPermissionDenied(run) || absl::IsUnauthenticated(run);
  return Fail(refused ? kExitUsage : kExitFailure, run);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "checkpoint_job --target=HOST:PORT --consumer=C --dir=D; see --helpfull");
  if (std::optional<int> exit_code =
          deltastream::HandleCommandLine(argc, argv)) {
    return *exit_code;
  }
  return deltastream::Main();
}
