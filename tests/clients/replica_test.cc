// The replica's contracts (clients/replica.h) on both backends: applies and
// lookups, dense parameters swapped with the rows, resets, reopening a
// RocksDB replica bit for bit (and refusing a damaged one), bad input changing
// nothing, dense parameters too large for the database refused, lookups past
// their limit refused, and lookups running while applies install (run under
// TSan too).
#include "clients/replica.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/all.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/tensor_values.h"
#include "tests/testing/test_dirs.h"

namespace deltastream {
namespace {

at::Tensor Mask(std::vector<int64_t> bits) {
  return at::tensor(bits, at::TensorOptions(at::kLong)).to(at::kBool);
}

// Rows whose every element is `value`.
at::Tensor Filled(int64_t n, int64_t dim, float value) {
  return at::full({n, dim}, value, at::TensorOptions(at::kFloat));
}

struct TableRowsSpec {
  std::string fqn;
  at::Tensor ids;
  at::Tensor values;
};

ReceivedDelta Delta(
    std::vector<TableRowsSpec> tables,
    std::vector<std::pair<std::string, at::Tensor>> dense = {}) {
  ReceivedDelta delta;
  for (TableRowsSpec& table : tables) {
    ReceivedTable& out = delta.tables[table.fqn];
    out.ids = table.ids;
    out.values = table.values;
  }
  delta.dense = std::move(dense);
  return delta;
}

ReplicaOptions AtPath(const std::string& dir) {
  ReplicaOptions options;
  options.db_path = dir;
  return options;
}

bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(),
                     a.nbytes()) == 0;
}

class ReplicaTest : public ::testing::TestWithParam<bool> {
 protected:
  bool rocks() const { return GetParam(); }

  std::unique_ptr<Replica> Open(const std::string& name) {
    ReplicaOptions options;
    if (rocks()) options.db_path = FreshDir(name);
    absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Open(options);
    EXPECT_TRUE(replica.ok()) << replica.status();
    return replica.ok() ? *std::move(replica) : nullptr;
  }
};

TEST_P(ReplicaTest, StartsEmpty) {
  std::unique_ptr<Replica> replica = Open("empty");
  EXPECT_EQ(replica->Version(), -1);
  EXPECT_EQ(replica->RunId(), "");
  EXPECT_TRUE(replica->Tables().empty());
  EXPECT_TRUE(replica->Dense().parameters.empty());
  EXPECT_EQ(replica->Lookup("t", Ids({1})).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(ReplicaTest, AppliesAndLooksUpRows) {
  std::unique_ptr<Replica> replica = Open("apply");
  at::Tensor values =
      at::arange(12, at::TensorOptions(at::kFloat)).view({3, 4});
  ASSERT_TRUE(replica
                  ->Apply({Delta({{"t", Ids({-5, 7, int64_t{1} << 40}), values},
                                  {"u", Ids({3}), Filled(1, 2, 9)}})},
                          10, "run-a")
                  .ok());
  EXPECT_EQ(replica->Version(), 10);
  EXPECT_EQ(replica->RunId(), "run-a");
  EXPECT_EQ(replica->RowCount("t"), 3);
  EXPECT_EQ(replica->RowCount("u"), 1);
  EXPECT_EQ(replica->RowCount("none"), 0);

  absl::StatusOr<ReplicaRows> rows =
      replica->Lookup("t", Ids({int64_t{1} << 40, 8, -5}));
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->version, 10);
  ASSERT_EQ(rows->rows.sizes(), (at::IntArrayRef{3, 4}));
  EXPECT_TRUE(at::equal(rows->rows[0], values[2]));
  EXPECT_TRUE(at::equal(rows->rows[1], at::zeros({4})));  // missing: zeros
  EXPECT_TRUE(at::equal(rows->rows[2], values[0]));
  EXPECT_TRUE(at::equal(rows->found, Mask({1, 0, 1})));

  absl::StatusOr<ReplicaRows> none = replica->Lookup("u", Ids({}));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->rows.sizes(), (at::IntArrayRef{0, 2}));

  const std::map<std::string, ReplicaTableInfo> tables = replica->Tables();
  ASSERT_EQ(tables.size(), 2u);
  EXPECT_EQ(tables.at("t").dim, 4);
  EXPECT_EQ(tables.at("t").dtype, at::kFloat);
}

