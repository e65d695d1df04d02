// The crash-and-corruption matrix (issue 21), in the spirit of RocksDB's
// crash tests: for every file the system persists (a tracker's snapshot
// database, a predictor's replica database, checkpoint-chain links, trainer
// checkpoints, .npz exports), damage the persisted state (truncate every file
// at several points, flip bytes, delete it) and kill the writer at random
// points (a forked child writes states 1, 2, ... until SIGKILL). The only
// outcomes allowed: the previous state, the new state, or a clear refusal
// (a non-OK status) that left every file as it was. Never an empty or mixed
// state opened as if it were fine.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/npz_file.h"
#include "clients/replica.h"
#include "store/checkpoint_chain.h"
#include "store/snapshot_db.h"
#include "tests/crash/directory_contents.h"
#include "trainer/checkpoint.h"
#include "trainer/models/dlrm.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp ? tmp : "/tmp") /
                       absl::StrCat("crash_matrix.", name, ".", getpid());
  fs::remove_all(dir);
  return dir.string();
}

using Contents = std::map<std::string, std::string>;

Contents ReadAll(const std::string& dir) { return DirectoryContents(dir); }

void RestoreAll(const std::string& dir, const Contents& contents) {
  fs::remove_all(dir);
  for (const auto& [path, bytes] : contents) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << bytes;
  }
}

// What a check of the persisted state found: the state it holds (0: none
// yet), or the refusal.
struct Outcome {
  absl::Status status;
  int64_t state = 0;
};

// Opens/loads the persisted state in `dir` and says which state it holds;
// must verify that the content is exactly that state's.
using Check = std::function<Outcome(const std::string& dir)>;

// One damage to one file.
struct Damage {
  std::string what;
  std::function<void(const std::string& path, std::string& bytes)> apply;
};

std::vector<Damage> Damages() {
  std::vector<Damage> damages;
  for (double at : {0.0, 0.5, 0.9}) {
    damages.push_back({absl::StrCat("truncate at ", at),
                       [at](const std::string&, std::string& bytes) {
                         bytes.resize(static_cast<size_t>(bytes.size() * at));
                       }});
  }
  damages.push_back(
      {"lose the last byte", [](const std::string&, std::string& bytes) {
         if (!bytes.empty()) bytes.pop_back();
       }});
  for (double at : {0.1, 0.5, 0.99}) {
    damages.push_back({absl::StrCat("flip a byte at ", at),
                       [at](const std::string&, std::string& bytes) {
                         if (bytes.empty()) return;
                         bytes[static_cast<size_t>(bytes.size() * at)] ^= 0x5a;
                       }});
  }
  return damages;
}

// Damages every file of the persisted state in `dir` (which holds
// `expected`) in every way, and deletes it; checks each outcome. Files for
// which `rolls_back` says so may also open as an older, consistent state
// (see ReplicaDatabase).
void DamageEveryFile(
    const std::string& dir, int64_t expected, const Check& check, int* refusals,
    const std::function<bool(const std::string& name)>& rolls_back = nullptr) {
  const Contents baseline = ReadAll(dir);
  ASSERT_FALSE(baseline.empty());
  for (const auto& [path, bytes] : baseline) {
    const std::string name = fs::path(path).filename().string();
    if (name == "LOCK" || absl::StartsWith(name, "LOG")) continue;  // no data
    std::vector<Damage> damages = Damages();
    damages.push_back({"delete", nullptr});
    for (const Damage& damage : damages) {
      SCOPED_TRACE(absl::StrCat(name, ": ", damage.what));
      RestoreAll(dir, baseline);
      if (damage.apply == nullptr) {
        fs::remove(path);
      } else {
        std::string damaged = bytes;
        damage.apply(path, damaged);
        if (damaged == bytes) continue;
        std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
      }
      const Contents before = ReadAll(dir);
      const Outcome outcome = check(dir);
      if (outcome.status.ok() && rolls_back != nullptr && rolls_back(name)) {
        EXPECT_TRUE(outcome.state >= 0 && outcome.state <= expected)
            << "opened as a mixed or unknown state " << outcome.state;
        if (outcome.state != expected) {
          std::printf("known: %s: %s opens as state %lld of %lld\n",
                      name.c_str(), "damaged",
                      static_cast<long long>(outcome.state),
                      static_cast<long long>(expected));
        }
      } else if (outcome.status.ok()) {
        // The new state, or the previous one (a whole generation lost).
        EXPECT_TRUE(outcome.state == expected || outcome.state == expected - 1)
            << "opened as state " << outcome.state << " after damage";
      } else {
        ++*refusals;
        EXPECT_FALSE(outcome.status.message().empty());
        EXPECT_TRUE(ReadAll(dir) == before)
            << "refused (" << outcome.status << ") but changed files";
      }
    }
  }
  RestoreAll(dir, baseline);
}

