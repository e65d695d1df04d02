// How long a consumer's read holds up the training thread. A tracker runs in
// process as a trainer hosts it (embedding mode, auto-compaction, its service
// on loopback); the training thread computes (a busy --step_ms), then records
// a batch (--batch_ids IDs into table "train"), steps and triggers
// compaction, over and over: its tracker calls are what is timed. Each run
// records a delta of --rows rows into table "t" and has a consumer read
// everything through the service (DeltaClient::GetDelta, the service's
// streamed read, which copies the delta's rows; or, with --read=subscribe,
// the push of a subscription that pushes every step, as the predictor reads)
// while training goes on, then lets training run alone for as long.
//
//   bazel run -c opt //tests/bench:record_stall_bench -- [--rows=200000
//     --dim=64 --batch_ids=4096 --step_ms=5 --read=get|subscribe --repeat=20]
//
// Prints, over --repeat runs (after one warm-up run), the median of each
// read's longest tracker call of the training thread (record, step and
// compaction of one step), their median during reads and while nothing
// reads, and the reads' median time.

#include <ATen/core/Tensor.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/host_memory.h"
#include "clients/delta_client.h"
#include "tests/bench/timing.h"
#include "tracker_service/delta_tracker_service.h"

ABSL_FLAG(int64_t, rows, 200000, "rows of the delta each run reads");
ABSL_FLAG(int64_t, dim, 64, "float32 state dim");
ABSL_FLAG(int64_t, batch_ids, 4096, "IDs the training thread records a step");
ABSL_FLAG(double, step_ms, 5,
          "the training thread's compute between records (busy), ms");
ABSL_FLAG(std::string, read, "get",
          "get (a GetDelta per run) or subscribe (one subscription, a push "
          "a step, as the predictor reads)");
ABSL_FLAG(int, repeat, 20, "runs; medians are reported");

