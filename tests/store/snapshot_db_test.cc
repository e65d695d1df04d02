#include "store/snapshot_db.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "store/delta_store.h"
#include "tests/crash/directory_contents.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

// A fresh directory path (not created) under the test's temporary directory.
std::string FreshPath(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  fs::path path =
      fs::path(root != nullptr ? root : "/tmp") / ("snapshot_db_test." + name);
  fs::remove_all(path);
  return path.string();
}

int64_t DirectoryBytes(const std::string& path) {
  int64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file()) bytes += entry.file_size();
  }
  return bytes;
}

StoredTable MakeTable(const std::string& fqn, at::ScalarType dtype, int64_t dim,
                      std::vector<int64_t> lookup_rows, bool with_states,
                      uint64_t seed) {
  at::manual_seed(seed);
  StoredTable table;
  table.fqn = fqn;
  table.state_dtype = dtype;
  table.state_dim = dim;
  int64_t batch = 0;
  for (int64_t rows : lookup_rows) {
    StoredLookup lookup;
    lookup.batch_idx = batch;
    batch += 2;
    lookup.ids =
        at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {rows}, at::kLong);
    if (with_states) lookup.states = at::randn({rows, dim}).to(dtype);
    table.lookups.push_back(std::move(lookup));
  }
  return table;
}

void ExpectSameTables(const std::vector<StoredTable>& expected,
                      const std::vector<StoredTable>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t t = 0; t < expected.size(); ++t) {
    SCOPED_TRACE(expected[t].fqn);
    EXPECT_EQ(expected[t].fqn, actual[t].fqn);
    EXPECT_EQ(expected[t].device, actual[t].device);
    EXPECT_EQ(expected[t].state_dtype, actual[t].state_dtype);
    EXPECT_EQ(expected[t].state_dim, actual[t].state_dim);
    ASSERT_EQ(expected[t].lookups.size(), actual[t].lookups.size());
    for (size_t l = 0; l < expected[t].lookups.size(); ++l) {
      const StoredLookup& e = expected[t].lookups[l];
      const StoredLookup& a = actual[t].lookups[l];
      EXPECT_EQ(e.batch_idx, a.batch_idx);
      EXPECT_TRUE(at::equal(e.ids, a.ids));
      ASSERT_EQ(e.states.defined(), a.states.defined());
      if (e.states.defined()) {
        EXPECT_EQ(e.states.scalar_type(), a.states.scalar_type());
        EXPECT_TRUE(at::equal(e.states, a.states));
      }
    }
  }
}

std::vector<StoredTable> SampleTables() {
  std::vector<StoredTable> tables;
  // 100k rows of dim 64 in float32: 26 MB, several 4 MiB chunks.
  tables.push_back(MakeTable("a.f32", at::kFloat, 64, {100000, 3, 0}, true, 1));
  tables.push_back(MakeTable("b.f16", at::kHalf, 5, {7, 1000}, true, 2));
  tables.push_back(MakeTable("c.bf16", at::kBFloat16, 3, {11}, true, 3));
  tables.push_back(MakeTable("d.ids_only", at::kFloat, 0, {50, 60}, false, 4));
  tables.push_back(MakeTable("e.empty", at::kFloat, 8, {}, true, 5));
  return tables;
}

TEST(SnapshotDbTest, NewDatabaseHasNoSnapshot) {
  const std::string path = FreshPath("new");
  absl::StatusOr<std::unique_ptr<SnapshotDb>> db = SnapshotDb::Open(path);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_FALSE((*db)->latest().has_value());
  absl::StatusOr<std::optional<Snapshot>> read = (*db)->Read();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->has_value());
}

