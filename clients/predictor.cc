// The predictor: keeps a replica of a trainer's model (its embedding tables
// and dense parameters, clients/replica.h) in step with the trainer's tracker
// and serves lookups from it (proto/predictor.proto, service ReplicaLookup).
//
//   predictor --target=HOST:PORT [--consumer=predictor] [--listen=HOST:PORT]
//       [--replica_db=DIR] [--bootstrap_chain=DIR] [--every_ms=100]
//       [--every_steps=0] [--dense_every_steps=0] [--dense_every_ms=0]
//       [--apply_log=FILE] [--token_file=F] [--tls_ca=F]
//
// Prints "listening on HOST:PORT" as its first stdout line once the lookup
// API is up (port 0 picks a free one); everything else goes to stderr.
//
// How it follows the trainer:
//  - Bootstrap: an empty replica (a new one, or an in-memory predictor that
//    restarted) takes a full read (all_rows, with the dense parameters), or,
//    with --bootstrap_chain, loads a checkpoint chain when the chain ends at
//    or after the consumer's cursor and not after the trainer's batch. A
//    RocksDB replica that reopens non-empty resumes at its version.
//  - Then it subscribes and applies each push. A push without dense
//    parameters while the trainer sends them is staged and applied with the
//    next push that carries them, in one atomic apply: lookups never mix two
//    model versions.
//  - With the tracker's acknowledged reads, a push is committed only once it
//    is applied (and, for RocksDB, synced): a predictor killed in between
//    gets the same rows again, and applying them again is harmless (values
//    are the rows' current ones). The apply log records, per applied
//    version, only the batches the replica did not hold yet.
//  - Resync with a full read when the tracker says rows were dropped
//    (resync_required), when a push starts after what the replica holds (a
//    gap), when the trainer restarted behind the replica's version (another
//    run whose start batch is below the replica's version), or when a push
//    cannot be applied.
//  - A failed subscription is retried with backoff (100 ms doubling to 1 s);
//    lookups keep being served meanwhile.
//
// SIGTERM/SIGINT: cancels the subscription, stops serving, exits 0. Exit
// codes: 0 stopped by a signal, 1 an error retrying cannot fix (the tracker
// serves no live rows, a refused token, an unusable replica database), 2 bad
// flags.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/grpc_server.h"
#include "base/process.h"
#include "clients/checkpoint_chain.h"
#include "clients/delta_client.h"
#include "clients/replica.h"
#include "proto/predictor.grpc.pb.h"
#include "proto/tensor_codec.h"

ABSL_FLAG(std::string, target, "", "the trainer's tracker, HOST:PORT");
ABSL_FLAG(std::string, consumer, "predictor", "the predictor's consumer name");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "the lookup API's address, HOST:PORT (port 0: a free one)");
ABSL_FLAG(std::string, replica_db, "",
          "RocksDB directory of the replica (empty: in memory)");
ABSL_FLAG(std::string, bootstrap_chain, "",
          "checkpoint chain directory to bootstrap an empty replica from "
          "(instead of a full read) when it is recent enough; rows the chain "
          "never recorded are missing until they change");
ABSL_FLAG(int64_t, every_ms, 100, "publish interval (0: by steps only)");
ABSL_FLAG(int64_t, every_steps, 0,
          "publish every N batches as well (0: by time only; both 0: every "
          "batch)");
ABSL_FLAG(int64_t, dense_every_steps, 0,
          "dense parameters at most every N batches (both dense_every_* 0: "
          "with every push)");
ABSL_FLAG(int64_t, dense_every_ms, 0, "dense parameters at most every N ms");
ABSL_FLAG(std::string, apply_log, "",
          "append one line per applied version: <from_batch> <to_batch> "
          "<rows> <dense 0|1> <all_rows 0|1> <run_id>");
ABSL_FLAG(std::string, token_file, "", "bearer token (first line)");
ABSL_FLAG(std::string, tls_ca, "", "PEM roots: connect with TLS");

