#include "clients/checkpoint_job.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/file_io.h"
#include "base/log.h"
#include "clients/checkpoint_chain.h"

namespace deltastream {
namespace {

std::string LinkName(const ChainLink& link) {
  return std::filesystem::path(link.path).filename().string();
}

}  // namespace

absl::Status ValidateCheckpointJobOptions(const CheckpointJobOptions& options) {
  if (options.dir.empty())
    return absl::InvalidArgumentError("--dir is required");
  if (options.consumer.empty()) {
    return absl::InvalidArgumentError("--consumer must not be empty");
  }
  if (options.every_ms < 0 || options.count < 0 || options.compact_every < 0 ||
      options.retry_s < 0) {
    return absl::InvalidArgumentError(
        "--every_ms, --count, --compact_every and --retry_s must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<HeldVersion> ReadChainEnd(const std::string& dir) {
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return links.status();
  if (std::vector<std::string> problems = ChainProblems(*links);
      !problems.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the chain in '", dir, "' is broken: ", problems.front()));
  }
  HeldVersion held;
  const std::vector<ChainLink> applied = AppliedLinks(*links);
  if (applied.empty()) return held;
  absl::StatusOr<ChainLinkInfo> info = ReadChainLinkInfo(applied.back().path);
  if (!info.ok()) return info.status();
  held.end_batch = applied.back().end_batch;
  held.run_id = info->run_id;
  return held;
}

namespace {

// ReadChainEnd, except that a chain whose newest link's description is
// damaged (DataLoss) ends nowhere known: end_batch -1, as an empty chain, so
// that the next link is a full one, which supersedes it (kept on disk), as
// any damaged link; links ending after the full link's end would overlap it
// and are removed first (CheckpointJob::DropLinksPastFull).
absl::StatusOr<HeldVersion> ChainEndOrUnknown(const std::string& dir) {
  absl::StatusOr<HeldVersion> chain = ReadChainEnd(dir);
  if (chain.status().code() != absl::StatusCode::kDataLoss) return chain;
  LogWarning(absl::StrCat(chain.status().message(),
                          ": the chain's end is not known; the next link "
                          "is a full one"));
  return HeldVersion{};
}

// The first problem of the links a load of `dir` applies (VerifyChainLink:
// every record's checksum), or nullopt when all are sound. Other errors (a
// link that cannot be read at all) are returned.
absl::StatusOr<std::optional<std::string>> FirstDamagedLink(
    const std::string& dir) {
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return links.status();
  for (const ChainLink& link : AppliedLinks(*links)) {
    absl::Status status = VerifyChainLink(link);
    if (status.code() == absl::StatusCode::kDataLoss) {
      return std::optional<std::string>(std::string(status.message()));
    }
    if (!status.ok()) return status;
  }
  return std::optional<std::string>();
}

// Removes the temporary files of link writes a crash cut short.
// Best effort: a directory it cannot list is ListChain's to report.
void RemoveUnfinishedLinks(const std::string& dir) {
  absl::StatusOr<std::vector<std::filesystem::directory_entry>> entries =
      ListDirectory(dir, "the checkpoint chain");
  if (!entries.ok()) return;
  for (const std::filesystem::directory_entry& entry : *entries) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, ".ckpt.tmp")) continue;
    std::error_code error;
    if (std::filesystem::remove(entry.path(), error)) {
      LogInfo(absl::StrCat("removed ", name,
                           ", a link whose write did not finish"));
    }
  }
}

}  // namespace

bool UnreachableRetry::ShouldRetry(const absl::Status& status, absl::Time now) {
  just_started_ = false;
  if (status.code() != absl::StatusCode::kUnavailable &&
      status.code() != absl::StatusCode::kCancelled &&
      status.code() != absl::StatusCode::kDeadlineExceeded) {
    return false;
  }
  if (!since_.has_value()) {
    since_ = now;
    just_started_ = limit_ > absl::ZeroDuration();
  }
  return now - *since_ < limit_;
}

