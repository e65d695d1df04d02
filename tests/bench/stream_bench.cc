// Streaming throughput of the tracker service over loopback TCP, against the
// ceiling of a bare gRPC server stream of raw bytes measured in the same run:
// one consumer, then --consumers at once. Payload = IDs + states bytes. The
// tracker runs as tracker_server does by default (auto-compaction at every
// step) and each delta is recorded over --steps batches, so a read streams
// compacted rows; the compaction itself is store_bench's subject.
//
//   bazel run -c opt //tests/bench:stream_bench -- [--rows --dim --repeat]
//
// To profile one transfer (here the first consumer's) and nothing else:
//
//   mkfifo /tmp/ctl /tmp/ack; exec {ctl}<>/tmp/ctl {ack}<>/tmp/ack
//   perf record -g -D -1 --control=fd:$ctl,$ack --
//     bazel-bin/tests/bench/stream_bench --profile=one
//     --perf_ctl_fd=$ctl --perf_ack_fd=$ack    (one line)
//
// Prints the median, min and max over --repeat runs (after one warm-up run)
// of each rate and of each GetDelta rate as a percentage of the bare stream
// timed just before it, in the same run (three bare streams per run).

#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/host_memory.h"
#include "clients/delta_client.h"
#include "tests/bench/raw_stream.grpc.pb.h"
#include "tests/bench/timing.h"
#include "tracker_service/delta_tracker_service.h"

ABSL_FLAG(int64_t, rows, 200000, "rows per delta");
ABSL_FLAG(int64_t, dim, 64, "float32 state dim");
ABSL_FLAG(int, consumers, 16, "consumers reading at once");
ABSL_FLAG(int, repeat, 10, "runs; medians are reported");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20, "chunk size, both streams");
ABSL_FLAG(int64_t, steps, 4, "batches each delta is recorded over");
ABSL_FLAG(std::string, profile, "",
          "with perf record's --control=fd:CTL,ACK: one of bare (its three "
          "streams per run), one, second, many; perf counts only those "
          "transfers of the counted runs");
ABSL_FLAG(int, perf_ctl_fd, -1, "perf record's control fd (--profile)");
ABSL_FLAG(int, perf_ack_fd, -1, "perf record's ack fd (--profile)");

namespace deltastream {
namespace {

using bench::Clock;
using bench::Median;

class RawStreamService final : public bench::RawStream::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*, const bench::RawRequest* request,
                      grpc::ServerWriter<bench::RawChunk>* writer) override {
    bench::RawChunk chunk;
    const int64_t size = std::max<int64_t>(1, request->chunk_bytes());
    chunk.mutable_data()->assign(size, 'x');
    for (int64_t sent = 0; sent < request->total_bytes(); sent += size) {
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }
};

// Tells perf record (started with --control=fd:CTL,ACK and -D -1, so that
// it counts nothing until told) to count or stop; waits for its ack so that
// what follows is counted. Does nothing without --perf_ctl_fd.
void TellPerf(const char* command) {
  const int ctl = absl::GetFlag(FLAGS_perf_ctl_fd);
  const int ack = absl::GetFlag(FLAGS_perf_ack_fd);
  if (ctl < 0) return;
  const std::string line = std::string(command) + "\n";
  if (write(ctl, line.data(), line.size()) < 0) return;
  char reply[16];
  if (ack >= 0 && read(ack, reply, sizeof(reply)) < 0) return;
}

// CPU seconds this process (server and clients, every thread) has used, in
// user space and in the kernel (the socket copies): on a machine shared with
// other work, CPU per byte holds steadier than wall time. The kernel splits
// the two by sampling at its tick, so over one 20 ms transfer the split is
// rough; medians over runs are what to read.
struct CpuSeconds {
  double user = 0;
  double kernel = 0;
};
CpuSeconds ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return {seconds(usage.ru_utime), seconds(usage.ru_stime)};
}