// One lookup returns at most kMaxLookupBytes of rows: more IDs are refused
// before anything is allocated (a request of 64 MiB of IDs would otherwise
// make the replica zero-fill and send dim/1 times as much).
TEST_P(ReplicaTest, ALookupReturnsAtMostItsLimit) {
  std::unique_ptr<Replica> replica = Open("lookup_limit");
  const int64_t dim = 4096;  // rows of 16 KiB: the limit is 4096 of them
  ASSERT_TRUE(
      replica->Apply({Delta({{"wide", Ids({7}), Filled(1, dim, 2)}})}, 1, "r")
          .ok());
  const int64_t most = kMaxLookupBytes / (dim * 4);
  absl::StatusOr<ReplicaRows> full =
      replica->Lookup("wide", at::arange(most, at::kLong));
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->rows.sizes(), (at::IntArrayRef{most, dim}));
  EXPECT_TRUE(at::equal(full->rows[7], at::full({dim}, 2.0f)));
  absl::StatusOr<ReplicaRows> over =
      replica->Lookup("wide", at::arange(most + 1, at::kLong));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(over.status().message()),
              ::testing::HasSubstr("4097 IDs of table 'wide'"));
}

TEST_P(ReplicaTest, LaterRowsWinAndRedeliveryIsHarmless) {
  std::unique_ptr<Replica> replica = Open("later");
  // Two pushes applied together: the second's rows replace the first's.
  const ReceivedDelta first = Delta({{"t", Ids({1, 2}), Filled(2, 2, 1)}});
  const ReceivedDelta second = Delta({{"t", Ids({2, 3}), Filled(2, 2, 2)}});
  ASSERT_TRUE(replica->Apply({first, second}, 5, "r").ok());
  EXPECT_EQ(replica->RowCount("t"), 3);  // ID 2 once
  absl::StatusOr<ReplicaRows> rows = replica->Lookup("t", Ids({1, 2, 3}));
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(at::equal(rows->rows.select(1, 0), at::tensor({1.f, 2.f, 2.f})));

  // The same delta again (a redelivery) at the same version: nothing changes.
  ASSERT_TRUE(replica->Apply({second}, 5, "r").ok());
  EXPECT_EQ(replica->RowCount("t"), 3);
  absl::StatusOr<ReplicaRows> again = replica->Lookup("t", Ids({1, 2, 3}));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(at::equal(again->rows, rows->rows));
}

TEST_P(ReplicaTest, DenseParametersSwapWithTheRows) {
  std::unique_ptr<Replica> replica = Open("dense");
  ASSERT_TRUE(replica
                  ->Apply({Delta({{"t", Ids({1}), Filled(1, 2, 1)}},
                                 {{"mlp.w", Filled(2, 3, 1)},
                                  {"mlp.b", at::ones({3})}})},
                          1, "r")
                  .ok());
  ReplicaDense dense = replica->Dense();
  EXPECT_EQ(dense.version, 1);
  ASSERT_EQ(dense.parameters.size(), 2u);
  EXPECT_EQ(dense.parameters[0].first, "mlp.w");  // the model's order
  EXPECT_EQ(dense.parameters[1].first, "mlp.b");

  // A delta without dense parameters keeps the last ones (and their version).
  ASSERT_TRUE(
      replica->Apply({Delta({{"t", Ids({1}), Filled(1, 2, 2)}})}, 2, "r").ok());
  EXPECT_EQ(replica->Dense().version, 1);

  // Of several deltas, the last one that carries dense parameters wins.
  ASSERT_TRUE(replica
                  ->Apply({Delta({}, {{"mlp.w", Filled(2, 3, 3)}}),
                           Delta({{"t", Ids({1}), Filled(1, 2, 4)}},
                                 {{"mlp.w", Filled(2, 3, 4)}}),
                           Delta({{"t", Ids({2}), Filled(1, 2, 5)}})},
                          5, "r")
                  .ok());
  dense = replica->Dense();
  EXPECT_EQ(dense.version, 5);
  ASSERT_EQ(dense.parameters.size(), 1u);
  EXPECT_TRUE(at::equal(dense.parameters[0].second, Filled(2, 3, 4)));
}

