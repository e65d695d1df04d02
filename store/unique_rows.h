#ifndef DELTASTREAM_STORE_UNIQUE_ROWS_H_
#define DELTASTREAM_STORE_UNIQUE_ROWS_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "store/update_mode.h"

namespace deltastream {

// The rows of one table that changed in a window: each ID once.
struct UniqueRows {
  // int64 [n], strictly ascending.
  at::Tensor ids;
  // [n, dim] rows matching `ids`, chosen by the store's UpdateMode; undefined
  // in UpdateMode::kNone.
  at::Tensor states;

  int64_t size() const { return ids.defined() ? ids.numel() : 0; }
};

// Unique rows of the concatenation of `ids` (each int64 [n_i]) and, unless
// `mode` is kNone, `states` (each [n_i, dim]), computed with tensor operations
// on the tensors' own device: no host copy. With kFirst a row's state is the
// one of its first occurrence in concatenation order, with kLast its last.
// `ids` must not be empty. This is the store's rule for device-resident lookups
// and the reference the host-side index is tested against.
UniqueRows UniqueRowsOf(const std::vector<at::Tensor>& ids,
                        const std::vector<at::Tensor>& states, UpdateMode mode);

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_UNIQUE_ROWS_H_
