#include "trainer/comm/process_group.h"

#include <ATen/core/Tensor.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "trainer/comm/c10d_compat.h"

namespace deltastream {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// A store value from text, and back.
std::vector<uint8_t> Bytes(absl::string_view text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}
std::string Text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// The store keys a failing rank writes: "failed/<rank>" once it has seen the
// group fail (ProcessGroup's MissingRanks, Leave), "left/<rank>" with its
// reason when it leaves (Leave).
std::string FailedKey(int rank) { return absl::StrCat("failed/", rank); }
std::string LeftKey(int rank) { return absl::StrCat("left/", rank); }

// Whether a rank of the group on `store` has seen it fail (or left it).
bool AnyRankFailed(::c10d::Store& store, int world_size) {
  for (int r = 0; r < world_size; ++r) {
    if (store.check({FailedKey(r)})) return true;
  }
  return false;
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || absl::StartsWith(addr, "127.");
}

int64_t RowBytes(const at::Tensor& t) {
  return t.dim() == 0 ? t.element_size()
                      : (t.size(0) == 0 ? 0 : t.nbytes() / t.size(0));
}

// Collectives take tensors on the group's device (NCCL refuses host
// tensors, Gloo device ones): checked at every world size, so that a caller
// that passes the wrong one fails in a one-process run too, not first on
// several GPUs.
absl::Status CheckDevice(const at::Tensor& tensor, c10::Device device,
                         absl::string_view collective,
                         absl::string_view label) {
  if (tensor.device() == device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      collective, " '", label, "': a tensor on ", tensor.device().str(),
      ", the group's device is ", device.str()));
}

// CheckDevice of a collective's input and output.
absl::Status CheckDevices(const at::Tensor& input, const at::Tensor& output,
                          c10::Device device, absl::string_view collective,
                          absl::string_view label) {
  absl::Status status = CheckDevice(input, device, collective, label);
  return status.ok() ? CheckDevice(output, device, collective, label) : status;
}

absl::Status CheckSplits(absl::Span<const int64_t> splits, int world_size,
                         const at::Tensor& tensor, absl::string_view what) {
  if (static_cast<int>(splits.size()) != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " splits have ", splits.size(), " entries for ",
                     world_size, " ranks"));
  }
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " split ", s, " is negative"));
    }
    sum += s;
  }
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  if (sum != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " splits sum to ", sum, " but the tensor has ", rows, " rows"));
  }
  return absl::OkStatus();
}

// Gloo writes to its peers with writev(2), which raises SIGPIPE once a peer
// is gone, and SIGPIPE's default action ends this process there, silently,
// before the collective can fail with a Status naming the dead rank. Python
// ignores SIGPIPE for every PyTorch program; a C++ one has to itself. A
// handler the program installed is left alone.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

struct ProcessGroup::Impl {
  ProcessGroupOptions options;
  bool is_gloo = true;
  c10::intrusive_ptr<::c10d::Store> store;  // this group's prefix
  c10::intrusive_ptr<c10d_compat::CollectiveBackend> backend;

  mutable absl::Mutex mu;
  std::map<std::string, CollectiveStats> stats ABSL_GUARDED_BY(mu);
  // Set by the first failed collective; every later call returns it.
  absl::Status broken ABSL_GUARDED_BY(mu);
  // When the group formed or its last collective ended: a rank that enters a
  // collective more than a timeout later kept the others waiting.
  absl::Time last_done ABSL_GUARDED_BY(mu) = absl::Now();
  // Whether a collective of this group or of a sibling failed because of
  // other ranks (failed_elsewhere()): shared by a group and its siblings.
  std::shared_ptr<std::atomic<bool>> failed_elsewhere =
      std::make_shared<std::atomic<bool>>(false);

  int rank() const { return options.env.rank; }
  int size() const { return options.env.world_size; }