TEST(SnapshotDbTest, WriteThenReadAndReopenGiveTheSameSnapshot) {
  const std::string path = FreshPath("roundtrip");
  Snapshot snapshot;
  snapshot.owner_state = std::string("owner\0state", 11);
  snapshot.tables = SampleTables();
  {
    auto db = SnapshotDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    absl::StatusOr<SnapshotInfo> info = (*db)->Write(snapshot);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->generation, 1u);
    EXPECT_EQ(info->payload_bytes, 100003 * (8 + 64 * 4) + 1007 * (8 + 5 * 2) +
                                       11 * (8 + 3 * 2) + 110 * 8);
    SnapshotInfo read_info;
    auto read = (*db)->Read(&read_info);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_TRUE(read->has_value());
    EXPECT_EQ((*read)->owner_state, snapshot.owner_state);
    ExpectSameTables(snapshot.tables, (*read)->tables);
    EXPECT_EQ(read_info.generation, 1u);
  }
  auto reopened = SnapshotDb::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_TRUE((*reopened)->latest().has_value());
  EXPECT_EQ((*reopened)->latest()->generation, 1u);
  auto read = (*reopened)->Read();
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  // A restart's restore says how long it took (its metric read 0).
  EXPECT_GT((*reopened)->latest()->elapsed, absl::ZeroDuration());
  EXPECT_EQ((*read)->owner_state, snapshot.owner_state);
  ExpectSameTables(snapshot.tables, (*read)->tables);
}

TEST(SnapshotDbTest, NewGenerationsReplaceOldOnesAndFreeTheirSpace) {
  const std::string path = FreshPath("generations");
  auto db = SnapshotDb::Open(path);
  ASSERT_TRUE(db.ok()) << db.status();
  Snapshot snapshot;
  for (int i = 1; i <= 6; ++i) {
    snapshot.owner_state = "state " + std::to_string(i);
    snapshot.tables = {MakeTable("t", at::kFloat, 32, {20000, 500}, true, i)};
    auto info = (*db)->Write(snapshot);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->generation, static_cast<uint64_t>(i));
  }
  auto read = (*db)->Read();
  ASSERT_TRUE(read.ok() && read->has_value()) << read.status();
  EXPECT_EQ((*read)->owner_state, "state 6");
  ExpectSameTables(snapshot.tables, (*read)->tables);
  // One snapshot is 20500 * (8 + 128) = 2.8 MB; six would be 16.7 MB.
  EXPECT_LT(DirectoryBytes(path), 2 * 20500 * (8 + 128) + (1 << 20));
}