namespace deltastream {
namespace {

using Clock = std::chrono::steady_clock;

// Resubscribing waits 100 ms, doubling up to the channel's own reconnect
// backoff (ClientOptions::max_reconnect_backoff, 1 s): a restarted trainer
// is followed again within about a second of serving.
constexpr std::chrono::milliseconds kFirstBackoff{100};
const std::chrono::milliseconds kLongestBackoff =
    ClientOptions().max_reconnect_backoff;
constexpr std::chrono::milliseconds kTrainerPoll{200};
constexpr std::chrono::seconds kSummaryEvery{5};
constexpr size_t kFreshnessSamples = 10000;
// every_steps for "by time only": a push is due only when the timer runs out.
constexpr int64_t kNeverBySteps = int64_t{1} << 40;

void Log(const std::string& line) {
  std::fprintf(stderr, "predictor: %s\n", line.c_str());
}

int64_t PayloadBytes(const ReceivedDelta& delta) {
  int64_t bytes = 0;
  for (const auto& [fqn, table] : delta.tables) {
    for (const at::Tensor* t :
         {&table.ids, &table.states, &table.values, &table.scores}) {
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
    }
  }
  for (const auto& [name, tensor] : delta.dense) {
    bytes += static_cast<int64_t>(tensor.nbytes());
  }
  return bytes;
}

int64_t Rows(const ReceivedDelta& delta) {
  int64_t rows = 0;
  for (const auto& [fqn, table] : delta.tables) {
    if (table.ids.defined()) rows += table.ids.numel();
  }
  return rows;
}

// Freshness samples in milliseconds: the last kFreshnessSamples.
class FreshnessWindow {
 public:
  void Add(double ms) {
    if (samples_.size() < kFreshnessSamples) {
      samples_.push_back(ms);
    } else {
      samples_[next_] = ms;
      next_ = (next_ + 1) % kFreshnessSamples;
    }
  }
  // The q-quantile (nearest rank) of the samples held; 0 without any.
  double Quantile(double q) const {
    if (samples_.empty()) return 0;
    std::vector<double> sorted = samples_;
    const size_t rank = std::min(
        sorted.size() - 1,
        static_cast<size_t>(std::ceil(q * sorted.size())) - (q > 0 ? 1 : 0));
    std::nth_element(sorted.begin(), sorted.begin() + rank, sorted.end());
    return sorted[rank];
  }
  double Max() const {
    return samples_.empty()
               ? 0
               : *std::max_element(samples_.begin(), samples_.end());
  }
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }

 private:
  std::vector<double> samples_;
  size_t next_ = 0;
};

struct PredictorOptions {
  std::string target;
  std::string consumer;
  std::string bootstrap_chain;
  int64_t every_ms = 100;
  int64_t every_steps = 0;
  int64_t dense_every_steps = 0;
  int64_t dense_every_ms = 0;
};

// Keeps a replica in step with a tracker (see the top of this file). Run()
// is the one thread that writes the replica; Status(), the replica's reads,
// Stop() and PollTrainer() may run on other threads.
class Predictor {
 public:
  Predictor(PredictorOptions options, std::unique_ptr<DeltaClient> client,
            std::unique_ptr<Replica> replica, FILE* apply_log)
      : options_(std::move(options)),
        client_(std::move(client)),
        replica_(std::move(replica)),
        apply_log_(apply_log) {}

  // Follows the tracker until Stop(); returns only an error that retrying
  // cannot fix (OK once stopped).
  absl::Status Run();

  // Ends Run() and PollTrainer() soon: cancels the subscription, wakes
  // sleeps. Any thread; idempotent.
  void Stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_.store(true);
    if (subscription_ != nullptr) subscription_->Cancel();
    stop_cv_.notify_all();
  }

  // Until Stop(): polls the tracker's current batch every kTrainerPoll and
  // logs a summary every kSummaryEvery.
  void PollTrainer();

  v1::PredictorStatus Status() const;
  const Replica& replica() const { return *replica_; }

