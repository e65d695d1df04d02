// Google Benchmark micro-benchmarks of the data path's hot functions, so that
// a regression shows up as a number: the row index folding new and known IDs,
// compaction and reads of a window (whole, and up to where a streamed read
// starts sending), chunk encoding and decoding, and the tracker's step and
// read as its consumers multiply.
//
//   bazel run -c opt //tests/bench:micro_bench [-- --benchmark_filter=Fold]
//
// Workload: lookups of 4096 IDs drawn from tests/bench/zipf.h's bounded
// Zipf(1.05) over 1M rows, float32 states of dim 64 (DESIGN.md's workload, one
// table). items/s counts IDs; bytes/s counts state (or wire) bytes.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/rand.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/host_memory.h"
#include "proto/tensor.pb.h"
#include "proto/tensor_codec.h"
#include "store/delta_store.h"
#include "store/row_gather.h"
#include "store/row_index.h"
#include "tests/bench/zipf.h"
#include "tracker_service/tracker.h"

namespace deltastream {
namespace {

constexpr int64_t kIds = 4096;
constexpr int64_t kDim = 64;
constexpr int64_t kRowBytes = kDim * sizeof(float);

// `count` lookups of kIds Zipf IDs with random float32 states, drawn once.
struct Lookups {
  std::vector<at::Tensor> ids, states;
};

const Lookups& ZipfLookups() {
  static const Lookups* lookups = [] {
    auto* l = new Lookups;
    ZipfIds zipf(1000000, 1.05, 1);
    for (int b = 0; b < 100; ++b) {
      at::Tensor ids = at::empty({kIds}, at::kLong);
      int64_t* out = ids.data_ptr<int64_t>();
      for (int64_t i = 0; i < kIds; ++i) out[i] = zipf.Next();
      l->ids.push_back(ids);
      l->states.push_back(at::rand({kIds, kDim}));
    }
    return l;
  }();
  return *lookups;
}

UpdateMode ModeArg(const benchmark::State& state) {
  return static_cast<UpdateMode>(state.range(0));
}

void Fold(RowIndex& index, const Lookups& l, size_t b) {
  index.Fold(l.ids[b], l.states[b]);
}

// Folding lookups into a fresh index: most IDs are new (a bit and a slot
// each; kFirst/kLast point at their rows where they were recorded).
void BM_RowIndexInsertNew(benchmark::State& state) {
  const Lookups& l = ZipfLookups();
  const int64_t batches = state.range(1);
  for (auto _ : state) {
    RowIndex index(ModeArg(state), kRowBytes);
    for (int64_t b = 0; b < batches; ++b) Fold(index, l, b);
    benchmark::DoNotOptimize(index.size());
  }
  state.SetItemsProcessed(state.iterations() * batches * kIds);
}
BENCHMARK(BM_RowIndexInsertNew)
    ->ArgNames({"mode", "batches"})
    ->Args({static_cast<int>(UpdateMode::kNone), 1})
    ->Args({static_cast<int>(UpdateMode::kFirst), 1})
    ->Args({static_cast<int>(UpdateMode::kLast), 1})
    ->Args({static_cast<int>(UpdateMode::kFirst), 10});

// Folding one more lookup into an index that holds 30 (auto-compaction's step
// in the steady state): most IDs are known, a bit test each; kLast keeps the
// lookup as a run and, whenever its runs hold 8 times the kept rows' bytes,
// settles them (a copy of the kept rows) within the timing.
void BM_RowIndexFoldIntoHeld(benchmark::State& state) {
  const Lookups& l = ZipfLookups();
  RowIndex index(ModeArg(state), kRowBytes);
  for (int b = 0; b < 30; ++b) Fold(index, l, b);
  size_t next = 30;
  for (auto _ : state) {
    Fold(index, l, next);
    next = next + 1 < l.ids.size() ? next + 1 : 30;
  }
  state.SetItemsProcessed(state.iterations() * kIds);
}
BENCHMARK(BM_RowIndexFoldIntoHeld)
    ->ArgName("mode")
    ->Arg(static_cast<int>(UpdateMode::kNone))
    ->Arg(static_cast<int>(UpdateMode::kFirst))
    ->Arg(static_cast<int>(UpdateMode::kLast));

// Appends lookups 0..batches-1 to table "t" of `store`, one per batch.
void AppendLookups(DeltaStore& store, const Lookups& l, int64_t batches) {
  for (int64_t b = 0; b < batches; ++b) {
    (void)store.Append(
        b, {{"t", l.ids[b],
             store.mode() == UpdateMode::kNone ? at::Tensor() : l.states[b]}});
  }
}

// Compacting a window of recorded lookups into one (DeltaStore::Compact).
void BM_CompactWindow(benchmark::State& state) {
  const Lookups& l = ZipfLookups();
  const UpdateMode mode = ModeArg(state);
  const int64_t batches = state.range(1);
  for (auto _ : state) {
    state.PauseTiming();
    auto store = std::make_unique<DeltaStore>(mode);
    AppendLookups(*store, l, batches);
    state.ResumeTiming();
    store->Compact(0, batches);
    state.PauseTiming();
    store.reset();  // freeing is not compaction's cost
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * batches * kIds);
}
BENCHMARK(BM_CompactWindow)
    ->ArgNames({"mode", "batches"})
    ->Args({static_cast<int>(UpdateMode::kNone), 30})
    ->Args({static_cast<int>(UpdateMode::kFirst), 30})
    ->Args({static_cast<int>(UpdateMode::kLast), 30});

// A store holding a window of 30 batches in the mode of argument 0,
// compacted when argument 1 is nonzero.
std::unique_ptr<DeltaStore> WindowStore(const benchmark::State& state) {
  auto store = std::make_unique<DeltaStore>(ModeArg(state));
  AppendLookups(*store, ZipfLookups(), 30);
  if (state.range(1) != 0) store->Compact(0, 30);
  return store;
}

// Reading the unique rows of a window: compacted (one index, one gather) or
// as recorded (indexed where they are, then one gather).
void BM_ReadWindow(benchmark::State& state) {
  const std::unique_ptr<DeltaStore> store = WindowStore(state);
  int64_t rows = 0;
  for (auto _ : state) {
    UniqueRows read = *store->GetUniqueTable("t", 0);
    rows = read.size();
    benchmark::DoNotOptimize(read.ids.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * rows);
  state.SetBytesProcessed(
      state.iterations() * rows *
      (ModeArg(state) == UpdateMode::kNone ? 8 : 8 + kRowBytes));
}
BENCHMARK(BM_ReadWindow)
    ->ArgNames({"mode", "compacted"})
    ->Args({static_cast<int>(UpdateMode::kNone), 1})
    ->Args({static_cast<int>(UpdateMode::kFirst), 1})
    ->Args({static_cast<int>(UpdateMode::kFirst), 0})
    ->Args({static_cast<int>(UpdateMode::kLast), 0})
    ->Args({static_cast<int>(UpdateMode::kLast), 1});

// What a filling read (the service's stream) does before its first chunk
// can go: the IDs sorted and each kept row's place found
// (DeltaStore::GetUniqueTableDeferred), without the copy of the rows, which
// goes on while chunks are sent. BM_ReadWindow minus this is that copy.
void BM_ReadWindowDeferred(benchmark::State& state) {
  const std::unique_ptr<DeltaStore> store = WindowStore(state);
  int64_t rows = 0;
  for (auto _ : state) {
    DeltaStore::DeferredRows read = *store->GetUniqueTableDeferred("t", 0);
    rows = read.rows.size();
    benchmark::DoNotOptimize(read.rows.ids.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}
BENCHMARK(BM_ReadWindowDeferred)
    ->ArgNames({"mode", "compacted"})
    ->Args({static_cast<int>(UpdateMode::kFirst), 1})
    ->Args({static_cast<int>(UpdateMode::kFirst), 0})
    ->Args({static_cast<int>(UpdateMode::kLast), 0})
    ->Args({static_cast<int>(UpdateMode::kLast), 1});

// The copy of a streamed read's rows (CopyRowsAt, the gather that
// RowGather and compaction run): 51 MiB of rows of `row_bytes`, spread in
// random order over twice that (a store's rows, far more than the caches
// hold), or in order (spread 0: one sequential copy of the same bytes, the
// gather's floor).
void BM_CopyRowsAt(benchmark::State& state) {
  const int64_t row_bytes = state.range(0);
  const int64_t rows = (51 << 20) / row_bytes;
  std::vector<uint8_t> pool(2 * rows * row_bytes, 1);
  std::vector<int64_t> order(2 * rows);
  for (int64_t i = 0; i < 2 * rows; ++i) order[i] = i;
  if (state.range(1) != 0) {
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  }
  std::vector<const uint8_t*> rows_at(rows);
  for (int64_t i = 0; i < rows; ++i) {
    rows_at[i] = pool.data() + order[i] * row_bytes;
  }
  std::vector<uint8_t> out(rows * row_bytes);
  for (auto _ : state) {
    CopyRowsAt(rows_at, 0, rows, row_bytes, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * rows * row_bytes);
}
BENCHMARK(BM_CopyRowsAt)
    ->ArgNames({"row_bytes", "spread"})
    ->Args({256, 0})
    ->Args({64, 1})
    ->Args({256, 1})
    ->Args({1024, 1})
    ->Unit(benchmark::kMillisecond);

// One chunk of states (4096 rows x 64 float32 = 1 MiB, GetDelta's default
// chunk) to its wire form and back into a table, as the service and the
// client do per chunk.
void BM_EncodeChunk(benchmark::State& state) {
  const at::Tensor table = at::rand({16 * kIds, kDim});
  v1::Tensor wire;
  int64_t offset = 0;
  for (auto _ : state) {
    (void)EncodeTensor(table.narrow(0, offset, kIds), &wire);
    benchmark::DoNotOptimize(wire.data().data());
    offset = (offset + kIds) % table.size(0);
  }
  state.SetBytesProcessed(state.iterations() * kIds * kRowBytes);
}
BENCHMARK(BM_EncodeChunk);

void BM_DecodeChunk(benchmark::State& state) {
  const int64_t table_rows = 16 * kIds;
  v1::Tensor wire;
  (void)EncodeTensor(at::rand({kIds, kDim}), &wire);
  at::Tensor table;
  int64_t offset = 0;
  for (auto _ : state) {
    (void)DecodeRowsInto(wire, offset, table_rows, &table);
    benchmark::DoNotOptimize(table.data_ptr());
    offset = (offset + kIds) % table_rows;
  }
  state.SetBytesProcessed(state.iterations() * kIds * kRowBytes);
}
BENCHMARK(BM_DecodeChunk);

// One step of a trainer with `tables` tables (64 IDs each) followed by one
// delete-on-read, the consumers of `consumers` taking turns: what the
// tracker's lock is held for per read as the consumers (predictor replicas,
// checkpoint jobs) multiply, each at a cursor of its own.
void BM_TrackerReadAmongConsumers(benchmark::State& state) {
  const int64_t tables = state.range(0);
  const int64_t consumers = state.range(1);
  TrackerOptions options;  // ID_ONLY, open: any table, delete on read
  for (int64_t c = 0; c < consumers; ++c) {
    options.consumers.push_back("c" + std::to_string(c));
  }
  std::unique_ptr<Tracker> tracker = *Tracker::Create(options);
  std::vector<std::string> fqns;
  for (int64_t t = 0; t < tables; ++t) fqns.push_back("t" + std::to_string(t));
  const at::Tensor ids = at::arange(64, at::kLong);
  DeltaRequest read;
  read.through_current_batch = false;
  int64_t turn = 0, read_ids = 0;
  for (auto _ : state) {
    std::vector<TableLookup> lookups;
    for (const std::string& fqn : fqns) lookups.push_back({fqn, ids, {}});
    (void)tracker->RecordTables(std::move(lookups));
    tracker->Step();
    read.consumer = options.consumers[turn++ % consumers];
    absl::StatusOr<Delta> delta = tracker->GetDelta(read);
    read_ids += delta->tables.begin()->second.ids.numel();
  }
  benchmark::DoNotOptimize(read_ids);
}
BENCHMARK(BM_TrackerReadAmongConsumers)
    ->ArgNames({"tables", "consumers"})
    ->Args({4, 1})
    ->Args({4, 16})
    ->Args({4, 256})
    ->Args({64, 16})
    ->Args({64, 256});

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  at::set_num_threads(1);
  deltastream::KeepHostMemoryForReuse();  // as a long-running trainer
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