// Status calls and metrics scrapes ask for latest() while the trainer
// writes a snapshot: they get the generation before it at once, not after
// the write (which held them for its whole I/O, and a fan-in predictor's
// 10 s Status poll with them).
TEST(SnapshotDbTest, LatestDoesNotWaitForAWriteInProgress) {
  const std::string path = FreshPath("latest_during_write");
  auto db = SnapshotDb::Open(path);
  ASSERT_TRUE(db.ok()) << db.status();
  Snapshot small;
  small.tables = {MakeTable("t", at::kFloat, 8, {100}, true, 1)};
  ASSERT_TRUE((*db)->Write(small).ok());
  // 128 MiB of states: a write of a few hundred milliseconds.
  Snapshot large;
  large.tables = {MakeTable("t", at::kFloat, 64, {500000}, true, 2)};
  std::atomic<bool> started{false};
  std::atomic<bool> done{false};
  std::thread writer([&] {
    started.store(true);
    absl::StatusOr<SnapshotInfo> info = (*db)->Write(large);
    EXPECT_TRUE(info.ok()) << info.status();
    done.store(true);
  });
  while (!started.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::optional<SnapshotInfo> during = (*db)->latest();
  const bool write_done = done.load();
  writer.join();
  ASSERT_TRUE(during.has_value());
  EXPECT_EQ(during->generation, 1u);
  EXPECT_FALSE(write_done);
  ASSERT_TRUE((*db)->latest().has_value());
  EXPECT_EQ((*db)->latest()->generation, 2u);
}

TEST(SnapshotDbTest, StoreExportImportThroughTheDatabaseKeepsEveryRead) {
  for (UpdateMode mode :
       {UpdateMode::kNone, UpdateMode::kFirst, UpdateMode::kLast}) {
    SCOPED_TRACE(UpdateModeName(mode));
    DeltaStore store(mode);
    std::mt19937_64 rng(7);
    for (int64_t batch = 0; batch < 12; ++batch) {
      std::vector<TableLookup> lookups;
      for (const char* fqn : {"x", "y"}) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % 300);
        at::Tensor ids = at::randint(0, 200, {n}, at::kLong);
        at::Tensor states = at::randn({n, 4});
        lookups.push_back({fqn, ids, states});
      }
      ASSERT_TRUE(store.Append(batch, std::move(lookups)).ok());
      if (batch % 4 == 3) store.Compact(batch - 3, batch);  // compacted lookups
    }
    const std::string path =
        FreshPath(absl::StrCat("store.", UpdateModeName(mode)));
    auto db = SnapshotDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Write({"", 0, store.Export()}).ok());
    auto read = (*db)->Read();
    ASSERT_TRUE(read.ok() && read->has_value()) << read.status();
    DeltaStore restored(mode);
    ASSERT_TRUE(restored.Import(std::move((*read)->tables)).ok());
    EXPECT_EQ(restored.Fqns(), store.Fqns());
    for (const std::string fqn : {"x", "y"}) {
      EXPECT_EQ(restored.BatchIndices(fqn), store.BatchIndices(fqn));
    }
    for (int64_t from = 0; from <= 12; ++from) {
      auto expected = store.GetUnique(from);
      auto actual = restored.GetUnique(from);
      for (const auto& [fqn, rows] : expected) {
        EXPECT_TRUE(at::equal(rows.ids, actual[fqn].ids)) << from;
        if (mode != UpdateMode::kNone) {
          EXPECT_TRUE(at::equal(rows.states, actual[fqn].states)) << from;
        }
      }
    }
  }
}

TEST(SnapshotDbTest, ImportRejectsTablesThatDoNotFitAndKeepsTheStore) {
  DeltaStore store(UpdateMode::kLast);
  ASSERT_TRUE(store.Append(0, {{"t", at::arange(3), at::zeros({3, 2})}}).ok());
  std::vector<StoredTable> bad(1);
  bad[0].fqn = "u";
  bad[0].state_dim = 2;
  bad[0].lookups.push_back({0, at::arange(3), at::zeros({3, 5})});
  absl::Status status = store.Import(bad);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  bad[0].lookups[0].states = at::zeros({3, 2});
  bad[0].lookups.push_back({-1, at::arange(3), at::zeros({3, 2})});
  EXPECT_EQ(store.Import(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Fqns(), std::vector<std::string>{"t"});
  EXPECT_EQ(store.BatchIndices("t"), std::vector<int64_t>{0});
}

TEST(SnapshotDbTest, PathThatIsAFileOrAForeignDirectoryIsRefused) {
  const std::string file = FreshPath("a_file");
  std::ofstream(file) << "hello";
  auto db = SnapshotDb::Open(file);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(db.status().message().find("not a directory"), std::string::npos)
      << db.status();

  const std::string dir = FreshPath("foreign_dir");
  fs::create_directories(dir);
  std::ofstream(dir + "/notes.txt") << "someone's files";
  db = SnapshotDb::Open(dir);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(db.status().message().find("no RocksDB database"),
            std::string::npos)
      << db.status();
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));
}