  // Who else saw the group fail: each survivor writes "failed/<rank>", then
  // waits up to the timeout for the others. Returns the ranks that never
  // wrote, or an error when the store itself is gone.
  absl::StatusOr<std::vector<int>> MissingRanks() {
    // The ranks not yet reported at the last poll that reached the store:
    // the store's host (rank 0) may exit while others still poll, having
    // given up first.
    std::optional<std::vector<int>> last_seen;
    try {
      store->set(FailedKey(rank()), std::vector<uint8_t>{1});
      const absl::Time deadline = absl::Now() + options.timeout;
      while (true) {
        std::vector<int> missing;
        for (int r = 0; r < size(); ++r) {
          if (r != rank() && !store->check({FailedKey(r)})) {
            missing.push_back(r);
          }
        }
        last_seen = missing;
        if (missing.empty() || absl::Now() >= deadline) return missing;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception& e) {
      if (last_seen) return *last_seen;
      return absl::UnavailableError(e.what());
    }
  }

  // The ranks that left the group (ProcessGroup::Leave) and why, in rank
  // order; empty when the store cannot tell.
  std::vector<std::pair<int, std::string>> LeftRanks() {
    std::vector<std::pair<int, std::string>> left;
    try {
      for (int r = 0; r < size(); ++r) {
        const std::string key = LeftKey(r);
        if (r != rank() && store->check({key})) {
          left.emplace_back(r, Text(store->get(key)));
        }
      }
    } catch (const std::exception&) {
    }
    return left;
  }

  // Runs one collective `body` under the lock, converting c10d's exceptions
  // into the Status described in the header.
  template <typename F>
  absl::Status Run(absl::string_view kind, absl::string_view label,
                   int64_t bytes_sent, int64_t bytes_received, F&& body) {
    absl::MutexLock lock(&mu);
    if (!broken.ok()) return broken;
    const absl::Time start = absl::Now();
    try {
      body();
    } catch (const std::exception& e) {
      std::string cause = e.what();
      if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
        cause = c10_error->what_without_backtrace();
      }
      const bool timed_out = absl::StrContains(cause, "imed out") ||
                             absl::StrContains(cause, "imeout");
      const std::string head = absl::StrCat(
          kind, " '", label, "' failed on rank ", rank(), " of ", size(),
          " after ", absl::FormatDuration(absl::Now() - start), ": ");
      absl::StatusOr<std::vector<int>> missing = MissingRanks();
      std::string who;
      // Other ranks to blame: the store's host unreachable (from another
      // rank), or ranks that left or never reported; never when this rank
      // came to the collective late enough for the others to have given up
      // on it (it is then the likelier fault, and its failure must count).
      const bool on_time = start - last_done <= options.timeout;
      bool elsewhere = false;
      if (!missing.ok()) {
        who = absl::StrCat(
            "rank 0 (the store's host at ", options.env.master_addr, ":",
            options.env.master_port, ") is unreachable, dead or hung (",
            missing.status().message(), ")");
        elsewhere = on_time && rank() != 0;
      } else {
        std::vector<std::string> parts;
        for (const auto& [r, why] : LeftRanks()) {
          parts.push_back(absl::StrCat("rank ", r, " left the group: ", why));
        }
        if (!missing->empty()) {
          parts.push_back(absl::StrCat(
              missing->size() == 1 ? "rank " : "ranks ",
              absl::StrJoin(*missing, ", "), " did not report within ",
              absl::FormatDuration(options.timeout), " (dead or hung)"));
        }
        elsewhere = on_time && !parts.empty();
        who = parts.empty() ? "every rank saw it fail"
                            : absl::StrJoin(parts, "; ");
      }
      if (elsewhere) *failed_elsewhere = true;
      const std::string message = absl::StrCat(head, who, "; c10d: ", cause);
      broken = timed_out ? absl::DeadlineExceededError(message)
                         : absl::UnavailableError(message);
      return broken;
    }
    last_done = absl::Now();
    CollectiveStats& s = stats[std::string(label)];
    ++s.calls;
    s.bytes_sent += bytes_sent;
    s.bytes_received += bytes_received;
    return absl::OkStatus();
  }
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::FromEnvironment(
    c10::Device device, absl::Duration timeout,
    absl::Duration rendezvous_timeout) {
  absl::StatusOr<TorchrunEnvironment> env = TorchrunEnvironmentFromEnv();
  if (!env.ok()) return env.status();
  ProcessGroupOptions options;
  options.env = *env;
  options.device = device;
  options.timeout = timeout;
  options.rendezvous_timeout = rendezvous_timeout;
  return Create(options);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(
    const ProcessGroupOptions& options) {
  const TorchrunEnvironment& env = options.env;
  if (options.timeout <= absl::ZeroDuration() ||
      options.rendezvous_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be > 0");
  }
  IgnoreSigpipeUnlessHandled();
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->is_gloo = !options.device.is_cuda();
  if (!impl->is_gloo && !c10d_compat::kHasNccl) {
    return absl::UnimplementedError(absl::StrCat(
        "device ", options.device.str(),
        " needs NCCL, which this LibTorch was built without (CPU tensors use "
        "Gloo)"));
  }
  const std::string where = absl::StrCat(env.master_addr, ":", env.master_port);
  const absl::Time deadline = absl::Now() + options.rendezvous_timeout;
  try {
    ::c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(env.master_port);
    store_options.isServer = !env.use_agent_store && env.rank == 0;
    if (!env.use_agent_store) store_options.numWorkers = env.world_size;
    store_options.waitWorkers = !env.use_agent_store;
    while (true) {
      store_options.timeout =
          ToChrono(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
      bool stale = false;
      try {
        c10::intrusive_ptr<::c10d::Store> store =
            c10::make_intrusive<::c10d::TCPStore>(env.master_addr,
                                                  store_options);
        if (env.use_agent_store) {
          store = c10::make_intrusive<::c10d::PrefixStore>(
              absl::StrCat("/worker/attempt_", env.restart_count), store);
        }
        impl->store =
            c10::make_intrusive<::c10d::PrefixStore>("deltastream_pg/", store);
        // The store of a group that failed: a previous run's, whose host is
        // still reporting its failure (up to a collective timeout) when this
        // rank's restarted process reaches it (a Kubernetes pod recreated
        // before its peers have exited). Joining it would fail, or be
        // refused as a second process of this RANK: wait for that host to
        // exit and this run's to come up.
        stale = !store_options.isServer && !env.use_agent_store &&
                AnyRankFailed(*impl->store, env.world_size);
      } catch (const std::exception&) {
        // A client whose store went away while it looked (that old host
        // exiting) tries again; the rest is the rendezvous's failure.
        if (store_options.isServer || env.use_agent_store ||
            deadline - absl::Now() < absl::Seconds(1)) {
          throw;
        }
        stale = true;
      }
      if (!stale) break;
      impl->store.reset();
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(absl::StrCat(
            "rank ", env.rank, " of ", env.world_size, ": the TCPStore at ",
            where, " still held a failed group's keys after ",
            absl::FormatDuration(options.rendezvous_timeout),
            " (a previous run's rank 0 that did not exit)"));
      }
      absl::SleepFor(absl::Milliseconds(500));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", env.rank, " of ", env.world_size,
        ": rendezvous through the TCPStore at ", where, " failed within ",
        absl::FormatDuration(options.rendezvous_timeout), ": ", e.what()));
  }
  return Connect(std::move(impl), where);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Connect(
    std::unique_ptr<Impl> impl, const std::string& where) {
  const TorchrunEnvironment& env = impl->options.env;
  const ProcessGroupOptions& options = impl->options;
  // Every rank checks in, so that the backend's connection (bounded by the
  // collective timeout) starts only once all ranks are up.
  std::vector<std::string> joined;
  for (int r = 0; r < env.world_size; ++r) {
    joined.push_back(absl::StrCat("joined/", r));
  }
  // Polled, not the store's blocking wait: on the store's host that wait
  // outlived its timeout when a rank never came.
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.rendezvous_timeout;
  std::vector<int> missing;
  // A launch no group can come of (a WORLD_SIZE the ranks do not share, two
  // processes given one RANK) is refused by the rank that finds it, and
  // through the store's "refused" key by every rank, at once.
  const std::string refused_key = "refused";
  std::string refused;
  // The store's host (rank 0, without torchrun's agent store) keeps the
  // store up after a refusal until every rank that came has read it (or
  // kRefusalGrace passed): they would see a store that failed instead.
  constexpr absl::Duration kRefusalGrace = absl::Seconds(5);
  const bool hosts_store = !env.use_agent_store && env.rank == 0;
  try {
    impl->store->add("arrivals", 1);
    const std::string size = std::to_string(env.world_size);
    if (const std::string agreed =
            Text(impl->store->compareSet("world_size", {}, Bytes(size)));
        agreed != size) {
      refused = absl::StrCat("WORLD_SIZE is ", size, " for rank ", env.rank,
                             " and ", agreed,
                             " for the ranks before it: every rank must be "
                             "given the same WORLD_SIZE");
    } else if (impl->store->add(absl::StrCat("joins/", env.rank), 1) > 1) {
      refused = absl::StrCat("two processes were given RANK ", env.rank,
                             ": every rank must be started once");
    }
    if (!refused.empty()) {
      impl->store->set(refused_key, Bytes(refused));
    } else {
      impl->store->set(joined[env.rank], std::vector<uint8_t>{1});
    }
    while (refused.empty()) {
      if (impl->store->check({refused_key})) {
        refused = Text(impl->store->get(refused_key));
        break;
      }
      missing.clear();
      for (int r = 0; r < env.world_size; ++r) {
        if (!impl->store->check({joined[r]})) missing.push_back(r);
      }
      if (missing.empty() || absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (!refused.empty()) {
      impl->store->add("refusal_read", 1);
      const absl::Time until = absl::Now() + kRefusalGrace;
      while (hosts_store && absl::Now() < until &&
             impl->store->add("refusal_read", 0) <
                 impl->store->add("arrivals", 0)) {
        absl::SleepFor(absl::Milliseconds(20));
      }
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", env.rank, " of ", env.world_size, ": the store at ", where,
        " failed after ", absl::FormatDuration(absl::Now() - start),
        " while the ranks joined: ", e.what()));
  }
  if (!refused.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", env.rank, " of ", env.world_size,
                     ": the ranks joining through ", where,
                     " cannot form a group: ", refused));
  }
  if (!missing.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", env.rank, " of ", env.world_size, ": ",
        missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
        " did not join through ", where, " within ",
        absl::FormatDuration(options.rendezvous_timeout)));
  }
  try {
    if (impl->is_gloo) {
      impl->backend = c10d_compat::MakeGloo(
          impl->store, env.rank, env.world_size, ToChrono(options.timeout),
          IsLoopback(env.master_addr) ? "127.0.0.1" : "");
    } else {
      impl->backend = c10d_compat::MakeNccl(
          impl->store, env.rank, env.world_size, ToChrono(options.timeout));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rank ", env.rank, " of ", env.world_size, ": connecting ",
                     impl->is_gloo ? "Gloo" : "NCCL", " through ", where,
                     " failed: ", e.what()));
  }
  {
    absl::MutexLock lock(&impl->mu);
    impl->last_done = absl::Now();
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::CreateSibling(
    absl::string_view name) const {
  auto impl = std::make_unique<Impl>();
  impl->options = impl_->options;
  impl->is_gloo = impl_->is_gloo;
  impl->failed_elsewhere = impl_->failed_elsewhere;
  impl->store = c10::make_intrusive<::c10d::PrefixStore>(
      absl::StrCat(name, "/"), impl_->store);
  return Connect(std::move(impl),
                 absl::StrCat(impl_->options.env.master_addr, ":",
                              impl_->options.env.master_port, " (", name, ")"));
}

int ProcessGroup::rank() const { return impl_->rank(); }
int ProcessGroup::world_size() const { return impl_->size(); }
int ProcessGroup::local_rank() const { return impl_->options.env.local_rank; }
int ProcessGroup::local_world_size() const {
  return impl_->options.env.local_world_size;
}
c10::Device ProcessGroup::device() const { return impl_->options.device; }
absl::Duration ProcessGroup::timeout() const { return impl_->options.timeout; }
absl::string_view ProcessGroup::backend_name() const {
  return impl_->is_gloo ? "gloo" : "nccl";
}

absl::Status ProcessGroup::AllToAll(const at::Tensor& input,
                                    absl::Span<const int64_t> input_splits,
                                    at::Tensor& output,
                                    absl::Span<const int64_t> output_splits,
                                    absl::string_view label) {
  const int size = world_size();
  if (absl::Status s =
          CheckDevices(input, output, device(), "all-to-all", label);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckSplits(input_splits, size, input, "all-to-all input");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckSplits(output_splits, size, output, "all-to-all output");
      !s.ok()) {
    return s;
  }
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size; ++r) {
    if (r == rank()) continue;
    sent += input_splits[r];
    received += output_splits[r];
  }
  sent *= RowBytes(input);
  received *= RowBytes(output);
  std::vector<int64_t> in(input_splits.begin(), input_splits.end());
  std::vector<int64_t> out(output_splits.begin(), output_splits.end());
  return impl_->Run("all-to-all", label, sent, received, [&] {
    if (size == 1) {
      output.copy_(input);
      return;
    }
    at::Tensor in_tensor = input.contiguous();
    impl_->backend->alltoall_base(output, in_tensor, out, in)->wait();
  });
}

