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
//   std::bad_alloc, and a c10::Error that reports "out of memory"
//                         -> ResourceExhausted
//   any other std::exception -> Internal
// No exception crosses an API of this project: wrap LibTorch calls in
// CatchTorchErrors.
inline absl::Status TorchErrorStatus(const c10::Error& e) {
  const char* message = e.what_without_backtrace();
  if (absl::string_view(message).find("out of memory") !=
      absl::string_view::npos) {
    return absl::ResourceExhaustedError(message);
  }
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
