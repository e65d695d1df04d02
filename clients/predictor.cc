// Predictor: the replica-following loop (clients/predictor.h).
#include "clients/predictor.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/host_port.h"
#include "base/log.h"
#include "base/subscription_schedule.h"
#include "clients/checkpoint_chain.h"
#include "clients/delta_continuity.h"

namespace deltastream {

absl::Status ValidatePredictorOptions(const PredictorOptions& options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("--target is required");
  }
  if (absl::Status valid = ValidateTarget(options.target); !valid.ok()) {
    return valid;
  }
  if (options.consumer.empty()) {
    return absl::InvalidArgumentError("--consumer must not be empty");
  }
  if (options.every_ms < 0 || options.every_steps < 0 ||
      options.dense_every_steps < 0 || options.dense_every_ms < 0) {
    return absl::InvalidArgumentError(
        "--every_ms, --every_steps, --dense_every_steps and --dense_every_ms "
        "must be >= 0");
  }
  // The trainer's bounds on a subscription's periods, here rather than as a
  // subscription the trainer refuses after the replica said it was ready.
  if (options.every_ms > SubscriptionSchedule::kMaxEveryMs ||
      options.dense_every_ms > SubscriptionSchedule::kMaxEveryMs ||
      options.every_steps > SubscriptionSchedule::kMaxEverySteps ||
      options.dense_every_steps > SubscriptionSchedule::kMaxEverySteps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--every_ms and --dense_every_ms must be at most ",
        SubscriptionSchedule::kMaxEveryMs, ", --every_steps and ",
        "--dense_every_steps at most ", SubscriptionSchedule::kMaxEverySteps));
  }
  return absl::OkStatus();
}

namespace {

using Clock = std::chrono::steady_clock;

// Resubscribing waits 100 ms, doubling up to the channel's own reconnect
// backoff (ClientOptions::max_reconnect_backoff, 1 s): a restarted trainer
// is followed again within about a second of serving.
constexpr std::chrono::milliseconds kFirstBackoff{100};
const std::chrono::milliseconds kLongestBackoff =
    ClientOptions().max_reconnect_backoff;
// A resync right after a read of every row (none of the pushes between could
// be applied) waits 1 s, doubling up to 60 s.
constexpr std::chrono::milliseconds kFirstResyncWait{1000};
constexpr std::chrono::milliseconds kLongestResyncWait{60000};
// A bootstrap or resync touches its consumer this often, as often as the
// tracker touches a subscription waiting for its next push: a consumer
// expiry of a few seconds is not reached.
constexpr absl::Duration kKeepAliveEvery = absl::Seconds(1);
constexpr std::chrono::milliseconds kTrainerPoll{200};
constexpr std::chrono::seconds kSummaryEvery{5};
// every_steps for "by time only": a push is due only when the timer runs out.
constexpr int64_t kNeverBySteps = int64_t{1} << 40;

void Log(const std::string& line) { LogInfo(line); }

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

bool IsFatal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnauthenticated ||
         status.code() == absl::StatusCode::kPermissionDenied;
}

// A replica write that failed in the replica's own storage (a full or
// failing disk under --replica_db): retrying the trainer cannot fix it, and a
// database whose write failed must not be written again.
bool IsReplicaStorageFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInternal ||
         status.code() == absl::StatusCode::kDataLoss ||
         status.code() == absl::StatusCode::kResourceExhausted;
}

}  // namespace

// Keeps the predictor's consumer in contact with the tracker from its
// construction to its destruction or Stop(), from a thread of its own
// (KeepConsumerAlive on keep_alive_thread_). Its end and Stop() cancel a
// touch in flight and do not wait for it: the next keep-alive or the
// predictor's destructor joins the thread, within 100 ms of the cancel.
class Predictor::ConsumerKeepAlive {
 public:
  explicit ConsumerKeepAlive(Predictor& predictor) : predictor_(predictor) {
    predictor_.StartKeepAlive();
  }
  ~ConsumerKeepAlive() { predictor_.EndKeepAlive(); }
  ConsumerKeepAlive(const ConsumerKeepAlive&) = delete;
  ConsumerKeepAlive& operator=(const ConsumerKeepAlive&) = delete;

 private:
  Predictor& predictor_;
};