TEST_P(ReplicaTest, ResetDropsEverythingAndMayGoBack) {
  std::unique_ptr<Replica> replica = Open("reset");
  ASSERT_TRUE(replica
                  ->Apply({Delta({{"t", Ids({1, 2}), Filled(2, 2, 1)},
                                  {"old", Ids({1}), Filled(1, 2, 1)}},
                                 {{"w", at::ones({2})}})},
                          50, "run-1")
                  .ok());
  // A trainer that restarted at an older batch: the replica follows it back,
  // and a table may change its width.
  ASSERT_TRUE(
      replica->Reset({Delta({{"t", Ids({3}), Filled(1, 4, 7)}})}, 20, "run-2")
          .ok());
  EXPECT_EQ(replica->Version(), 20);
  EXPECT_EQ(replica->RunId(), "run-2");
  EXPECT_EQ(replica->RowCount("t"), 1);
  EXPECT_EQ(replica->Tables().count("old"), 0u);
  EXPECT_EQ(replica->Lookup("old", Ids({1})).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(replica->Dense().parameters.empty());
  EXPECT_EQ(replica->Dense().version, -1);
  absl::StatusOr<ReplicaRows> rows = replica->Lookup("t", Ids({1, 3}));
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(at::equal(rows->found, Mask({0, 1})));
  EXPECT_TRUE(at::equal(rows->rows[1], at::full({4}, 7.f)));
}

TEST_P(ReplicaTest, BadInputChangesNothing) {
  std::unique_ptr<Replica> replica = Open("bad");
  ASSERT_TRUE(replica
                  ->Apply({Delta({{"t", Ids({1}), Filled(1, 2, 1)}},
                                 {{"w", at::ones({2})}})},
                          10, "r")
                  .ok());
  auto unchanged = [&] {
    EXPECT_EQ(replica->Version(), 10);
    EXPECT_EQ(replica->RowCount("t"), 1);
    EXPECT_EQ(replica->Tables().size(), 1u);
    absl::StatusOr<ReplicaRows> rows = replica->Lookup("t", Ids({1, 2}));
    ASSERT_TRUE(rows.ok());
    EXPECT_TRUE(
        at::equal(rows->rows, at::tensor({1.f, 1.f, 0.f, 0.f}).view({2, 2})));
    ASSERT_EQ(replica->Dense().parameters.size(), 1u);
    EXPECT_TRUE(
        at::equal(replica->Dense().parameters[0].second, at::ones({2})));
  };
  // A good table first, then one of the wrong width: neither is written.
  const ReceivedDelta good = Delta(
      {{"new", Ids({5}), Filled(1, 2, 5)}, {"t", Ids({2}), Filled(1, 2, 2)}},
      {{"w", at::zeros({2})}});
  const ReceivedDelta wrong_dim = Delta({{"t", Ids({1}), Filled(1, 3, 9)}});
  absl::Status status = replica->Apply({good, wrong_dim}, 11, "r");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("'t'"), std::string::npos) << status;
  unchanged();

  // Wrong dtype for the table, IDs that are not int64, rows without values,
  // values of the wrong row count, a dtype the wire lacks, an unnamed table.
  const std::vector<ReceivedDelta> bad = {
      Delta({{"t", Ids({2}), at::ones({1, 2}, at::kHalf)}}),
      Delta({{"t", at::ones({1}, at::kInt), Filled(1, 2, 2)}}),
      Delta({{"t", Ids({2}), at::Tensor()}}),
      Delta({{"t", Ids({2, 3}), Filled(1, 2, 2)}}),
      Delta({{"x", Ids({2}), at::ones({1, 2}, at::kInt)}}),  // not a wire dtype
      Delta({{"", Ids({2}), Filled(1, 2, 2)}}),
      Delta({{std::string("a\0b", 3), Ids({2}), Filled(1, 2, 2)}}),
      Delta({}, {{"w", at::Tensor()}}),
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    status = replica->Apply({good, bad[i]}, 11, "r");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << i << ": " << status;
    status = replica->Reset({good, bad[i]}, 11, "r");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << i << ": " << status;
    unchanged();
  }

  // Versions only go back by Reset.
  EXPECT_EQ(replica->Apply({good}, 9, "r").code(),
            absl::StatusCode::kFailedPrecondition);
  unchanged();

  // Lookups: unknown table, IDs of the wrong type or shape.
  EXPECT_EQ(replica->Lookup("nope", Ids({1})).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(replica->Lookup("t", at::ones({1}, at::kInt)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(replica->Lookup("t", Ids({1, 2}).view({1, 2})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(replica->Lookup("t", at::Tensor()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(ReplicaTest, TablesWithoutRowsAreSkipped) {
  std::unique_ptr<Replica> replica = Open("norows");
  ReceivedDelta delta;
  delta.tables["empty"];  // a table a read named but that had no rows
  ASSERT_TRUE(replica->Apply({delta}, 3, "r").ok());
  EXPECT_EQ(replica->Version(), 3);
  EXPECT_TRUE(replica->Tables().empty());
}

// Every apply writes version v into every row and the dense parameter; a
// lookup must see rows of one version only, the version it reports, and the
// dense parameters of that version.
TEST_P(ReplicaTest, LookupsDuringAppliesSeeWholeVersions) {
  std::unique_ptr<Replica> replica = Open("concurrent");
  constexpr int64_t kRows = 256;
  constexpr int kVersions = 60;
  const at::Tensor ids = at::arange(kRows, at::TensorOptions(at::kLong));
  auto version_delta = [&](int v) {
    return Delta({{"t", ids, Filled(kRows, 8, static_cast<float>(v))}},
                 {{"w", at::full({4}, static_cast<float>(v))}});
  };
  ASSERT_TRUE(replica->Apply({version_delta(0)}, 0, "r").ok());

  std::atomic<bool> done{false};
  std::atomic<int64_t> checks{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        absl::StatusOr<ReplicaRows> rows = replica->Lookup("t", ids);
        ASSERT_TRUE(rows.ok()) << rows.status();
        ASSERT_TRUE(at::all(rows->found).item<bool>());
        const float v = static_cast<float>(rows->version);
        ASSERT_TRUE(at::all(rows->rows == v).item<bool>())
            << "rows of several versions at " << rows->version;
        // The run is the one of that version (the reset's is "s").
        ASSERT_EQ(rows->run_id, rows->version == kVersions + 1 ? "s" : "r")
            << "version " << rows->version;
        ReplicaDense dense = replica->Dense();
        ASSERT_EQ(dense.parameters.size(), 1u);
        ASSERT_TRUE(at::all(dense.parameters[0].second ==
                            static_cast<float>(dense.version))
                        .item<bool>());
        ASSERT_GE(dense.version, rows->version);  // versions only grow
        ASSERT_GE(replica->Version(), dense.version);
        checks.fetch_add(1);
      }
    });
  }
  for (int v = 1; v <= kVersions; ++v) {
    ASSERT_TRUE(replica->Apply({version_delta(v)}, v, "r").ok());
  }
  // A reset installs whole too.
  ASSERT_TRUE(
      replica->Reset({version_delta(kVersions + 1)}, kVersions + 1, "s").ok());
  while (checks.load() < 20) std::this_thread::yield();
  done.store(true);
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(replica->Version(), kVersions + 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, ReplicaTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("RocksDb")
                                             : std::string("InMemory");
                         });

TEST(RocksDbReplicaTest, ReopenKeepsEverythingBitForBit) {
  const std::string dir = FreshDir("reopen");
  at::manual_seed(7);
  at::Tensor big = at::randn({1000, 16});
  big[3][2] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor big_ids =
      at::randperm(1 << 20, at::TensorOptions(at::kLong)).narrow(0, 0, 1000) -
      (1 << 19);
  const at::Tensor half_rows = at::randn({5, 3}).to(at::kHalf);
  const at::Tensor dense_w = at::randn({7, 5});
  const at::Tensor dense_b = at::randn({5}).to(at::kBFloat16);
  {
    absl::StatusOr<std::unique_ptr<Replica>> replica =
        Replica::Open(AtPath(dir));
    ASSERT_TRUE(replica.ok()) << replica.status();
    ASSERT_TRUE((*replica)
                    ->Apply({Delta({{"big", big_ids, big},
                                    {"half", Ids({1, 2, 3, 4, 5}), half_rows}},
                                   {{"w", dense_w}, {"b", dense_b}})},
                            123, "run-x")
                    .ok());
    // An increment after the dense parameters: they keep their version.
    ASSERT_TRUE(
        (*replica)
            ->Apply({Delta({{"half", Ids({9}), half_rows.narrow(0, 0, 1)}})},
                    130, "run-x")
            .ok());
    // Another process cannot open it meanwhile.
    absl::StatusOr<std::unique_ptr<Replica>> second =
        Replica::Open(AtPath(dir));
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition)
        << second.status();
  }
  absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Open(AtPath(dir));
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ((*replica)->Version(), 130);
  EXPECT_EQ((*replica)->RunId(), "run-x");
  EXPECT_EQ((*replica)->RowCount("big"), 1000);
  EXPECT_EQ((*replica)->RowCount("half"), 6);
  EXPECT_EQ((*replica)->Tables().at("half").dtype, at::kHalf);
  absl::StatusOr<ReplicaRows> rows = (*replica)->Lookup("big", big_ids);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_TRUE(SameBytes(rows->rows, big));
  absl::StatusOr<ReplicaRows> halves =
      (*replica)->Lookup("half", Ids({1, 2, 3, 4, 5}));
  ASSERT_TRUE(halves.ok());
  EXPECT_TRUE(SameBytes(halves->rows, half_rows));
  ReplicaDense dense = (*replica)->Dense();
  EXPECT_EQ(dense.version, 123);
  ASSERT_EQ(dense.parameters.size(), 2u);
  EXPECT_EQ(dense.parameters[0].first, "w");
  EXPECT_TRUE(SameBytes(dense.parameters[0].second, dense_w));
  EXPECT_EQ(dense.parameters[1].first, "b");
  EXPECT_TRUE(SameBytes(dense.parameters[1].second, dense_b));
  // Rows counted after a reopen: IDs 4 and 5 are held, 10 and 11 are new.
  ASSERT_TRUE((*replica)
                  ->Apply({Delta({{"half", Ids({4, 10, 5, 11}),
                                   half_rows.narrow(0, 0, 4)}})},
                          131, "run-x")
                  .ok());
  EXPECT_EQ((*replica)->RowCount("half"), 8);

  // A reset survives a reopen too: nothing of the old contents comes back.
  ASSERT_TRUE((*replica)
                  ->Reset({Delta({{"t", Ids({1}), Filled(1, 2, 1)}})}, 7, "y")
                  .ok());
  replica->reset();
  replica = Replica::Open(AtPath(dir));
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ((*replica)->Version(), 7);
  EXPECT_EQ((*replica)->RunId(), "y");
  EXPECT_EQ((*replica)->Tables().size(), 1u);
  EXPECT_EQ((*replica)->RowCount("t"), 1);
  EXPECT_TRUE((*replica)->Dense().parameters.empty());
  EXPECT_EQ((*replica)->Lookup("big", big_ids).status().code(),
            absl::StatusCode::kNotFound);
}

// The key RocksDB holds row `id` of table `fqn` under (clients/replica.h).
std::string RowKey(const std::string& fqn, int64_t id) {
  std::string key = "r" + fqn;
  key.push_back('\0');
  const uint64_t value = static_cast<uint64_t>(id) ^ (uint64_t{1} << 63);
  for (int shift = 56; shift >= 0; shift -= 8) {
    key.push_back(static_cast<char>((value >> shift) & 0xff));
  }
  return key;
}

// Opening checks every row against its table's record: rows lost, or rows
// of the wrong size, are refused as DataLoss rather than served.
TEST(RocksDbReplicaTest, ReopenRefusesRowsThatDisagreeWithTheirTable) {
  struct Damage {
    std::string name;
    std::function<rocksdb::Status(rocksdb::DB&)> apply;
    std::string message;
  };
  const std::vector<Damage> damages = {
      {"lost",
       [](rocksdb::DB& db) {
         return db.Delete(rocksdb::WriteOptions(), RowKey("t", -2));
       },
       "table 't' records 3 rows but holds 2"},
      {"short",
       [](rocksdb::DB& db) {
         return db.Put(rocksdb::WriteOptions(), RowKey("t", 7), "abc");
       },
       "row 7 of table 't' has 3 bytes, not 8"},
      {"orphan",
       [](rocksdb::DB& db) {
         return db.Put(rocksdb::WriteOptions(), RowKey("gone", 1), "12345678");
       },
       "rows of table 'gone', which has no table record"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    const std::string dir = FreshDir("damaged_" + damage.name);
    {
      absl::StatusOr<std::unique_ptr<Replica>> replica =
          Replica::Open(AtPath(dir));
      ASSERT_TRUE(replica.ok()) << replica.status();
      ASSERT_TRUE(
          (*replica)
              ->Apply({Delta({{"t", Ids({-2, 7, 9}), Filled(3, 2, 1)}})}, 1,
                      "run")
              .ok());
    }
    {
      rocksdb::DB* raw = nullptr;
      ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
      std::unique_ptr<rocksdb::DB> db(raw);
      ASSERT_TRUE(damage.apply(*db).ok());
    }
    absl::StatusOr<std::unique_ptr<Replica>> replica =
        Replica::Open(AtPath(dir));
    EXPECT_EQ(replica.status().code(), absl::StatusCode::kDataLoss)
        << replica.status();
    EXPECT_NE(replica.status().message().find(damage.message),
              absl::string_view::npos)
        << replica.status();
  }
}

TEST(RocksDbReplicaTest, DenseParametersPastOneRecordAreRefusedNotLost) {
  // Past protobuf's 2 GiB limit their record would be written empty, and the
  // reopened replica would have none. The tensor's pages are never touched.
  const std::string dir = FreshDir("huge_dense");
  const at::Tensor huge = at::empty({(int64_t{1} << 29) + 1}, at::kFloat);
  {
    absl::StatusOr<std::unique_ptr<Replica>> replica =
        Replica::Open(AtPath(dir));
    ASSERT_TRUE(replica.ok()) << replica.status();
    ASSERT_TRUE((*replica)
                    ->Apply({Delta({{"t", Ids({1}), Filled(1, 2, 1)}},
                                   {{"w", at::ones({3})}})},
                            1, "r")
                    .ok());
    const absl::Status refused = (*replica)->Apply(
        {Delta({{"t", Ids({2}), Filled(1, 2, 2)}}, {{"w", huge}})}, 2, "r");
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    EXPECT_NE(refused.message().find("dense parameters take"),
              std::string::npos)
        << refused;
    EXPECT_EQ((*replica)->Version(), 1);
  }
  absl::StatusOr<std::unique_ptr<Replica>> reopened =
      Replica::Open(AtPath(dir));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->Version(), 1);
  ReplicaDense dense = (*reopened)->Dense();
  ASSERT_EQ(dense.parameters.size(), 1u);
  EXPECT_TRUE(at::equal(dense.parameters[0].second, at::ones({3})));
}

TEST(RocksDbReplicaTest, RefusesDirectoriesThatAreNotReplicas) {
  const std::string dir = FreshDir("foreign");
  std::filesystem::create_directories(dir);
  {
    FILE* f = std::fopen((dir + "/notes.txt").c_str(), "w");
    std::fputs("not a database", f);
    std::fclose(f);
  }
  absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Open(AtPath(dir));
  EXPECT_EQ(replica.status().code(), absl::StatusCode::kFailedPrecondition)
      << replica.status();
}

}  // namespace
}  // namespace deltastream