 private:
  // One connection: bootstrap or resync when needed, then the subscription.
  // OK when it ended for a resync or Stop().
  absl::Status Session();
  // A full read (all_rows, dense) replacing the replica's contents.
  absl::Status FullRead(const std::string& why);
  // Loads --bootstrap_chain when it fits; false (logged) when it does not.
  bool BootstrapFromChain(const v1::StatusResponse& tracker, int64_t cursor);
  // The subscription's callback; false ends the subscription.
  bool OnPush(ReceivedDelta&& delta);
  // Commits `end_batch` in acknowledged mode (errors logged: the tracker
  // then delivers the rows again, which is harmless).
  void Commit(int64_t end_batch);
  void LogApply(int64_t from, int64_t to, int64_t rows, bool dense,
                bool all_rows, const std::string& run_id);
  void NoteError(const absl::Status& status);
  // Sleeps unless stopped meanwhile; false when stopped.
  bool Sleep(std::chrono::milliseconds duration);

  const PredictorOptions options_;
  const std::unique_ptr<DeltaClient> client_;
  const std::unique_ptr<Replica> replica_;
  FILE* const apply_log_;  // may be null

  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  Subscription* subscription_ = nullptr;  // guarded by stop_mu_

  // Run()'s own state.
  std::vector<ReceivedDelta> staged_;  // pushes waiting for dense parameters
  std::string resync_reason_;          // non-empty: resync before subscribing
  absl::Status push_error_;            // a push that failed to apply
  bool first_push_ = true;             // of the current subscription
  bool chain_tried_ = false;
  bool progressed_ = false;  // the current session applied something
  // When the newest batch of the replica's version was closed (0: unknown).
  int64_t version_newest_change_us_ = 0;
  bool acknowledged_ = false;
  bool fatal_ = false;  // Session() failed in a way retrying cannot fix

  // What Status() reports.
  mutable std::mutex mu_;
  int64_t trainer_batch_ = -1;
  int64_t applied_deltas_ = 0;
  int64_t applied_rows_ = 0;
  int64_t bytes_received_ = 0;
  int64_t resyncs_ = 0;
  int64_t reconnects_ = 0;
  int64_t staged_count_ = 0;
  int64_t superseded_commits_ = 0;
  // Whether the trainer sends dense parameters (a full read or a
  // subscription's first push tells).
  bool dense_expected_ = false;
  std::string last_error_;
  FreshnessWindow freshness_;
};

bool Predictor::Sleep(std::chrono::milliseconds duration) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stop_cv_.wait_for(lock, duration, [this] { return stopping_.load(); });
  return !stopping_.load();
}

void Predictor::NoteError(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  last_error_ = std::string(status.message());
}

bool IsFatal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnauthenticated ||
         status.code() == absl::StatusCode::kPermissionDenied;
}

absl::Status Predictor::Run() {
  std::chrono::milliseconds backoff = kFirstBackoff;
  while (!stopping_.load()) {
    progressed_ = false;
    absl::Status status = Session();
    if (stopping_.load()) break;
    if (status.ok()) {  // a resync is due: now
      backoff = kFirstBackoff;
      continue;
    }
    NoteError(status);
    if (fatal_ || IsFatal(status)) return status;
    if (progressed_) backoff = kFirstBackoff;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++reconnects_;
    }
    Log(absl::StrFormat("reconnect in %d ms: %s", backoff.count(),
                        status.message()));
    if (!Sleep(backoff)) break;
    backoff = std::min(backoff * 2, kLongestBackoff);
  }
  return absl::OkStatus();
}

