#include "base/subscription_schedule.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace deltastream {
namespace {

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t max) {
  if (value < 0 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be 0 to ", max, ", got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SubscriptionSchedule> SubscriptionSchedule::Create(
    const SubscriptionPeriods& periods, absl::Time now,
    std::optional<int64_t> continue_from) {
  for (auto [field, value, max] :
       {std::make_tuple("every_steps", periods.every_steps, kMaxEverySteps),
        std::make_tuple("every_ms", periods.every_ms, kMaxEveryMs),
        std::make_tuple("dense_every_steps", periods.dense_every_steps,
                        kMaxEverySteps),
        std::make_tuple("dense_every_ms", periods.dense_every_ms,
                        kMaxEveryMs)}) {
    if (absl::Status status = CheckRange(field, value, max); !status.ok()) {
      return status;
    }
  }
  return SubscriptionSchedule(periods, now, continue_from);
}

SubscriptionSchedule::SubscriptionSchedule(const SubscriptionPeriods& periods,
                                           absl::Time now,
                                           std::optional<int64_t> continue_from)
    : every_steps_(std::max<int64_t>(1, periods.every_steps)),
      every_(periods.every_ms > 0 ? absl::Milliseconds(periods.every_ms)
                                  : absl::InfiniteDuration()),
      dense_every_steps_(periods.dense_every_steps),
      dense_every_(periods.dense_every_ms > 0
                       ? absl::Milliseconds(periods.dense_every_ms)
                       : absl::ZeroDuration()),
      first_continue_from_(continue_from),
      last_push_(now) {}

bool SubscriptionSchedule::Due(int64_t current_batch, absl::Time now) const {
  if (first_) return true;
  // Differences, not sums: nothing here can overflow.
  const int64_t closed = current_batch - pushed_through_;
  return closed >= every_steps_ || (closed > 0 && now - last_push_ >= every_);
}

bool SubscriptionSchedule::DenseDue(int64_t current_batch,
                                    absl::Time now) const {
  const bool every_push =
      dense_every_steps_ == 0 && dense_every_ == absl::ZeroDuration();
  return first_ || every_push ||
         (dense_every_steps_ > 0 &&
          current_batch - dense_through_ >= dense_every_steps_) ||
         (dense_every_ > absl::ZeroDuration() &&
          now - last_dense_ >= dense_every_);
}

SubscriptionSchedule::Push SubscriptionSchedule::NextPush(
    bool all_rows, bool include_dense, int64_t current_batch,
    absl::Time now) const {
  Push push;
  push.all_rows = all_rows && first_;
  if (!first_) {
    push.continue_from = pushed_through_;
  } else if (!push.all_rows) {
    push.continue_from = first_continue_from_;
  }
  push.include_dense = include_dense && DenseDue(current_batch, now);
  return push;
}

void SubscriptionSchedule::Pushed(const Push& push, int64_t end_batch,
                                  absl::Time now) {
  if (push.include_dense) {
    dense_through_ = end_batch;
    last_dense_ = now;
  }
  first_ = false;
  pushed_through_ = end_batch;
  last_push_ = now;
}

SubscriptionSchedule::Wake SubscriptionSchedule::NextWake(
    absl::Time now, absl::Duration check) const {
  // The step that makes a push due (once the timer has run out, any step),
  // the timer, or the periodic check.
  const absl::Time timer = last_push_ + every_;  // saturates at infinity
  if (now >= timer) return {pushed_through_, now + check};
  return {pushed_through_ + every_steps_ - 1, std::min(now + check, timer)};
}

}  // namespace deltastream
