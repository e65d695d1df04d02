// Checkpoints of one process (world size 1): the round trip, TorchRec key
// names, keep rotation, torn checkpoints never picked, old single-file
// checkpoints still restored and read, models that do not fit refused, mixed
// precision's gradient scaler state saved and restored.
#include "trainer/checkpoint.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "proto/checkpoint_manifest.pb.h"
#include "tests/testing/test_dirs.h"
#include "tests/trainer/checkpoint_fixtures.h"
#include "trainer/pipeline/gradient_scaler.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;
using ::deltastream::testing::CheckKnownStates;
using ::deltastream::testing::MakeCheckpointModel;
using ::deltastream::testing::SetKnownStates;

std::unique_ptr<Dlrm> Model(SparseOptimizerType optimizer, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<Dlrm>> model =
      MakeCheckpointModel(optimizer, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// One Adam step of the dense optimizer with fixed gradients, so that it has
// state to save.
void DenseStep(RecModel& model, torch::optim::Optimizer& optimizer) {
  for (const at::Tensor& p : model.dense().parameters()) {
    p.mutable_grad() = at::full_like(p, 0.25);
  }
  optimizer.step();
}

class CheckpointTest : public ::testing::TestWithParam<SparseOptimizerType> {};

TEST_P(CheckpointTest, RoundTripRestoresEveryState) {
  const std::string dir = FreshDir("round_trip");
  std::unique_ptr<Dlrm> saved = Model(GetParam(), 1);
  ASSERT_NE(saved, nullptr);
  ASSERT_TRUE(SetKnownStates(*saved).ok());
  torch::optim::Adam saved_optimizer(saved->dense().parameters());
  DenseStep(*saved, saved_optimizer);
  ASSERT_TRUE(SetKnownStates(*saved).ok());  // dense back to known values
  absl::StatusOr<CheckpointInfo> info =
      SaveCheckpoint(dir, 12, 480, *saved, saved_optimizer, 2);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->path, dir + "/checkpoint-000000000012");
  EXPECT_GT(info->bytes, 0);
  EXPECT_TRUE(fs::exists(info->path + "/rank-00000-of-00001.pt"));
  EXPECT_TRUE(fs::exists(info->path + "/manifest.json"));
  EXPECT_EQ(LatestCheckpoint(dir).value(), info->path);
  EXPECT_EQ(CheckpointStep(info->path), 12);

  std::unique_ptr<Dlrm> loaded = Model(GetParam(), 2);  // other values
  ASSERT_NE(loaded, nullptr);
  EXPECT_FALSE(CheckKnownStates(*loaded, {}).ok());  // the check checks
  torch::optim::Adam loaded_optimizer(loaded->dense().parameters());
  absl::StatusOr<CheckpointInfo> restored =
      LoadCheckpoint(info->path, *loaded, loaded_optimizer);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 12);
  EXPECT_EQ(restored->examples, 480);
  absl::Status same = CheckKnownStates(*loaded, {});
  EXPECT_TRUE(same.ok()) << same;
  // The dense optimizer continues as the saved one does.
  DenseStep(*saved, saved_optimizer);
  DenseStep(*loaded, loaded_optimizer);
  std::vector<at::Tensor> a = saved->dense().parameters();
  std::vector<at::Tensor> b = loaded->dense().parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i]));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CheckpointTest,
                         ::testing::Values(SparseOptimizerType::kSgd,
                                           SparseOptimizerType::kAdagrad,
                                           SparseOptimizerType::kRowwiseAdagrad,
                                           SparseOptimizerType::kAdam));