absl::Status ProcessGroup::AllReduceSum(at::Tensor& tensor,
                                        absl::string_view label) {
  if (absl::Status s = CheckDevice(tensor, device(), "all-reduce", label);
      !s.ok()) {
    return s;
  }
  const int size = world_size();
  // A ring all-reduce sends (and receives) 2 (n - 1) / n of the tensor.
  const int64_t bytes = tensor.nbytes() * 2 * (size - 1) / size;
  return impl_->Run("all-reduce", label, bytes, bytes, [&] {
    if (size == 1) return;
    std::vector<at::Tensor> tensors = {tensor};
    impl_->backend->allreduce(tensors)->wait();
  });
}

absl::Status ProcessGroup::AllGather(const at::Tensor& input,
                                     at::Tensor& output,
                                     absl::string_view label) {
  if (absl::Status s =
          CheckDevices(input, output, device(), "all-gather", label);
      !s.ok()) {
    return s;
  }
  const int size = world_size();
  if (output.dim() == 0 || output.size(0) != input.size(0) * size) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-gather '", label, "': output needs ",
                     input.size(0) * size, " rows"));
  }
  const int64_t bytes = input.nbytes() * (size - 1);
  return impl_->Run("all-gather", label, bytes, bytes, [&] {
    if (size == 1) {
      output.copy_(input);
      return;
    }
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (at::Tensor& chunk : output.chunk(size, 0)) {
      outputs[0].push_back(chunk);
    }
    std::vector<at::Tensor> inputs = {input.contiguous()};
    impl_->backend->allgather(outputs, inputs)->wait();
  });
}

