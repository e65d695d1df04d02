#ifndef DELTASTREAM_BASE_EXCLUSIVE_LOCKABLE_H_
#define DELTASTREAM_BASE_EXCLUSIVE_LOCKABLE_H_

#include "absl/base/thread_annotations.h"
#include "base/shared_mutex.h"

namespace deltastream {

// The exclusive side of a SharedMutex as the BasicLockable that
// std::condition_variable_any waits with, so that what a condition variable
// waits on can be ABSL_GUARDED_BY a SharedMutex: clang checks the locking,
// and ThreadSanitizer sees it (it does not see absl::Mutex from Debian's
// uninstrumented libabsl, and reports every wait on one as a race). Use while
// holding the mutex (WriterLock): wait() unlocks it while it sleeps and
// locks it again before it returns. Not thread-safe itself: one per wait.
class ExclusiveLockable {
 public:
  explicit ExclusiveLockable(SharedMutex& mu) : mu_(mu) {}
  // Called by the condition variable only (the analysis cannot follow it).
  void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }

 private:
  SharedMutex& mu_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_EXCLUSIVE_LOCKABLE_H_