Predictor::Predictor(PredictorOptions options,
                     std::unique_ptr<TrackerClient> client,
                     std::unique_ptr<Replica> replica, FILE* apply_log)
    : options_(std::move(options)),
      client_(std::move(client)),
      replica_(std::move(replica)),
      apply_log_(apply_log) {}

Predictor::~Predictor() {
  EndKeepAlive();
  if (keep_alive_thread_.joinable()) keep_alive_thread_.join();
}

void Predictor::StartKeepAlive() {
  // The last keep-alive's thread has ended, or ends within 100 ms (its end
  // cancelled its touch).
  if (keep_alive_thread_.joinable()) keep_alive_thread_.join();
  const CallCanceller* touches;
  {
    absl::MutexLock lock(&stop_mu_);
    keeping_alive_ = true;
    keep_alive_touches_ = std::make_unique<CallCanceller>();
    touches = keep_alive_touches_.get();
  }
  keep_alive_thread_ =
      std::thread([this, touches] { KeepConsumerAlive(*touches); });
}

void Predictor::EndKeepAlive() {
  absl::MutexLock lock(&stop_mu_);
  keeping_alive_ = false;
  if (keep_alive_touches_ != nullptr) keep_alive_touches_->Cancel();
  stop_cv_.SignalAll();
}

void Predictor::Stop() {
  absl::MutexLock lock(&stop_mu_);
  stopping_.store(true);
  if (in_flight_ != nullptr) in_flight_->Cancel();
  if (keep_alive_touches_ != nullptr) keep_alive_touches_->Cancel();
  stop_cv_.SignalAll();
}

bool Predictor::StartCall(CallCanceller* call) {
  absl::MutexLock lock(&stop_mu_);
  if (stopping_.load()) return false;
  in_flight_ = call;
  return true;
}

void Predictor::EndCall() {
  absl::MutexLock lock(&stop_mu_);
  in_flight_ = nullptr;
}

bool Predictor::Sleep(absl::Duration duration) {
  const absl::Time deadline = absl::Now() + duration;
  absl::MutexLock lock(&stop_mu_);
  while (!stopping_.load()) {
    if (stop_cv_.WaitWithDeadline(&stop_mu_, deadline)) break;
  }
  return !stopping_.load();
}

bool Predictor::WaitToKeepAlive(absl::Time deadline) {
  absl::MutexLock lock(&stop_mu_);
  while (keeping_alive_ && !stopping_.load()) {
    if (stop_cv_.WaitWithDeadline(&stop_mu_, deadline)) break;
  }
  return keeping_alive_ && !stopping_.load();
}

void Predictor::KeepConsumerAlive(const CallCanceller& touches) {
  // At once: the consumer may have been silent for a while already (its
  // predictor restarted).
  absl::Time next = absl::Now();
  while (WaitToKeepAlive(next)) {
    const absl::Status touched = client_->Touch(options_.consumer, &touches);
    if (touched.code() == absl::StatusCode::kNotFound) {
      LogWarning(absl::StrCat(
          "consumer '", options_.consumer, "' is gone from ", options_.target,
          " (removed, or expired) before the subscription: ",
          touched.message()));
      return;
    }
    // Any other error (the tracker unreachable a moment) is the
    // subscription's to meet.
    next = absl::Now() + kKeepAliveEvery;
  }
}

void Predictor::NoteError(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  last_error_ = std::string(status.message());
}