absl::Status ProcessGroup::ReduceScatterSum(const at::Tensor& input,
                                            at::Tensor& output,
                                            absl::string_view label) {
  if (absl::Status s =
          CheckDevices(input, output, device(), "reduce-scatter", label);
      !s.ok()) {
    return s;
  }
  const int size = world_size();
  if (input.dim() == 0 || input.size(0) != output.size(0) * size) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter '", label, "': input needs ",
                     output.size(0) * size, " rows"));
  }
  // A ring reduce-scatter moves (n - 1) / n of the input; Gloo's emulation
  // (an all-reduce) twice that.
  const int64_t bytes =
      input.nbytes() * (impl_->is_gloo ? 2 : 1) * (size - 1) / size;
  return impl_->Run("reduce-scatter", label, bytes, bytes, [&] {
    if (size == 1) {
      output.copy_(input);
      return;
    }
    at::Tensor in_tensor = input.contiguous();
    c10d_compat::ReduceScatterSum(*impl_->backend, impl_->is_gloo, rank(), size,
                                  in_tensor, output);
  });
}

absl::Status ProcessGroup::Barrier(absl::string_view label) {
  return impl_->Run("barrier", label, 0, 0, [&] {
    if (world_size() == 1) return;
    impl_->backend->barrier()->wait();
  });
}

