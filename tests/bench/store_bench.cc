// Drives the DeltaStore as the tracker drives it in TorchRec: every batch
// appends one lookup per table, auto-compaction after every step compacts
// everything since the consumer's cursor, and one consumer reads once at the
// end. Reports the median of --repeat runs and the ratios to a plain copy of
// the same bytes and to a copy of just the unique rows the read returns.
//
//   bazel run -c opt //tests/bench:store_bench -- --mode=first [--json]
//
// --write_ids=F writes the workload's IDs to F and exits; --ids_file=F reads
// them back instead of drawing them, so that another implementation
// (tests/bench/torchrec_side_by_side.py) runs on the very same IDs.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/rand.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "base/host_memory.h"
#include "store/delta_store.h"
#include "store/row_gather.h"
#include "tests/bench/timing.h"
#include "tests/bench/zipf.h"

ABSL_FLAG(std::string, mode, "first", "update mode: none, first or last");
ABSL_FLAG(int64_t, tables, 8, "tables (FQNs)");
ABSL_FLAG(int64_t, batches, 100, "batches (steps)");
ABSL_FLAG(int64_t, ids, 4096, "IDs per table per batch");
ABSL_FLAG(int64_t, rows, 1000000, "rows per table");
ABSL_FLAG(int64_t, dim, 64, "embedding dim (float32 states)");
ABSL_FLAG(double, zipf, 1.05, "Zipf exponent of ID popularity");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(int, repeat, 3, "runs; the median is reported");
ABSL_FLAG(std::string, clock, "wall",
          "wall: elapsed time; cpu: this thread's CPU time");
ABSL_FLAG(bool, json, false, "print one JSON line instead of a table");
ABSL_FLAG(std::string, write_ids, "",
          "write the workload's IDs to this file (raw little-endian int64, "
          "batch-major then table then lookup order) and exit");
ABSL_FLAG(std::string, ids_file, "",
          "read the IDs from this file (as --write_ids writes it, for the same "
          "--tables, --batches and --ids) instead of drawing them");