absl::Status Predictor::Run() {
  std::chrono::milliseconds backoff = kFirstBackoff;
  std::chrono::milliseconds resync_wait = kFirstResyncWait;
  while (!stopping_.load()) {
    progressed_ = false;
    absl::Status status = Session();
    if (stopping_.load()) break;
    // A resync is due: now, unless the last one did not help.
    if (status.ok()) {
      backoff = kFirstBackoff;
      if (full_reads_since_push_ == 0) {
        resync_wait = kFirstResyncWait;
        continue;
      }
      LogWarning(absl::StrFormat(
          "resync again in %d ms: no push could be applied since the last "
          "read of every row (%s)",
          resync_wait.count(), resync_reason_));
      if (!Sleep(absl::FromChrono(resync_wait))) break;
      resync_wait = std::min(resync_wait * 2, kLongestResyncWait);
      continue;
    }
    NoteError(status);
    if (fatal_ || IsFatal(status)) return status;
    if (progressed_) backoff = kFirstBackoff;
    {
      absl::MutexLock lock(&mu_);
      ++reconnects_;
    }
    LogWarning(absl::StrFormat("reconnect in %d ms: %s", backoff.count(),
                               status.message()));
    if (!Sleep(absl::FromChrono(backoff))) break;
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
    absl::MutexLock lock(&mu_);
    trainer_batch_ = tracker->current_batch();
    if (replica_->Version() >= 0 && !dense_expected_) {
      dense_expected_ = !replica_->Dense().parameters.empty();
    }
  }
  // A sharded trainer's ranks may hold the consumer at different cursors:
  // a replica must not start before the highest (the rows before it may be
  // gone from that rank).
  int64_t cursor = -2;
  for (const v1::ConsumerStatus& consumer : tracker->consumers()) {
    if (consumer.name() == options_.consumer) {
      cursor = std::max(consumer.cursor(), consumer.highest_cursor());
    }
  }
  if (cursor == -2) {
    absl::StatusOr<std::vector<std::string>> added =
        client_->AddConsumer(options_.consumer);
    if (!added.ok() &&
        added.status().code() != absl::StatusCode::kAlreadyExists) {
      // A name the trainer refuses is refused on every retry.
      fatal_ = added.status().code() == absl::StatusCode::kInvalidArgument;
      return added.status();
    }
    // Said loudly: a misspelt name would hold rows on the trainer for good.
    LogWarning(absl::StrCat(
        "consumer '", options_.consumer, "' was not on ", options_.target,
        ": added; the trainer keeps its unread rows until it is removed "
        "(deltactl consumers remove ",
        options_.consumer, ")"));
    cursor = tracker->current_batch();
  }

  if (replica_->Version() < 0 || !resync_reason_.empty()) {
    // Until the subscription, which keeps the consumer in contact itself.
    const ConsumerKeepAlive keep_alive(*this);
    if (absl::Status s = BootstrapOrResync(*tracker, cursor); !s.ok()) {
      return s;
    }
  }
  resync_reason_.clear();

  v1::SubscribeRequest request;
  v1::GetDeltaRequest* read = request.mutable_read();
  read->set_consumer(options_.consumer);
  read->set_omit_states(true);
  read->set_include_dense(true);
  // The first push starts after the version held, also on a rank that
  // still holds that read uncommitted (a sharded trainer's rank that the
  // commit never reached before a crash): the ranks' parts start together
  // and no resync follows.
  if (const int64_t held = replica_->Version(); held >= 0) {
    read->set_continue_from(held);
  }
  request.set_every_ms(options_.every_ms);
  request.set_every_steps(options_.every_steps > 0 || options_.every_ms == 0
                              ? options_.every_steps
                              : kNeverBySteps);
  request.set_dense_every_steps(options_.dense_every_steps);
  request.set_dense_every_ms(options_.dense_every_ms);
  CallCanceller subscription;
  if (!StartCall(&subscription)) return absl::OkStatus();
  absl::Status status = client_->Subscribe(
      request,
      [this](ReceivedDelta&& delta) { return OnPush(std::move(delta)); },
      &subscription);
  EndCall();
  if (!push_error_.ok()) return std::exchange(push_error_, absl::OkStatus());
  if (!status.ok()) {
    // A subscription the trainer refuses is refused on every retry: the
    // replica would stay at this version while the predictor says it is
    // ready.
    fatal_ = status.code() == absl::StatusCode::kInvalidArgument;
    return status;
  }
  if (stopping_.load() || !resync_reason_.empty()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("the subscription to ", options_.target, " ended"));
}

absl::Status Predictor::BootstrapOrResync(const v1::StatusResponse& tracker,
                                          int64_t cursor) {
  if (replica_->Version() < 0) {
    if (!options_.bootstrap_chain.empty() && !chain_tried_) {
      chain_tried_ = true;
      if (BootstrapFromChain(tracker, cursor)) return absl::OkStatus();
    }
    return FullRead("bootstrap");
  }
  {
    absl::MutexLock lock(&mu_);
    ++resyncs_;
  }
  Log(absl::StrCat("resync: ", resync_reason_));
  return FullRead("resync");
}