TEST(CheckpointKeysTest, RankFileUsesTorchRecNames) {
  const std::string dir = FreshDir("keys");
  std::unique_ptr<Dlrm> model = Model(SparseOptimizerType::kAdam, 1);
  ASSERT_NE(model, nullptr);
  torch::optim::SGD optimizer(model->dense().parameters(),
                              torch::optim::SGDOptions(0.1));
  absl::StatusOr<CheckpointInfo> info =
      SaveCheckpoint(dir, 3, 30, *model, optimizer, 1);
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<std::map<std::string, at::Tensor>> tensors =
      ReadCheckpointTensors(info->path + "/rank-00000-of-00001.pt");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::set<std::string> keys;
  for (const auto& [key, tensor] : *tensors) keys.insert(key);
  const std::string fqn = "sparse_arch.embedding_bag_collection.embedding_bags";
  for (const char* table : {"t0", "t1", "t2", "t3"}) {
    for (const std::string& key :
         {absl::StrCat(fqn, ".", table, ".weight"),
          absl::StrCat("fused_optimizer.state.", fqn, ".", table, ".weight.",
                       table, ".momentum1"),
          absl::StrCat("fused_optimizer.state.", fqn, ".", table, ".weight.",
                       table, ".momentum2"),
          absl::StrCat("fused_optimizer.state.", fqn, ".", table, ".weight.",
                       table, ".step")}) {
      EXPECT_EQ(keys.erase(key), 1u) << key;
    }
  }
  for (const auto& item : model->dense().named_parameters()) {
    EXPECT_EQ(keys.erase(item.key()), 1u) << item.key();
  }
  EXPECT_EQ(keys.erase("dense_optimizer"), 1u);
  EXPECT_TRUE(keys.empty()) << *keys.begin();

  // The one mapping, both ways.
  EXPECT_EQ(CheckpointTableKey(fqn + ".t0"), fqn + ".t0.weight");
  EXPECT_EQ(TableFqnOfCheckpointKey(fqn + ".t0.weight"), fqn + ".t0");
  EXPECT_EQ(TableFqnOfCheckpointKey("dense_arch.0.weight"), std::nullopt);
  EXPECT_EQ(TableFqnOfCheckpointKey(
                CheckpointOptimizerStateKey(fqn + ".t0", "momentum1")),
            std::nullopt);
  EXPECT_EQ(CheckpointOptimizerStateKey("m.embeddings.t", "momentum1"),
            "fused_optimizer.state.m.embeddings.t.weight.t.momentum1");

  // ReadCheckpointModel: tables by FQN, dense by name.
  absl::StatusOr<deltastream::CheckpointModel> read =
      ReadCheckpointModel(info->path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 3);
  ASSERT_EQ(read->tables.count(fqn + ".t1"), 1u);
  EXPECT_TRUE(at::equal(read->tables[fqn + ".t1"],
                        model->embedding_modules()[0]->weight(1)));
  EXPECT_EQ(read->dense.size(), model->dense().named_parameters().size());
}

TEST(CheckpointFilesTest, KeepsTheNewestAndNeverPicksATornOne) {
  const std::string dir = FreshDir("torn");
  std::unique_ptr<Dlrm> model = Model(SparseOptimizerType::kAdagrad, 1);
  ASSERT_NE(model, nullptr);
  torch::optim::SGD optimizer(model->dense().parameters(),
                              torch::optim::SGDOptions(0.1));
  for (int64_t step : {1, 2, 3}) {
    ASSERT_TRUE(SaveCheckpoint(dir, step, step, *model, optimizer, 2).ok());
  }
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-000000000001"));
  const std::string two = dir + "/checkpoint-000000000002";
  const std::string three = dir + "/checkpoint-000000000003";
  EXPECT_EQ(LatestCheckpoint(dir).value(), three);

  // A rank file missing, shorter, or the manifest missing: not complete.
  const std::string rank_file = three + "/rank-00000-of-00001.pt";
  const std::string moved = dir + "/moved";
  fs::rename(rank_file, moved);
  EXPECT_EQ(LatestCheckpoint(dir).value(), two);
  {
    absl::StatusOr<std::string> bytes = ReadSmallFile(moved);
    ASSERT_TRUE(bytes.ok());
    std::ofstream(rank_file, std::ios::binary)
        << bytes->substr(0, bytes->size() - 1);
  }
  EXPECT_EQ(LatestCheckpoint(dir).value(), two);
  fs::rename(moved, rank_file);
  EXPECT_EQ(LatestCheckpoint(dir).value(), three);
  fs::remove(three + "/manifest.json");
  EXPECT_EQ(LatestCheckpoint(dir).value(), two);
  // A manifest that does not parse.
  std::ofstream(three + "/manifest.json") << "{\"step\": ";
  EXPECT_EQ(LatestCheckpoint(dir).value(), two);
  EXPECT_EQ(ReadCheckpointModel(three).status().code(),
            absl::StatusCode::kDataLoss);
  // The next save removes the torn one of an earlier step.
  ASSERT_TRUE(SaveCheckpoint(dir, 4, 4, *model, optimizer, 2).ok());
  EXPECT_FALSE(fs::exists(three));
  EXPECT_TRUE(fs::exists(two));
  // Saving a step again replaces it.
  ASSERT_TRUE(SaveCheckpoint(dir, 4, 40, *model, optimizer, 2).ok());
  torch::optim::SGD other(model->dense().parameters(),
                          torch::optim::SGDOptions(0.1));
  absl::StatusOr<CheckpointInfo> info =
      LoadCheckpoint(*LatestCheckpoint(dir).value(), *model, other);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->examples, 40);
  EXPECT_EQ(LatestCheckpoint(FreshDir("empty")).value(), std::nullopt);
  EXPECT_EQ(LatestCheckpoint(FreshDir("empty") + "/missing").value(),
            std::nullopt);
}