absl::Status Predictor::Session() {
  first_push_ = true;
  // Pushes staged on a broken subscription come again (acknowledged reads),
  // or show up as a gap (resync).
  staged_.clear();
  absl::StatusOr<v1::StatusResponse> tracker = client_->Status();
  if (!tracker.ok()) return tracker.status();
  if (!tracker->serves_live_rows()) {
    fatal_ = true;
    return absl::FailedPreconditionError(absl::StrCat(
        "the tracker at ", options_.target,
        " serves no live rows (a standalone tracker_server?): a predictor "
        "needs the trainer's current values"));
  }
  acknowledged_ = tracker->acknowledged_reads();
  {
    std::lock_guard<std::mutex> lock(mu_);
    trainer_batch_ = tracker->current_batch();
    if (replica_->Version() >= 0 && !dense_expected_) {
      dense_expected_ = !replica_->Dense().parameters.empty();
    }
  }
  int64_t cursor = -2;
  for (const v1::ConsumerStatus& consumer : tracker->consumers()) {
    if (consumer.name() == options_.consumer) cursor = consumer.cursor();
  }
  if (cursor == -2) {
    absl::StatusOr<std::vector<std::string>> added =
        client_->AddConsumer(options_.consumer);
    if (!added.ok() &&
        added.status().code() != absl::StatusCode::kAlreadyExists) {
      return added.status();
    }
    Log(absl::StrCat("added consumer '", options_.consumer, "' to ",
                     options_.target));
    cursor = tracker->current_batch();
  }

  if (replica_->Version() < 0) {
    bool bootstrapped = false;
    if (!options_.bootstrap_chain.empty() && !chain_tried_) {
      chain_tried_ = true;
      bootstrapped = BootstrapFromChain(*tracker, cursor);
    }
    if (!bootstrapped) {
      if (absl::Status s = FullRead("bootstrap"); !s.ok()) return s;
    }
  } else if (!resync_reason_.empty()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++resyncs_;
    }
    Log(absl::StrCat("resync: ", resync_reason_));
    if (absl::Status s = FullRead("resync"); !s.ok()) return s;
  }
  resync_reason_.clear();

  v1::SubscribeRequest request;
  v1::GetDeltaRequest* read = request.mutable_read();
  read->set_consumer(options_.consumer);
  read->set_omit_states(true);
  read->set_include_dense(true);
  request.set_every_ms(options_.every_ms);
  request.set_every_steps(options_.every_steps > 0 || options_.every_ms == 0
                              ? options_.every_steps
                              : kNeverBySteps);
  request.set_dense_every_steps(options_.dense_every_steps);
  request.set_dense_every_ms(options_.dense_every_ms);
  Subscription subscription;
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopping_.load()) return absl::OkStatus();
    subscription_ = &subscription;
  }
  absl::Status status = client_->Subscribe(
      request,
      [this](ReceivedDelta&& delta) { return OnPush(std::move(delta)); },
      &subscription);
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    subscription_ = nullptr;
  }
  if (!push_error_.ok()) return std::exchange(push_error_, absl::OkStatus());
  if (!status.ok()) return status;
  if (stopping_.load() || !resync_reason_.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the subscription to ", options_.target, " ended"));
}

absl::Status Predictor::FullRead(const std::string& why) {
  v1::GetDeltaRequest request;
  request.set_consumer(options_.consumer);
  request.set_all_rows(true);
  request.set_include_dense(true);
  request.set_omit_states(true);
  const absl::Time started = absl::Now();
  absl::StatusOr<ReceivedDelta> delta = client_->GetDelta(request);
  if (!delta.ok()) return delta.status();
  const v1::DeltaHeader header = delta->header;
  const int64_t rows = Rows(*delta);
  const int64_t bytes = PayloadBytes(*delta);
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_received_ += bytes;
    trainer_batch_ = std::max(trainer_batch_, header.end_batch());
  }
  if (absl::Status s =
          replica_->Reset({*delta}, header.end_batch(), header.run_id());
      !s.ok()) {
    return s;
  }
  staged_.clear();
  progressed_ = true;
  version_newest_change_us_ = header.newest_change_unix_micros();
  // A full read starts the count again: it covers what the consumer's read
  // covered, whatever the replica held before.
  LogApply(std::max<int64_t>(header.start_batch(), 0), header.end_batch(), rows,
           !delta->dense.empty(), true, header.run_id());
  {
    std::lock_guard<std::mutex> lock(mu_);
    dense_expected_ = header.dense_parameters() > 0;
    ++applied_deltas_;
    applied_rows_ += rows;
  }
  Commit(header.end_batch());
  Log(absl::StrFormat(
      "%s: full read of %d rows and %d dense parameters (%.1f MiB) in %.2f s: "
      "version %d of run %s",
      why, rows, delta->dense.size(), bytes / 1048576.0,
      absl::ToDoubleSeconds(absl::Now() - started), header.end_batch(),
      header.run_id()));
  return absl::OkStatus();
}