absl::Status Predictor::FullRead(const std::string& why) {
  v1::GetDeltaRequest request;
  request.set_consumer(options_.consumer);
  request.set_all_rows(true);
  request.set_include_dense(true);
  request.set_omit_states(true);
  const absl::Time started = absl::Now();
  CallCanceller read;
  if (!StartCall(&read)) return absl::CancelledError("stopping");
  absl::StatusOr<ReceivedDelta> delta = client_->GetDelta(request, &read);
  EndCall();
  if (!delta.ok()) return delta.status();
  const v1::DeltaHeader header = delta->header;
  const int64_t rows = Rows(*delta);
  const int64_t bytes = PayloadBytes(*delta);
  {
    absl::MutexLock lock(&mu_);
    bytes_received_ += bytes;
    trainer_batch_ = std::max(trainer_batch_, header.end_batch());
  }
  if (absl::Status s =
          replica_->Reset({*delta}, header.end_batch(), header.run_id());
      !s.ok()) {
    fatal_ = IsReplicaStorageFailure(s);
    return s;
  }
  staged_.clear();
  progressed_ = true;
  ++full_reads_since_push_;
  version_newest_change_us_ = header.newest_change_unix_micros();
  // A full read starts the count again: it covers what the consumer's read
  // covered, whatever the replica held before.
  LogApply(std::max<int64_t>(header.start_batch(), 0), header.end_batch(), rows,
           !delta->dense.empty(), true, header.run_id());
  {
    absl::MutexLock lock(&mu_);
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
  // Stop() ends the load within one record.
  absl::StatusOr<LoadedChain> chain =
      LoadChain(dir, [this] { return stopping_.load(); });
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
  if (RunLostHeldBatches({chain->end_batch, chain->run_id}, tracker.run_id(),
                         tracker.run_start_batch())) {
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
    absl::MutexLock lock(&mu_);
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
    absl::MutexLock lock(&mu_);
    bytes_received_ += PayloadBytes(delta);
    trainer_batch_ = std::max(trainer_batch_, end);
    if (first_push_) {
      // The first push of a subscription carries the dense parameters when
      // the trainer has any.
      dense_expected_ = !delta.dense.empty();
    }
  }
  first_push_ = false;
  const int64_t version = replica_->Version();
  const int64_t covered =
      staged_.empty() ? version : staged_.back().header.end_batch();
  const DeltaVerdict verdict =
      ClassifyDelta({version, replica_->RunId()}, covered, header);
  if (verdict.must_resync()) {
    resync_reason_ = verdict.reason;
    return false;
  }
  const bool dense_expected = [this] {
    absl::MutexLock lock(&mu_);
    return dense_expected_;
  }();
  const bool catches_up_dense = end == version && !delta.dense.empty() &&
                                replica_->Dense().version < version;
  if (verdict.fit == DeltaFit::kHeldAlready && !catches_up_dense) {
    // Nothing the replica lacks: a redelivery, or a push of no new batch.
    Commit(end);
    return true;
  }
  const bool has_dense = !delta.dense.empty();
  staged_.push_back(std::move(delta));
  if (dense_expected && !has_dense) {
    absl::MutexLock lock(&mu_);
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
      fatal_ = IsReplicaStorageFailure(s);
      push_error_ = s;
    }
    return false;
  }
  const int64_t applied_at = absl::ToUnixMicros(absl::Now());
  version_newest_change_us_ = header.newest_change_unix_micros();
  staged_.clear();
  progressed_ = true;
  full_reads_since_push_ = 0;
  LogApply(version, end, rows, has_dense, false, header.run_id());
  {
    absl::MutexLock lock(&mu_);
    ++applied_deltas_;
    applied_rows_ += rows;
    staged_count_ = 0;
    if (oldest > 0) freshness_.Add((applied_at - oldest) / 1000.0);
  }
  if (oldest > 0 && options_.on_freshness) {
    options_.on_freshness((applied_at - oldest) / 1e6);
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
    absl::MutexLock lock(&mu_);
    ++superseded_commits_;
  } else if (!status.ok()) {
    NoteError(status);
    LogWarning(
        absl::StrCat("commit of batch ", end_batch,
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
  while (Sleep(absl::FromChrono(kTrainerPoll))) {
    if (absl::StatusOr<v1::StatusResponse> tracker = client_->Status();
        tracker.ok()) {
      absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
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

}  // namespace deltastream
