#ifndef DELTASTREAM_TRAINER_COMM_PROCESS_GROUP_H_
#define DELTASTREAM_TRAINER_COMM_PROCESS_GROUP_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "trainer/comm/torchrun_env.h"

namespace deltastream {

struct ProcessGroupOptions {
  TorchrunEnvironment env;
  // CPU: Gloo. CUDA: NCCL, where LibTorch was built with it (a LibTorch 2.x
  // wheel); elsewhere Create returns Unimplemented.
  c10::Device device = c10::Device(c10::kCPU);
  // The longest any collective, and the rendezvous, may wait for the other
  // ranks. A rank that died or hangs makes every other rank's collective
  // fail within 2 x timeout (the failed collective, then as long again for
  // the survivors to find out who is missing).
  absl::Duration timeout = absl::Seconds(60);
  // How long Create waits for every rank to join (ranks of a job may start
  // minutes apart, e.g. pods being scheduled); collectives then fail fast.
  absl::Duration rendezvous_timeout = absl::Minutes(5);
};

// Bytes one rank moved through one labelled kind of collective since the
// last ResetStats: what it sent to and received from other ranks (its own
// share, which stays in memory, is not counted).
struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

// A c10d process group over the ranks of one job (TorchRec's
// dist.ProcessGroup): rendezvous through c10d's TCPStore, collectives by
// Gloo (CPU tensors) or NCCL (CUDA tensors), each wrapped so that it returns
// a Status instead of throwing.
//
// Every collective must be called by every rank, in the same order, with
// matching sizes (the usual c10d contract); `label` names it in errors and
// in stats (e.g. "input_dist.values"). Collectives block until done.
//
// Failures. When a collective fails (a peer closed its connection, or the
// timeout passed) this rank records its failure in the store and waits up to
// the timeout for the other ranks to do the same; the Status (Unavailable,
// or DeadlineExceeded for a timeout) names the collective, its label, the
// ranks that left the group and why (Leave), the ranks that never reported
// (dead or hung), and c10d's own message. The
// group is unusable afterwards (every later call fails at once): exit and
// restart from a checkpoint. So that a dead peer fails the collective rather
// than this process, Create sets SIGPIPE to be ignored (as Python does for
// every PyTorch program) unless the program installed a handler for it.
//
// Threads: calls are serialised internally, but collectives from two threads
// would interleave unpredictably across ranks: call from one thread (the
// training thread, or autograd's backward on it).
class ProcessGroup {
 public:
  // Rendezvous: rank 0 hosts the TCPStore at master_addr:master_port (or
  // every rank is a client of torchrun's agent store), every rank checks in,
  // then the backend connects every pair of ranks. Unavailable (naming the
  // address and the ranks that did not join) when the others do not arrive
  // within rendezvous_timeout; Unimplemented for a CUDA device without NCCL.
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Create(
      const ProcessGroupOptions& options);
  // Create with TorchrunEnvironmentFromEnv().
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> FromEnvironment(
      c10::Device device, absl::Duration timeout,
      absl::Duration rendezvous_timeout = absl::Minutes(5));

  // Another group of the same ranks over this group's store (keys under
  // "<name>/"), with its own backend connections: collectives on it pair up
  // among themselves, independently of this group's, so one thread may run
  // its collectives while another runs this group's (TrainPipelineSparseDist
  // distributes the next batch's input so). Every rank calls it with the
  // same name, in the same order relative to this group's collectives.
  // Errors as Create's.
  absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateSibling(
      absl::string_view name) const;

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const;
  int local_world_size() const;
  c10::Device device() const;
  absl::Duration timeout() const;
  // "gloo" or "nccl".
  absl::string_view backend_name() const;

  // output[output_offsets(q) ... + output_splits[q]) (dimension 0) receives
  // rank q's input rows meant for this rank; input rows
  // [input_offsets(p) ... + input_splits[p]) go to rank p. Both tensors
  // contiguous on the group's device with the same dtype and trailing
  // shape; `output` is allocated by the caller with sum(output_splits) rows.
  // InvalidArgument for splits that do not have world_size entries or do not
  // sum to the tensors' rows.
  absl::Status AllToAll(const at::Tensor& input,
                        absl::Span<const int64_t> input_splits,
                        at::Tensor& output,
                        absl::Span<const int64_t> output_splits,
                        absl::string_view label);
  // In place: every rank ends with the elementwise sum over ranks.
  absl::Status AllReduceSum(at::Tensor& tensor, absl::string_view label);
  // output ([world_size * n, ...], caller-allocated) holds every rank's
  // input ([n, ...]) in rank order.
  absl::Status AllGather(const at::Tensor& input, at::Tensor& output,
                         absl::string_view label);
  // input [world_size * n, ...]: output ([n, ...], caller-allocated) is the
  // sum over ranks of their input's block `rank()`. (Gloo in LibTorch 1.13
  // has no reduce-scatter: emulated there by an all-reduce and a slice.)
  absl::Status ReduceScatterSum(const at::Tensor& input, at::Tensor& output,
                                absl::string_view label);
  absl::Status Barrier(absl::string_view label);
  // The minimum of `value` over ranks (e.g. whether every rank still has
  // data, so that ranks stop at the same step).
  absl::StatusOr<int64_t> AllReduceMin(int64_t value, absl::string_view label);

  // The group's key-value store (the rendezvous store, under this group's
  // prefix): Set overwrites; Get waits up to the timeout for the key
  // (DeadlineExceeded naming it).
  absl::Status StoreSet(absl::string_view key, absl::string_view value);
  absl::StatusOr<std::string> StoreGet(absl::string_view key);

  // Tells the other ranks that this one leaves the group because of `why`
  // (a failure of its own: a checkpoint it cannot read, a port it cannot
  // bind), then closes its connections (Gloo). Their next or pending
  // collective fails at once, naming this rank and `why`, instead of
  // waiting out the timeout for a rank that never reports (dead or hung),
  // even while this process stays alive. Does nothing once the group has
  // failed (the others know); every later call on this rank fails. Best
  // effort: with the store gone, the others find this rank as they would a
  // dead one. Siblings (CreateSibling) are not left: leave each.
  void Leave(const absl::Status& why);
  // Whether a collective has failed or Leave was called: every later call
  // fails.
  bool failed() const;
  // Whether a collective of this group, or of a sibling (CreateSibling),
  // failed because of other ranks: it named a rank that left the group or
  // never reported (dead or hung), or, on a rank other than 0, found the
  // store's host gone, and this rank had entered it on time (within the
  // timeout of the group's forming or its previous collective: a rank
  // later than that kept the others waiting until they gave up, and is
  // itself the likelier fault). False while the group works, after Leave
  // alone (a failure of this rank's own), and when every rank saw the
  // collective fail (no rank to blame). It errs towards false: a
  // scheduler that counts failures per rank (the trainer's
  // --peer_failure_exit_code) may count one failure twice, never none.
  bool failed_elsewhere() const;

  // Per label, since construction or the last ResetStats.
  std::map<std::string, CollectiveStats> Stats() const;
  void ResetStats();

 private:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  // The rendezvous check-in and the backend's connections of a group whose
  // store is set (`where` names the store in errors).
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Connect(
      std::unique_ptr<Impl> impl, const std::string& where);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_COMM_PROCESS_GROUP_H_