bool Predictor::BootstrapFromChain(const v1::StatusResponse& tracker,
                                   int64_t cursor) {
  const std::string& dir = options_.bootstrap_chain;
  absl::StatusOr<LoadedChain> chain = LoadChain(dir);
  if (!chain.ok()) {
    Log(absl::StrCat("bootstrap: not from the chain in ", dir, ": ",
                     chain.status().message()));
    return false;
  }
  if (chain->end_batch < cursor || chain->end_batch > tracker.current_batch()) {
    Log(absl::StrFormat(
        "bootstrap: not from the chain in %s: it ends at batch %d, outside "
        "[%d, %d] (the consumer's cursor, the trainer's batch)",
        dir, chain->end_batch, cursor, tracker.current_batch()));
    return false;
  }
  if (!chain->run_id.empty() && chain->run_id != tracker.run_id() &&
      chain->end_batch > tracker.run_start_batch()) {
    Log(absl::StrFormat(
        "bootstrap: not from the chain in %s: it ends at batch %d of run %s, "
        "after the trainer's run %s started at batch %d (it holds changes "
        "the trainer lost)",
        dir, chain->end_batch, chain->run_id, tracker.run_id(),
        tracker.run_start_batch()));
    return false;
  }
  ReceivedDelta delta;
  delta.header.set_start_batch(0);
  delta.header.set_end_batch(chain->end_batch);
  delta.header.set_all_rows(true);
  for (const auto& [fqn, table] : chain->tables) {
    delta.tables[fqn].ids = table.ids;
    delta.tables[fqn].values = table.values;
  }
  // Dense parameters of another batch would mix two versions: without them
  // the replica waits for the subscription's first push to bring some.
  if (chain->dense_batch == chain->end_batch) delta.dense = chain->dense;
  if (absl::Status s =
          replica_->Reset({delta}, chain->end_batch, tracker.run_id());
      !s.ok()) {
    Log(absl::StrCat("bootstrap: not from the chain in ", dir, ": ",
                     s.message()));
    return false;
  }
  const int64_t rows = Rows(delta);
  progressed_ = true;
  LogApply(std::max<int64_t>(cursor, 0), chain->end_batch, rows,
           !delta.dense.empty(), true, tracker.run_id());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++applied_deltas_;
    applied_rows_ += rows;
  }
  Log(absl::StrFormat(
      "bootstrap: %d rows from the chain in %s (%d links): version %d", rows,
      dir, chain->links.size(), chain->end_batch));
  return true;
}

