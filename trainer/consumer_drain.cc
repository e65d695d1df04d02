#include "trainer/consumer_drain.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltastream {

bool DrainConsumers(Tracker& tracker, absl::Duration timeout,
                    const std::function<void(const std::string&)>& log) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> behind;
  do {
    behind.clear();
    const TrackerStatus status = tracker.Status();
    for (const ConsumerStatus& consumer : status.consumers) {
      if (consumer.cursor < status.current_batch ||
          consumer.pending_end.has_value()) {
        behind.push_back(absl::StrCat(consumer.name, " at batch ",
                                      std::max<int64_t>(consumer.cursor, 0)));
      }
    }
    if (behind.empty()) {
      log(absl::StrCat("drained: every consumer has read through batch ",
                       status.current_batch));
      return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  log(absl::StrCat("drain ended after ", absl::ToDoubleSeconds(timeout),
                   " s with consumers behind: ", absl::StrJoin(behind, ", ")));
  return false;
}

}  // namespace deltastream