CheckpointJob::CheckpointJob(CheckpointJobOptions options,
                             std::unique_ptr<TrackerClient> client, FILE* out)
    : options_(std::move(options)),
      client_(std::move(client)),
      out_(out),
      retry_(absl::Seconds(options_.retry_s)) {}

void CheckpointJob::Stop() {
  stopping_.store(true);
  stop_reads_.Cancel();
}

void CheckpointJob::Report(const std::string& line) {
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void CheckpointJob::Wait(absl::Duration duration) {
  const absl::Time deadline = absl::Now() + duration;
  while (!stopping_.load() && absl::Now() < deadline) {
    absl::SleepFor(std::min(absl::Milliseconds(10), deadline - absl::Now()));
  }
}

absl::Status CheckpointJob::Open() {
  absl::StatusOr<HeldVersion> chain = ChainEndOrUnknown(options_.dir);
  if (!chain.ok()) return chain.status();
  chain_ = *std::move(chain);
  need_full_ = chain_.end_batch < 0;
  RemoveUnfinishedLinks(options_.dir);
  if (std::filesystem::is_directory(options_.dir)) {
    // A link renamed into place by a job killed before its directory was
    // synced is on disk now, before this job commits any read it holds.
    if (absl::Status s = SyncDirectory(options_.dir); !s.ok()) return s;
  }
  if (!need_full_) {
    // Increments on a link that fails its checksums would never load: the
    // next link is a full one, which supersedes it (kept on disk).
    absl::StatusOr<std::optional<std::string>> damaged =
        FirstDamagedLink(options_.dir);
    if (!damaged.ok()) return damaged.status();
    if (damaged->has_value()) {
      LogWarning(absl::StrCat(**damaged,
                              ": the chain cannot be loaded past it; the "
                              "next link is a full one"));
      need_full_ = true;
    }
  }
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.chain_end_batch = chain_.end_batch;
  }
  LogInfo(absl::StrFormat("%s, chain in %s ends at batch %d", options_.consumer,
                          options_.dir, chain_.end_batch));
  opened_ = true;
  return absl::OkStatus();
}

absl::Status CheckpointJob::Run() {
  if (!opened_) {
    if (absl::Status s = Open(); !s.ok()) return s;
  }
  while (!stopping_.load()) {
    bool again = false;
    if (absl::Status s = Pull(&again); !s.ok()) return s;
    if (again) continue;
    if (options_.count > 0 && written_ >= options_.count) break;
    Wait(absl::Milliseconds(options_.every_ms));
  }
  return absl::OkStatus();
}

CheckpointJobStats CheckpointJob::Stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

absl::Status CheckpointJob::DropLostLinks(const v1::DeltaHeader& header) {
  Report(absl::StrFormat(
      "trainer run %s started at batch %d; the chain ends at batch %d (run "
      "%s): removing the links after batch %d, which hold changes the trainer "
      "lost",
      header.run_id(), header.run_start_batch(), chain_.end_batch,
      chain_.run_id.empty() ? "unknown" : chain_.run_id,
      header.run_start_batch()));
  if (absl::Status s = RemoveLinksAfter(header.run_start_batch()); !s.ok()) {
    return s;
  }
  absl::StatusOr<HeldVersion> chain = ChainEndOrUnknown(options_.dir);
  if (!chain.ok()) return chain.status();
  chain_ = *std::move(chain);
  absl::MutexLock lock(&stats_mu_);
  stats_.chain_end_batch = chain_.end_batch;
  return absl::OkStatus();
}