bool Predictor::OnPush(ReceivedDelta&& delta) {
  if (stopping_.load()) return false;
  const v1::DeltaHeader header = delta.header;
  const int64_t end = header.end_batch();
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_received_ += PayloadBytes(delta);
    trainer_batch_ = std::max(trainer_batch_, end);
    if (first_push_) {
      // The first push of a subscription carries the dense parameters when
      // the trainer has any.
      dense_expected_ = !delta.dense.empty();
    }
  }
  first_push_ = false;
  if (header.resync_required()) {
    resync_reason_ =
        absl::StrCat("the tracker dropped ", header.lost_rows(),
                     " IDs this consumer had not read (its memory cap)");
    return false;
  }
  const int64_t version = replica_->Version();
  const std::string run_id = replica_->RunId();
  if (header.run_id() != run_id && version > header.run_start_batch()) {
    resync_reason_ = absl::StrFormat(
        "the trainer restarted (run %s from batch %d) behind the replica's "
        "version %d of run %s",
        header.run_id(), header.run_start_batch(), version, run_id);
    return false;
  }
  const int64_t covered =
      staged_.empty() ? version : staged_.back().header.end_batch();
  const int64_t start = std::max<int64_t>(header.start_batch(), 0);
  if (start > covered) {
    resync_reason_ = absl::StrFormat(
        "a gap: the push starts at batch %d, the replica holds batches up to "
        "%d",
        start, covered);
    return false;
  }
  const bool dense_expected = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return dense_expected_;
  }();
  const bool catches_up_dense = end == version && !delta.dense.empty() &&
                                replica_->Dense().version < version;
  if (end <= covered && !catches_up_dense) {
    // Nothing the replica lacks: a redelivery, or a push of no new batch.
    Commit(end);
    return true;
  }
  const bool has_dense = !delta.dense.empty();
  staged_.push_back(std::move(delta));
  if (dense_expected && !has_dense) {
    std::lock_guard<std::mutex> lock(mu_);
    staged_count_ = static_cast<int64_t>(staged_.size());
    return true;
  }
  int64_t rows = 0;
  for (const ReceivedDelta& staged : staged_) rows += Rows(staged);
  // The oldest change the replica lacked: its first batch's close time, or,
  // for a redelivery (it starts before the replica's version), no earlier
  // than the close of the version's last batch (an upper bound on the age).
  const v1::DeltaHeader& first = staged_.front().header;
  int64_t oldest = first.oldest_change_unix_micros();
  if (first.start_batch() < version) {
    oldest = std::max(oldest, version_newest_change_us_);
  }
  if (absl::Status s = replica_->Apply(staged_, end, header.run_id());
      !s.ok()) {
    staged_.clear();
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      resync_reason_ =
          absl::StrCat("a push could not be applied: ", s.message());
      NoteError(s);
    } else {
      push_error_ = s;
    }
    return false;
  }
  const int64_t applied_at = absl::ToUnixMicros(absl::Now());
  version_newest_change_us_ = header.newest_change_unix_micros();
  staged_.clear();
  progressed_ = true;
  LogApply(version, end, rows, has_dense, false, header.run_id());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++applied_deltas_;
    applied_rows_ += rows;
    staged_count_ = 0;
    if (oldest > 0) freshness_.Add((applied_at - oldest) / 1000.0);
  }
  Commit(end);
  return true;
}

void Predictor::Commit(int64_t end_batch) {
  if (!acknowledged_) return;
  absl::Status status = client_->Commit(options_.consumer, end_batch);
  // FailedPrecondition: the read is no longer pending (a later commit covered
  // it, or more than Tracker::kMaxPendingReads reads were delivered since);
  // its rows come again in the next push, whose commit covers them.
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    std::lock_guard<std::mutex> lock(mu_);
    ++superseded_commits_;
  } else if (!status.ok()) {
    NoteError(status);
    Log(absl::StrCat("commit of batch ", end_batch,
                     " failed (the rows come again): ", status.message()));
  }
}

void Predictor::LogApply(int64_t from, int64_t to, int64_t rows, bool dense,
                         bool all_rows, const std::string& run_id) {
  if (apply_log_ == nullptr) return;
  std::fprintf(apply_log_, "%lld %lld %lld %d %d %s\n",
               static_cast<long long>(from), static_cast<long long>(to),
               static_cast<long long>(rows), dense ? 1 : 0, all_rows ? 1 : 0,
               run_id.empty() ? "-" : run_id.c_str());
  std::fflush(apply_log_);
}

void Predictor::PollTrainer() {
  Clock::time_point next_summary = Clock::now() + kSummaryEvery;
  while (Sleep(kTrainerPoll)) {
    if (absl::StatusOr<v1::StatusResponse> tracker = client_->Status();
        tracker.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      trainer_batch_ = tracker->current_batch();
    }
    if (Clock::now() < next_summary) continue;
    next_summary += kSummaryEvery;
    const v1::PredictorStatus status = Status();
    int64_t rows = 0;
    for (const v1::TableRowCount& table : status.tables()) rows += table.rows();
    Log(absl::StrFormat(
        "version %d (lag %d), %d rows in %d tables, %d applies, freshness "
        "p50 %.0f ms p99 %.0f ms (%d samples), %d resyncs, %d reconnects, %d "
        "superseded commits%s",
        status.version(), status.lag_steps(), rows, status.tables_size(),
        status.applied_deltas(), status.freshness_p50_ms(),
        status.freshness_p99_ms(), status.freshness_samples(), status.resyncs(),
        status.reconnects(), status.superseded_commits(),
        status.ready() ? "" : ", not ready"));
  }
}