absl::StatusOr<int64_t> ProcessGroup::AllReduceMin(int64_t value,
                                                   absl::string_view label) {
  at::Tensor tensor =
      at::full({1}, value, at::TensorOptions().dtype(at::kLong)).to(device());
  absl::Status status = impl_->Run("all-reduce", label, 8, 8, [&] {
    if (world_size() == 1) return;
    std::vector<at::Tensor> tensors = {tensor};
    ::c10d::AllreduceOptions options;
    options.reduceOp = ::c10d::ReduceOp::MIN;
    impl_->backend->allreduce(tensors, options)->wait();
  });
  if (!status.ok()) return status;
  return tensor.cpu().item<int64_t>();
}

bool ProcessGroup::failed() const {
  absl::MutexLock lock(&impl_->mu);
  return !impl_->broken.ok();
}

bool ProcessGroup::failed_elsewhere() const { return *impl_->failed_elsewhere; }

void ProcessGroup::Leave(const absl::Status& why) {
  absl::MutexLock lock(&impl_->mu);
  if (!impl_->broken.ok()) return;
  impl_->broken = absl::FailedPreconditionError(
      absl::StrCat("rank ", impl_->rank(), " left the group: ", why.message()));
  try {
    impl_->store->set(LeftKey(impl_->rank()), Bytes(why.message()));
    impl_->store->set(FailedKey(impl_->rank()), std::vector<uint8_t>{1});
  } catch (const std::exception&) {
    // The store is gone: the others find this rank gone as a dead one.
  }
  // Then its connections close, as they would at its exit: a collective the
  // others wait in for this rank fails at once (a peer's connection closed)
  // and finds the reason above, though this rank may stay alive a while
  // (serving its consumers' last reads). No collective is in flight: they
  // run under `mu`. NCCL's communicators are left to the process's exit.
  if (impl_->is_gloo) impl_->backend.reset();
}

absl::Status ProcessGroup::StoreSet(absl::string_view key,
                                    absl::string_view value) {
  try {
    impl_->store->set(std::string(key), Bytes(value));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("store set '", key, "' failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ProcessGroup::StoreGet(absl::string_view key) {
  try {
    impl_->store->wait({std::string(key)}, ToChrono(timeout()));
    return Text(impl_->store->get(std::string(key)));
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(
        absl::StrCat("store get '", key, "' failed: ", e.what()));
  }
}

std::map<std::string, CollectiveStats> ProcessGroup::Stats() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->stats;
}

void ProcessGroup::ResetStats() {
  absl::MutexLock lock(&impl_->mu);
  impl_->stats.clear();
}

}  // namespace deltastream