// A directory that cannot be listed is an error, never "no checkpoint": a
// trainer would start again from step 0 beside checkpoints it cannot see.
// (Tests run as root, so a file stands in for a directory without read
// permission.)
TEST(CheckpointTest, ADirectoryThatCannotBeListedIsAnErrorNotEmpty) {
  const std::string dir = FreshDir("unlistable");
  fs::create_directories(dir);
  const std::string file = dir + "/checkpoints";
  ASSERT_TRUE(WriteFileDurably(file, "not a directory").ok());
  absl::StatusOr<std::optional<std::string>> latest = LatestCheckpoint(file);
  // ENOTDIR, the OS's code: refused again on a restart.
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kFailedPrecondition)
      << latest.status();
  EXPECT_TRUE(absl::StrContains(latest.status().message(), file))
      << latest.status();
}

// The format before: one pickled typed dict, "checkpoint-<step>.pt".
void WriteOldCheckpoint(const std::string& path, RecModel& model,
                        torch::optim::Optimizer& optimizer, int64_t step) {
  c10::Dict<std::string, at::Tensor> tensors;
  tensors.insert("meta.step", at::scalar_tensor(step, at::kLong));
  tensors.insert("meta.examples", at::scalar_tensor(10 * step, at::kLong));
  for (const auto& item : model.dense().named_parameters()) {
    tensors.insert("dense." + item.key(), item.value().detach().clone());
  }
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  const std::string state = bytes.str();
  tensors.insert("dense_optimizer",
                 at::from_blob(const_cast<char*>(state.data()),
                               {static_cast<int64_t>(state.size())}, at::kByte)
                     .clone());
  for (EmbeddingModule* module : model.embedding_modules()) {
    for (const auto& [name, tensor] : module->StateTensors()) {
      tensors.insert(absl::StrCat("sparse.", module->path(), ".", name),
                     tensor.clone());
    }
  }
  const std::vector<char> pickled = torch::jit::pickle_save(tensors);
  ASSERT_TRUE(
      WriteFileDurably(path, absl::string_view(pickled.data(), pickled.size()))
          .ok());
}

class OldCheckpointTest : public ::testing::TestWithParam<SparseOptimizerType> {
};

