#ifndef DELTASTREAM_BASE_SUBSCRIPTION_SCHEDULE_H_
#define DELTASTREAM_BASE_SUBSCRIPTION_SCHEDULE_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace deltastream {

// How often a subscription pushes (SubscribeRequest's periods).
struct SubscriptionPeriods {
  // Push once the tracker is this many batches past the last push (0: 1).
  int64_t every_steps = 0;
  // ...or once this long has passed since the last push and a batch has
  // closed since (0: by steps only).
  int64_t every_ms = 0;
  // Dense parameters (when the read asks for them) go with the first push,
  // then with the first push once either period has passed since the last
  // push that carried them; neither set: with every push.
  int64_t dense_every_steps = 0;
  int64_t dense_every_ms = 0;
};

// When a subscription pushes and what each push reads: the one schedule of
// the gRPC Subscribe handler (tracker_service/) and of a fan-in client's
// subscription to a sharded trainer (clients/fan_in_client.h), so that both
// only translate. The first push reads from the consumer's cursor (with all
// rows when the read asks for them), or from the request's continue_from;
// each later push reads the batches closed since the previous push, from
// that push's end (continue_from: in acknowledged mode the previous push may
// still be uncommitted).
//
// Not thread-safe: one subscription's stream owns its schedule.
class SubscriptionSchedule {
 public:
  // The largest periods accepted: far beyond any use, and small enough that
  // no sum of a batch index or a time with them can overflow.
  static constexpr int64_t kMaxEverySteps = int64_t{1} << 40;
  static constexpr int64_t kMaxEveryMs = int64_t{366} * 24 * 3600 * 1000;

  // InvalidArgument, naming the field, for a period below 0 or above its
  // maximum. `now`: when the subscription starts. `continue_from`: the
  // request's, where the first push starts when it reads no full rows (a
  // consumer resuming from the version it holds: a sharded trainer's ranks
  // then start where it is, even those that never got its last commit).
  static absl::StatusOr<SubscriptionSchedule> Create(
      const SubscriptionPeriods& periods, absl::Time now,
      std::optional<int64_t> continue_from = std::nullopt);

  // Whether a push is due with the tracker at `current_batch` at `now`.
  bool Due(int64_t current_batch, absl::Time now) const;

  // What the push that is due reads, beyond the subscription's request.
  struct Push {
    bool all_rows = false;  // the request's all_rows, on the first push only
    // Every later push: the previous push's end; the first: the request's.
    std::optional<int64_t> continue_from;
    bool include_dense = false;  // the request's, by the dense periods
  };
  // The push that is due, for a subscription whose request asks for
  // `all_rows` and `include_dense`.
  Push NextPush(bool all_rows, bool include_dense, int64_t current_batch,
                absl::Time now) const;

  // `push` (from NextPush) was delivered, ending at `end_batch`.
  void Pushed(const Push& push, int64_t end_batch, absl::Time now);

  // When no push is due: wait for a batch after `after_batch`, or until
  // `deadline` (at most `check` from `now`, so that the caller looks at
  // cancellation and shutdown that often).
  struct Wake {
    int64_t after_batch = 0;
    absl::Time deadline;
  };
  Wake NextWake(absl::Time now, absl::Duration check) const;

 private:
  SubscriptionSchedule(const SubscriptionPeriods& periods, absl::Time now,
                       std::optional<int64_t> continue_from);
  bool DenseDue(int64_t current_batch, absl::Time now) const;

  int64_t every_steps_;
  absl::Duration every_;
  int64_t dense_every_steps_;
  absl::Duration dense_every_;
  bool first_ = true;
  std::optional<int64_t> first_continue_from_;
  int64_t pushed_through_ = 0;
  absl::Time last_push_;
  int64_t dense_through_ = 0;
  absl::Time last_dense_ = absl::InfinitePast();
};

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_SUBSCRIPTION_SCHEDULE_H_