namespace deltastream {
namespace {

using bench::Median;

// Now, in seconds: wall-clock time, or with --clock=cpu this thread's CPU
// time (user and system), which a machine shared with other work inflates
// less; both sides of a comparison use the same clock.
double Now() {
  static const bool cpu = absl::GetFlag(FLAGS_clock) == "cpu";
  if (cpu) {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) +
           1e-9 * static_cast<double>(t.tv_nsec);
  }
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Seconds(double since) { return Now() - since; }

struct Workload {
  std::vector<std::string> fqns;
  // [batch][table]
  std::vector<std::vector<at::Tensor>> ids, states;
  int64_t bytes = 0;
};

// Fills `ids` (int64 [n]) from the Zipf draw, or from `file` when it is open.
void FillIds(ZipfIds& zipf, std::ifstream& file, at::Tensor& ids) {
  int64_t* out = ids.data_ptr<int64_t>();
  if (!file.is_open()) {
    for (int64_t i = 0; i < ids.numel(); ++i) out[i] = zipf.Next();
    return;
  }
  if (!file.read(reinterpret_cast<char*>(out),
                 static_cast<std::streamsize>(ids.nbytes()))) {
    std::fprintf(stderr,
                 "store_bench: --ids_file=%s is shorter than "
                 "--tables x --batches x --ids IDs\n",
                 absl::GetFlag(FLAGS_ids_file).c_str());
    std::exit(2);
  }
}

Workload MakeWorkload(UpdateMode mode) {
  Workload w;
  const int64_t tables = absl::GetFlag(FLAGS_tables);
  const int64_t n = absl::GetFlag(FLAGS_ids);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  for (int64_t t = 0; t < tables; ++t) {
    w.fqns.push_back(absl::StrFormat("sparse.ebc.embedding_bags.t%d", t));
  }
  ZipfIds zipf(absl::GetFlag(FLAGS_rows), absl::GetFlag(FLAGS_zipf),
               absl::GetFlag(FLAGS_seed));
  std::ifstream file;
  if (!absl::GetFlag(FLAGS_ids_file).empty()) {
    file.open(absl::GetFlag(FLAGS_ids_file), std::ios::binary);
    if (!file) {
      std::fprintf(stderr, "store_bench: cannot read --ids_file=%s\n",
                   absl::GetFlag(FLAGS_ids_file).c_str());
      std::exit(2);
    }
  }
  for (int64_t b = 0; b < absl::GetFlag(FLAGS_batches); ++b) {
    w.ids.emplace_back();
    w.states.emplace_back();
    for (int64_t t = 0; t < tables; ++t) {
      at::Tensor ids = at::empty({n}, at::kLong);
      FillIds(zipf, file, ids);
      w.bytes += ids.nbytes();
      w.ids.back().push_back(ids);
      if (mode != UpdateMode::kNone) {
        at::Tensor states = at::rand({n, dim});
        w.bytes += states.nbytes();
        w.states.back().push_back(states);
      }
    }
  }
  return w;
}

struct RunResult {
  double total_s = 0;
  double compact_s = 0;
  double read_s = 0;
  double order_s = 0;   // of read_s: the IDs sorted and each kept row found
  double gather_s = 0;  // of read_s: the kept rows copied into the result
  int64_t unique_rows = 0;
  int64_t store_bytes = 0;  // held at the read, after the final compaction
};

RunResult RunOnce(UpdateMode mode, const Workload& w) {
  DeltaStore store(mode);
  const int64_t consumer_cursor = -1;  // one consumer that has not read yet
  RunResult r;
  const auto start = Now();
  for (size_t b = 0; b < w.ids.size(); ++b) {
    for (size_t t = 0; t < w.fqns.size(); ++t) {
      TableLookup lookup{
          w.fqns[t], w.ids[b][t],
          mode == UpdateMode::kNone ? at::Tensor() : w.states[b][t]};
      if (!store.Append(static_cast<int64_t>(b), {std::move(lookup)}).ok()) {
        std::fprintf(stderr, "append failed\n");
        std::exit(1);
      }
    }
    // trigger_compaction() at output dist: [max(cursors), curr).
    const auto compact_start = Now();
    store.Compact(consumer_cursor, static_cast<int64_t>(b));
    r.compact_s += Seconds(compact_start);
  }
  // get_delta(): compact [max(cursors), curr + 1), then read from the cursor:
  // table by table, the work of GetUnique (a deferred read and its gather)
  // timed in its two phases.
  const auto read_start = Now();
  store.Compact(consumer_cursor, static_cast<int64_t>(w.ids.size()));
  std::vector<UniqueRows> delta;
  for (const std::string& fqn : w.fqns) {
    const auto order_start = Now();
    auto deferred = store.GetUniqueTableDeferred(fqn, consumer_cursor);
    if (!deferred.ok()) {
      std::fprintf(stderr, "read failed\n");
      std::exit(1);
    }
    const auto gather_start = Now();
    r.order_s += gather_start - order_start;
    if (deferred->gather != nullptr) {
      deferred->gather->Copy(0, deferred->gather->rows());
    }
    r.gather_s += Seconds(gather_start);
    delta.push_back(std::move(deferred->rows));
  }
  r.read_s = Seconds(read_start);
  r.total_s = Seconds(start);
  r.store_bytes = store.bytes();
  for (const UniqueRows& rows : delta) r.unique_rows += rows.size();
  return r;
}

// A plain copy of the same bytes into newly allocated memory, as concatenating
// the recorded tensors would do (so page faults count on both sides).
double CopySeconds(const Workload& w) {
  const auto start = Now();
  std::unique_ptr<uint8_t[]> buffer(new uint8_t[w.bytes]);
  uint8_t* out = buffer.get();
  for (size_t b = 0; b < w.ids.size(); ++b) {
    for (size_t t = 0; t < w.fqns.size(); ++t) {
      std::memcpy(out, w.ids[b][t].data_ptr(), w.ids[b][t].nbytes());
      out += w.ids[b][t].nbytes();
      if (!w.states[b].empty()) {
        std::memcpy(out, w.states[b][t].data_ptr(), w.states[b][t].nbytes());
        out += w.states[b][t].nbytes();
      }
    }
  }
  const double seconds = Seconds(start);
  if (buffer[w.bytes / 2] == 0xff && buffer[0] == 0xff) {
    std::puts("");  // keeps the copy observable
  }
  return seconds;
}

// The unique rows a read returns, as pointers into the recorded tensors: per
// table, ascending by ID, each ID's first (kFirst) or last (kLast) recorded
// state, or just the ID (kNone).
struct UniqueSources {
  struct Table {
    std::vector<int64_t> ids;
    std::vector<const uint8_t*> rows_at;  // empty for kNone
  };
  std::vector<Table> tables;
  int64_t rows = 0;
  int64_t row_bytes = 0;
};

UniqueSources FindUniqueSources(UpdateMode mode, const Workload& w) {
  UniqueSources sources;
  sources.tables.resize(w.fqns.size());
  for (size_t t = 0; t < w.fqns.size(); ++t) {
    std::map<int64_t, const uint8_t*> chosen;
    for (size_t b = 0; b < w.ids.size(); ++b) {
      const int64_t* ids = w.ids[b][t].data_ptr<int64_t>();
      const auto* states =
          mode == UpdateMode::kNone
              ? nullptr
              : static_cast<const uint8_t*>(w.states[b][t].data_ptr());
      if (states != nullptr) {
        sources.row_bytes = w.states[b][t].size(1) * sizeof(float);
      }
      for (int64_t i = 0; i < w.ids[b][t].numel(); ++i) {
        const uint8_t* row =
            states == nullptr ? nullptr : states + i * sources.row_bytes;
        auto [it, inserted] = chosen.emplace(ids[i], row);
        if (!inserted && mode == UpdateMode::kLast) it->second = row;
      }
    }
    for (const auto& [id, row] : chosen) {
      sources.tables[t].ids.push_back(id);
      if (row != nullptr) sources.tables[t].rows_at.push_back(row);
    }
    sources.rows += static_cast<int64_t>(chosen.size());
  }
  return sources;
}

// The floor of any store: copying each unique row's ID and chosen state once,
// in ID order, into newly allocated memory (one buffer per table, all kept
// to the end, as a read's result tensors are: reusing one buffer for every
// table would find it in the cache). The states are gathered as the store
// gathers them (CopyRowsAt, prefetched): a plain row-by-row memcpy waits for
// each row's misses in turn and took up to 1.5x as long, which is no floor.
double UniqueCopySeconds(const UniqueSources& sources) {
  std::vector<std::unique_ptr<int64_t[]>> all_ids;
  std::vector<std::unique_ptr<uint8_t[]>> all_states;
  const auto start = Now();
  uint8_t check = 0;
  for (const auto& table : sources.tables) {
    const int64_t n = static_cast<int64_t>(table.ids.size());
    int64_t* ids = all_ids.emplace_back(new int64_t[n]).get();
    uint8_t* states =
        all_states.emplace_back(new uint8_t[n * sources.row_bytes + 1]).get();
    std::memcpy(ids, table.ids.data(), n * sizeof(int64_t));
    if (sources.row_bytes > 0) {
      CopyRowsAt(table.rows_at, 0, n, sources.row_bytes, states);
    }
    check ^=
        states[n * sources.row_bytes / 2] ^ static_cast<uint8_t>(ids[n / 2]);
  }
  const double seconds = Seconds(start);
  if (check == 0xff) std::puts("");  // keeps the copy observable
  return seconds;
}

// The floor of finding which IDs are new: one pass over every ID recorded,
// a test-and-set in a bitmap per table (no hashing at all: IDs are row
// numbers below --rows), counting the new ones. The bitmaps are allocated
// before the clock starts, as a store that reuses its memory would have them.
double IdFloorSeconds(const Workload& w) {
  const int64_t words = (absl::GetFlag(FLAGS_rows) + 63) / 64;
  std::vector<std::vector<uint64_t>> bits(w.fqns.size(),
                                          std::vector<uint64_t>(words));
  int64_t added = 0;
  const auto start = Now();
  for (size_t b = 0; b < w.ids.size(); ++b) {
    for (size_t t = 0; t < w.fqns.size(); ++t) {
      const int64_t* ids = w.ids[b][t].data_ptr<int64_t>();
      uint64_t* table_bits = bits[t].data();
      for (int64_t i = 0; i < w.ids[b][t].numel(); ++i) {
        const auto id = static_cast<uint64_t>(ids[i]);
        uint64_t& word = table_bits[id >> 6];
        const uint64_t bit = uint64_t{1} << (id & 63);
        added += (word & bit) == 0;
        word |= bit;
      }
    }
  }
  const double seconds = Seconds(start);
  if (added == -1) std::puts("");  // keeps the pass observable
  return seconds;
}

// --write_ids: the IDs alone, without drawing states.
int WriteIds() {
  const std::string path = absl::GetFlag(FLAGS_write_ids);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  ZipfIds zipf(absl::GetFlag(FLAGS_rows), absl::GetFlag(FLAGS_zipf),
               absl::GetFlag(FLAGS_seed));
  std::vector<int64_t> ids(absl::GetFlag(FLAGS_ids));
  for (int64_t b = 0; b < absl::GetFlag(FLAGS_batches); ++b) {
    for (int64_t t = 0; t < absl::GetFlag(FLAGS_tables); ++t) {
      for (int64_t& id : ids) id = zipf.Next();
      file.write(reinterpret_cast<const char*>(ids.data()),
                 static_cast<std::streamsize>(ids.size() * sizeof(int64_t)));
    }
  }
  if (!file.flush()) {
    std::fprintf(stderr, "store_bench: cannot write --write_ids=%s\n",
                 path.c_str());
    return 2;
  }
  return 0;
}

int Main() {
  auto mode = ParseUpdateMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) {
    std::fprintf(stderr, "store_bench: %s\n",
                 std::string(mode.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_clock) != "wall" &&
      absl::GetFlag(FLAGS_clock) != "cpu") {
    std::fprintf(stderr, "store_bench: --clock must be wall or cpu\n");
    return 2;
  }
  if (!absl::GetFlag(FLAGS_write_ids).empty()) return WriteIds();
  at::set_num_threads(1);
  KeepHostMemoryForReuse();  // as a long-running trainer or server
  const Workload w = MakeWorkload(*mode);
  const UniqueSources sources = FindUniqueSources(*mode, w);
  const int64_t total_ids = absl::GetFlag(FLAGS_tables) *
                            absl::GetFlag(FLAGS_batches) *
                            absl::GetFlag(FLAGS_ids);
  std::vector<double> totals, compacts, reads, orders, gathers, copies,
      unique_copies, id_floors;
  int64_t unique_rows = 0, store_bytes = 0;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_repeat)); ++i) {
    RunResult r = RunOnce(*mode, w);
    totals.push_back(r.total_s);
    compacts.push_back(r.compact_s);
    reads.push_back(r.read_s);
    orders.push_back(r.order_s);
    gathers.push_back(r.gather_s);
    copies.push_back(CopySeconds(w));
    unique_copies.push_back(UniqueCopySeconds(sources));
    id_floors.push_back(IdFloorSeconds(w));
    unique_rows = r.unique_rows;
    store_bytes = r.store_bytes;
  }
  if (unique_rows != sources.rows) {
    std::fprintf(stderr,
                 "store_bench: the store read %lld unique rows, %lld "
                 "were recorded\n",
                 static_cast<long long>(unique_rows),
                 static_cast<long long>(sources.rows));
    return 1;
  }
  const double total_s = Median(totals);
  const auto unique_bytes =
      static_cast<int64_t>(sources.rows * (8 + sources.row_bytes));
  const double copy_s = Median(copies);
  const double unique_copy_s = Median(unique_copies);
  const double id_floor_s = Median(id_floors);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"mode\":\"%s\",\"total_s\":%.6f,\"ids_per_s\":%.0f,"
        "\"unique_rows\":%lld,\"copy_ratio\":%.3f,\"compact_s\":%.6f,"
        "\"read_s\":%.6f,\"order_s\":%.6f,\"gather_s\":%.6f,"
        "\"copy_s\":%.6f,\"bytes\":%lld,"
        "\"unique_copy_s\":%.6f,\"unique_copy_ratio\":%.3f,"
        "\"store_bytes\":%lld,\"unique_bytes\":%lld,\"id_floor_s\":%.6f,"
        "\"floor_s\":%.6f}\n",
        std::string(UpdateModeName(*mode)).c_str(), total_s,
        total_ids / total_s, static_cast<long long>(unique_rows),
        total_s / copy_s, Median(compacts), Median(reads), Median(orders),
        Median(gathers), copy_s, static_cast<long long>(w.bytes), unique_copy_s,
        total_s / unique_copy_s, static_cast<long long>(store_bytes),
        static_cast<long long>(unique_bytes), id_floor_s,
        id_floor_s + unique_copy_s);
    return 0;
  }
  std::printf(
      "store_bench: mode=%s tables=%lld batches=%lld ids=%lld "
      "rows=%lld dim=%lld zipf=%.2f (median of %zu runs)\n",
      std::string(UpdateModeName(*mode)).c_str(),
      static_cast<long long>(absl::GetFlag(FLAGS_tables)),
      static_cast<long long>(absl::GetFlag(FLAGS_batches)),
      static_cast<long long>(absl::GetFlag(FLAGS_ids)),
      static_cast<long long>(absl::GetFlag(FLAGS_rows)),
      static_cast<long long>(absl::GetFlag(FLAGS_dim)),
      absl::GetFlag(FLAGS_zipf), totals.size());
  std::printf("  %-22s %12.4f s\n", "total", total_s);
  std::printf("  %-22s %12.4f s\n", "  auto-compaction", Median(compacts));
  std::printf("  %-22s %12.4f s\n", "  final compact+read", Median(reads));
  std::printf("  %-22s %12.4f s\n", "    rows found, sorted", Median(orders));
  std::printf("  %-22s %12.4f s\n", "    rows gathered", Median(gathers));
  std::printf("  %-22s %12.0f\n", "IDs recorded / s", total_ids / total_s);
  std::printf("  %-22s %12lld\n", "unique rows read",
              static_cast<long long>(unique_rows));
  std::printf("  %-22s %12.1f MiB in %.4f s\n", "plain copy",
              w.bytes / 1048576.0, copy_s);
  std::printf("  %-22s %12.2f x\n", "time / plain copy", total_s / copy_s);
  std::printf("  %-22s %12.1f MiB in %.4f s\n", "unique rows copy",
              sources.rows * (8.0 + sources.row_bytes) / 1048576.0,
              unique_copy_s);
  std::printf("  %-22s %12.2f x\n", "time / unique copy",
              total_s / unique_copy_s);
  std::printf("  %-22s %12.4f s\n", "new-ID bitmap pass", id_floor_s);
  std::printf("  %-22s %12.4f s (bitmap pass + unique rows copy)\n", "floor",
              id_floor_s + unique_copy_s);
  std::printf("  %-22s %12.2f x\n", "time / floor",
              total_s / (id_floor_s + unique_copy_s));
  std::printf("  %-22s %12.1f MiB (%.2f x the unique rows)\n",
              "store holds at read", store_bytes / 1048576.0,
              static_cast<double>(store_bytes) / unique_bytes);
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