TEST_P(OldCheckpointTest, StillRestoresAndReads) {
  const std::string dir = FreshDir("old");
  fs::create_directories(dir);
  std::unique_ptr<Dlrm> saved = Model(GetParam(), 1);
  ASSERT_NE(saved, nullptr);
  ASSERT_TRUE(SetKnownStates(*saved).ok());
  torch::optim::SGD optimizer(saved->dense().parameters(),
                              torch::optim::SGDOptions(0.1));
  const std::string old = dir + "/checkpoint-000000000005.pt";
  WriteOldCheckpoint(old, *saved, optimizer, 5);
  EXPECT_EQ(LatestCheckpoint(dir).value(), old);
  EXPECT_EQ(CheckpointStep(old), 5);

  std::unique_ptr<Dlrm> loaded = Model(GetParam(), 2);
  ASSERT_NE(loaded, nullptr);
  torch::optim::SGD loaded_optimizer(loaded->dense().parameters(),
                                     torch::optim::SGDOptions(0.1));
  absl::StatusOr<CheckpointInfo> info =
      LoadCheckpoint(old, *loaded, loaded_optimizer);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 5);
  EXPECT_EQ(info->examples, 50);
  EXPECT_TRUE(info->gradient_scaler_state.empty());
  absl::Status same = CheckKnownStates(*loaded, {});
  EXPECT_TRUE(same.ok()) << same;

  absl::StatusOr<deltastream::CheckpointModel> read = ReadCheckpointModel(old);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->step, 5);
  EXPECT_EQ(read->tables.count("sparse_arch.embedding_bag_collection.t2"), 1u);

  // A newer checkpoint in the new format is picked over it; both rotate.
  ASSERT_TRUE(SaveCheckpoint(dir, 6, 60, *loaded, loaded_optimizer, 1).ok());
  EXPECT_EQ(LatestCheckpoint(dir).value(), dir + "/checkpoint-000000000006");
  EXPECT_FALSE(fs::exists(old));
}

// An old file whose step is not one number, or whose table is not 2-D, is
// damage (DataLoss) for verify_model's reader, not an exception.
TEST(OldCheckpointFilesTest, MisshapenEntriesAreDataLoss) {
  const std::string dir = FreshDir("old_misshapen");
  fs::create_directories(dir);
  for (const auto& [key, tensor] :
       {std::pair<std::string, at::Tensor>{"meta.step", at::arange(2)},
        {"sparse.sparse_arch.t0.weight", at::ones({3})}}) {
    c10::Dict<std::string, at::Tensor> tensors;
    tensors.insert("meta.step", at::scalar_tensor(1, at::kLong));
    tensors.insert_or_assign(key, tensor);
    const std::vector<char> pickled = torch::jit::pickle_save(tensors);
    const std::string path = dir + "/checkpoint-000000000001.pt";
    ASSERT_TRUE(WriteFileDurably(
                    path, absl::string_view(pickled.data(), pickled.size()))
                    .ok());
    const absl::Status status = ReadCheckpointModel(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << key << status;
    EXPECT_TRUE(absl::StrContains(status.message(), key)) << status;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OldCheckpointTest,
                         ::testing::Values(SparseOptimizerType::kRowwiseAdagrad,
                                           SparseOptimizerType::kAdam));

TEST(CheckpointFilesTest, RefusesAModelItDoesNotFit) {
  const std::string dir = FreshDir("misfit");
  std::unique_ptr<Dlrm> saved = Model(SparseOptimizerType::kAdagrad, 1);
  ASSERT_NE(saved, nullptr);
  torch::optim::SGD optimizer(saved->dense().parameters(),
                              torch::optim::SGDOptions(0.1));
  absl::StatusOr<CheckpointInfo> info =
      SaveCheckpoint(dir, 1, 1, *saved, optimizer, 1);
  ASSERT_TRUE(info.ok()) << info.status();

  // Another sparse optimizer.
  std::unique_ptr<Dlrm> adam = Model(SparseOptimizerType::kAdam, 1);
  torch::optim::SGD adam_optimizer(adam->dense().parameters(),
                                   torch::optim::SGDOptions(0.1));
  absl::Status status =
      LoadCheckpoint(info->path, *adam, adam_optimizer).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "momentum2")) << status;

  // Another table size.
  DlrmConfig config;
  config.num_dense = 3;
  config.dense_arch = {4, testing::kCheckpointDim};
  config.over_arch = {4, 1};
  config.tables = testing::CheckpointTables();
  config.tables[2].num_embeddings = 18;
  config.sparse_optimizer.type = SparseOptimizerType::kAdagrad;
  absl::StatusOr<std::unique_ptr<Dlrm>> bigger = Dlrm::Create(config);
  ASSERT_TRUE(bigger.ok());
  torch::optim::SGD bigger_optimizer((*bigger)->dense().parameters(),
                                     torch::optim::SGDOptions(0.1));
  status = LoadCheckpoint(info->path, **bigger, bigger_optimizer).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(status.message(), "embedding_bags.t2' is [17, 8]"))
      << status;

  // A flipped byte in a rank file: the zip checksums refuse it.
  const std::string rank_file = info->path + "/rank-00000-of-00001.pt";
  absl::StatusOr<std::string> bytes = ReadSmallFile(rank_file);
  ASSERT_TRUE(bytes.ok());
  std::string damaged = *bytes;
  damaged[damaged.size() / 2] ^= 0x5a;
  std::ofstream(rank_file, std::ios::binary | std::ios::trunc) << damaged;
  status = LoadCheckpoint(info->path, *saved, optimizer).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
}