absl::Status CheckpointJob::DropLinksPastFull(const v1::DeltaHeader& header) {
  const int64_t end = header.end_batch();
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(options_.dir);
  if (!links.ok()) return links.status();
  int64_t past = 0;
  for (const ChainLink& link : *links) {
    if (link.end_batch <= end) continue;
    // The rule DropLostLinks follows where the chain's end is known, per
    // link: a link of the read's own run ending after the read is a service
    // behind the chain, not a restart.
    absl::StatusOr<ChainLinkInfo> info = ReadChainLinkInfo(link.path);
    if (info.status().code() == absl::StatusCode::kNotFound) continue;
    if (!info.ok() && info.status().code() != absl::StatusCode::kDataLoss) {
      return info.status();
    }
    const HeldVersion held{link.end_batch, info.ok() ? info->run_id : ""};
    if (!RunLostHeldBatches(held, header.run_id(), header.run_start_batch())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the service is at batch ", end, ", before the end of ",
          LinkName(link), " (", link.end_batch,
          ") in the same trainer run: refusing to write a full link that "
          "would not apply"));
    }
    ++past;
  }
  if (past == 0) return absl::OkStatus();
  Report(absl::StrFormat(
      "trainer run %s started at batch %d; the chain's end is not known: "
      "removing the links after batch %d, where its full link ends, which "
      "hold changes the trainer lost",
      header.run_id(), header.run_start_batch(), end));
  return RemoveLinksAfter(end);
}

absl::Status CheckpointJob::RemoveLinksAfter(int64_t batch) {
  absl::StatusOr<std::vector<ChainLink>> removed =
      TruncateChainAfter(options_.dir, batch);
  if (!removed.ok()) return removed.status();
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.removed_links += static_cast<int64_t>(removed->size());
  }
  for (const ChainLink& link : *removed) {
    Report(absl::StrFormat("removed %s (batches %d..%d)", LinkName(link),
                           link.start_batch, link.end_batch - 1));
  }
  return absl::OkStatus();
}

absl::Status CheckpointJob::AddOwnConsumer() {
  absl::StatusOr<std::vector<std::string>> added =
      client_->AddConsumer(options_.consumer);
  if (!added.ok() &&
      added.status().code() != absl::StatusCode::kAlreadyExists) {
    return added.status();
  }
  consumer_added_ = true;
  // Said loudly: a misspelt name would hold rows on the trainer for good.
  LogWarning(absl::StrCat(
      "consumer '", options_.consumer, "' was not on ", client_->target(),
      ": added; the trainer keeps its unread rows until it is removed "
      "(deltactl consumers remove ",
      options_.consumer, ")"));
  // A consumer added now starts at the trainer's present: whatever the
  // chain lacks before it comes only from a read of every row.
  if (!need_full_) {
    Report("resync: the consumer was added: writing a full link");
    absl::MutexLock lock(&stats_mu_);
    ++stats_.resyncs;
  }
  need_full_ = true;
  return absl::OkStatus();
}