// Forks a child that writes states 1, 2, 3, ... into `dir` with `write`
// (which must be durable when it returns) and reports each finished state
// through a pipe; kills it after `delay`; checks the persisted state is one
// the child started or finished, consistent, or a clear refusal.
void KillWriter(const std::string& dir,
                const std::function<void(int64_t state)>& write,
                const Check& check, std::chrono::microseconds delay,
                int* refusals) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    for (int64_t state = 1; state < 1000000; ++state) {
      write(state);
      if (::write(pipe_fds[1], &state, sizeof(state)) != sizeof(state)) {
        ::_exit(3);
      }
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::this_thread::sleep_for(delay);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  int64_t done = 0;
  for (int64_t state; ::read(pipe_fds[0], &state, sizeof(state)) ==
                      static_cast<ssize_t>(sizeof(state));) {
    done = state;
  }
  ::close(pipe_fds[0]);
  const Contents before = ReadAll(dir);
  const Outcome outcome = check(dir);
  SCOPED_TRACE(absl::StrCat("killed after ", delay.count(), " us, ", done,
                            " states durable"));
  if (outcome.status.ok()) {
    // The last finished state, or the one being written when killed.
    EXPECT_TRUE(outcome.state == done || outcome.state == done + 1)
        << "holds state " << outcome.state;
  } else {
    ++*refusals;
    EXPECT_TRUE(ReadAll(dir) == before) << "refused but changed files";
  }
}

std::vector<std::chrono::microseconds> KillDelays(uint64_t seed, int n,
                                                  int max_ms) {
  std::mt19937_64 rng(seed);
  std::vector<std::chrono::microseconds> delays;
  for (int i = 0; i < n; ++i) {
    delays.emplace_back(1000 + rng() % (max_ms * 1000));
  }
  return delays;
}

class CrashMatrixTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Forked children must not wait on a parent's thread pool.
    at::set_num_threads(1);
  }
  int refusals_ = 0;
};

// ------------------------------------------------------------ snapshot DB

Snapshot SnapshotState(int64_t state) {
  Snapshot snapshot;
  snapshot.owner_state = absl::StrCat(state);
  snapshot.owner_batch = state;
  StoredTable table;
  table.fqn = "t";
  table.state_dim = 8;
  const int64_t rows = 20000 + state;
  table.lookups.push_back({state, at::arange(rows, at::kLong) + state,
                           at::full({rows, 8}, static_cast<float>(state))});
  snapshot.tables.push_back(std::move(table));
  return snapshot;
}

Outcome CheckSnapshot(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<SnapshotDb>> db = SnapshotDb::Open(dir);
  if (!db.ok()) return {db.status()};
  absl::StatusOr<std::optional<Snapshot>> read = (*db)->Read();
  if (!read.ok()) return {read.status()};
  if (!read->has_value()) return {absl::OkStatus(), 0};
  const int64_t state = (*read)->owner_batch;
  const Snapshot expected = SnapshotState(state);
  const bool same = (*read)->owner_state == expected.owner_state &&
                    (*read)->tables.size() == 1 &&
                    (*read)->tables[0].lookups.size() == 1 &&
                    at::equal((*read)->tables[0].lookups[0].ids,
                              expected.tables[0].lookups[0].ids) &&
                    at::equal((*read)->tables[0].lookups[0].states,
                              expected.tables[0].lookups[0].states);
  if (!same) return {absl::OkStatus(), -1};  // a mixed state
  return {absl::OkStatus(), state};
}

