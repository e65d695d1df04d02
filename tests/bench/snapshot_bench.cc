// Snapshot and restore throughput of a tracker through RocksDB
// (tracker_service/tracker_snapshots.h, store/snapshot_db.h): a tracker in
// embedding mode holds --tables tables of --rows unique rows of --dim float32
// states, half as recorded lookups and half compacted; each run writes a
// snapshot (gather + one ingested SST) and restores it into a fresh tracker
// (read + import). Reports medians of --repeat runs in MB/s of IDs and states,
// and a plain sequential file write and read of the same bytes as a baseline.
//
//   bazel run -c opt //tests/bench:snapshot_bench -- [--rows=200000] [--json]

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/host_memory.h"
#include "tests/bench/timing.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_snapshots.h"

ABSL_FLAG(int64_t, tables, 8, "tables");
ABSL_FLAG(int64_t, rows, 200000, "rows held per table");
ABSL_FLAG(int64_t, dim, 64, "embedding dim (float32)");
ABSL_FLAG(int, repeat, 5, "runs; the median is reported");
ABSL_FLAG(std::string, dir, "",
          "where to put the database (default: $TMPDIR or /tmp)");
ABSL_FLAG(bool, json, false, "print one JSON line");

namespace deltastream {
namespace {

using bench::Clock;
using bench::Median;
using bench::Seconds;

std::unique_ptr<Tracker> MakeTracker() {
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.consumers = {"predictor", "checkpoint"};
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(std::move(options));
  if (!tracker.ok()) {
    std::fprintf(stderr, "%s\n", tracker.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(tracker);
}

// Writes and reads `bytes` bytes sequentially with fsync: the disk's own pace.
std::pair<double, double> FileBaseline(const std::string& dir, int64_t bytes) {
  const std::string path = dir + "/baseline.bin";
  std::vector<char> block(4 << 20, 'x');
  auto start = Clock::now();
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  for (int64_t done = 0; done < bytes; done += block.size()) {
    if (write(fd, block.data(), block.size()) < 0) break;
  }
  fsync(fd);
  close(fd);
  const double write_s = Seconds(start);
  start = Clock::now();
  fd = open(path.c_str(), O_RDONLY);
  while (read(fd, block.data(), block.size()) > 0) {
  }
  close(fd);
  const double read_s = Seconds(start);
  std::filesystem::remove(path);
  return {write_s, read_s};
}

int Main() {
  KeepHostMemoryForReuse();  // as a long-running trainer or server
  const int64_t tables = absl::GetFlag(FLAGS_tables);
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = tmp != nullptr ? tmp : "/tmp";
  }
  dir += "/deltastream_snapshot_bench";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  auto tracker = MakeTracker();
  for (int64_t half = 0; half < 2; ++half) {
    std::vector<TableLookup> lookups;
    for (int64_t t = 0; t < tables; ++t) {
      at::Tensor ids =
          at::randperm(rows, at::kLong).narrow(0, 0, rows / 2) + half * rows;
      lookups.push_back({absl::StrFormat("sparse.ec.embeddings.t%d", t), ids,
                         at::randn({rows / 2, dim})});
    }
    if (!tracker->RecordTables(std::move(lookups)).ok()) return 1;
    tracker->Step();
    if (half == 0) tracker->CompactAll();  // a compacted lookup per table
  }
  const int64_t payload = tables * (rows / 2) * 2 * (8 + dim * 4);

  std::vector<double> save_s, restore_s, open_s;
  for (int run = 0; run < absl::GetFlag(FLAGS_repeat); ++run) {
    auto snapshots = TrackerSnapshots::Open(dir + "/db", tracker.get());
    if (!snapshots.ok()) {
      std::fprintf(stderr, "%s\n", snapshots.status().ToString().c_str());
      return 1;
    }
    auto start = Clock::now();
    absl::StatusOr<SnapshotInfo> info = (*snapshots)->Snapshot();
    save_s.push_back(Seconds(start));
    if (!info.ok() || info->payload_bytes != payload) {
      std::fprintf(stderr, "snapshot failed: %s\n",
                   info.status().ToString().c_str());
      return 1;
    }
    snapshots->reset();

    auto restored = MakeTracker();
    start = Clock::now();
    // Opening checks the database read-only first (base/rocksdb_options.h:
    // every file's checksums, the MANIFEST against the directory).
    auto reopened = TrackerSnapshots::Open(dir + "/db", restored.get());
    open_s.push_back(Seconds(start));
    if (!reopened.ok()) return 1;
    auto result = (*reopened)->Restore();
    restore_s.push_back(Seconds(start));
    if (!result.ok() || !result->has_value() ||
        restored->Status().usage.total.ids != tables * rows) {
      std::fprintf(stderr, "restore failed: %s\n",
                   result.status().ToString().c_str());
      return 1;
    }
  }
  const auto [file_write_s, file_read_s] = FileBaseline(dir, payload);
  std::filesystem::remove_all(dir);

  const double mb = payload / 1e6;
  const double save = Median(save_s), restore = Median(restore_s),
               open = Median(open_s);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"payload_mb\": %.1f, \"snapshot_s\": %.3f, \"snapshot_mb_s\": "
        "%.0f, \"restore_s\": %.3f, \"restore_mb_s\": %.0f, "
        "\"open_s\": %.3f, \"file_write_mb_s\": %.0f, "
        "\"file_read_mb_s\": %.0f}\n",
        mb, save, mb / save, restore, mb / restore, open, mb / file_write_s,
        mb / file_read_s);
  } else {
    std::printf("payload %.1f MB (%lld tables x %lld rows x dim %lld)\n", mb,
                static_cast<long long>(tables), static_cast<long long>(rows),
                static_cast<long long>(dim));
    std::printf(
        "snapshot  %.3f s  %6.0f MB/s   (fsync'd file write %6.0f MB/s)\n",
        save, mb / save, mb / file_write_s);
    std::printf(
        "restore   %.3f s  %6.0f MB/s   (file read          %6.0f MB/s)\n",
        restore, mb / restore, mb / file_read_s);
    std::printf("  of which open (read-only checks) %.3f s\n", open);
  }
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
