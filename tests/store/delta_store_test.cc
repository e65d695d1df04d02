#include "store/delta_store.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "store/row_gather.h"
#include "store/unique_rows.h"
#include "tests/testing/tensor_values.h"

namespace deltastream {
namespace {

// One state row per ID: row i is filled with values[i].
at::Tensor States(std::vector<float> values, int64_t dim = 2,
                  at::ScalarType dtype = at::kFloat) {
  at::Tensor column = at::tensor(values, at::kFloat).unsqueeze(1);
  return column.expand({static_cast<int64_t>(values.size()), dim})
      .contiguous()
      .to(dtype);
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// First column of each state row, as floats.
std::vector<float> FirstColumn(const at::Tensor& states) {
  at::Tensor c = states.select(1, 0).to(at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

TEST(DeltaStoreTest, IdOnlyUniqueRowsAreSortedAndDeduplicated) {
  DeltaStore store(UpdateMode::kNone);
  ASSERT_TRUE(store.Append(0, {{"t1", Ids({5, 3, 5, 9}), {}}}).ok());
  ASSERT_TRUE(store.Append(1, {{"t1", Ids({3, 1}), {}}}).ok());
  auto delta = store.GetUnique(0);
  ASSERT_EQ(delta.size(), 1u);
  EXPECT_EQ(ToVector(delta["t1"].ids), (std::vector<int64_t>{1, 3, 5, 9}));
  EXPECT_FALSE(delta["t1"].states.defined());
  EXPECT_EQ(ToVector(store.GetUnique(1)["t1"].ids),
            (std::vector<int64_t>{1, 3}));
}

TEST(DeltaStoreTest, FirstKeepsEarliestStateAndLastKeepsLatest) {
  for (UpdateMode mode : {UpdateMode::kFirst, UpdateMode::kLast}) {
    DeltaStore store(mode);
    // ID 7 is seen three times: twice in batch 0 and once in batch 2.
    ASSERT_TRUE(
        store.Append(0, {{"t", Ids({7, 2, 7}), States({10, 20, 11})}}).ok());
    ASSERT_TRUE(store.Append(1, {{"t", Ids({2}), States({21})}}).ok());
    ASSERT_TRUE(store.Append(2, {{"t", Ids({7, 4}), States({12, 40})}}).ok());
    for (bool compacted : {false, true}) {
      if (compacted) store.Compact(0, 3);
      UniqueRows rows = store.GetUnique(0)["t"];
      EXPECT_EQ(ToVector(rows.ids), (std::vector<int64_t>{2, 4, 7}));
      std::vector<float> expected = mode == UpdateMode::kFirst
                                        ? std::vector<float>{20, 40, 10}
                                        : std::vector<float>{21, 40, 12};
      EXPECT_EQ(FirstColumn(rows.states), expected)
          << UpdateModeName(mode) << " compacted=" << compacted;
    }
  }
}

// A read indexes the lookups' rows where they are and copies each once into
// its result; states recorded as strided views (made contiguous for the read)
// and reads over compacted and recorded lookups together must answer as the
// tensor reference does, and leave the store's lookups unchanged.
TEST(DeltaStoreTest, ReadsOverStridedAndMixedLookupsMatchReference) {
  for (UpdateMode mode : {UpdateMode::kFirst, UpdateMode::kLast}) {
    DeltaStore store(mode);
    std::vector<at::Tensor> ids, states;
    for (int64_t b = 0; b < 6; ++b) {
      ids.push_back(at::randint(0, 40, {30}, at::kLong));
      // [30, 5] viewed from a [5, 30] tensor: not contiguous.
      states.push_back(at::randn({5, 30}).t());
      ASSERT_FALSE(states.back().is_contiguous());
      ASSERT_TRUE(store.Append(b, {{"t", ids.back(), states.back()}}).ok());
      if (b == 3) store.Compact(0, 3);  // batches 0-2 compacted, 3-5 recorded
    }
    for (int pass = 0; pass < 2; ++pass) {
      UniqueRows expected = UniqueRowsOf(ids, states, mode);
      UniqueRows got = store.GetUnique(-1)["t"];
      EXPECT_TRUE(at::equal(got.ids, expected.ids)) << UpdateModeName(mode);
      EXPECT_TRUE(at::equal(got.states, expected.states))
          << UpdateModeName(mode);
      EXPECT_EQ(store.BatchIndices("t"), (std::vector<int64_t>{0, 3, 4, 5}));
    }
  }
}

TEST(DeltaStoreTest, CompactMergesWindowIntoOneLookupAtStart) {
  DeltaStore store(UpdateMode::kFirst);
  for (int64_t b = 0; b < 5; ++b) {
    ASSERT_TRUE(
        store.Append(b, {{"t", Ids({b, b + 1}), States({float(b), float(b)})}})
            .ok());
  }
  store.Compact(1, 4);
  EXPECT_EQ(store.BatchIndices("t"), (std::vector<int64_t>{0, 1, 4}));
  // The merged lookup answers reads from its start.
  EXPECT_EQ(ToVector(store.GetUnique(1)["t"].ids),
            (std::vector<int64_t>{1, 2, 3, 4, 5}));
  // A window that starts before its first lookup moves that lookup to the
  // start.
  store.Compact(-1, 5);
  EXPECT_EQ(store.BatchIndices("t"), (std::vector<int64_t>{-1}));
  EXPECT_EQ(FirstColumn(store.GetUnique(-1)["t"].states),
            (std::vector<float>{0, 0, 1, 2, 3, 4}));
}

TEST(DeltaStoreTest, CompactOfOneLookupOrEmptyWindowChangesNothing) {
  DeltaStore store(UpdateMode::kNone);
  ASSERT_TRUE(store.Append(2, {{"t", Ids({1, 1}), {}}}).ok());
  store.Compact(0, 5);  // a single lookup keeps its index and its repeats
  EXPECT_EQ(store.BatchIndices("t"), (std::vector<int64_t>{2}));
  EXPECT_EQ(store.Usage().total.ids, 2);
  store.Compact(3, 3);
  store.Compact(4, 1);
  EXPECT_EQ(store.BatchIndices("t"), (std::vector<int64_t>{2}));
}

TEST(DeltaStoreTest, DeleteDropsLookupsBelowIndexAndKeepsTablesKnown) {
  DeltaStore store(UpdateMode::kLast);
  for (int64_t b = 0; b < 4; ++b) {
    ASSERT_TRUE(store
                    .Append(b, {{"a", Ids({b}), States({1}, 3)},
                                {"b", Ids({b}), States({1}, 3)}})
                    .ok());
  }
  store.Delete(2);
  EXPECT_EQ(store.BatchIndices("a"), (std::vector<int64_t>{2, 3}));
  store.DeleteTable("b", 3);
  EXPECT_EQ(store.BatchIndices("b"), (std::vector<int64_t>{3}));
  store.Delete();
  auto delta = store.GetUnique(0);
  ASSERT_EQ(delta.size(), 2u);
  EXPECT_EQ(delta["a"].size(), 0);
  EXPECT_EQ(delta["a"].states.sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(store.bytes(), 0);
  EXPECT_EQ(store.OldestBatchIndex(), std::nullopt);
}

TEST(DeltaStoreTest, EveryStateDtypeRoundTrips) {
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    DeltaStore store(UpdateMode::kFirst);
    ASSERT_TRUE(
        store.Append(0, {{"t", Ids({3, 1}), States({3, 1}, 4, dtype)}}).ok());
    ASSERT_TRUE(
        store.Append(1, {{"t", Ids({1, 2}), States({9, 2}, 4, dtype)}}).ok());
    store.Compact(0, 2);
    UniqueRows rows = store.GetUnique(0)["t"];
    EXPECT_EQ(rows.states.scalar_type(), dtype);
    EXPECT_EQ(FirstColumn(rows.states), (std::vector<float>{1, 2, 3}));
  }
}

TEST(DeltaStoreTest, RejectedAppendLeavesStoreUnchanged) {
  DeltaStore store(UpdateMode::kFirst);
  ASSERT_TRUE(store.Append(3, {{"t", Ids({1, 2}), States({1, 2})}}).ok());
  const StoreUsage before = store.Usage();

  struct Case {
    const char* what;
    int64_t batch_idx;
    std::vector<TableLookup> lookups;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back({"ids and states of different lengths",
                   3,
                   {{"t", Ids({1, 2, 3}), States({1, 2})}},
                   "[3, dim"});
  cases.push_back({"state dim that changes",
                   3,
                   {{"t", Ids({1}), States({1}, 5)}},
                   "dim 2"});
  cases.push_back({"state dtype that changes",
                   3,
                   {{"t", Ids({1}), States({1}, 2, at::kHalf)}},
                   "Float"});
  cases.push_back({"integer states",
                   3,
                   {{"u", Ids({1}), at::ones({1, 2}, at::kInt)}},
                   "float32, float16 or bfloat16"});
  cases.push_back({"missing states", 3, {{"u", Ids({1}), {}}}, "needs states"});
  cases.push_back(
      {"int32 IDs", 3, {{"u", at::ones({1}, at::kInt), States({1})}}, "int64"});
  cases.push_back(
      {"2-D IDs", 3, {{"u", at::ones({1, 1}, at::kLong), States({1})}}, "1-D"});
  cases.push_back(
      {"older batch index", 2, {{"t", Ids({1}), States({1})}}, "older than"});
  cases.push_back({"empty FQN", 3, {{"", Ids({1}), States({1})}}, "empty"});
  // Rows of no width: reads would return IDs without states.
  cases.push_back({"zero-width states",
                   3,
                   {{"u", Ids({1}), at::ones({1, 0})}},
                   "dim >= 1"});
  cases.push_back({"repeated FQN",
                   3,
                   {{"v", Ids({1}), States({1})}, {"v", Ids({1}), States({1})}},
                   "twice"});
  // One good table and one bad: nothing of either is kept.
  cases.push_back(
      {"one bad table of two",
       4,
       {{"w", Ids({1}), States({1})}, {"t", Ids({1}), States({1}, 7)}},
       "dim"});
  for (Case& c : cases) {
    absl::Status status = store.Append(c.batch_idx, std::move(c.lookups));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(status.message().find(c.message), std::string::npos)
        << c.what << ": " << status.message();
  }
  EXPECT_EQ(store.Fqns(), std::vector<std::string>{"t"});
  EXPECT_EQ(store.BatchIndices("t"), (std::vector<int64_t>{3}));
  EXPECT_EQ(store.Usage().total.bytes, before.total.bytes);
}

// A compacted lookup keeps only its window's start: an append older than
// the newest batch merged into it is still refused (FIRST would otherwise
// keep the newer state as the first).
TEST(DeltaStoreTest, AnAppendOlderThanACompactedBatchIsRefused) {
  DeltaStore store(UpdateMode::kFirst);
  ASSERT_TRUE(store.Append(5, {{"t", Ids({1}), States({50})}}).ok());
  ASSERT_TRUE(store.Append(6, {{"t", Ids({2}), States({60})}}).ok());
  store.Compact(0, 10);
  absl::Status status = store.Append(3, {{"t", Ids({1}), States({30})}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("older than its newest lookup at 6"),
            std::string::npos)
      << status;
  EXPECT_TRUE(store.Append(6, {{"t", Ids({3}), States({61})}}).ok());
}

TEST(DeltaStoreTest, UnknownTableIsNotFound) {
  DeltaStore store(UpdateMode::kNone);
  EXPECT_EQ(store.GetUniqueTable("nope", 0).status().code(),
            absl::StatusCode::kNotFound);
  store.CompactTable("nope", 0, 2);  // no-op, no crash
  store.DeleteTable("nope", 2);
}

TEST(DeltaStoreTest, CompactingBetweenBoundsIsCompactingEachWindow) {
  DeltaStore between(UpdateMode::kLast), each(UpdateMode::kLast);
  for (DeltaStore* store : {&between, &each}) {
    for (int64_t b = 0; b < 6; ++b) {
      ASSERT_TRUE(
          store->Append(b, {{"t", Ids({b % 3, b + 3}), States({1.0f * b, 2})}})
              .ok());
    }
  }
  between.CompactTableBetween("t", {0, 2, 5});
  each.CompactTable("t", 0, 2);
  each.CompactTable("t", 2, 5);
  EXPECT_EQ(between.BatchIndices("t"), each.BatchIndices("t"));
  EXPECT_EQ(between.BatchIndices("t").size(), 3u);  // [0,2), [2,5), 5
  for (int64_t from : {0, 2, 5}) {
    absl::StatusOr<UniqueRows> a = between.GetUniqueTable("t", from);
    absl::StatusOr<UniqueRows> b = each.GetUniqueTable("t", from);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(Longs(a->ids), Longs(b->ids)) << from;
    EXPECT_EQ(Floats(a->states), Floats(b->states)) << from;
  }
  between.CompactTableBetween("nope", {0, 2});  // no-op, no crash
}

TEST(DeltaStoreTest, AppendDetachesFromAutograd) {
  DeltaStore store(UpdateMode::kFirst);
  at::Tensor states = at::ones({2, 2}).set_requires_grad(true) * 2;
  ASSERT_TRUE(store.Append(0, {{"t", Ids({1, 2}), states}}).ok());
  ASSERT_TRUE(store.Append(0, {}).ok());
  EXPECT_FALSE(store.GetUnique(0)["t"].states.requires_grad());
}

TEST(DeltaStoreTest, UsageCountsBytesAndShrinksOnCompactionAndDelete) {
  DeltaStore store(UpdateMode::kFirst);
  for (int64_t b = 0; b < 10; ++b) {
    ASSERT_TRUE(
        store.Append(b, {{"t", Ids({1, 2, 3, 4}), States({1, 2, 3, 4}, 16)}})
            .ok());
  }
  StoreUsage usage = store.Usage();
  EXPECT_EQ(usage.total.lookups, 10);
  EXPECT_EQ(usage.total.ids, 40);
  EXPECT_EQ(usage.tables["t"].bytes, 10 * (4 * 8 + 4 * 16 * 4));
  EXPECT_EQ(store.bytes(), usage.total.bytes);
  store.Compact(0, 10);
  usage = store.Usage();
  EXPECT_EQ(usage.total.lookups, 1);
  EXPECT_EQ(usage.total.ids, 4);
  EXPECT_LT(usage.total.bytes, 10 * (4 * 8 + 4 * 16 * 4));
  EXPECT_EQ(store.bytes(), usage.total.bytes);
  store.Delete(1);
  EXPECT_EQ(store.bytes(), 0);
}

// Compaction points at kept states where they were recorded and holds those
// tensors (counted in bytes()) while enough of their rows are kept;
// ReleaseRecorded() copies the kept rows and lets go of every recorded tensor.
// Tables are kept for good once recorded: a producer that names new ones
// without end (a standalone server's clients) is refused past kMaxTables,
// all or nothing, while the tables held take lookups as before.
TEST(DeltaStoreTest, TablesPastTheMostAreRefusedAllOrNothing) {
  DeltaStore store(UpdateMode::kNone);
  std::vector<TableLookup> lookups;
  for (size_t t = 0; t < DeltaStore::kMaxTables; ++t) {
    lookups.push_back({absl::StrCat("t", t), Ids({1}), {}});
  }
  ASSERT_TRUE(store.Append(0, std::move(lookups)).ok());
  const absl::Status refused =
      store.Append(1, {{"t0", Ids({2}), {}}, {"new", Ids({3}), {}}});
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("'new'"), std::string::npos) << refused;
  EXPECT_EQ(store.BatchIndices("t0"), std::vector<int64_t>{0});
  ASSERT_TRUE(store.Append(1, {{"t0", Ids({2}), {}}}).ok());
  EXPECT_EQ(store.BatchIndices("t0"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(store.Fqns().size(), DeltaStore::kMaxTables);
}

TEST(DeltaStoreTest, ReleaseRecordedLetsGoOfRecordedStates) {
  for (UpdateMode mode : {UpdateMode::kFirst, UpdateMode::kLast}) {
    DeltaStore store(mode);
    std::vector<at::Tensor> recorded;
    constexpr int64_t kBatches = 12, kIds = 64, kDim = 64;
    for (int64_t b = 0; b < kBatches; ++b) {
      recorded.push_back(at::randn({kIds, kDim}));
      // A quarter of each lookup's rows are new.
      ASSERT_TRUE(
          store
              .Append(b, {{"t", at::arange(b * 16, b * 16 + kIds, at::kLong),
                           recorded.back()}})
              .ok());
      store.Compact(0, b + 1);
    }
    const int64_t recorded_bytes = kBatches * kIds * kDim * 4;
    // Every lookup keeps at least a quarter of its rows: all are held.
    EXPECT_GE(store.bytes(), recorded_bytes) << UpdateModeName(mode);
    const UniqueRows before = store.GetUnique(0)["t"];
    store.ReleaseRecorded();
    // 240 kept rows of 768 recorded, with the index.
    EXPECT_LT(store.bytes(), recorded_bytes / 2) << UpdateModeName(mode);
    // Nothing points into the recorded tensors any more.
    for (at::Tensor& states : recorded) states.fill_(-1);
    const UniqueRows after = store.GetUnique(0)["t"];
    EXPECT_TRUE(at::equal(before.ids, after.ids));
    EXPECT_TRUE(at::equal(before.states, after.states)) << UpdateModeName(mode);
  }
}

// In kLast, later lookups outdate the rows of earlier ones: once a compacted
// window's recorded tensors hold more than 8 times its kept rows' bytes, it
// copies each ID's latest row once and lets go of them, so over many steps it
// holds a bounded multiple of its kept rows, not everything recorded.
TEST(DeltaStoreTest, LastModeReleasesOutdatedRecordedStates) {
  DeltaStore store(UpdateMode::kLast);
  std::mt19937_64 rng(5);
  std::vector<at::Tensor> ids, states;
  constexpr int64_t kRows = 256, kDim = 64, kRowBytes = kDim * 4;
  for (int64_t b = 0; b < 300; ++b) {
    ids.push_back(at::randint(0, kRows, {64}, at::kLong));
    states.push_back(at::randn({64, kDim}));
    ASSERT_TRUE(store.Append(b, {{"t", ids.back(), states.back()}}).ok());
    store.Compact(0, b);
  }
  // At most about 8.5 times the kept rows' bytes, and an index.
  EXPECT_LT(store.bytes(), 9 * kRows * kRowBytes);
  EXPECT_LT(store.bytes(), 300 * 64 * kRowBytes / 4);
  store.Compact(0, 300);
  const UniqueRows expected = UniqueRowsOf(ids, states, UpdateMode::kLast);
  const UniqueRows got = store.GetUnique(0)["t"];
  EXPECT_TRUE(at::equal(got.ids, expected.ids));
  EXPECT_TRUE(at::equal(got.states, expected.states));
}

// TorchRec's algorithm, step for step: every compaction re-uniques the window
// with tensor operations. The store must answer exactly as this does.
class ReferenceStore {
 public:
  explicit ReferenceStore(UpdateMode mode) : mode_(mode) {}

  void Append(int64_t batch_idx, const std::string& fqn, at::Tensor ids,
              at::Tensor states) {
    tables_[fqn].push_back({batch_idx, ids, states});
  }
  void Compact(int64_t start, int64_t end) {
    if (start >= end) return;
    for (auto& [fqn, lookups] : tables_) {
      std::vector<Lookup> kept, window;
      for (Lookup& l : lookups) {
        (l.batch_idx >= start && l.batch_idx < end ? window : kept)
            .push_back(l);
      }
      if (window.size() <= 1) continue;
      UniqueRows rows = Unique(window);
      std::vector<Lookup> result;
      bool inserted = false;
      for (Lookup& l : kept) {
        if (!inserted && l.batch_idx >= end) {
          result.push_back({start, rows.ids, rows.states});
          inserted = true;
        }
        result.push_back(l);
      }
      if (!inserted) result.push_back({start, rows.ids, rows.states});
      lookups = result;
    }
  }
  void Delete(int64_t up_to) {
    for (auto& [fqn, lookups] : tables_) {
      std::vector<Lookup> kept;
      for (Lookup& l : lookups) {
        if (l.batch_idx >= up_to) kept.push_back(l);
      }
      lookups = kept;
    }
  }
  std::map<std::string, UniqueRows> GetUnique(int64_t from) {
    std::map<std::string, UniqueRows> result;
    for (auto& [fqn, lookups] : tables_) {
      std::vector<Lookup> window;
      for (Lookup& l : lookups) {
        if (l.batch_idx >= from) window.push_back(l);
      }
      if (!window.empty()) result[fqn] = Unique(window);
    }
    return result;
  }
  std::vector<int64_t> BatchIndices(const std::string& fqn) {
    std::vector<int64_t> indices;
    for (Lookup& l : tables_[fqn]) indices.push_back(l.batch_idx);
    return indices;
  }

 private:
  struct Lookup {
    int64_t batch_idx;
    at::Tensor ids, states;
  };
  UniqueRows Unique(const std::vector<Lookup>& window) {
    std::vector<at::Tensor> ids, states;
    for (const Lookup& l : window) {
      ids.push_back(l.ids);
      if (mode_ != UpdateMode::kNone) states.push_back(l.states);
    }
    return UniqueRowsOf(ids, states, mode_);
  }
  UpdateMode mode_;
  std::map<std::string, std::vector<Lookup>> tables_;
};

void ExpectSameDelta(DeltaStore& store, ReferenceStore& reference, int64_t from,
                     const std::string& context) {
  auto actual = store.GetUnique(from);
  auto expected = reference.GetUnique(from);
  for (auto& [fqn, rows] : actual) {
    auto it = expected.find(fqn);
    if (it == expected.end()) {
      EXPECT_EQ(rows.size(), 0) << context << " fqn " << fqn;
      continue;
    }
    ASSERT_TRUE(at::equal(rows.ids, it->second.ids))
        << context << " fqn " << fqn << " from " << from;
    if (store.mode() != UpdateMode::kNone) {
      ASSERT_TRUE(at::equal(rows.states, it->second.states))
          << context << " fqn " << fqn << " from " << from;
    }
  }
}

class DeltaStoreEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<UpdateMode, at::ScalarType>> {
};

TEST_P(DeltaStoreEquivalenceTest, RandomOperationsMatchTorchRecAlgorithm) {
  const auto [mode, dtype] = GetParam();
  std::mt19937_64 rng(42 + static_cast<int>(mode));
  for (int round = 0; round < 20; ++round) {
    DeltaStore store(mode);
    ReferenceStore reference(mode);
    const std::vector<std::string> fqns = {"a", "b", "c"};
    // Odd rounds draw from more rows, so that lookups bring fewer new rows
    // and compaction copies the rows of sparse ones instead of holding them.
    const int64_t id_range = round % 2 == 0 ? 20 : 200;
    const int64_t max_ids = round % 2 == 0 ? 12 : 60;
    // Every fourth round spreads the IDs over negative and far-out values,
    // so that the row index is hashed from the start.
    const int64_t id_step = round % 4 == 3 ? int64_t{1} << 40 : 1;
    const int64_t id_offset = round % 4 == 3 ? -id_step * (id_range / 2) : 0;
    int64_t batch = 0;
    for (int op = 0; op < 60; ++op) {
      const int kind = static_cast<int>(rng() % 11);
      if (kind == 10) {  // reads must not change
        store.ReleaseRecorded();
      } else if (kind < 6) {  // record a batch into some tables
        std::vector<TableLookup> lookups;
        for (const std::string& fqn : fqns) {
          if (rng() % 3 == 0) continue;
          const int64_t n = static_cast<int64_t>(rng() % max_ids);
          at::Tensor ids =
              at::randint(0, id_range, {n}, at::kLong) * id_step + id_offset;
          at::Tensor states = at::randn({n, 3}).to(dtype);
          reference.Append(batch, fqn, ids, states);
          lookups.push_back({fqn, ids, states});
        }
        ASSERT_TRUE(store.Append(batch, std::move(lookups)).ok());
        if (rng() % 2 == 0) ++batch;
      } else if (kind < 8) {
        const int64_t start = static_cast<int64_t>(rng() % (batch + 2)) - 1;
        const int64_t end = start + static_cast<int64_t>(rng() % 5);
        store.Compact(start, end);
        reference.Compact(start, end);
      } else if (kind < 9) {
        const int64_t up_to = static_cast<int64_t>(rng() % (batch + 1)) - 1;
        store.Delete(up_to);
        reference.Delete(up_to);
      } else {
        const std::string context =
            "round " + std::to_string(round) + " op " + std::to_string(op);
        for (int64_t from = -1; from <= batch + 1; ++from) {
          ExpectSameDelta(store, reference, from, context);
        }
        for (const std::string& fqn : fqns) {
          if (!store.BatchIndices(fqn).empty() ||
              !reference.BatchIndices(fqn).empty()) {
            ASSERT_EQ(store.BatchIndices(fqn), reference.BatchIndices(fqn));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllModes, DeltaStoreEquivalenceTest,
    ::testing::Values(std::make_tuple(UpdateMode::kNone, at::kFloat),
                      std::make_tuple(UpdateMode::kFirst, at::kFloat),
                      std::make_tuple(UpdateMode::kLast, at::kFloat),
                      std::make_tuple(UpdateMode::kFirst, at::kHalf),
                      std::make_tuple(UpdateMode::kLast, at::kBFloat16)));

TEST(DeltaStoreTest, GetUniqueReadsAWindowOfBatches) {
  DeltaStore store(UpdateMode::kNone);
  for (int64_t b = 0; b < 4; ++b) {
    ASSERT_TRUE(store.Append(b, {{"t", Ids({10 + b}), {}}}).ok());
  }
  EXPECT_EQ(ToVector(store.GetUnique(1, 3)["t"].ids),
            (std::vector<int64_t>{11, 12}));
  EXPECT_EQ(store.GetUnique(3, 1)["t"].size(), 0);
  auto rows = store.GetUniqueTable("t", 2);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(ToVector(rows->ids), (std::vector<int64_t>{12, 13}));
}

// In id_only mode small non-negative IDs are held in a bitmap that turns into
// a hash index when an ID does not fit; answers must not change either way.
// Every mode starts with a direct index (a bitmap of the IDs held, with a
// slot per ID in kFirst/kLast) and must switch to a hash index, without losing
// or reordering anything, when an ID is negative or far out.
TEST(DeltaStoreTest, EveryModeHandlesEveryIdRange) {
  for (UpdateMode mode :
       {UpdateMode::kNone, UpdateMode::kFirst, UpdateMode::kLast}) {
    std::mt19937_64 rng(3);
    for (int64_t far : {int64_t{5}, int64_t{1} << 22, int64_t{1} << 40,
                        int64_t{-7}, INT64_MAX, INT64_MIN}) {
      DeltaStore store(mode);
      std::vector<at::Tensor> recorded, states;
      for (int64_t b = 0; b < 30; ++b) {
        std::vector<int64_t> ids;
        for (int i = 0; i < 50; ++i)
          ids.push_back(static_cast<int64_t>(rng() % 3000));
        if (b == 17) ids.push_back(far);  // late, after the index grew
        recorded.push_back(Ids(ids));
        states.push_back(
            at::randn({static_cast<int64_t>(ids.size()), 4}, at::kFloat));
        ASSERT_TRUE(
            store
                .Append(b, {{"t", recorded.back(),
                             mode == UpdateMode::kNone ? at::Tensor()
                                                       : states.back()}})
                .ok());
        store.Compact(-1, b);
      }
      UniqueRows expected = UniqueRowsOf(
          recorded,
          mode == UpdateMode::kNone ? std::vector<at::Tensor>{} : states, mode);
      for (int pass = 0; pass < 2; ++pass) {
        UniqueRows got = store.GetUnique(-1)["t"];
        EXPECT_TRUE(at::equal(got.ids, expected.ids))
            << UpdateModeName(mode) << " far ID " << far;
        if (mode != UpdateMode::kNone) {
          EXPECT_TRUE(at::equal(got.states, expected.states))
              << UpdateModeName(mode) << " far ID " << far;
        }
        store.Compact(-1, 30);
      }
    }
  }
}

// A deferred read answers as GetUniqueTable once its gather has copied every
// row, in pieces of any size and order: over recorded lookups (a read's own
// index), one compacted lookup, and several, in every mode.
TEST(DeltaStoreTest, DeferredReadCopiedInPiecesEqualsRead) {
  for (UpdateMode mode :
       {UpdateMode::kNone, UpdateMode::kFirst, UpdateMode::kLast}) {
    std::mt19937_64 rng(5);
    DeltaStore store(mode);
    for (int64_t b = 0; b < 12; ++b) {
      std::vector<int64_t> ids;
      for (int i = 0; i < 300; ++i) {
        ids.push_back(static_cast<int64_t>(rng() % 2000));
      }
      if (b == 9) ids.push_back(int64_t{1} << 40);  // the hashed index too
      at::Tensor states =
          at::randn({static_cast<int64_t>(ids.size()), 3}, at::kFloat);
      ASSERT_TRUE(
          store
              .Append(b, {{"t", Ids(ids),
                           mode == UpdateMode::kNone ? at::Tensor() : states}})
              .ok());
    }
    store.Compact(0, 4);  // one compacted lookup
    store.Compact(4, 8);
    for (auto [from, to] :
         {std::pair<int64_t, int64_t>{0, 4}, {8, 12}, {0, 12}, {5, 5}}) {
      const UniqueRows expected = *store.GetUniqueTable("t", from, to);
      absl::StatusOr<DeltaStore::DeferredRows> deferred =
          store.GetUniqueTableDeferred("t", from, to);
      ASSERT_TRUE(deferred.ok()) << deferred.status();
      EXPECT_TRUE(at::equal(deferred->rows.ids, expected.ids));
      if (mode == UpdateMode::kNone || expected.size() == 0) {
        EXPECT_EQ(deferred->gather, nullptr);
      } else {
        ASSERT_NE(deferred->gather, nullptr);
        RowGather& gather = *deferred->gather;
        ASSERT_EQ(gather.rows(), expected.size());
        EXPECT_EQ(gather.row_bytes(), 3 * static_cast<int64_t>(sizeof(float)));
        // The second half first, then the first in pieces of 7 rows.
        const int64_t half = gather.rows() / 2;
        gather.Copy(half, gather.rows());
        for (int64_t begin = 0; begin < half; begin += 7) {
          gather.Copy(begin, std::min(half, begin + 7));
        }
      }
      if (mode != UpdateMode::kNone) {
        EXPECT_TRUE(at::equal(deferred->rows.states, expected.states))
            << UpdateModeName(mode) << " [" << from << ", " << to << ")";
      }
    }
    EXPECT_EQ(store.GetUniqueTableDeferred("nope", 0).status().code(),
              absl::StatusCode::kNotFound);
  }
}

// CopyRowsAt copies each row to its place whatever the row size (below,
// at and above a cache line, not a multiple of one) and however the rows are
// cut into pieces: the first rows of a piece and the rows near the end,
// where the look-ahead runs out, included.
TEST(DeltaStoreTest, CopyRowsAtCopiesEveryRowInAnyPieces) {
  std::mt19937_64 rng(11);
  for (int64_t row_bytes : {4, 12, 64, 100, 4096}) {
    const int64_t rows = 3000;
    std::vector<uint8_t> pool(2 * rows * row_bytes);
    for (uint8_t& byte : pool) byte = static_cast<uint8_t>(rng());
    std::vector<int64_t> order(2 * rows);
    for (int64_t i = 0; i < 2 * rows; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<const uint8_t*> rows_at(rows);
    for (int64_t i = 0; i < rows; ++i) {
      rows_at[i] = pool.data() + order[i] * row_bytes;
    }
    std::vector<uint8_t> out(rows * row_bytes, 0);
    // Pieces of 1 to 700 rows, the last one first.
    const int64_t tail = rows - 1 - static_cast<int64_t>(rng() % 50);
    CopyRowsAt(rows_at, tail, rows, row_bytes, out.data());
    for (int64_t begin = 0; begin < tail;) {
      const int64_t end =
          std::min(tail, begin + 1 + static_cast<int64_t>(rng() % 700));
      CopyRowsAt(rows_at, begin, end, row_bytes, out.data());
      begin = end;
    }
    CopyRowsAt(rows_at, 7, 7, row_bytes, out.data());  // no rows
    for (int64_t i = 0; i < rows; ++i) {
      ASSERT_TRUE(std::equal(rows_at[i], rows_at[i] + row_bytes,
                             out.data() + i * row_bytes))
          << "row " << i << " of " << row_bytes << " bytes";
    }
  }
}

// Lookups recorded on a GPU stay there: compaction and reads run as tensor
// operations on the device and must answer exactly as the host path does.
TEST(DeltaStoreCudaTest, DeviceLookupsMatchHostLookups) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (UpdateMode mode :
       {UpdateMode::kNone, UpdateMode::kFirst, UpdateMode::kLast}) {
    DeltaStore host(mode), device(mode);
    for (int64_t b = 0; b < 20; ++b) {
      at::Tensor ids = at::randint(0, 50, {32}, at::kLong);
      at::Tensor states = at::randn({32, 8}).to(at::kHalf);
      ASSERT_TRUE(host.Append(b, {{"t", ids, states}}).ok());
      ASSERT_TRUE(device.Append(b, {{"t", ids.cuda(), states.cuda()}}).ok());
      host.Compact(-1, b);
      device.Compact(-1, b);
    }
    UniqueRows expected = host.GetUnique(-1)["t"];
    UniqueRows actual = device.GetUnique(-1)["t"];
    EXPECT_TRUE(actual.ids.is_cuda());
    EXPECT_TRUE(at::equal(actual.ids.cpu(), expected.ids));
    if (mode != UpdateMode::kNone) {
      EXPECT_TRUE(at::equal(actual.states.cpu(), expected.states));
    }
  }
}

// Auto-compaction's tiered form keeps few device lookups and answers as a
// full compaction does, from every cursor.
TEST(DeltaStoreCudaTest, TieredCompactionAnswersAsFullCompaction) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (UpdateMode mode :
       {UpdateMode::kNone, UpdateMode::kFirst, UpdateMode::kLast}) {
    DeltaStore host(mode), device(mode);
    for (int64_t b = 0; b < 100; ++b) {
      at::Tensor ids = at::randint(0, 500, {64}, at::kLong);
      at::Tensor states = at::randn({64, 4});
      ASSERT_TRUE(host.Append(b, {{"t", ids, states}}).ok());
      ASSERT_TRUE(device.Append(b, {{"t", ids.cuda(), states.cuda()}}).ok());
      host.Compact(40, b);  // a cursor at 40: windows never cross it
      host.Compact(-1, std::min<int64_t>(b, 40));
      device.CompactTableTiered("t", 40, b);
      device.CompactTableTiered("t", -1, std::min<int64_t>(b, 40));
    }
    EXPECT_LE(device.BatchIndices("t").size(), 24u) << UpdateModeName(mode);
    for (int64_t from : {-1, 40}) {
      UniqueRows expected = host.GetUnique(from)["t"];
      UniqueRows actual = device.GetUnique(from)["t"];
      EXPECT_TRUE(at::equal(actual.ids.cpu(), expected.ids))
          << UpdateModeName(mode) << " from " << from;
      if (mode != UpdateMode::kNone) {
        EXPECT_TRUE(at::equal(actual.states.cpu(), expected.states))
            << UpdateModeName(mode) << " from " << from;
      }
    }
  }
}

// The training thread appends and compacts while service threads read; the
// final answer must equal the single-threaded one.
TEST(DeltaStoreConcurrencyTest, AppendCompactAndReadFromSeveralThreads) {
  DeltaStore store(UpdateMode::kLast);
  ReferenceStore reference(UpdateMode::kLast);
  constexpr int64_t kBatches = 200;
  std::vector<at::Tensor> ids, states;
  for (int64_t b = 0; b < kBatches; ++b) {
    ids.push_back(at::randint(0, 500, {64}, at::kLong));
    states.push_back(at::randn({64, 4}));
    reference.Append(b, "t", ids.back(), states.back());
    reference.Compact(-1, b + 1);
  }
  std::atomic<bool> done{false};
  std::atomic<int64_t> reads{0};
  std::thread trainer([&] {
    for (int64_t b = 0; b < kBatches; ++b) {
      ASSERT_TRUE(store.Append(b, {{"t", ids[b], states[b]}}).ok());
      store.Compact(-1, b + 1);
      // Halfway, make sure reads really overlap with appends.
      while (b == kBatches / 2 && reads.load() < 3) std::this_thread::yield();
    }
    done = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&] {
      do {
        auto delta = store.GetUnique(-1);
        if (!delta.empty()) {
          EXPECT_EQ(delta["t"].ids.numel(), delta["t"].states.size(0));
        }
        EXPECT_GE(store.Usage().total.bytes, 0);
        ++reads;
      } while (!done);
    });
  }
  trainer.join();
  for (std::thread& t : readers) t.join();
  EXPECT_GT(reads.load(), 0);
  ExpectSameDelta(store, reference, -1, "concurrent");
}

}  // namespace
}  // namespace deltastream