absl::Status CheckpointJob::Pull(bool* again) {
  // A call that failed: retried (at once, after a pause) while the service
  // is unreachable for less than retry_s; otherwise the job ends, with OK
  // when it is stopping anyway.
  auto failed_call = [&](const absl::Status& status) {
    acknowledged_.reset();  // a restarted trainer may read otherwise
    if (retry_.ShouldRetry(status, absl::Now())) {
      if (retry_.just_started()) {
        LogWarning(absl::StrFormat("%s; retrying for %ds", status.message(),
                                   options_.retry_s));
      }
      Wait(absl::Milliseconds(std::max<int64_t>(options_.every_ms, 100)));
      *again = true;
      return absl::OkStatus();
    }
    return stopping_.load() ? absl::OkStatus() : status;
  };

  const absl::Time pull_start = absl::Now();
  v1::GetDeltaRequest request;
  request.set_consumer(options_.consumer);
  request.set_omit_states(true);
  request.set_all_rows(need_full_);
  // After the chain's end, also where the read that ended there is still
  // uncommitted (the job died before its commit reached every rank of a
  // sharded trainer): those rows are on disk already.
  if (!need_full_ && chain_.end_batch >= 0) {
    request.set_continue_from(chain_.end_batch);
  }
  request.set_include_dense(options_.dense);
  absl::StatusOr<ReceivedDelta> delta =
      client_->GetDelta(request, &stop_reads_);
  if (!delta.ok() && stopping_.load()) return absl::OkStatus();  // cancelled
  if (delta.status().code() == absl::StatusCode::kNotFound &&
      !consumer_added_) {
    // The job names no table: the service does not know its consumer.
    absl::Status added = AddOwnConsumer();
    if (!added.ok()) return failed_call(added);
    *again = true;
    return absl::OkStatus();
  }
  if (!delta.ok()) return failed_call(delta.status());
  retry_.Succeeded();
  consumer_added_ = false;
  const v1::DeltaHeader& header = delta->header;
  if (need_full_ && !header.all_rows()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the service at ", client_->target(),
        " did not send every row (all_rows): a chain's base needs the "
        "trainer's service"));
  }
  if (RunLostHeldBatches(chain_, header.run_id(), header.run_start_batch())) {
    if (absl::Status s = DropLostLinks(header); !s.ok()) return s;
  }

  const int64_t end = header.end_batch();
  bool write = false;
  if (!header.all_rows()) {
    const DeltaVerdict verdict =
        ClassifyDelta(chain_, chain_.end_batch, header);
    if (verdict.must_resync()) {
      // The full read replaces this one (acknowledged mode: it was not
      // committed; otherwise a read of every row covers it anyway).
      Report(absl::StrCat("resync: ", verdict.reason, ": writing a full link"));
      {
        absl::MutexLock lock(&stats_mu_);
        ++stats_.resyncs;
      }
      need_full_ = true;
      *again = true;
      return absl::OkStatus();
    }
    write = verdict.fit == DeltaFit::kContinues;
    // A read delivered again (the job died before committing) covers
    // batches the chain has: write only what it lacks.
    if (write &&
        std::max<int64_t>(header.start_batch(), 0) < chain_.end_batch) {
      delta->header.set_start_batch(chain_.end_batch);
    }
  } else if (end < chain_.end_batch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the service is at batch ", end, ", before the chain's end (",
        chain_.end_batch,
        ") in the same trainer run: refusing to write a full link that "
        "would not apply"));
  } else {
    write = end > 0;
    // Where the chain's end was not known, links after this one's end may
    // remain, which would overlap it: gone, durably, before it is written
    // (a crash in between leaves a shorter chain, never an overlap).
    if (write && chain_.end_batch < 0) {
      if (absl::Status s = DropLinksPastFull(header); !s.ok()) return s;
    }
  }
  if (write) {
    absl::StatusOr<ChainLink> link = WriteChainLink(options_.dir, *delta);
    if (!link.ok()) return link.status();
    chain_.end_batch = end;
    chain_.run_id = header.run_id();
    need_full_ = false;
    ++written_;
    int64_t rows = 0;
    for (const auto& [fqn, table] : delta->tables) rows += table.ids.numel();
    {
      const absl::Time now = absl::Now();
      absl::MutexLock lock(&stats_mu_);
      ++(link->full ? stats_.full_links : stats_.increment_links);
      stats_.bytes_written += link->bytes;
      stats_.rows_written += rows;
      stats_.chain_end_batch = chain_.end_batch;
      stats_.last_link_time = now;
      stats_.last_link_duration = now - pull_start;
    }
    Report(absl::StrFormat("%s batches %d..%d: %d rows, %d dense, %d bytes",
                           link->full ? "full" : "increment", link->start_batch,
                           link->end_batch - 1, rows, delta->dense.size(),
                           link->bytes));
    if (options_.compact_every > 0 && written_ % options_.compact_every == 0) {
      absl::StatusOr<ChainLink> compacted = CompactChain(options_.dir);
      if (!compacted.ok()) return compacted.status();
    }
  }
  // Commit what is on disk (acknowledged mode; elsewhere the read was final
  // already: no commit, which the server would refuse, counted as an RPC
  // error). Not committed, the read comes again and only what the chain
  // lacks is written.
  if (!acknowledged_.has_value()) {
    absl::StatusOr<v1::StatusResponse> status = client_->Status();
    if (!status.ok()) return failed_call(status.status());
    acknowledged_ = status->acknowledged_reads();
  }
  if (!*acknowledged_) return absl::OkStatus();
  // FailedPrecondition: the read is no longer pending (a later commit
  // covered it): nothing to do.
  if (absl::Status commit = client_->Commit(options_.consumer, end);
      !commit.ok() && commit.code() != absl::StatusCode::kFailedPrecondition) {
    return failed_call(commit);
  }
  return absl::OkStatus();
}

}  // namespace deltastream
