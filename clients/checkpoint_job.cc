// The checkpoint job: pulls deltas on a schedule as its own consumer and
// writes incremental checkpoints (clients/checkpoint_chain.h) into a
// directory, one link per pull that brought new batches.
//
//   checkpoint_job --target=HOST:PORT --consumer=checkpoint --dir=D
//       [--every_ms=1000] [--count=0] [--compact_every=0] [--dense=true]
//       [--retry_s=0] [--token_file=F] [--tls_ca=F]
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
// SIGTERM/SIGINT end it after the pull in progress. Exit codes: 0 done, 1 a
// pull or write failed (an unreachable service is retried for --retry_s
// first), 2 bad flags.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/process.h"
#include "clients/checkpoint_chain.h"
#include "clients/delta_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "tracker HOST:PORT");
ABSL_FLAG(std::string, consumer, "checkpoint", "the job's consumer name");
ABSL_FLAG(std::string, dir, "", "the checkpoint chain's directory");
ABSL_FLAG(int64_t, every_ms, 1000, "pull period");
ABSL_FLAG(int64_t, count, 0, "stop after N links (0: never)");
ABSL_FLAG(int64_t, compact_every, 0,
          "compact the chain into one full link every N links (0: never)");
ABSL_FLAG(bool, dense, true,
          "store the model's dense parameters in every link");
ABSL_FLAG(int64_t, retry_s, 0,
          "keep retrying an unreachable service for this long (a trainer "
          "restarting) before failing");
ABSL_FLAG(std::string, token_file, "", "bearer token (first line)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots: connect with TLS");

namespace deltastream {
namespace {

std::atomic<bool> stopping{false};

void OnSignal(int) { stopping.store(true); }

// Where the chain on disk ends, and the trainer run its last link came from.
struct ChainState {
  int64_t end = -1;  // -1: empty
  std::string run_id;
};

absl::StatusOr<ChainState> ReadChainState(const std::string& dir) {
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return links.status();
  if (std::vector<std::string> problems = ChainProblems(*links);
      !problems.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the chain in '", dir, "' is broken: ", problems.front()));
  }
  ChainState state;
  const std::vector<ChainLink> applied = AppliedLinks(*links);
  if (applied.empty()) return state;
  absl::StatusOr<ChainLinkInfo> info = ReadChainLinkInfo(applied.back().path);
  if (!info.ok()) return info.status();
  state.end = applied.back().end_batch;
  state.run_id = info->run_id;
  return state;
}

std::string LinkName(const ChainLink& link) {
  return std::filesystem::path(link.path).filename().string();
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) return Fail(2, "--dir is required");
  const int64_t every_ms = absl::GetFlag(FLAGS_every_ms);
  const int64_t count = absl::GetFlag(FLAGS_count);
  const int64_t compact_every = absl::GetFlag(FLAGS_compact_every);
  const int64_t retry_s = absl::GetFlag(FLAGS_retry_s);
  if (every_ms < 0 || count < 0 || compact_every < 0 || retry_s < 0) {
    return Fail(
        2, "--every_ms, --count, --compact_every and --retry_s must be >= 0");
  }
  ClientOptions options;
  if (absl::Status read =
          ReadCredentialFiles(absl::GetFlag(FLAGS_token_file),
                              absl::GetFlag(FLAGS_tls_ca), options);
      !read.ok()) {
    return Fail(2, std::string(read.message()));
  }
  std::unique_ptr<DeltaClient> client =
      DeltaClient::Create(absl::GetFlag(FLAGS_target), options);
  const std::string consumer = absl::GetFlag(FLAGS_consumer);

  absl::StatusOr<ChainState> chain = ReadChainState(dir);
  if (!chain.ok()) return Fail(1, std::string(chain.status().message()));
  std::fprintf(stderr, "checkpoint_job: %s, chain in %s ends at batch %lld\n",
               consumer.c_str(), dir.c_str(),
               static_cast<long long>(chain->end));