// A manifest whose blocks of a table do not tile it is damage, also where
// their element count adds up: rows [0, h) listed twice as [0, h) and
// [0, n - h), rows [h, n) in none, read as a whole table and left the rows
// no block filled as whatever memory held.
TEST(CheckpointFilesTest, AManifestWhoseBlocksDoNotTileIsDataLoss) {
  const std::string dir = FreshDir("overlap");
  std::unique_ptr<Dlrm> saved = Model(SparseOptimizerType::kAdagrad, 1);
  ASSERT_NE(saved, nullptr);
  torch::optim::SGD optimizer(saved->dense().parameters(),
                              torch::optim::SGDOptions(0.1));
  absl::StatusOr<CheckpointInfo> info =
      SaveCheckpoint(dir, 1, 1, *saved, optimizer, 1);
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string path = info->path + "/manifest.json";
  absl::StatusOr<std::string> json = ReadSmallFile(path);
  ASSERT_TRUE(json.ok()) << json.status();
  v1::CheckpointManifest manifest;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(*json, &manifest).ok());
  v1::CheckpointTensor* table = nullptr;
  for (v1::CheckpointTensor& tensor : *manifest.mutable_tensors()) {
    if (tensor.merge() == v1::TILE && tensor.shape(0) >= 3) table = &tensor;
  }
  ASSERT_NE(table, nullptr);
  const int64_t rows = table->shape(0), half = rows / 2;
  ASSERT_EQ(table->blocks_size(), 1);
  table->mutable_blocks(0)->set_rows(half);
  *table->add_blocks() = table->blocks(0);
  table->mutable_blocks(1)->set_rows(rows - half);
  std::string edited;
  ASSERT_TRUE(
      google::protobuf::util::MessageToJsonString(manifest, &edited).ok());
  ASSERT_TRUE(WriteFileDurably(path, edited).ok());

  const absl::Status status =
      LoadCheckpoint(info->path, *saved, optimizer).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StrContains(
      status.message(),
      absl::StrCat("'", table->key(), "' block 1 overlaps block 0")))
      << status;
  // Not a checkpoint to start from, nor one to keep as the newest.
  EXPECT_EQ(LatestCheckpoint(dir).value(), std::nullopt);
}

// The scaler's state by name, as plain numbers.
std::pair<double, int64_t> ScaleAndTracker(const GradientScaler& scaler) {
  std::pair<double, int64_t> values{0, -1};
  for (const auto& [name, tensor] : scaler.StateTensors()) {
    if (name == "scale") values.first = tensor.item<double>();
    if (name == "growth_tracker") values.second = tensor.item<int64_t>();
  }
  return values;
}

