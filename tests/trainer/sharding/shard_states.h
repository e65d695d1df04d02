#ifndef DELTASTREAM_TESTS_TRAINER_SHARDING_SHARD_STATES_H_
#define DELTASTREAM_TESTS_TRAINER_SHARDING_SHARD_STATES_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/modules/embedding_modules.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {
namespace testing {

// How the tests that train a sharded module (or trainer) next to the
// unsharded one compare what they hold. Plain functions; the tensors are
// read, never changed.

// The largest absolute difference between `a` and `b` (as doubles); 0 for
// two empty tensors; 1e30 for tensors of different shapes or an undefined
// one (no broadcasting: a shape mismatch is a failure).
double MaxDiff(const at::Tensor& a, const at::Tensor& b);

// The part of an unsharded module's state that `shard` holds: rows
// [row_offset, row_offset + rows) of a per-row state (2-D, or 1-D of more
// than one value, as row-wise Adagrad's) and, of a 2-D state wider than one
// column, columns [col_offset, col_offset + cols). A one-value state whole.
// A view of `unsharded`.
at::Tensor ShardSlice(const at::Tensor& unsharded, const EmbeddingShard& shard);

// One state of one local shard against the same part of the unsharded
// module's.
struct ShardStateDiff {
  std::string state;  // "<table>.<state>", e.g. "t0.momentum1"
  double diff = 0;    // MaxDiff(local state, ShardSlice(unsharded state))
};

// Every state ("weight", "momentum1", "momentum2" and, with `with_step`,
// "step") of every local shard of `sharded` that `unsharded` also has (by
// StateTensors' names), against ShardSlice of the unsharded state, in the
// order of local_shards(). Empty when the rank holds no shard. NotFound,
// naming the state, when a shard lacks one that `unsharded` has ("step"
// included, even without `with_step`).
absl::StatusOr<std::vector<ShardStateDiff>> ShardStateDiffs(
    const EmbeddingModule& unsharded, const ShardedEmbeddingModule& sharded,
    bool with_step);

}  // namespace testing
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRAINER_SHARDING_SHARD_STATES_H_
