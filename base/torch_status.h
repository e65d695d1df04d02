#ifndef DELTASTREAM_BASE_TORCH_STATUS_H_
#define DELTASTREAM_BASE_TORCH_STATUS_H_

#include <c10/util/Exception.h>

#include <exception>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {

// The one mapping from LibTorch's exceptions to statuses. LibTorch reports a
// failed check (TORCH_CHECK: a shape, a dtype, an index out of range) by
// throwing c10::Error; in this project the tensors a LibTorch call sees come
// from its caller (a request, a batch, a config), so:
//   c10::Error            -> InvalidArgument (its message, without backtrace)
//   std::bad_alloc, and a c10::Error that reports memory an allocator
//   could not give (IsOutOfMemory) -> ResourceExhausted
//   any other std::exception -> Internal
// No exception crosses an API of this project: wrap LibTorch calls in
// CatchTorchErrors.
//
// Whether `e` reports memory an allocator could not give: c10's
// OutOfMemoryError (CUDA's caching allocator, KeepHostMemoryForReuse's CPU
// allocator: "out of memory") or LibTorch's default CPU allocator's "not
// enough memory". A reader that maps LibTorch's errors to DataLoss (damaged
// bytes) asks this first: running out of memory is not damage.
inline bool IsOutOfMemory(const c10::Error& e) {
  const absl::string_view message = e.what_without_backtrace();
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
         message.find("out of memory") != absl::string_view::npos ||
         message.find("not enough memory") != absl::string_view::npos;
}

inline absl::Status TorchErrorStatus(const c10::Error& e) {
  const char* message = e.what_without_backtrace();
  if (IsOutOfMemory(e)) return absl::ResourceExhaustedError(message);
  return absl::InvalidArgumentError(message);
}

// Runs `f` (returning absl::Status or absl::StatusOr<T>) and turns any
// exception it throws into a status by the mapping above.
template <typename F>
auto CatchTorchErrors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("unexpected error: ", e.what()));
  }
}

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_TORCH_STATUS_H_
