#ifndef DELTASTREAM_TRAINER_CONSUMER_DRAIN_H_
#define DELTASTREAM_TRAINER_CONSUMER_DRAIN_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "tracker_service/tracker.h"

namespace deltastream {

// Waits, at the end of training, until every consumer of `tracker` has read
// through its current batch (cursor at the current batch, no read pending),
// polling every 20 ms, or until `timeout` passes. Logs one line through
// `log`: that every consumer has drained, or the consumers still behind with
// their cursors. Returns whether every consumer drained. The tracker must be
// serving (the service answers the reads meanwhile); thread-safe as
// Tracker::Status is.
bool DrainConsumers(Tracker& tracker, absl::Duration timeout,
                    const std::function<void(const std::string&)>& log);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CONSUMER_DRAIN_H_