namespace deltastream {
namespace {

using bench::Clock;

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The tracker calls of one training step: when they started and ended.
struct Iteration {
  Clock::time_point start, end;
};

int Main() {
  KeepHostMemoryForReuse();  // as a long-running trainer
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  const int64_t batch_ids = absl::GetFlag(FLAGS_batch_ids);
  const int repeat = absl::GetFlag(FLAGS_repeat);
  const std::string read = absl::GetFlag(FLAGS_read);
  if (read != "get" && read != "subscribe") {
    std::fprintf(stderr,
                 "record_stall_bench: --read is get or subscribe, not '%s'\n",
                 read.c_str());
    return 2;
  }
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.auto_compact = true;
  options.consumers = {"c"};
  auto tracker = Tracker::Create(options);
  if (!tracker.ok()) return 1;
  DeltaTrackerService service(tracker->get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  auto client = DeltaClient::Create("127.0.0.1:" + std::to_string(port));

  // The training thread: a fresh random batch each step, from a pool.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Iteration> iterations;
  std::thread trainer([&] {
    const at::Tensor pool_ids = at::randint(1000000, {8, batch_ids}, at::kLong);
    const at::Tensor pool_states = at::randn({8, batch_ids, dim});
    const auto compute = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::milli>(
            absl::GetFlag(FLAGS_step_ms)));
    for (int64_t step = 0; !stop.load(); ++step) {
      const Clock::time_point computed = Clock::now() + compute;
      while (Clock::now() < computed) {
      }
      const Clock::time_point begun = Clock::now();
      if (!(*tracker)
               ->RecordTables({{"train", pool_ids[step % 8].contiguous(),
                                pool_states[step % 8].contiguous()}})
               .ok()) {
        std::fprintf(stderr, "record_stall_bench: record failed\n");
        std::exit(1);
      }
      (*tracker)->Step();
      (*tracker)->TriggerCompaction();
      std::lock_guard<std::mutex> lock(mu);
      iterations.push_back({begun, Clock::now()});
    }
  });

  const at::Tensor ids = at::randperm(rows, at::kLong);
  const at::Tensor states = at::randn({rows, dim});
  std::vector<std::pair<Clock::time_point, Clock::time_point>> reads;
  // --read=subscribe: the subscription's pushes, the delta's rows among them.
  const bool subscribe = read == "subscribe";
  CallCanceller subscription;
  std::mutex pushed_mu;
  std::condition_variable pushed;
  int64_t pushes_of_t = 0;
  std::thread subscriber;
  if (subscribe) {
    subscriber = std::thread([&] {
      v1::SubscribeRequest request;
      request.mutable_read()->set_consumer("c");
      request.set_every_steps(1);
      const absl::Status status = client->Subscribe(
          request,
          [&](ReceivedDelta&& delta) {
            if (delta.tables["t"].ids.numel() == rows) {
              std::lock_guard<std::mutex> lock(pushed_mu);
              ++pushes_of_t;
              pushed.notify_all();
            }
            return true;
          },
          &subscription);
      if (!subscription.cancelled()) {
        std::fprintf(stderr, "record_stall_bench: subscription ended: %s\n",
                     status.ToString().c_str());
        std::exit(1);
      }
    });
  }
  for (int run = 0; run <= repeat; ++run) {
    if (!(*tracker)->RecordTables({{"t", ids, states}}).ok()) return 1;
    // The delta's batch closes at the training thread's next step.
    const int64_t batch = (*tracker)->current_batch();
    (*tracker)->WaitForBatchAfter(batch, absl::InfiniteFuture());
    const Clock::time_point start = Clock::now();
    if (subscribe) {
      std::unique_lock<std::mutex> lock(pushed_mu);
      pushed.wait(lock, [&] { return pushes_of_t > run; });
    } else {
      v1::GetDeltaRequest request;
      request.set_consumer("c");
      absl::StatusOr<ReceivedDelta> delta = client->GetDelta(request);
      if (!delta.ok() || delta->tables["t"].ids.numel() != rows) {
        std::fprintf(stderr, "record_stall_bench: read failed: %s\n",
                     delta.status().ToString().c_str());
        return 1;
      }
    }
    const Clock::time_point end = Clock::now();
    if (run > 0) reads.emplace_back(start, end);
    std::this_thread::sleep_for(end - start);  // training alone
  }
  if (subscribe) {
    subscription.Cancel();
    subscriber.join();
  }
  stop = true;
  trainer.join();
  server->Shutdown();

  // Iterations that overlap a read, and those that overlap none.
  std::vector<double> longest, during, alone, read_ms;
  size_t next = 0;
  for (const auto& [start, end] : reads) {
    double most = 0;
    for (; next < iterations.size() && iterations[next].start < end; ++next) {
      const Iteration& it = iterations[next];
      const double ms = Ms(it.end - it.start);
      if (it.end <= start) {
        if (it.start >= reads.front().first) alone.push_back(ms);
        continue;
      }
      during.push_back(ms);
      most = std::max(most, ms);
    }
    longest.push_back(most);
    read_ms.push_back(Ms(end - start));
  }
  std::printf(
      "record_stall_bench: a %.1f MiB delta (%lld rows x %lld float32) read "
      "by one consumer (--read=%s) while a training thread records %lld IDs "
      "every %.1f "
      "ms; medians of %zu runs; load %s\n",
      (ids.nbytes() + states.nbytes()) / 1048576.0,
      static_cast<long long>(rows), static_cast<long long>(dim), read.c_str(),
      static_cast<long long>(batch_ids), absl::GetFlag(FLAGS_step_ms),
      reads.size(), bench::LoadAverage().c_str());
  std::printf("  read                              %.2f ms\n",
              bench::Median(read_ms));
  std::printf("  longest tracker call of each read  %.3f ms (max %.3f)\n",
              bench::Median(longest),
              *std::max_element(longest.begin(), longest.end()));
  std::printf("  tracker calls during reads        %.3f ms (%zu)\n",
              bench::Median(during), during.size());
  std::printf("  tracker calls, no read           %.3f ms (%zu)\n",
              bench::Median(alone), alone.size());
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
