// The checkpoint job: pulls deltas on a schedule as its own consumer and
// writes incremental checkpoints (clients/checkpoint_chain.h) into a
// directory, one link per pull that brought new batches.
//
//   checkpoint_job --target=HOST:PORT --consumer=checkpoint --dir=D
//       [--every_ms=1000] [--count=0] [--compact_every=0]
//       [--token_file=F] [--tls_ca=F]
//
// The first link is a full one, so the consumer must have been there from the
// first batch (its first read starts at the beginning); a chain can only
// continue where it ends. With the tracker's acknowledged reads, a pull is
// committed only once its link is on disk: a job killed in between reads the
// same batches again and writes only the part its chain lacks, so nothing is
// missed and nothing applied twice. SIGTERM/SIGINT end it after the pull in
// progress. Exit codes: 0 done, 1 a pull or write failed, 2 bad flags.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "clients/checkpoint_chain.h"
#include "clients/delta_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "tracker HOST:PORT");
ABSL_FLAG(std::string, consumer, "checkpoint", "the job's consumer name");
ABSL_FLAG(std::string, dir, "", "the checkpoint chain's directory");
ABSL_FLAG(int64_t, every_ms, 1000, "pull period");
ABSL_FLAG(int64_t, count, 0, "stop after N links (0: never)");
ABSL_FLAG(int64_t, compact_every, 0,
          "compact the chain into one full link every N links (0: never)");
ABSL_FLAG(std::string, token_file, "", "bearer token (first line)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots: connect with TLS");

namespace deltastream {
namespace {

std::atomic<bool> stopping{false};

void OnSignal(int) { stopping.store(true); }

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "checkpoint_job: %s\n", message.c_str());
  return code;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) return Fail(2, "--dir is required");
  if (absl::GetFlag(FLAGS_every_ms) < 0 || absl::GetFlag(FLAGS_count) < 0 ||
      absl::GetFlag(FLAGS_compact_every) < 0) {
    return Fail(2, "--every_ms, --count and --compact_every must be >= 0");
  }
  ClientOptions options;
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    absl::StatusOr<std::string> text = ReadFile(file);
    if (!text.ok()) return Fail(2, std::string(text.status().message()));
    options.auth_token = std::string(absl::StripAsciiWhitespace(
        absl::string_view(*text).substr(0, text->find('\n'))));
  }
  if (const std::string file = absl::GetFlag(FLAGS_tls_ca); !file.empty()) {
    absl::StatusOr<std::string> pem = ReadFile(file);
    if (!pem.ok()) return Fail(2, std::string(pem.status().message()));
    options.tls_root_certs_pem = *pem;
  }
  std::unique_ptr<DeltaClient> client =
      DeltaClient::Create(absl::GetFlag(FLAGS_target), options);
  const std::string consumer = absl::GetFlag(FLAGS_consumer);

  // Where the chain on disk ends: pulls continue from there.
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return Fail(1, std::string(links.status().message()));
  if (std::vector<std::string> problems = ChainProblems(*links);
      !problems.empty()) {
    return Fail(1, absl::StrCat("the chain in '", dir,
                                "' is broken: ", problems.front()));
  }
  int64_t chain_end = -1;
  for (const ChainLink& link : *links) {
    chain_end = std::max(chain_end, link.end_batch);
  }
  std::fprintf(stderr, "checkpoint_job: %s, chain in %s ends at batch %lld\n",
               consumer.c_str(), dir.c_str(),
               static_cast<long long>(chain_end));

  int64_t written = 0;
  while (!stopping.load()) {
    v1::GetDeltaRequest request;
    request.set_consumer(consumer);
    request.set_omit_states(true);
    absl::StatusOr<ReceivedDelta> delta = client->GetDelta(request);
    if (!delta.ok()) return Fail(1, std::string(delta.status().message()));
    const int64_t start = std::max<int64_t>(delta->header.start_batch(), 0);
    const int64_t end = delta->header.end_batch();
    if (end > std::max<int64_t>(chain_end, start)) {
      bool full = false;
      if (chain_end < 0) {
        if (start > 0) {
          return Fail(
              1, absl::StrCat("consumer '", consumer, "' starts at batch ",
                              start, " but the chain in '", dir,
                              "' is empty: it has no base (add the consumer "
                              "before the first batch, or start from a full "
                              "checkpoint)"));
        }
        full = true;
      } else if (start > chain_end) {
        return Fail(1, absl::StrCat("batches ", chain_end, "..", start - 1,
                                    " were read by someone else as '", consumer,
                                    "': the chain would have a gap"));
      } else {
        // A read delivered again (the job died before committing) covers
        // batches the chain has: write only what it lacks.
        delta->header.set_start_batch(chain_end);
      }
      absl::StatusOr<ChainLink> link = WriteChainLink(dir, *delta, full);
      if (!link.ok()) return Fail(1, std::string(link.status().message()));
      chain_end = end;
      ++written;
      int64_t rows = 0;
      for (const auto& [fqn, table] : delta->tables) rows += table.ids.numel();
      std::printf("%s batches %lld..%lld: %lld rows, %lld bytes\n",
                  link->full ? "full" : "increment",
                  static_cast<long long>(link->start_batch),
                  static_cast<long long>(link->end_batch - 1),
                  static_cast<long long>(rows),
                  static_cast<long long>(link->bytes));
      std::fflush(stdout);
      const int64_t compact_every = absl::GetFlag(FLAGS_compact_every);
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
      return Fail(1, std::string(commit.message()));
    }
    const int64_t count = absl::GetFlag(FLAGS_count);
    if (count > 0 && written >= count) break;
    for (int64_t waited = 0;
         waited < absl::GetFlag(FLAGS_every_ms) && !stopping.load();
         waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
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
