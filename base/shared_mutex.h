#ifndef DELTASTREAM_BASE_SHARED_MUTEX_H_
#define DELTASTREAM_BASE_SHARED_MUTEX_H_

#include <pthread.h>

#include "absl/base/thread_annotations.h"

namespace deltastream {

// A reader-writer mutex that clang's -Wthread-safety understands (like
// absl::Mutex) and that ThreadSanitizer sees (unlike absl::Mutex from Debian's
// libabsl, which is built without TSan instrumentation, so every read under a
// reader lock would be reported as a race with the last writer).
//
// Writers are preferred: a waiting writer (the training thread appending)
// goes before new readers, so a stream of readers cannot starve it, which
// glibc's default rwlock (and so std::shared_mutex) allows.
class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&mu_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  ~SharedMutex() { pthread_rwlock_destroy(&mu_); }
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { pthread_rwlock_wrlock(&mu_); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { pthread_rwlock_unlock(&mu_); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { pthread_rwlock_rdlock(&mu_); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { pthread_rwlock_unlock(&mu_); }

 private:
  pthread_rwlock_t mu_;
};

// Holds `mu` exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->Lock();
  }
  ~WriterLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds `mu` shared for its scope.
class ABSL_SCOPED_LOCKABLE ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* const mu_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_SHARED_MUTEX_H_