// A process killed while RocksDB created the database, before its CURRENT:
// the directory holds RocksDB's lock, info log, IDENTITY, a first MANIFEST
// and CURRENT's temporary file. The next start creates the database there
// (it was refused as a foreign directory, on every start after).
TEST(SnapshotDbTest, ACreationCutShortIsCreatedAgain) {
  const std::string path = FreshPath("cut_short");
  fs::create_directories(path);
  for (const char* name :
       {"LOCK", "LOG", "IDENTITY", "MANIFEST-000001", "000001.dbtmp"}) {
    std::ofstream(path + "/" + name)
        << (std::string(name) == "LOCK" ? "" : "x");
  }
  Snapshot snapshot;
  snapshot.owner_state = "state";
  snapshot.tables = SampleTables();
  {
    auto db = SnapshotDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    EXPECT_FALSE((*db)->latest().has_value());
    ASSERT_TRUE((*db)->Write(snapshot).ok());
  }
  auto reopened = SnapshotDb::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  auto read = (*reopened)->Read();
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(read->has_value());
  ExpectSameTables(snapshot.tables, (*read)->tables);

  // With a file of data (a write-ahead log) beside them it is no creation
  // cut short: refused, as before.
  const std::string with_log = FreshPath("cut_short_with_log");
  fs::create_directories(with_log);
  std::ofstream(with_log + "/IDENTITY") << "x";
  std::ofstream(with_log + "/000003.log") << "rows";
  EXPECT_EQ(SnapshotDb::Open(with_log).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::exists(with_log + "/000003.log"));
}

TEST(SnapshotDbTest, OtherRocksDbOrOtherFormatIsIncompatible) {
  const std::string other = FreshPath("other_rocksdb");
  {
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, other, &raw).ok());
    std::unique_ptr<rocksdb::DB> foreign(raw);
    ASSERT_TRUE(foreign->Put(rocksdb::WriteOptions(), "user", "data").ok());
  }
  auto db = SnapshotDb::Open(other);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(db.status().message().find("not a deltastream snapshot database"),
            std::string::npos)
      << db.status();

  const std::string future = FreshPath("future_format");
  ASSERT_TRUE(SnapshotDb::Open(future).ok());
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), future, &raw).ok());
    std::unique_ptr<rocksdb::DB> edit(raw);
    ASSERT_TRUE(
        edit->Put(rocksdb::WriteOptions(), "format", "deltastream-snapshots/9")
            .ok());
  }
  db = SnapshotDb::Open(future);
  EXPECT_EQ(db.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(db.status().message().find("deltastream-snapshots/9"),
            std::string::npos)
      << db.status();
}

TEST(SnapshotDbTest, CorruptedFilesGiveDataLossNotACrashOrAReset) {
  const std::string path = FreshPath("corrupt");
  Snapshot snapshot;
  snapshot.tables = {MakeTable("t", at::kFloat, 64, {50000}, true, 9)};
  {
    auto db = SnapshotDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Write(snapshot).ok());
  }
  // Flip bytes in the middle of every table file: data blocks, not footers.
  int corrupted = 0;
  for (const auto& entry : fs::directory_iterator(path)) {
    if (entry.path().extension() != ".sst" || entry.file_size() < 4096) {
      continue;
    }
    std::fstream file(entry.path(),
                      std::ios::in | std::ios::out | std::ios::binary);
    for (int64_t at = 1000;
         at + 64 < static_cast<int64_t>(entry.file_size()) / 2; at += 1 << 20) {
      file.seekp(at);
      file.write("CORRUPTED-CORRUPTED-CORRUPTED", 29);
    }
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  const std::map<std::string, std::string> before = DirectoryContents(path);
  auto db = SnapshotDb::Open(path);
  // Refused before the database is opened for writing: nothing changed.
  EXPECT_EQ(db.status().code(), absl::StatusCode::kDataLoss) << db.status();
  EXPECT_NE(db.status().message().find(path), std::string::npos) << db.status();
  EXPECT_TRUE(DirectoryContents(path) == before);
}