TEST(CheckpointScalerTest, GradientScalerStateRoundTrips) {
  const std::string dir = FreshDir("scaler");
  std::unique_ptr<Dlrm> model = Model(SparseOptimizerType::kAdagrad, 1);
  ASSERT_NE(model, nullptr);
  torch::optim::SGD optimizer(model->dense().parameters(),
                              torch::optim::SGDOptions(0.1));
  GradientScalerOptions options;
  options.init_scale = 1024;
  options.growth_interval = 3;
  // By its rule: a non-finite step halves the scale, two finite ones count.
  GradientScaler saved_scaler(options);
  saved_scaler.Update(/*found_non_finite=*/true);
  saved_scaler.Update(false);
  saved_scaler.Update(false);
  ASSERT_EQ(ScaleAndTracker(saved_scaler), std::make_pair(512.0, int64_t{2}));
  absl::StatusOr<CheckpointInfo> info = SaveCheckpoint(
      dir, 7, 70, *model, optimizer, 2, nullptr, saved_scaler.StateTensors());
  ASSERT_TRUE(info.ok()) << info.status();

  // Rank 0's file: "grad_scaler.<name>", 0-dim, beside TorchRec's keys.
  absl::StatusOr<std::map<std::string, at::Tensor>> tensors =
      ReadCheckpointTensors(info->path + "/rank-00000-of-00001.pt");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->count("grad_scaler.scale"), 1u);
  ASSERT_EQ(tensors->count("grad_scaler.growth_tracker"), 1u);
  EXPECT_EQ(tensors->at("grad_scaler.scale").dtype(), at::kDouble);
  EXPECT_EQ(tensors->at("grad_scaler.scale").dim(), 0);
  EXPECT_EQ(tensors->at("grad_scaler.growth_tracker").dtype(), at::kLong);
  EXPECT_TRUE(ReadCheckpointModel(info->path).ok());

  // Loaded into another model and scaler: the same scale and tracker, and
  // the next finite step grows the scale as the saved scaler's would.
  std::unique_ptr<Dlrm> loaded = Model(SparseOptimizerType::kAdagrad, 2);
  ASSERT_NE(loaded, nullptr);
  torch::optim::SGD loaded_optimizer(loaded->dense().parameters(),
                                     torch::optim::SGDOptions(0.1));
  absl::StatusOr<CheckpointInfo> restored =
      LoadCheckpoint(info->path, *loaded, loaded_optimizer);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->gradient_scaler_state.size(), 2u);
  GradientScaler loaded_scaler(options);
  absl::Status status =
      loaded_scaler.LoadStateTensors(restored->gradient_scaler_state);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(ScaleAndTracker(loaded_scaler), ScaleAndTracker(saved_scaler));
  loaded_scaler.Update(false);
  EXPECT_EQ(ScaleAndTracker(loaded_scaler), std::make_pair(1024.0, int64_t{0}));

  // A checkpoint saved without it: nothing to restore.
  ASSERT_TRUE(SaveCheckpoint(dir, 8, 80, *model, optimizer, 2).ok());
  restored =
      LoadCheckpoint(*LatestCheckpoint(dir).value(), *loaded, loaded_optimizer);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 8);
  EXPECT_TRUE(restored->gradient_scaler_state.empty());

  // A saved state the scaler refuses (a negative scale): loading it into
  // the scaler changes nothing.
  GradientScalerState bad = saved_scaler.StateTensors();
  bad[0].second = at::scalar_tensor(-4.0, at::kDouble);
  ASSERT_TRUE(
      SaveCheckpoint(dir, 9, 90, *model, optimizer, 2, nullptr, bad).ok());
  restored =
      LoadCheckpoint(*LatestCheckpoint(dir).value(), *loaded, loaded_optimizer);
  ASSERT_TRUE(restored.ok()) << restored.status();
  status = loaded_scaler.LoadStateTensors(restored->gradient_scaler_state);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(ScaleAndTracker(loaded_scaler), std::make_pair(1024.0, int64_t{0}));

  // A state that cannot be saved (an unnamed, repeated or undefined
  // tensor) is refused before anything is written.
  for (const GradientScalerState& refused :
       {GradientScalerState{{"", at::scalar_tensor(1.0, at::kDouble)}},
        GradientScalerState{{"scale", at::scalar_tensor(1.0, at::kDouble)},
                            {"scale", at::scalar_tensor(2.0, at::kDouble)}},
        GradientScalerState{{"scale", at::Tensor()}}}) {
    status =
        SaveCheckpoint(dir, 10, 100, *model, optimizer, 2, nullptr, refused)
            .status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_FALSE(fs::exists(dir + "/checkpoint-000000000010"));
    EXPECT_EQ(LatestCheckpoint(dir).value(), dir + "/checkpoint-000000000009");
  }
}

}  // namespace
}  // namespace deltastream
