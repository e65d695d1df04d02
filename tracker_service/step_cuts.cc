#include "tracker_service/step_cuts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/exclusive_lockable.h"

namespace deltastream {
namespace {

// A deadline the clock can hold (an infinite one would overflow it).
std::chrono::system_clock::time_point Bounded(absl::Time deadline) {
  return absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Hours(24)));
}

}  // namespace

absl::Status StepCuts::Await(int64_t cut, absl::Time deadline,
                             const std::function<bool()>& cancelled) {
  if (cut == 0) return absl::InvalidArgumentError("cut 0 names no cut");
  WriterLock lock(&mu_);
  if (!cuts_.emplace(cut, stepping_ ? State::kWaiting : State::kUnserved)
           .second) {
    return absl::AlreadyExistsError(
        absl::StrCat("cut ", cut, " is being read here already"));
  }
  if (!stepping_) return absl::OkStatus();
  order_.push_back(cut);
  auto opened = [this, cut]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !stepping_ || cuts_.at(cut) != State::kWaiting;
  };
  ExclusiveLockable held(mu_);
  bool gave_up = false;  // the caller cancelled
  if (cancelled) {
    // A client that cancelled (another rank's part failed) must not leave
    // this cut waiting, and a handler thread held, until the deadline.
    constexpr absl::Duration kPoll = absl::Milliseconds(20);
    while (!opened() && absl::Now() < deadline) {
      if (cancelled()) {
        gave_up = true;
        break;
      }
      cv_.wait_until(held, Bounded(std::min(deadline, absl::Now() + kPoll)),
                     opened);
    }
  } else {
    cv_.wait_until(held, Bounded(deadline), opened);
  }
  order_.erase(std::find(order_.begin(), order_.end(), cut));
  if (!opened()) {
    cuts_.erase(cut);
    if (gave_up) {
      return absl::CancelledError(
          absl::StrCat("the read of cut ", cut, " was cancelled"));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "the other ranks did not all receive cut ", cut,
        " in time: a read of a sharded trainer goes to every rank"));
  }
  State& state = cuts_.at(cut);
  if (state == State::kWaiting) state = State::kUnserved;  // not stepping
  return absl::OkStatus();
}

void StepCuts::Finish(int64_t cut) {
  WriterLock lock(&mu_);
  auto it = cuts_.find(cut);
  if (it == cuts_.end()) return;
  // Serve() counts and erases what it opened and waits for; a cut read
  // while the trainer did not step, or after Serve gave up waiting, is
  // nobody's to wait for.
  if (it->second == State::kOpen) {
    it->second = State::kFinished;
    cv_.notify_all();
  } else {
    cuts_.erase(it);
  }
}

std::vector<int64_t> StepCuts::Waiting() const {
  WriterLock lock(&mu_);
  std::vector<int64_t> waiting;
  for (int64_t cut : order_) {
    if (waiting.size() == kMaxPerBoundary) break;
    if (cuts_.at(cut) == State::kWaiting) waiting.push_back(cut);
  }
  return waiting;
}

int StepCuts::Serve(absl::Span<const int64_t> cuts, absl::Time deadline) {
  WriterLock lock(&mu_);
  std::vector<int64_t> opened;
  for (int64_t cut : cuts) {
    auto it = cuts_.find(cut);
    if (it == cuts_.end() || it->second != State::kWaiting) continue;
    it->second = State::kOpen;
    opened.push_back(cut);
  }
  if (opened.empty()) return 0;
  cv_.notify_all();
  auto all_finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int64_t cut : opened) {
      auto it = cuts_.find(cut);
      if (it != cuts_.end() && it->second != State::kFinished) return false;
    }
    return true;
  };
  ExclusiveLockable held(mu_);
  cv_.wait_until(held, Bounded(deadline), all_finished);
  int finished = 0;
  for (int64_t cut : opened) {
    auto it = cuts_.find(cut);
    if (it == cuts_.end()) continue;
    if (it->second == State::kFinished) {
      ++finished;
      cuts_.erase(it);
    } else {
      it->second = State::kAbandoned;  // Finish erases it
    }
  }
  return finished;
}

void StepCuts::SetStepping(bool stepping) {
  WriterLock lock(&mu_);
  stepping_ = stepping;
  cv_.notify_all();  // waiting reads go on unserved when it is false
}

}  // namespace deltastream