// Issue 21, defect 1: a MANIFEST that lost its last bytes (a torn write) used
// to open as an empty database, and RocksDB deleted the snapshot's file.
TEST(SnapshotDbTest, TornManifestIsRefusedAndNothingChanges) {
  Snapshot snapshot;
  snapshot.owner_state = "kept";
  snapshot.tables = {MakeTable("t", at::kFloat, 16, {5000}, true, 11)};
  for (int64_t lost : {1, 7, 40}) {
    SCOPED_TRACE(lost);
    const std::string path = FreshPath(absl::StrCat("torn_manifest.", lost));
    {
      auto db = SnapshotDb::Open(path);
      ASSERT_TRUE(db.ok()) << db.status();
      ASSERT_TRUE((*db)->Write(snapshot).ok());
    }
    int manifests = 0;
    for (const auto& entry : fs::directory_iterator(path)) {
      if (!absl::StartsWith(entry.path().filename().string(), "MANIFEST-")) {
        continue;
      }
      fs::resize_file(entry.path(), entry.file_size() - lost);
      ++manifests;
    }
    ASSERT_EQ(manifests, 1);
    const std::map<std::string, std::string> before = DirectoryContents(path);
    auto db = SnapshotDb::Open(path);
    EXPECT_FALSE(db.ok()) << "a torn database opened; latest: "
                          << (db.ok() && (*db)->latest().has_value());
    if (!db.ok()) {
      EXPECT_NE(db.status().message().find(path), std::string::npos)
          << db.status();
    }
    db = absl::UnknownError("closed");
    EXPECT_TRUE(DirectoryContents(path) == before);
  }
}

// A process killed after a snapshot's file was linked into the database but
// before its MANIFEST record was written leaves a table file the MANIFEST
// does not name, beside a MANIFEST that ends cleanly: the database opens as
// it was before that snapshot (RocksDB removes the file).
TEST(SnapshotDbTest, TableFileOfAnInterruptedWriteOpensThePreviousSnapshot) {
  const std::string path = FreshPath("interrupted_ingest");
  Snapshot snapshot;
  snapshot.owner_state = "before";
  snapshot.tables = {MakeTable("t", at::kFloat, 4, {200}, true, 13)};
  {
    auto db = SnapshotDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Write(snapshot).ok());
  }
  std::string table_file;
  for (const auto& entry : fs::directory_iterator(path)) {
    if (entry.path().extension() == ".sst") table_file = entry.path().string();
  }
  ASSERT_FALSE(table_file.empty());
  fs::copy_file(table_file, fs::path(path) / "000999.sst");
  auto db = SnapshotDb::Open(path);
  ASSERT_TRUE(db.ok()) << db.status();
  auto read = (*db)->Read();
  ASSERT_TRUE(read.ok() && read->has_value()) << read.status();
  EXPECT_EQ((*read)->owner_state, "before");
}

// The format marker is kept in table files, not only the WAL: a database
// without its WAL is still a snapshot database, with its snapshot.
TEST(SnapshotDbTest, DatabaseWithoutItsWalKeepsItsFormatAndSnapshot) {
  Snapshot snapshot;
  snapshot.owner_state = "no wal";
  snapshot.tables = {MakeTable("t", at::kFloat, 4, {300}, true, 12)};
  for (bool with_snapshot : {false, true}) {
    SCOPED_TRACE(with_snapshot);
    const std::string path = FreshPath(absl::StrCat("no_wal.", with_snapshot));
    {
      auto db = SnapshotDb::Open(path);
      ASSERT_TRUE(db.ok()) << db.status();
      if (with_snapshot) {
        ASSERT_TRUE((*db)->Write(snapshot).ok());
      }
    }
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.path().extension() == ".log") fs::remove(entry.path());
    }
    auto db = SnapshotDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    auto read = (*db)->Read();
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->has_value(), with_snapshot);
    if (with_snapshot) {
      EXPECT_EQ((*read)->owner_state, "no wal");
      ExpectSameTables(snapshot.tables, (*read)->tables);
    }
  }
}

TEST(SnapshotDbTest, SecondOpenOfTheSameDatabaseIsRefused) {
  const std::string path = FreshPath("locked");
  auto first = SnapshotDb::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SnapshotDb::Open(path);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition)
      << second.status();
}

}  // namespace
}  // namespace deltastream