v1::PredictorStatus Predictor::Status() const {
  v1::PredictorStatus status;
  status.set_consumer(options_.consumer);
  status.set_target(options_.target);
  const int64_t version = replica_->Version();
  status.set_version(version);
  status.set_run_id(replica_->RunId());
  const bool has_dense = !replica_->Dense().parameters.empty();
  status.set_has_dense(has_dense);
  for (const auto& [fqn, info] : replica_->Tables()) {
    v1::TableRowCount* table = status.add_tables();
    table->set_fqn(fqn);
    table->set_rows(info.rows);
  }
  std::lock_guard<std::mutex> lock(mu_);
  status.set_trainer_batch(trainer_batch_);
  status.set_lag_steps(version >= 0 && trainer_batch_ >= 0
                           ? std::max<int64_t>(trainer_batch_ - version, 0)
                           : 0);
  status.set_applied_deltas(applied_deltas_);
  status.set_applied_rows(applied_rows_);
  status.set_bytes_received(bytes_received_);
  status.set_freshness_p50_ms(freshness_.Quantile(0.5));
  status.set_freshness_p99_ms(freshness_.Quantile(0.99));
  status.set_freshness_max_ms(freshness_.Max());
  status.set_freshness_samples(freshness_.size());
  status.set_resyncs(resyncs_);
  status.set_reconnects(reconnects_);
  status.set_ready(version >= 0 && (!dense_expected_ || has_dense));
  status.set_last_error(last_error_);
  status.set_staged_deltas(staged_count_);
  status.set_superseded_commits(superseded_commits_);
  return status;
}

// ------------------------------------------------------------ the lookup API

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// Translates requests to the replica's calls; the semantics live there.
class ReplicaLookupService final : public v1::ReplicaLookup::Service {
 public:
  explicit ReplicaLookupService(const Predictor* predictor)
      : predictor_(predictor) {}

  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override {
    const Replica& replica = predictor_->replica();
    if (replica.Version() < 0) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the replica holds no version yet");
    }
    absl::StatusOr<at::Tensor> ids = DecodeTensor(request->ids());
    if (!ids.ok()) return ToGrpc(ids.status());
    absl::StatusOr<ReplicaRows> rows = replica.Lookup(request->fqn(), *ids);
    if (!rows.ok()) return ToGrpc(rows.status());
    response->set_version(rows->version);
    response->set_run_id(replica.RunId());
    if (absl::Status s = EncodeTensor(rows->rows, response->mutable_rows());
        !s.ok()) {
      return ToGrpc(s);
    }
    const bool* found = rows->found.data_ptr<bool>();
    const int64_t* id = ids->data_ptr<int64_t>();
    for (int64_t i = 0; i < rows->found.numel(); ++i) {
      if (!found[i]) response->add_missing_ids(id[i]);
    }
    return grpc::Status::OK;
  }

  grpc::Status GetDense(grpc::ServerContext*, const v1::GetDenseRequest*,
                        v1::GetDenseResponse* response) override {
    const ReplicaDense dense = predictor_->replica().Dense();
    response->set_version(dense.version);
    for (const auto& [name, tensor] : dense.parameters) {
      v1::NamedTensor* named = response->add_parameters();
      named->set_name(name);
      if (absl::Status s = EncodeTensor(tensor, named->mutable_tensor());
          !s.ok()) {
        return ToGrpc(s);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext*, const v1::PredictorStatusRequest*,
                      v1::PredictorStatus* response) override {
    *response = predictor_->Status();
    return grpc::Status::OK;
  }

 private:
  const Predictor* const predictor_;
};

// ------------------------------------------------------------ main

// Checks every command-line flag is known and its value parses, so that bad
// flags end with one line and exit code 2 (absl's parser exits 1).
std::string CommandLineError(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "-")) {
      return absl::StrCat("unexpected argument '", arg, "'");
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() &&
          equals == absl::string_view::npos) {
        continue;
      }
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", name);
    if (equals == absl::string_view::npos) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= argc) return absl::StrCat("--", name, " needs a value");
      arg = argv[++i];
    } else {
      arg = arg.substr(equals + 1);
    }
    std::string error;
    if (!flag->ParseFrom(arg, &error)) {
      return absl::StrCat("--", name, ": ", error);
    }
  }
  return "";
}