int Main() {
  KeepHostMemoryForReuse();  // as a long-running trainer or server
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  const int consumers = absl::GetFlag(FLAGS_consumers);
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  // tracker_server's default: Step compacts, reads stream what is compacted.
  options.auto_compact = true;
  // c0 reads alone, then "second" alone (the rows c0's read gathered, shared:
  // the transfer without the store's read), then c1..cN at once.
  options.consumers.push_back("second");
  for (int c = 0; c <= consumers; ++c) {
    options.consumers.push_back("c" + std::to_string(c));
  }
  auto tracker = Tracker::Create(options);
  if (!tracker.ok()) return 1;
  DeltaTrackerService service(tracker->get());
  RawStreamService raw;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  builder.RegisterService(&raw);
  auto server = builder.BuildAndStart();
  const std::string target = "127.0.0.1:" + std::to_string(port);

  const at::Tensor ids = at::randperm(rows, at::kLong);
  const at::Tensor states = at::randn({rows, dim});
  const int64_t payload = ids.nbytes() + states.nbytes();
  auto client = DeltaClient::Create(target);
  // The delta is recorded over --steps batches, as a trainer does between
  // reads; auto-compaction at each step leaves one compacted lookup to read.
  const int64_t steps = std::max<int64_t>(1, absl::GetFlag(FLAGS_steps));
  auto record = [&] {
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t first = rows * step / steps;
      const int64_t n = rows * (step + 1) / steps - first;
      if (!client
               ->Record({{{"t", ids.narrow(0, first, n),
                           states.narrow(0, first, n)}}})
               .ok() ||
          !client->Step().ok()) {
        std::fprintf(stderr, "stream_bench: record failed\n");
        std::exit(1);
      }
    }
  };
  auto channel =
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto raw_stub = bench::RawStream::NewStub(channel);
  auto read_raw = [&](int64_t bytes) {
    grpc::ClientContext context;
    bench::RawRequest request;
    request.set_total_bytes(bytes);
    request.set_chunk_bytes(absl::GetFlag(FLAGS_chunk_bytes));
    auto reader = raw_stub->Stream(&context, request);
    bench::RawChunk chunk;
    int64_t got = 0;
    while (reader->Read(&chunk)) got += chunk.data().size();
    return reader->Finish().ok() && got >= bytes;
  };

  // The 16 readers connect once, as the bare stream's channel and the first
  // consumer's client do: each run times streaming, not connection setup.
  std::vector<std::unique_ptr<DeltaClient>> readers;
  for (int c = 1; c <= consumers; ++c) {
    readers.push_back(DeltaClient::Create(target));
  }
  auto read_delta = [&](DeltaClient& reader, const std::string& consumer) {
    v1::GetDeltaRequest request;
    request.set_consumer(consumer);
    request.set_max_chunk_bytes(absl::GetFlag(FLAGS_chunk_bytes));
    auto delta = reader.GetDelta(request);
    return delta.ok() && delta->tables["t"].ids.numel() == rows;
  };

  // What the counted runs measured of one kind of transfer: GB/s, and CPU
  // seconds per GB delivered (all of them and the kernel's).
  struct Series {
    const char* name;  // as --profile names it
    std::vector<double> gbs, cpu, kernel;
  };
  Series bare{"bare"}, one{"one"}, second{"second"}, many{"many"};
  // Each GetDelta transfer is compared with a bare stream timed just before
  // it (one_raw_gbs...): the load of a shared machine changes from one
  // transfer to the next, less so between neighbours.
  std::vector<double> one_raw_gbs, second_raw_gbs, many_raw_gbs;
  int failed_calls = 0;
  const std::string profiled = absl::GetFlag(FLAGS_profile);
  // Runs `transfer`, which moves `bytes` and says whether it succeeded; in a
  // counted run adds its figures to `series` (and has perf count it when
  // --profile names it).
  auto measure = [&](bool counted, int64_t bytes, Series& series,
                     auto&& transfer) {
    const bool profile = counted && profiled == series.name;
    if (profile) TellPerf("enable");
    const auto start = Clock::now();
    const CpuSeconds cpu_start = ProcessCpuSeconds();
    if (!transfer()) ++failed_calls;
    if (profile) TellPerf("disable");
    if (!counted) return;
    series.gbs.push_back(bytes / bench::Seconds(start) / 1e9);
    const CpuSeconds cpu_end = ProcessCpuSeconds();
    const double kernel = cpu_end.kernel - cpu_start.kernel;
    series.cpu.push_back((cpu_end.user - cpu_start.user + kernel) /
                         (bytes / 1e9));
    series.kernel.push_back(kernel / (bytes / 1e9));
  };
  // A bare stream of `bytes`, its rate also kept in `adjacent`.
  auto measure_raw = [&](bool counted, int64_t bytes,
                         std::vector<double>& adjacent) {
    measure(counted, bytes, bare, [&] { return read_raw(bytes); });
    if (counted) adjacent.push_back(bare.gbs.back());
  };
  double load_before[3] = {0, 0, 0};
  getloadavg(load_before, 3);
  // Run 0 warms up (connections, the heap's first touch) and is not counted.
  for (int run = 0; run <= absl::GetFlag(FLAGS_repeat); ++run) {
    const bool counted = run > 0;
    record();  // every consumer has this delta to read
    measure_raw(counted, payload, one_raw_gbs);
    measure(counted, payload, one, [&] { return read_delta(*client, "c0"); });
    measure_raw(counted, payload, second_raw_gbs);
    measure(counted, payload, second,
            [&] { return read_delta(*client, "second"); });
    measure_raw(counted, payload, many_raw_gbs);
    measure(counted, payload * consumers, many, [&] {
      std::atomic<int> failures{0};
      std::vector<std::thread> threads;
      for (int c = 1; c <= consumers; ++c) {
        threads.emplace_back([&, c] {
          if (!read_delta(*readers[c - 1], "c" + std::to_string(c))) {
            ++failures;
          }
        });
      }
      for (std::thread& t : threads) t.join();
      failed_calls += failures.load();
      return true;
    });
  }
  double load_after[3] = {0, 0, 0};
  getloadavg(load_after, 3);
  std::printf(
      "stream_bench: %lld rows x %lld float32 (%.1f MiB per delta), "
      "%lld KiB chunks, --steps=%lld, loopback, median of %zu runs; load "
      "average %.2f before, %.2f after\n",
      static_cast<long long>(rows), static_cast<long long>(dim),
      payload / 1048576.0,
      static_cast<long long>(absl::GetFlag(FLAGS_chunk_bytes) / 1024),
      static_cast<long long>(steps), one.gbs.size(), load_before[0],
      load_after[0]);
  // Each GetDelta transfer against the bare stream timed just before it.
  std::vector<double> one_ratio, second_ratio, many_ratio;
  for (size_t run = 0; run < one.gbs.size(); ++run) {
    one_ratio.push_back(100 * one.gbs[run] / one_raw_gbs[run]);
    second_ratio.push_back(100 * second.gbs[run] / second_raw_gbs[run]);
    many_ratio.push_back(100 * many.gbs[run] / many_raw_gbs[run]);
  }
  auto spread = [](const std::vector<double>& v) {
    return absl::StrFormat("median %.3f, min %.3f, max %.3f", Median(v),
                           *std::min_element(v.begin(), v.end()),
                           *std::max_element(v.begin(), v.end()));
  };
  std::printf("  bare gRPC byte stream      GB/s: %s\n",
              spread(bare.gbs).c_str());
  std::printf("  GetDelta, one consumer     GB/s: %s\n",
              spread(one.gbs).c_str());
  std::printf("    %% of bare, same run          %s\n",
              spread(one_ratio).c_str());
  std::printf("  GetDelta, a second consumer (rows read) GB/s: %s\n",
              spread(second.gbs).c_str());
  std::printf("    %% of bare, same run          %s\n",
              spread(second_ratio).c_str());
  std::printf("  GetDelta, %d consumers at once, aggregate GB/s: %s\n",
              consumers, spread(many.gbs).c_str());
  std::printf("    %% of bare, same run          %s\n",
              spread(many_ratio).c_str());
  std::string runs;
  for (size_t run = 0; run < one.gbs.size(); ++run) {
    absl::StrAppendFormat(&runs, " %.0f/%.0f/%.0f", one_ratio[run],
                          second_ratio[run], many_ratio[run]);
  }
  std::printf("  per run, %% of bare (one/second/%d):%s\n", consumers,
              runs.c_str());
  std::printf(
      "  CPU s per GB (all threads): bare %.3f, GetDelta one %.3f (%.2fx "
      "bare), second %.3f (%.2fx), %d at once %.3f (%.2fx)\n",
      Median(bare.cpu), Median(one.cpu), Median(one.cpu) / Median(bare.cpu),
      Median(second.cpu), Median(second.cpu) / Median(bare.cpu), consumers,
      Median(many.cpu), Median(many.cpu) / Median(bare.cpu));
  std::printf(
      "    of which in the kernel:  bare %.3f, one %.3f, second %.3f, "
      "%d at once %.3f\n",
      Median(bare.kernel), Median(one.kernel), Median(second.kernel), consumers,
      Median(many.kernel));
  std::printf("  failed calls               %d\n", failed_calls);
  server->Shutdown();
  return failed_calls == 0 ? 0 : 1;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
