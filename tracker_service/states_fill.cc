#include "tracker_service/states_fill.h"

#include <memory>
#include <utility>

#include "base/exclusive_lockable.h"
#include "tracker_service/tracker.h"

namespace deltastream {

StatesFill::~StatesFill() {
  WriterLock lock(&mu_);
  ExclusiveLockable lockable(mu_);
  changed_.wait(lockable,
                [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return finished_; });
}

absl::Status StatesFill::AwaitRows(const std::string& fqn, int64_t rows) {
  WriterLock lock(&mu_);
  ExclusiveLockable lockable(mu_);
  changed_.wait(lockable, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return SettledLocked(fqn, rows);
  });
  return CopiedLocked(fqn, rows) ? absl::OkStatus() : failure_;
}

bool StatesFill::HasRows(const std::string& fqn, int64_t rows) {
  WriterLock lock(&mu_);
  return SettledLocked(fqn, rows);
}

bool StatesFill::SettledLocked(const std::string& fqn, int64_t rows) const {
  return finished_ || CopiedLocked(fqn, rows);
}

bool StatesFill::CopiedLocked(const std::string& fqn, int64_t rows) const {
  auto it = copied_.find(fqn);
  return it == copied_.end() || it->second >= rows;
}

void StatesFill::HandOut(absl::StatusOr<Delta> delta) {
  WriterLock lock(&mu_);
  if (handed_out_) return;
  handed_out_ = true;
  delta_ = std::make_unique<absl::StatusOr<Delta>>(std::move(delta));
  changed_.notify_all();
}

void StatesFill::Expect(const std::string& fqn) {
  WriterLock lock(&mu_);
  copied_[fqn] = 0;
}

void StatesFill::Copied(const std::string& fqn, int64_t rows) {
  WriterLock lock(&mu_);
  copied_[fqn] = rows;
  changed_.notify_all();
}

void StatesFill::Finish(absl::Status status) {
  WriterLock lock(&mu_);
  finished_ = true;
  if (status.ok()) {
    copied_.clear();
  } else {
    failure_ = std::move(status);
  }
  changed_.notify_all();
}

absl::StatusOr<Delta> StatesFill::AwaitDelta() {
  WriterLock lock(&mu_);
  ExclusiveLockable lockable(mu_);
  changed_.wait(lockable,
                [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return handed_out_; });
  std::unique_ptr<absl::StatusOr<Delta>> delta = std::move(delta_);
  return *std::move(delta);
}

FillThread::~FillThread() {
  {
    WriterLock lock(&mu_);
    stopping_ = true;
    queued_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void FillThread::Run(std::function<void()> read) {
  WriterLock lock(&mu_);
  reads_.push_back(std::move(read));
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { Loop(); });
  }
  queued_.notify_one();
}

void FillThread::Loop() {
  while (true) {
    std::function<void()> read;
    {
      WriterLock lock(&mu_);
      ExclusiveLockable lockable(mu_);
      queued_.wait(lockable, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !reads_.empty();
      });
      if (reads_.empty()) return;  // stopping, nothing left
      read = std::move(reads_.front());
      reads_.pop_front();
    }
    read();
  }
}

}  // namespace deltastream