  auto wait = [&](int64_t ms) {
    for (int64_t waited = 0; waited < ms && !stopping.load(); waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  // An unreachable (or stopping) service is retried for --retry_s from its
  // first failure.
  std::optional<std::chrono::steady_clock::time_point> unreachable_since;
  auto retry = [&](const absl::Status& status) {
    // A server shutting down cancels the calls in flight.
    if (status.code() != absl::StatusCode::kUnavailable &&
        status.code() != absl::StatusCode::kCancelled) {
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!unreachable_since.has_value()) {
      unreachable_since = now;
      if (retry_s > 0) {
        std::fprintf(stderr, "checkpoint_job: %s; retrying for %llds\n",
                     std::string(status.message()).c_str(),
                     static_cast<long long>(retry_s));
      }
    }
    if (now - *unreachable_since >= std::chrono::seconds(retry_s)) {
      return false;
    }
    wait(std::max<int64_t>(every_ms, 100));
    return true;
  };

  bool need_full = chain->end < 0;
  int64_t written = 0;
  while (!stopping.load()) {
    v1::GetDeltaRequest request;
    request.set_consumer(consumer);
    request.set_omit_states(true);
    request.set_all_rows(need_full);
    request.set_include_dense(absl::GetFlag(FLAGS_dense));
    absl::StatusOr<ReceivedDelta> delta = client->GetDelta(request);
    if (!delta.ok()) {
      if (retry(delta.status())) continue;
      if (stopping.load()) break;
      return Fail(1, std::string(delta.status().message()));
    }
    unreachable_since.reset();
    const v1::DeltaHeader& header = delta->header;
    if (need_full && !header.all_rows()) {
      return Fail(1, absl::StrCat("the service at ", client->target(),
                                  " did not send every row (all_rows): a "
                                  "chain's base needs the trainer's service"));
    }

    // A trainer that restarted from an older snapshot lost the changes the
    // chain holds after it: those links go.
    if (!header.run_id().empty() && chain->end >= 0 &&
        header.run_id() != chain->run_id &&
        chain->end > header.run_start_batch()) {
      std::printf(
          "trainer run %s started at batch %lld; the chain ends at batch %lld "
          "(run %s): removing the links after batch %lld, which hold changes "
          "the trainer lost\n",
          header.run_id().c_str(),
          static_cast<long long>(header.run_start_batch()),
          static_cast<long long>(chain->end),
          chain->run_id.empty() ? "unknown" : chain->run_id.c_str(),
          static_cast<long long>(header.run_start_batch()));
      absl::StatusOr<std::vector<ChainLink>> removed =
          TruncateChainAfter(dir, header.run_start_batch());
      if (!removed.ok())
        return Fail(1, std::string(removed.status().message()));
      for (const ChainLink& link : *removed) {
        std::printf("removed %s (batches %lld..%lld)\n", LinkName(link).c_str(),
                    static_cast<long long>(link.start_batch),
                    static_cast<long long>(link.end_batch - 1));
      }
      std::fflush(stdout);
      chain = ReadChainState(dir);
      if (!chain.ok()) return Fail(1, std::string(chain.status().message()));
    }

    const int64_t start = std::max<int64_t>(header.start_batch(), 0);
    const int64_t end = header.end_batch();
    if (!header.all_rows()) {
      std::string why;
      if (chain->end < 0) {
        why = "the chain is empty";
      } else if (header.resync_required()) {
        why = absl::StrCat("the service dropped ", header.lost_rows(),
                           " rows this job had not read");
      } else if (start > chain->end) {
        why = absl::StrCat("batches ", chain->end, "..", start - 1,
                           " were never read by this job");
      }
      if (!why.empty()) {
        // The full read replaces this one (acknowledged mode: it was not
        // committed; otherwise a read of every row covers it anyway).
        std::printf("resync: %s: writing a full link\n", why.c_str());
        std::fflush(stdout);
        need_full = true;
        continue;
      }
    } else if (end < chain->end) {
      return Fail(1, absl::StrCat("the service is at batch ", end,
                                  ", before the chain's end (", chain->end,
                                  ") in the same trainer run: refusing to "
                                  "write a full link that would not apply"));
    }
    if (header.all_rows() ? end > 0 : end > chain->end) {
      // A read delivered again (the job died before committing) covers
      // batches the chain has: write only what it lacks.
      if (!header.all_rows() && start < chain->end) {
        delta->header.set_start_batch(chain->end);
      }
      absl::StatusOr<ChainLink> link = WriteChainLink(dir, *delta);
      if (!link.ok()) return Fail(1, std::string(link.status().message()));
      chain->end = end;
      chain->run_id = header.run_id();
      need_full = false;
      ++written;
      int64_t rows = 0;
      for (const auto& [fqn, table] : delta->tables) rows += table.ids.numel();
      std::printf("%s batches %lld..%lld: %lld rows, %zu dense, %lld bytes\n",
                  link->full ? "full" : "increment",
                  static_cast<long long>(link->start_batch),
                  static_cast<long long>(link->end_batch - 1),
                  static_cast<long long>(rows), delta->dense.size(),
                  static_cast<long long>(link->bytes));
      std::fflush(stdout);
      if (compact_every > 0 && written % compact_every == 0) {
        absl::StatusOr<ChainLink> compacted = CompactChain(dir);
        if (!compacted.ok()) {
          return Fail(1, std::string(compacted.status().message()));
        }
      }
    }
    // Commit what is on disk (acknowledged mode; elsewhere the read was final
    // already and the server says so).
    if (absl::Status commit = client->Commit(consumer, end);
        !commit.ok() &&
        commit.code() != absl::StatusCode::kFailedPrecondition) {
      // Not committed: the read comes again and only what the chain lacks is
      // written.
      if (retry(commit)) continue;
      if (stopping.load()) break;
      return Fail(1, std::string(commit.message()));
    }
    if (count > 0 && written >= count) break;
    wait(every_ms);
  }
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "checkpoint_job --target=HOST:PORT --consumer=C --dir=D; see --helpfull");
  absl::ParseCommandLine(argc, argv);
  signal(SIGTERM, deltastream::OnSignal);
  signal(SIGINT, deltastream::OnSignal);
  return deltastream::Main();
}