TEST_F(CrashMatrixTest, SnapshotDatabase) {
  const std::string dir = FreshDir("snapshots");
  {
    auto db = SnapshotDb::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Write(SnapshotState(1)).ok());
    ASSERT_TRUE((*db)->Write(SnapshotState(2)).ok());
  }
  DamageEveryFile(dir, 2, CheckSnapshot, &refusals_);
  for (auto delay : KillDelays(1, 6, 120)) {
    fs::remove_all(dir);
    KillWriter(
        dir,
        [&dir](int64_t state) {
          static std::unique_ptr<SnapshotDb> db;
          if (db == nullptr) db = *SnapshotDb::Open(dir);
          if (!db->Write(SnapshotState(state)).ok()) ::_exit(4);
        },
        CheckSnapshot, delay, &refusals_);
  }
  std::printf("snapshot database: %d refusals\n", refusals_);
}

// ------------------------------------------------------------ replica DB

ReceivedDelta ReplicaState(int64_t state) {
  ReceivedDelta delta;
  delta.header.set_end_batch(state);
  at::Tensor ids = at::arange(3000, at::kLong);
  delta.tables["t"] = {
      ids, {}, at::full({3000, 4}, static_cast<float>(state)), {}};
  delta.dense = {{"w", at::full({3}, static_cast<float>(state))}};
  return delta;
}

Outcome CheckReplica(const std::string& dir) {
  ReplicaOptions options;
  options.db_path = dir;
  options.cache_bytes = 1 << 20;
  absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Open(options);
  if (!replica.ok()) return {replica.status()};
  const int64_t version = (*replica)->Version();
  if (version < 0) return {absl::OkStatus(), 0};
  absl::StatusOr<ReplicaRows> rows =
      (*replica)->Lookup("t", at::arange(3000, at::kLong));
  if (!rows.ok()) return {rows.status()};
  const ReplicaDense dense = (*replica)->Dense();
  const bool same =
      rows->found.all().item<bool>() &&
      at::equal(rows->rows, ReplicaState(version).tables["t"].values) &&
      dense.parameters.size() == 1 &&
      at::equal(dense.parameters[0].second,
                at::full({3}, static_cast<float>(version)));
  return {absl::OkStatus(), same ? version : -1};
}

TEST_F(CrashMatrixTest, ReplicaDatabase) {
  const std::string dir = FreshDir("replica");
  ReplicaOptions options;
  options.db_path = dir;
  {
    auto replica = Replica::Open(options);
    ASSERT_TRUE(replica.ok()) << replica.status();
    ASSERT_TRUE((*replica)->Reset({ReplicaState(1)}, 1, "run").ok());
    ASSERT_TRUE((*replica)->Apply({ReplicaState(2)}, 2, "run").ok());
  }
  // The replica's recent applies live in RocksDB's live WAL (synced writes,
  // no flush): a WAL that loses its tail or is deleted opens as an older
  // state, silently; RocksDB tracks only closed WALs in its MANIFEST
  // (track_and_verify_wals_in_manifest). Held to "a consistent older state"
  // here and reported (issue 21 note); every other file as the rest.
  const auto in_wal = [](const std::string& name) {
    return name.size() > 4 && name.compare(name.size() - 4, 4, ".log") == 0;
  };
  DamageEveryFile(dir, 2, CheckReplica, &refusals_, in_wal);
  // The same rows flushed to a table file (as RocksDB does once the
  // memtable fills): damage to it is refused, with nothing changed.
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Flush(rocksdb::FlushOptions()).ok());
  }
  DamageEveryFile(dir, 2, CheckReplica, &refusals_, in_wal);
  for (auto delay : KillDelays(2, 6, 120)) {
    fs::remove_all(dir);
    KillWriter(
        dir,
        [&options](int64_t state) {
          static std::unique_ptr<Replica> replica;
          if (replica == nullptr) replica = *Replica::Open(options);
          if (!replica->Apply({ReplicaState(state)}, state, "run").ok()) {
            ::_exit(4);
          }
        },
        CheckReplica, delay, &refusals_);
  }
  std::printf("replica database: %d refusals\n", refusals_);
}

// ------------------------------------------------------------ chain links