int Main() {
  PredictorOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.consumer = absl::GetFlag(FLAGS_consumer);
  options.bootstrap_chain = absl::GetFlag(FLAGS_bootstrap_chain);
  options.every_ms = absl::GetFlag(FLAGS_every_ms);
  options.every_steps = absl::GetFlag(FLAGS_every_steps);
  options.dense_every_steps = absl::GetFlag(FLAGS_dense_every_steps);
  options.dense_every_ms = absl::GetFlag(FLAGS_dense_every_ms);
  if (options.target.empty()) return Fail(2, "--target is required");
  if (options.consumer.empty()) return Fail(2, "--consumer must not be empty");
  if (options.every_ms < 0 || options.every_steps < 0 ||
      options.dense_every_steps < 0 || options.dense_every_ms < 0) {
    return Fail(2,
                "--every_ms, --every_steps, --dense_every_steps and "
                "--dense_every_ms must be >= 0");
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (listen.rfind(':') == std::string::npos) {
    return Fail(2,
                absl::StrCat("--listen must be HOST:PORT, not '", listen, "'"));
  }
  ClientOptions client_options;
  if (absl::Status read =
          ReadCredentialFiles(absl::GetFlag(FLAGS_token_file),
                              absl::GetFlag(FLAGS_tls_ca), client_options);
      !read.ok()) {
    return Fail(2, read.message());
  }
  FILE* apply_log = nullptr;
  if (const std::string path = absl::GetFlag(FLAGS_apply_log); !path.empty()) {
    apply_log = std::fopen(path.c_str(), "a");
    if (apply_log == nullptr) {
      return Fail(2, absl::StrCat("cannot append to --apply_log '", path, "'"));
    }
  }

  // Signals are taken by a thread of their own: blocked before any other
  // thread starts (gRPC's and RocksDB's inherit the mask).
  const sigset_t signals = BlockTerminationSignals();

  ReplicaOptions replica_options;
  replica_options.db_path = absl::GetFlag(FLAGS_replica_db);
  absl::StatusOr<std::unique_ptr<Replica>> replica =
      Replica::Open(replica_options);
  if (!replica.ok()) return Fail(1, replica.status().message());
  if ((*replica)->Version() >= 0) {
    Log(absl::StrFormat("replica in %s resumes at version %d of run %s",
                        (*replica)->where(), (*replica)->Version(),
                        (*replica)->RunId()));
  }
  Predictor predictor(options,
                      DeltaClient::Create(options.target, client_options),
                      *std::move(replica), apply_log);

  ReplicaLookupService service(&predictor);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  absl::StatusOr<StartedServer> started =
      StartServer(builder, listen, grpc::InsecureServerCredentials());
  if (!started.ok()) return Fail(kExitUsage, started.status());
  std::unique_ptr<grpc::Server> server = std::move(started->server);
  std::printf("listening on %s\n", started->address.c_str());
  std::fflush(stdout);

  std::atomic<bool> signalled{false};
  std::thread stopper([&] {
    const int signal = WaitForTerminationSignal(signals);
    if (!signalled.exchange(true)) {
      Log(absl::StrCat("signal ", signal, ": stopping"));
    }
    predictor.Stop();
  });
  std::thread poller([&predictor] { predictor.PollTrainer(); });
  const absl::Status run = predictor.Run();
  predictor.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  poller.join();
  if (!signalled.exchange(true)) kill(getpid(), SIGTERM);  // wakes `stopper`
  stopper.join();
  if (apply_log != nullptr) std::fclose(apply_log);
  if (!run.ok()) return Fail(1, run.message());
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "predictor --target=HOST:PORT [--replica_db=DIR]; see --helpfull");
  if (const std::string error = deltastream::CommandLineError(argc, argv);
      !error.empty()) {
    return deltastream::Fail(2, error);
  }
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
