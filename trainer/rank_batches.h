#ifndef DELTASTREAM_TRAINER_RANK_BATCHES_H_
#define DELTASTREAM_TRAINER_RANK_BATCHES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"

namespace deltastream {

class ProcessGroup;

// The batches of one rank of a data-parallel job: `global` yields global
// batches of world_size x batch_size examples (the same ones on every rank:
// the same source and seed), and rank r trains examples
// [r x batch_size, (r + 1) x batch_size) of each. So N ranks of batch_size
// B see, step for step, the examples one process of batch N x B sees.
//
// Ranks stop together: every Next() agrees with the other ranks (one
// all-reduce of one number, "data.next") whether all of them go on, and if
// not, whether for a stop request (stop_requested()). It ends
// (nullopt on every rank) when any rank's source ended, returned a partial
// global batch (the last batch of a file: dropped, as a data loader with
// drop_last does, since every rank must train the same number of examples),
// failed (that rank returns its error, the others end), or saw `stop` set
// (a signal that reached the ranks at different steps). A failed
// agreement (a rank died) is the group's error.
//
// Every rank must call Next() equally often (a collective): the trainer's
// pipelines do. Not thread-safe.
class RankBatchSource : public BatchSource {
 public:
  // `group` and `stop` (may be null) outlive the source.
  RankBatchSource(std::unique_ptr<BatchSource> global, ProcessGroup* group,
                  int64_t batch_size, const std::atomic<bool>* stop);
  absl::StatusOr<std::optional<Batch>> Next() override;
  // Skips `batches` global batches (the global source's Skip: no batch
  // drawn where it can jump ahead), then agrees with the other ranks on how
  // many were skipped (one all-reduce, "data.skip": the fewest). A
  // collective, as Next() is.
  absl::StatusOr<int64_t> Skip(int64_t batches) override;

  // Where the agreement reads the stop request (null: none).
  void set_stop(const std::atomic<bool>* stop) { stop_ = stop; }
  // Whether the last Next() ended because some rank saw its stop request
  // (and every rank's data went on): what the ranks that did not see the
  // signal yet learn from the agreement.
  bool stop_requested() const { return stop_requested_; }

 private:
  std::unique_ptr<BatchSource> global_;
  ProcessGroup* group_;
  int64_t batch_size_;
  const std::atomic<bool>* stop_;
  bool stop_requested_ = false;
};

// This rank's examples of a global batch (see RankBatchSource);
// InvalidArgument when the batch does not hold world_size x batch_size.
absl::StatusOr<Batch> RankExamples(const Batch& global, int rank,
                                   int world_size, int64_t batch_size);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_RANK_BATCHES_H_