ChainLinkContent LinkState(int64_t state, bool full) {
  ChainLinkContent content;
  content.full = full;
  content.start_batch = full ? 0 : state - 1;
  content.end_batch = state;
  const int64_t rows = full ? 4000 : 100;
  content.tables["t"] = {at::arange(rows, at::kLong),
                         at::full({rows, 4}, static_cast<float>(state))};
  return content;
}

Outcome CheckChain(const std::string& dir) {
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  if (!loaded.ok()) {
    // An empty directory is the state before the first link.
    if (ListChain(dir).ok() && ListChain(dir)->empty()) {
      return {absl::OkStatus(), 0};
    }
    return {loaded.status()};
  }
  const int64_t state = loaded->end_batch;
  // Rows 0..99 hold the newest state, the others the full link's.
  const at::Tensor values = loaded->tables.at("t").values;
  const bool same = loaded->tables.at("t").ids.numel() == 4000 &&
                    at::equal(values.narrow(0, 0, 100),
                              at::full({100, 4}, static_cast<float>(state)));
  return {absl::OkStatus(), same ? state : -1};
}

TEST_F(CrashMatrixTest, CheckpointChainLinks) {
  const std::string dir = FreshDir("chain");
  ChainWriteOptions small;
  small.chunk_bytes = 4096;
  ASSERT_TRUE(WriteChainLinkContent(dir, LinkState(1, true), small).ok());
  ASSERT_TRUE(WriteChainLinkContent(dir, LinkState(2, false), small).ok());
  // Damage to the increment: state 2, the previous state 1 (it is gone), or
  // a refusal; damage to the base: a refusal.
  const Contents baseline = ReadAll(dir);
  for (const auto& [path, bytes] : baseline) {
    for (const Damage& damage : Damages()) {
      SCOPED_TRACE(absl::StrCat(path, ": ", damage.what));
      RestoreAll(dir, baseline);
      std::string damaged = bytes;
      damage.apply(path, damaged);
      std::ofstream(path, std::ios::binary | std::ios::trunc) << damaged;
      const Outcome outcome = CheckChain(dir);
      EXPECT_FALSE(outcome.status.ok()) << "damaged link loaded";
      ++refusals_;
      EXPECT_EQ(
          VerifyChainLink({path, path.find("full-") != std::string::npos,
                           path.find("full-") != std::string::npos ? 0 : 1,
                           path.find("full-") != std::string::npos ? 1 : 2, 0})
              .code(),
          absl::StatusCode::kDataLoss);
    }
    RestoreAll(dir, baseline);
    fs::remove(path);
    const Outcome outcome = CheckChain(dir);
    if (outcome.status.ok()) {
      EXPECT_TRUE(outcome.state == 1) << outcome.state;  // increment deleted
    }
  }
  RestoreAll(dir, baseline);
  for (auto delay : KillDelays(3, 6, 60)) {
    fs::remove_all(dir);
    ASSERT_TRUE(WriteChainLinkContent(dir, LinkState(1, true), small).ok());
    KillWriter(
        dir,
        [&dir, &small](int64_t state) {
          if (!WriteChainLinkContent(dir, LinkState(state + 1, false), small)
                   .ok()) {
            ::_exit(4);
          }
        },
        [](const std::string& d) {
          Outcome outcome = CheckChain(d);
          if (outcome.status.ok()) --outcome.state;  // link k+1 is state k
          return outcome;
        },
        delay, &refusals_);
  }
  std::printf("checkpoint chain: %d refusals\n", refusals_);
}

// ------------------------------------------------------------ .npz exports

std::vector<std::pair<std::string, at::Tensor>> NpzState(int64_t state) {
  return {{"values", at::full({200000}, static_cast<float>(state))},
          {"state", at::full({1}, state, at::kLong)}};
}

TEST_F(CrashMatrixTest, NpzExports) {
  // An export has no reader here (NumPy reads it): the check compares the
  // file with what each state writes.
  const std::string dir = FreshDir("npz");
  fs::create_directories(dir);
  std::map<std::string, int64_t> states;
  for (int64_t state = 1; state <= 100; ++state) {
    const std::string reference = dir + "/reference.npz";
    ASSERT_TRUE(WriteNpz(reference, NpzState(state)).ok());
    states[ReadAll(dir).at(reference)] = state;
    fs::remove(reference);
  }
  const std::string path = dir + "/delta.npz";
  const Check check = [&](const std::string&) -> Outcome {
    std::ifstream in(path, std::ios::binary);
    if (!in) return {absl::OkStatus(), 0};
    std::stringstream bytes;
    bytes << in.rdbuf();
    auto it = states.find(bytes.str());
    return {absl::OkStatus(), it == states.end() ? -1 : it->second};
  };
  for (auto delay : KillDelays(4, 6, 60)) {
    fs::remove(path);
    KillWriter(
        dir,
        [&path](int64_t state) {
          if (state > 100) ::pause();  // no reference beyond
          if (!WriteNpz(path, NpzState(state)).ok()) ::_exit(4);
        },
        [&check](const std::string& d) {
          Outcome outcome = check(d);
          return outcome;
        },
        delay, &refusals_);
  }
}

// ------------------------------------------------------------ trainer
// checkpoints (trainer/checkpoint.h, through its public API)

std::unique_ptr<RecModel> SmallModel() {
  DlrmConfig config;
  config.num_dense = 2;
  config.dense_arch = {4, 4};
  config.over_arch = {4, 1};
  config.tables = {{"t0", 500, 4, {"cat_0"}}};
  config.device = c10::Device(c10::kCPU);
  absl::StatusOr<std::unique_ptr<Dlrm>> model = Dlrm::Create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::unique_ptr<RecModel>(std::move(*model)) : nullptr;
}

void SetModelState(RecModel& model, int64_t state) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : model.dense().parameters()) {
    p.fill_(static_cast<double>(state));
  }
}

// The embedding tables every state holds (SetModelState changes only the
// dense parameters).
std::map<std::string, at::Tensor>& TrainerTables() {
  static auto* tables = new std::map<std::string, at::Tensor>();
  return *tables;
}

Outcome CheckTrainerCheckpoint(const std::string& dir) {
  std::optional<std::string> latest = LatestCheckpoint(dir).value();
  if (!latest.has_value()) return {absl::OkStatus(), 0};
  absl::StatusOr<CheckpointModel> model = ReadCheckpointModel(*latest);
  if (!model.ok()) return {model.status()};
  bool same =
      !model->dense.empty() && model->tables.size() == TrainerTables().size();
  for (const auto& [name, table] : model->tables) {
    same = same && TrainerTables().count(name) == 1 &&
           at::equal(table, TrainerTables().at(name));
  }
  for (const auto& [name, tensor] : model->dense) {
    same = same &&
           at::equal(tensor,
                     at::full_like(tensor, static_cast<double>(model->step)));
  }
  return {absl::OkStatus(), same ? model->step : -1};
}

TEST_F(CrashMatrixTest, TrainerCheckpoints) {
  const std::string dir = FreshDir("trainer");
  std::unique_ptr<RecModel> model = SmallModel();
  ASSERT_NE(model, nullptr);
  torch::optim::SGD optimizer(model->dense().parameters(),
                              torch::optim::SGDOptions(0.1));
  for (int64_t state : {1, 2}) {
    SetModelState(*model, state);
    ASSERT_TRUE(SaveCheckpoint(dir, state, 0, *model, optimizer, 2).ok());
  }
  {
    absl::StatusOr<CheckpointModel> saved =
        ReadCheckpointModel(*LatestCheckpoint(dir).value());
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_FALSE(saved->tables.empty());
    TrainerTables() = saved->tables;
  }
  DamageEveryFile(dir, 2, CheckTrainerCheckpoint, &refusals_);
  for (auto delay : KillDelays(5, 6, 60)) {
    fs::remove_all(dir);
    KillWriter(
        dir,
        [&](int64_t state) {
          SetModelState(*model, state);
          if (!SaveCheckpoint(dir, state, 0, *model, optimizer, 2).ok()) {
            ::_exit(4);
          }
        },
        CheckTrainerCheckpoint, delay, &refusals_);
  }
  std::printf("trainer checkpoints: %d refusals\n", refusals_);
}

}  // namespace
}  // namespace deltastream
