#include "trainer/checkpoint.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <new>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "base/torch_status.h"
#include "base/zip_checksums.h"
#include "proto/checkpoint_manifest.pb.h"
#include "trainer/checkpoint_format.h"
#include "trainer/comm/process_group.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "checkpoint-";
constexpr char kLegacySuffix[] = ".pt";
constexpr char kDenseOptimizer[] = "dense_optimizer";
// The manifest's state of the gradient scaler's tensors, and their keys'
// prefix ("grad_scaler.<name>").
constexpr char kGradScaler[] = "grad_scaler";
constexpr absl::string_view kGradScalerPrefix = "grad_scaler.";
constexpr const char* kTableStates[] = {"weight", "momentum1", "momentum2",
                                        "step"};

std::string TableFqn(absl::string_view path, bool pooled,
                     absl::string_view table) {
  return absl::StrCat(path, pooled ? ".embedding_bags." : ".embeddings.",
                      table);
}

// One table this rank holds (a shard, or the whole table), the module that
// holds it under the table's own name, and the region of the whole table.
struct LocalTable {
  EmbeddingModule* module = nullptr;
  std::string fqn;
  std::string table;
  int64_t rows = 0;  // of the whole table
  int64_t dim = 0;
  int64_t row_offset = 0;
  int64_t local_rows = 0;
  int64_t col_offset = 0;
  int64_t cols = 0;
  // Whether this rank writes it: not for a data-parallel copy that a lower
  // rank writes too, nor an unsharded table on ranks other than 0.
  bool writes = true;
};

std::vector<LocalTable> LocalTables(RecModel& model, int rank) {
  std::vector<LocalTable> tables;
  const std::vector<ShardedEmbeddingModule*> sharded = model.sharded_modules();
  for (ShardedEmbeddingModule* module : sharded) {
    for (const EmbeddingShard& shard : module->local_shards()) {
      const EmbeddingTableConfig& config = module->tables()[shard.table_index];
      LocalTable table;
      table.module = module->local_module();
      table.fqn = TableFqn(module->path(), module->pooled(), shard.table);
      table.table = shard.table;
      table.rows = config.num_embeddings;
      table.dim = config.embedding_dim;
      table.row_offset = shard.row_offset;
      table.local_rows = shard.rows;
      table.col_offset = shard.col_offset;
      table.cols = shard.cols;
      for (const EmbeddingShard& other : module->shards()) {
        if (shard.sharding_type == v1::DATA_PARALLEL &&
            other.table_index == shard.table_index && other.rank < rank) {
          table.writes = false;
        }
      }
      tables.push_back(std::move(table));
    }
  }
  if (!sharded.empty()) return tables;
  for (EmbeddingModule* module : model.embedding_modules()) {
    for (size_t i = 0; i < module->tables().size(); ++i) {
      const EmbeddingTableConfig& config = module->tables()[i];
      LocalTable table;
      table.module = module;
      table.fqn = module->TableFqn(static_cast<int64_t>(i));
      table.table = config.name;
      table.rows = table.local_rows = config.num_embeddings;
      table.dim = table.cols = config.embedding_dim;
      table.writes = rank == 0;
      tables.push_back(std::move(table));
    }
  }
  return tables;
}

// A table's live states by state name ("weight", "momentum1", ...).
absl::StatusOr<std::map<std::string, at::Tensor>> LiveStates(
    const LocalTable& table) {
  std::map<std::string, at::Tensor> states;
  const std::string prefix = table.table + ".";
  for (const auto& [name, tensor] : table.module->StateTensors()) {
    if (!absl::StartsWith(name, prefix)) continue;
    const std::string state = name.substr(prefix.size());
    for (const char* known : kTableStates) {
      if (state == known) states[state] = tensor;
    }
  }
  if (states.count("weight") == 0) {
    return absl::InternalError(absl::StrCat("module '", table.module->path(),
                                            "' has no state '", prefix,
                                            "weight'"));
  }
  return states;
}

// How a table state's blocks merge, from its shape: a 0-dim counter, a
// [rows, 1] row state of a wider table, or an element-wise state.
v1::CheckpointMerge MergeOf(const at::Tensor& state, int64_t cols) {
  if (state.dim() == 0) return v1::MAX;
  if (state.dim() == 2 && state.size(1) == 1 && cols != 1) {
    return v1::COLUMN_MEAN;
  }
  return v1::TILE;
}

v1::CheckpointTensor* AddTensor(v1::CheckpointManifest& manifest,
                                std::string key, const at::Tensor& tensor,
                                v1::CheckpointMerge merge) {
  v1::CheckpointTensor* entry = manifest.add_tensors();
  entry->set_key(std::move(key));
  entry->set_dtype(DtypeName(tensor));
  entry->set_merge(merge);
  for (int64_t size : tensor.sizes()) entry->add_shape(size);
  return entry;
}

void AddBlock(v1::CheckpointTensor& entry, int file, int64_t row_offset,
              int64_t rows, int64_t col_offset, int64_t cols) {
  v1::CheckpointBlock* block = entry.add_blocks();
  block->set_file(file);
  block->set_row_offset(row_offset);
  block->set_rows(rows);
  block->set_col_offset(col_offset);
  block->set_cols(cols);
}

// This rank's tensors and their part of the manifest (its file, tensors
// with one block each).
absl::Status CollectRankTensors(
    RecModel& model, torch::optim::Optimizer& dense_optimizer,
    const GradientScalerState& gradient_scaler_state, int rank,
    std::vector<std::pair<std::string, at::Tensor>>& tensors,
    v1::CheckpointManifest& part) {
  try {
    if (rank == 0) {
      for (const auto& item : model.dense().named_parameters()) {
        at::Tensor value = item.value().detach();
        v1::CheckpointTensor* entry =
            AddTensor(part, item.key(), value, v1::WHOLE);
        entry->set_parameter(item.key());
        AddBlock(*entry, rank, 0, 0, 0, 0);
        tensors.emplace_back(item.key(), value);
      }
      torch::serialize::OutputArchive archive;
      dense_optimizer.save(archive);
      std::ostringstream bytes;
      archive.save_to(bytes);
      const std::string state = bytes.str();
      at::Tensor archive_bytes =
          at::from_blob(const_cast<char*>(state.data()),
                        {static_cast<int64_t>(state.size())}, at::kByte)
              .clone();
      v1::CheckpointTensor* entry =
          AddTensor(part, kDenseOptimizer, archive_bytes, v1::WHOLE);
      entry->set_state(kDenseOptimizer);
      AddBlock(*entry, rank, 0, 0, 0, 0);
      tensors.emplace_back(kDenseOptimizer, archive_bytes);
      for (const auto& [name, tensor] : gradient_scaler_state) {
        const std::string key = absl::StrCat(kGradScalerPrefix, name);
        at::Tensor value = tensor.detach().to(at::kCPU).contiguous();
        v1::CheckpointTensor* scaler = AddTensor(part, key, value, v1::WHOLE);
        scaler->set_state(kGradScaler);
        AddBlock(*scaler, rank, 0, 0, 0, 0);
        tensors.emplace_back(key, value);
      }
    }
    for (const LocalTable& table : LocalTables(model, rank)) {
      if (!table.writes) continue;
      absl::StatusOr<std::map<std::string, at::Tensor>> states =
          LiveStates(table);
      if (!states.ok()) return states.status();
      for (const auto& [state, tensor] : *states) {
        const std::string key =
            state == "weight" ? CheckpointTableKey(table.fqn)
                              : CheckpointOptimizerStateKey(table.fqn, state);
        const v1::CheckpointMerge merge = MergeOf(tensor, table.cols);
        v1::CheckpointTensor* entry = AddTensor(part, key, tensor, merge);
        entry->clear_shape();
        if (merge == v1::TILE) {
          entry->add_shape(table.rows);
          entry->add_shape(table.dim);
        } else if (merge == v1::COLUMN_MEAN) {
          entry->add_shape(table.rows);
          entry->add_shape(1);
        }
        entry->set_table(table.fqn);
        entry->set_state(state);
        AddBlock(*entry, rank, table.row_offset, table.local_rows,
                 table.col_offset, table.cols);
        tensors.emplace_back(key, tensor.detach());
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(
        "collecting rank ", rank, "'s tensors: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

void AddModules(RecModel& model, v1::CheckpointManifest& manifest) {
  const std::vector<ShardedEmbeddingModule*> sharded = model.sharded_modules();
  for (ShardedEmbeddingModule* module : sharded) {
    v1::CheckpointModule* entry = manifest.add_modules();
    entry->set_path(module->path());
    entry->set_pooled(module->pooled());
    *entry->mutable_plan() = module->plan();
  }
  if (!sharded.empty()) return;
  for (EmbeddingModule* module : model.embedding_modules()) {
    v1::CheckpointModule* entry = manifest.add_modules();
    entry->set_path(module->path());
    entry->set_pooled(module->pooled());
  }
}

// Adds `part`'s tensors to `manifest`, blocks of a key already there to its
// entry.
void MergeManifest(const v1::CheckpointManifest& part,
                   v1::CheckpointManifest& manifest,
                   std::map<std::string, int>& index) {
  for (const v1::CheckpointTensor& tensor : part.tensors()) {
    auto [it, added] = index.emplace(tensor.key(), manifest.tensors_size());
    if (added) {
      *manifest.add_tensors() = tensor;
    } else {
      for (const v1::CheckpointBlock& block : tensor.blocks()) {
        *manifest.mutable_tensors(it->second)->add_blocks() = block;
      }
    }
  }
}

std::atomic<int64_t> save_generation{0};

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
  bool legacy = false;
};

// Checkpoint directories and old files in `dir`, by step (a directory
// before a file of the same step); none when `dir` does not exist. Internal,
// naming `dir`, when it cannot be listed, and the OS's error when an entry
// cannot be looked at: taken for empty, a trainer would start again from
// step 0.
absl::StatusOr<std::vector<CheckpointEntry>> CheckpointEntries(
    const std::string& dir) {
  absl::StatusOr<std::vector<fs::directory_entry>> items =
      ListDirectory(dir, "the checkpoints in");
  if (!items.ok()) return items.status();
  std::vector<CheckpointEntry> entries;
  for (const fs::directory_entry& item : *items) {
    const std::string path = item.path().string();
    std::optional<int64_t> step = CheckpointStep(path);
    if (!step.has_value()) continue;
    const bool legacy = absl::EndsWith(path, kLegacySuffix);
    // Where the listing gave no file type (some network file systems) this
    // stats the entry: an error other than its removal meanwhile is not a
    // checkpoint that is not there.
    std::error_code type_error;
    const bool directory = item.is_directory(type_error);
    if (type_error && type_error != std::errc::no_such_file_or_directory) {
      return absl::ErrnoToStatus(type_error.value(),
                                 absl::StrCat("cannot stat '", path, "'"));
    }
    if (legacy == directory) continue;
    entries.push_back({*step, path, legacy});
  }
  std::sort(entries.begin(), entries.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) {
              return a.step != b.step ? a.step < b.step : a.legacy > b.legacy;
            });
  return entries;
}

// OK when `entry` is a complete checkpoint; NotFound or DataLoss when it is
// not (a save cut short: no manifest, a rank file missing or short); another
// error when that cannot be told (an I/O error reading the manifest). That
// must not be taken for incomplete: a restore would skip, and a rotation
// remove, a checkpoint that the next try reads.
absl::Status CheckComplete(const CheckpointEntry& entry) {
  if (entry.legacy) return absl::OkStatus();  // written whole by one rename
  absl::StatusOr<v1::CheckpointManifest> manifest =
      ReadCheckpointManifest(entry.path);
  if (!manifest.ok()) return manifest.status();
  return CheckCheckpointFiles(entry.path, *manifest);
}

bool Incomplete(const absl::Status& complete) {
  return complete.code() == absl::StatusCode::kNotFound ||
         complete.code() == absl::StatusCode::kDataLoss;
}

void RemoveCheckpoint(const CheckpointEntry& entry) {
  std::error_code error;
  if (!entry.legacy) {
    // The manifest first: a checkpoint partly removed is never complete.
    fs::remove(absl::StrCat(entry.path, "/", kCheckpointManifestName), error);
  }
  fs::remove_all(entry.path, error);
}

// Rank 0, after step `step`'s manifest: keeps the newest `keep` complete
// checkpoints, and no incomplete one older than `step`. A directory it
// cannot list, and a checkpoint it cannot tell complete or not, are left as
// they are.
void RotateCheckpoints(const std::string& dir, int64_t step, int64_t keep) {
  absl::StatusOr<std::vector<CheckpointEntry>> entries = CheckpointEntries(dir);
  if (!entries.ok()) return;
  int64_t kept = 0;
  for (auto it = entries->rbegin(); it != entries->rend(); ++it) {
    const absl::Status complete = CheckComplete(*it);
    if (complete.ok()) {
      if (++kept > std::max<int64_t>(keep, 1)) RemoveCheckpoint(*it);
    } else if (Incomplete(complete) && it->step < step) {
      RemoveCheckpoint(*it);
    }
  }
  (void)SyncDirectory(dir);
}

// Rank 0's share of a save: every rank's description, the manifest.
absl::Status CommitManifest(RecModel& model, ProcessGroup* group,
                            const std::string& checkpoint_dir,
                            const std::string& store_prefix,
                            const v1::CheckpointManifest& own_part,
                            v1::CheckpointManifest& manifest) {
  const int world = group != nullptr ? group->world_size() : 1;
  AddModules(model, manifest);
  std::map<std::string, int> index;
  std::vector<std::string> failures;
  for (int rank = 0; rank < world; ++rank) {
    v1::CheckpointManifest part;
    if (rank == 0) {
      part = own_part;
    } else {
      absl::StatusOr<std::string> value =
          group->StoreGet(absl::StrCat(store_prefix, rank));
      if (!value.ok()) {
        failures.push_back(
            absl::StrCat("rank ", rank, ": ", value.status().message()));
        continue;
      }
      if (absl::StartsWith(*value, "error:")) {
        failures.push_back(absl::StrCat("rank ", rank, ": ", value->substr(6)));
        continue;
      }
      if (!part.ParseFromString(value->substr(3))) {
        failures.push_back(absl::StrCat("rank ", rank, ": unreadable"));
        continue;
      }
    }
    for (const v1::CheckpointFile& file : part.files()) {
      *manifest.add_files() = file;
    }
    MergeManifest(part, manifest, index);
  }
  if (!failures.empty()) {
    return absl::InternalError(
        absl::StrCat("checkpoint '", checkpoint_dir,
                     "' not written: ", absl::StrJoin(failures, "; ")));
  }
  return WriteCheckpointManifest(checkpoint_dir, manifest);
}

}  // namespace

absl::StatusOr<CheckpointInfo> SaveCheckpoint(
    const std::string& dir, int64_t step, int64_t examples, RecModel& model,
    torch::optim::Optimizer& dense_optimizer, int64_t keep, ProcessGroup* group,
    const GradientScalerState& gradient_scaler_state) {
  const absl::Time start = absl::Now();
  const int rank = group != nullptr ? group->rank() : 0;
  const int world = group != nullptr ? group->world_size() : 1;
  std::set<std::string> scaler_names;
  for (const auto& [name, tensor] : gradient_scaler_state) {
    if (name.empty() || !scaler_names.insert(name).second ||
        !tensor.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint of step ", step, ": gradient scaler state '",
                       name, "' is ",
                       name.empty()       ? "unnamed"
                       : tensor.defined() ? "given twice"
                                          : "undefined"));
    }
  }
  const std::string checkpoint_dir =
      absl::StrCat(dir, "/", CheckpointDirName(step));
  const std::string store_prefix =
      absl::StrCat("checkpoint/", step, "/", save_generation++, "/");
  std::error_code error;
  fs::create_directories(dir, error);
  if (rank == 0 && !error) {
    // A checkpoint of this step being replaced is incomplete from here on.
    if (fs::remove(absl::StrCat(checkpoint_dir, "/", kCheckpointManifestName),
                   error)) {
      (void)SyncDirectory(checkpoint_dir);
    }
    error.clear();
  }
  if (group != nullptr) {
    if (absl::Status status = group->Barrier("checkpoint.begin");
        !status.ok()) {
      return status;
    }
  }
  fs::create_directories(checkpoint_dir, error);
  CheckpointInfo info;
  info.step = step;
  info.examples = examples;
  info.path = checkpoint_dir;

  // This rank's file.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  v1::CheckpointManifest part;
  absl::Status written =
      error ? absl::PermissionDeniedError(absl::StrCat(
                  "cannot create '", checkpoint_dir, "': ", error.message()))
            : CollectRankTensors(model, dense_optimizer, gradient_scaler_state,
                                 rank, tensors, part);
  if (written.ok()) {
    absl::StatusOr<std::string> bytes = PickleTensorDict(tensors);
    tensors.clear();
    if (bytes.ok()) {
      v1::CheckpointFile* file = part.add_files();
      file->set_name(CheckpointRankFileName(rank, world));
      file->set_rank(rank);
      file->set_bytes(static_cast<int64_t>(bytes->size()));
      info.bytes = file->bytes();
      written = WriteFileDurably(
          absl::StrCat(checkpoint_dir, "/", file->name()), *bytes);
    } else {
      written = bytes.status();
    }
  }

  // Every rank's description to rank 0, which writes the manifest.
  absl::Status committed = absl::OkStatus();
  if (rank == 0) {
    v1::CheckpointManifest manifest;
    manifest.set_format_version(kCheckpointFormatVersion);
    manifest.set_step(step);
    manifest.set_examples(examples);
    manifest.set_world_size(world);
    committed = written.ok() ? CommitManifest(model, group, checkpoint_dir,
                                              store_prefix, part, manifest)
                             : written;
    if (committed.ok()) {
      // The new checkpoint's entry is durable before any older one goes.
      committed = SyncDirectory(dir);
    }
    if (committed.ok()) {
      RotateCheckpoints(dir, step, keep);
      info.bytes = 0;
      for (const v1::CheckpointFile& file : manifest.files()) {
        info.bytes += file.bytes();
      }
    }
    if (group != nullptr && !committed.ok()) {
      (void)group->StoreSet(absl::StrCat(store_prefix, "result"),
                            committed.message());
    }
  } else {
    (void)group->StoreSet(absl::StrCat(store_prefix, rank),
                          written.ok()
                              ? absl::StrCat("ok:", part.SerializeAsString())
                              : absl::StrCat("error:", written.message()));
  }
  if (group != nullptr) {
    absl::StatusOr<int64_t> all_ok = group->AllReduceMin(
        written.ok() && committed.ok() ? 1 : 0, "checkpoint.commit");
    if (!all_ok.ok()) return all_ok.status();
    if (*all_ok == 0) {
      if (!written.ok()) return written;
      if (!committed.ok()) return committed;
      absl::StatusOr<std::string> reason =
          group->StoreGet(absl::StrCat(store_prefix, "result"));
      return absl::InternalError(absl::StrCat(
          "checkpoint '", checkpoint_dir, "' failed on another rank: ",
          reason.ok() ? *reason : reason.status().ToString()));
    }
  }
  if (!written.ok()) return written;
  if (!committed.ok()) return committed;
  info.elapsed = absl::Now() - start;
  return info;
}

std::optional<int64_t> CheckpointStep(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  if (name.empty()) name = fs::path(path).parent_path().filename().string();
  if (absl::EndsWith(name, kLegacySuffix)) {
    name.resize(name.size() - (sizeof(kLegacySuffix) - 1));
  }
  const size_t prefix = sizeof(kPrefix) - 1;
  if (name.size() <= prefix || !absl::StartsWith(name, kPrefix)) {
    return std::nullopt;
  }
  int64_t step = 0;
  const std::string digits = name.substr(prefix);
  if (digits.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(digits, &step)) {
    return std::nullopt;
  }
  return step;
}

absl::StatusOr<std::optional<std::string>> LatestCheckpoint(
    const std::string& dir) {
  absl::StatusOr<std::vector<CheckpointEntry>> entries = CheckpointEntries(dir);
  if (!entries.ok()) return entries.status();
  for (auto it = entries->rbegin(); it != entries->rend(); ++it) {
    const absl::Status complete = CheckComplete(*it);
    if (complete.ok()) return it->path;
    if (!Incomplete(complete)) return complete;
  }
  return std::nullopt;
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadCheckpointTensors(
    const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;  // before the message's allocations
    return absl::ErrnoToStatus(error, absl::StrCat("cannot read '", path, "'"));
  }
  std::vector<char> bytes;
  char buffer[1 << 16];
  try {
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) {
      bytes.insert(bytes.end(), buffer, buffer + n);
    }
  } catch (const std::bad_alloc&) {
    std::fclose(file);
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory to read '", path, "'"));
  }
  // A read that failed (EIO on a network volume) is the disk's failure, not
  // a damaged checkpoint: its bytes must not reach the checksum check.
  const int read_error =
      std::ferror(file) == 0 ? 0 : (errno != 0 ? errno : EIO);
  std::fclose(file);
  if (read_error != 0) {
    return absl::ErrnoToStatus(read_error,
                               absl::StrCat("reading '", path, "' failed"));
  }

  // torch::jit::pickle_load does not check the archive's CRCs: a flipped byte
  // in a table would load as a wrong value.
  if (absl::Status s = VerifyZipChecksums(
          absl::string_view(bytes.data(), bytes.size()), path);
      !s.ok()) {
    return s;
  }
  std::map<std::string, at::Tensor> tensors;
  try {
    c10::IValue loaded = torch::jit::pickle_load(bytes);
    for (const auto& entry : loaded.toGenericDict()) {
      tensors[entry.key().toStringRef()] = entry.value().toTensor();
    }
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) return TorchErrorStatus(e);
    return absl::DataLossError(absl::StrCat(
        "'", path,
        "' is not a readable checkpoint: ", e.what_without_backtrace()));
  }
  return tensors;
}

std::string CheckpointTableKey(absl::string_view fqn) {
  return absl::StrCat(fqn, ".weight");
}

std::string CheckpointOptimizerStateKey(absl::string_view fqn,
                                        absl::string_view state) {
  absl::string_view table = fqn;
  for (absl::string_view infix : {".embedding_bags.", ".embeddings."}) {
    const size_t at = fqn.find(infix);
    if (at != absl::string_view::npos) {
      table = fqn.substr(at + infix.size());
      break;
    }
  }
  return absl::StrCat("fused_optimizer.state.", fqn, ".weight.", table, ".",
                      state);
}

std::optional<std::string> TableFqnOfCheckpointKey(absl::string_view key) {
  constexpr absl::string_view kWeight = ".weight";
  if (!absl::EndsWith(key, kWeight) ||
      absl::StartsWith(key, "fused_optimizer.") ||
      (!absl::StrContains(key, ".embedding_bags.") &&
       !absl::StrContains(key, ".embeddings."))) {
    return std::nullopt;
  }
  return std::string(key.substr(0, key.size() - kWeight.size()));
}

std::string CheckpointTableName(absl::string_view fqn) {
  std::string name(fqn);
  for (absl::string_view part : {".embedding_bags.", ".embeddings."}) {
    const size_t at = name.find(part.data(), 0, part.size());
    if (at != std::string::npos) return name.replace(at, part.size(), ".");
  }
  return name;
}

namespace {

// One tensor to assemble from the blocks of the files: a whole dense tensor,
// or the region [row_offset, +rows) x [col_offset, +cols) of a table state.
struct Target {
  explicit Target(const v1::CheckpointTensor* entry, int64_t row_offset = 0,
                  int64_t rows = 0, int64_t col_offset = 0, int64_t cols = 0)
      : entry(entry),
        row_offset(row_offset),
        rows(rows),
        col_offset(col_offset),
        cols(cols) {}

  const v1::CheckpointTensor* entry;
  int64_t row_offset;
  int64_t rows;
  int64_t col_offset;
  int64_t cols;
  at::Tensor out;
  at::Tensor sum;     // COLUMN_MEAN: double, [rows, 1]
  at::Tensor weight;  // COLUMN_MEAN: columns summed per row
  int64_t covered = 0;
};

int64_t Overlap(int64_t a, int64_t a_size, int64_t b, int64_t b_size,
                int64_t* begin) {
  *begin = std::max(a, b);
  return std::max<int64_t>(0, std::min(a + a_size, b + b_size) - *begin);
}

std::string BlockText(const v1::CheckpointBlock& block) {
  return absl::StrFormat("rows [%d, %d) columns [%d, %d)", block.row_offset(),
                         block.row_offset() + block.rows(), block.col_offset(),
                         block.col_offset() + block.cols());
}

// Adds `block` (held as `saved`) to `target` where they overlap.
absl::Status Apply(const v1::CheckpointBlock& block, const at::Tensor& saved,
                   Target& target) {
  const v1::CheckpointTensor& entry = *target.entry;
  int64_t row = 0, col = 0;
  const int64_t rows = Overlap(target.row_offset, target.rows,
                               block.row_offset(), block.rows(), &row);
  const int64_t cols = Overlap(target.col_offset, target.cols,
                               block.col_offset(), block.cols(), &col);
  if (entry.merge() != v1::WHOLE && (rows == 0 || cols == 0)) {
    return absl::OkStatus();
  }
  auto misfit = [&](const std::string& expected) {
    return absl::DataLossError(
        absl::StrCat("'", entry.key(), "' ", BlockText(block), " is ",
                     c10::str(saved.sizes()), ", expected ", expected));
  };
  switch (entry.merge()) {
    case v1::WHOLE:
      if (static_cast<size_t>(saved.dim()) !=
              static_cast<size_t>(entry.shape_size()) ||
          !std::equal(saved.sizes().begin(), saved.sizes().end(),
                      entry.shape().begin())) {
        return misfit("the manifest's shape");
      }
      target.out = saved;
      target.covered = 1;
      return absl::OkStatus();
    case v1::TILE:
      if (saved.dim() != 2 || saved.size(0) != block.rows() ||
          saved.size(1) != block.cols()) {
        return misfit(absl::StrCat("[", block.rows(), ", ", block.cols(), "]"));
      }
      if (!target.out.defined()) {
        target.out = at::empty({target.rows, target.cols}, saved.options());
      }
      target.out.narrow(0, row - target.row_offset, rows)
          .narrow(1, col - target.col_offset, cols)
          .copy_(saved.narrow(0, row - block.row_offset(), rows)
                     .narrow(1, col - block.col_offset(), cols));
      target.covered += rows * cols;
      return absl::OkStatus();
    case v1::COLUMN_MEAN:
      if (saved.dim() != 2 || saved.size(0) != block.rows() ||
          saved.size(1) != 1) {
        return misfit(absl::StrCat("[", block.rows(), ", 1]"));
      }
      if (!target.sum.defined()) {
        target.out = at::empty({target.rows, 1}, saved.options());
        target.sum = at::zeros({target.rows, 1}, at::kDouble);
        target.weight = at::zeros({target.rows, 1}, at::kDouble);
      }
      // The product of a float and a small integer is exact in double, so
      // a single block divides back to its own values bit for bit.
      target.sum.narrow(0, row - target.row_offset, rows)
          .add_(
              saved.narrow(0, row - block.row_offset(), rows).to(at::kDouble) *
              static_cast<double>(cols));
      target.weight.narrow(0, row - target.row_offset, rows)
          .add_(static_cast<double>(cols));
      return absl::OkStatus();
    case v1::MAX:
      if (saved.dim() != 0) return misfit("a scalar");
      target.out =
          target.out.defined() ? at::maximum(target.out, saved) : saved.clone();
      target.covered = 1;
      return absl::OkStatus();
    default:
      return absl::DataLossError(
          absl::StrCat("'", entry.key(), "' has no known merge rule"));
  }
}

absl::Status Finish(Target& target) {
  const v1::CheckpointTensor& entry = *target.entry;
  std::string missing;
  if (entry.merge() == v1::COLUMN_MEAN) {
    if (!target.sum.defined() ||
        !at::equal(target.weight, at::full_like(target.weight, target.cols))) {
      missing = "some rows' columns";
    } else {
      target.out.copy_(target.sum / target.weight);
      target.sum = target.weight = at::Tensor();
    }
  } else if (entry.merge() == v1::TILE) {
    if (target.covered != target.rows * target.cols) {
      missing =
          absl::StrCat(target.rows * target.cols - target.covered, " elements");
    }
  } else if (target.covered == 0) {
    missing = "every element";
  }
  if (!missing.empty()) {
    return absl::DataLossError(absl::StrFormat(
        "the blocks of '%s' miss %s of rows [%d, %d) columns [%d, %d)",
        entry.key(), missing, target.row_offset,
        target.row_offset + target.rows, target.col_offset,
        target.col_offset + target.cols));
  }
  return absl::OkStatus();
}

// Fills `targets` from `files` (paths by manifest file index), reading each
// file that holds a needed block once, one at a time. `preloaded`: file 0's
// tensors when the caller has them (an old single-file checkpoint).
absl::Status Fill(const std::vector<std::string>& files,
                  std::vector<Target>& targets, int64_t* bytes_read,
                  std::map<std::string, at::Tensor>* preloaded = nullptr) {
  // Per file: (target, block) pairs that overlap.
  std::map<int, std::vector<std::pair<Target*, const v1::CheckpointBlock*>>>
      reads;
  for (Target& target : targets) {
    for (const v1::CheckpointBlock& block : target.entry->blocks()) {
      if (block.file() < 0 || block.file() >= static_cast<int>(files.size())) {
        return absl::DataLossError(absl::StrCat("'", target.entry->key(),
                                                "' names file ", block.file(),
                                                " of ", files.size()));
      }
      int64_t unused = 0;
      if (target.entry->merge() == v1::WHOLE ||
          (Overlap(target.row_offset, target.rows, block.row_offset(),
                   block.rows(), &unused) > 0 &&
           Overlap(target.col_offset, target.cols, block.col_offset(),
                   block.cols(), &unused) > 0)) {
        reads[block.file()].emplace_back(&target, &block);
      }
    }
  }
  for (const auto& [file, pairs] : reads) {
    std::map<std::string, at::Tensor> loaded;
    if (file == 0 && preloaded != nullptr) {
      loaded = std::move(*preloaded);
    } else {
      absl::StatusOr<std::map<std::string, at::Tensor>> read =
          ReadCheckpointTensors(files[file]);
      if (!read.ok()) return read.status();
      loaded = *std::move(read);
      std::error_code error;
      *bytes_read += static_cast<int64_t>(fs::file_size(files[file], error));
    }
    try {
      at::NoGradGuard no_grad;
      for (const auto& [target, block] : pairs) {
        auto it = loaded.find(target->entry->key());
        if (it == loaded.end()) {
          return absl::DataLossError(
              absl::StrCat("'", files[file], "' lacks '", target->entry->key(),
                           "', which its manifest places there"));
        }
        if (absl::Status s = Apply(*block, it->second, *target); !s.ok()) {
          return absl::DataLossError(
              absl::StrCat("'", files[file], "': ", s.message()));
        }
      }
    } catch (const c10::Error& e) {
      if (IsOutOfMemory(e)) return TorchErrorStatus(e);
      return absl::DataLossError(
          absl::StrCat("'", files[file], "': ", e.what_without_backtrace()));
    }
  }
  for (Target& target : targets) {
    if (absl::Status s = Finish(target); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A checkpoint opened for reading: its manifest (synthesised for an old
// single file) and its files by manifest index.
struct OpenedCheckpoint {
  v1::CheckpointManifest manifest;
  std::vector<std::string> files;
  std::map<std::string, at::Tensor> legacy_tensors;  // old file, until read
};

absl::StatusOr<OpenedCheckpoint> OpenDirectory(const std::string& path) {
  OpenedCheckpoint opened;
  absl::StatusOr<v1::CheckpointManifest> manifest =
      ReadCheckpointManifest(path);
  if (!manifest.ok()) return manifest.status();
  if (absl::Status s = CheckCheckpointFiles(path, *manifest); !s.ok()) {
    return s;
  }
  opened.manifest = *std::move(manifest);
  for (const v1::CheckpointFile& file : opened.manifest.files()) {
    opened.files.push_back(absl::StrCat(path, "/", file.name()));
  }
  return opened;
}

// An old single file as a one-file checkpoint, its keys mapped to the
// model's tables ("sparse.<module path>.<table>.<state>").
absl::StatusOr<OpenedCheckpoint> OpenLegacy(const std::string& path,
                                            RecModel& model) {
  OpenedCheckpoint opened;
  absl::StatusOr<std::map<std::string, at::Tensor>> read =
      ReadCheckpointTensors(path);
  if (!read.ok()) return read.status();
  opened.legacy_tensors = *std::move(read);
  opened.files = {path};
  v1::CheckpointManifest& manifest = opened.manifest;
  manifest.set_world_size(1);
  std::map<std::string, at::Tensor>& tensors = opened.legacy_tensors;
  for (const char* meta : {"meta.step", "meta.examples"}) {
    if (tensors.count(meta) == 0 || tensors[meta].numel() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' has no '", meta,
                       "': it is not a checkpoint of this model"));
    }
  }
  manifest.set_step(tensors["meta.step"].item<int64_t>());
  manifest.set_examples(tensors["meta.examples"].item<int64_t>());
  // Global tables of the model: (module path, pooled, config).
  std::vector<std::pair<std::string, std::string>> prefixes;  // old, FQN
  std::map<std::string, std::pair<int64_t, int64_t>> shapes;  // by FQN
  auto add_module = [&](const std::string& module_path, bool pooled,
                        const std::vector<EmbeddingTableConfig>& tables) {
    for (const EmbeddingTableConfig& table : tables) {
      const std::string fqn = TableFqn(module_path, pooled, table.name);
      prefixes.emplace_back(
          absl::StrCat("sparse.", module_path, ".", table.name, "."), fqn);
      shapes[fqn] = {table.num_embeddings, table.embedding_dim};
    }
  };
  const std::vector<ShardedEmbeddingModule*> sharded = model.sharded_modules();
  for (ShardedEmbeddingModule* module : sharded) {
    add_module(module->path(), module->pooled(), module->tables());
  }
  if (sharded.empty()) {
    for (EmbeddingModule* module : model.embedding_modules()) {
      add_module(module->path(), module->pooled(), module->tables());
    }
  }
  for (const auto& [key, tensor] : tensors) {
    if (absl::StartsWith(key, "meta.")) continue;
    v1::CheckpointTensor* entry = nullptr;
    if (key == kDenseOptimizer) {
      entry = AddTensor(manifest, key, tensor, v1::WHOLE);
      entry->set_state(kDenseOptimizer);
    } else if (absl::StartsWith(key, "dense.")) {
      entry = AddTensor(manifest, key, tensor, v1::WHOLE);
      entry->set_parameter(key.substr(6));
    } else {
      for (const auto& [prefix, fqn] : prefixes) {
        if (!absl::StartsWith(key, prefix)) continue;
        const std::string state = key.substr(prefix.size());
        const auto [rows, cols] = shapes[fqn];
        entry = AddTensor(manifest, key, tensor, MergeOf(tensor, cols));
        entry->set_table(fqn);
        entry->set_state(state);
        AddBlock(*entry, 0, 0, rows, 0, cols);
        break;
      }
      if (entry == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", path, "' holds '", key, "', which this model does not have"));
      }
      continue;
    }
    AddBlock(*entry, 0, 0, 0, 0, 0);
  }
  return opened;
}

absl::StatusOr<OpenedCheckpoint> Open(const std::string& path,
                                      RecModel* model) {
  std::error_code error;
  if (fs::is_directory(path, error)) return OpenDirectory(path);
  if (error && error != std::errc::no_such_file_or_directory) {
    return absl::ErrnoToStatus(error.value(),
                               absl::StrCat("cannot stat '", path, "'"));
  }
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a checkpoint directory"));
  }
  return OpenLegacy(path, *model);
}

}  // namespace

absl::StatusOr<CheckpointInfo> LoadCheckpoint(
    const std::string& path, RecModel& model,
    torch::optim::Optimizer& dense_optimizer, ProcessGroup* group) {
  const absl::Time start = absl::Now();
  const int rank = group != nullptr ? group->rank() : 0;
  absl::StatusOr<OpenedCheckpoint> opened = Open(path, &model);
  if (!opened.ok()) return opened.status();
  const v1::CheckpointManifest& manifest = opened->manifest;
  std::map<std::pair<std::string, std::string>, const v1::CheckpointTensor*>
      states;  // by (table FQN, state)
  std::map<std::string, const v1::CheckpointTensor*> parameters;
  const v1::CheckpointTensor* optimizer = nullptr;
  std::vector<const v1::CheckpointTensor*> scaler;
  for (const v1::CheckpointTensor& entry : manifest.tensors()) {
    if (!entry.table().empty()) {
      states[{entry.table(), entry.state()}] = &entry;
    } else if (!entry.parameter().empty()) {
      parameters[entry.parameter()] = &entry;
    } else if (entry.state() == kDenseOptimizer) {
      optimizer = &entry;
    } else if (entry.state() == kGradScaler &&
               absl::StartsWith(entry.key(), kGradScalerPrefix)) {
      scaler.push_back(&entry);
    }
  }
  auto does_not_fit = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' does not fit the model: ", what));
  };

  std::vector<Target> targets;
  targets.reserve(manifest.tensors_size());
  // Dense parameters and the optimizer.
  std::vector<std::pair<at::Tensor, size_t>> dense;  // live, target
  for (const auto& item : model.dense().named_parameters()) {
    auto it = parameters.find(item.key());
    if (it == parameters.end()) {
      return does_not_fit(
          absl::StrCat("it has no dense parameter '", item.key(), "'"));
    }
    const std::vector<int64_t> shape(it->second->shape().begin(),
                                     it->second->shape().end());
    if (item.value().sizes() != c10::IntArrayRef(shape)) {
      return does_not_fit(absl::StrCat("dense parameter '", item.key(), "' is ",
                                       c10::str(c10::IntArrayRef(shape)),
                                       ", the model's is ",
                                       c10::str(item.value().sizes())));
    }
    dense.emplace_back(item.value(), targets.size());
    targets.emplace_back(it->second);
    parameters.erase(it);
  }
  if (!parameters.empty()) {
    return does_not_fit(absl::StrCat("it has dense parameter '",
                                     parameters.begin()->first,
                                     "', which the model does not"));
  }
  if (optimizer == nullptr) return does_not_fit("it has no dense optimizer");
  const size_t optimizer_target = targets.size();
  targets.emplace_back(optimizer);
  const size_t scaler_targets = targets.size();
  for (const v1::CheckpointTensor* entry : scaler) targets.emplace_back(entry);

  // Tables: every one of the checkpoint must be the model's, the same size.
  std::set<std::string> model_tables;
  auto add_tables = [&](const std::string& module_path, bool pooled,
                        const std::vector<EmbeddingTableConfig>& tables) {
    for (const EmbeddingTableConfig& table : tables) {
      const std::string fqn = TableFqn(module_path, pooled, table.name);
      model_tables.insert(fqn);
      auto it = states.find({fqn, "weight"});
      if (it == states.end()) {
        return does_not_fit(absl::StrCat("it has no table '", fqn, "'"));
      }
      const auto& shape = it->second->shape();
      if (shape.size() != 2 || shape[0] != table.num_embeddings ||
          shape[1] != table.embedding_dim) {
        return does_not_fit(
            absl::StrCat("table '", fqn, "' is [", absl::StrJoin(shape, ", "),
                         "], the model's [", table.num_embeddings, ", ",
                         table.embedding_dim, "]"));
      }
    }
    return absl::OkStatus();
  };
  const std::vector<ShardedEmbeddingModule*> sharded = model.sharded_modules();
  for (ShardedEmbeddingModule* module : sharded) {
    absl::Status s =
        add_tables(module->path(), module->pooled(), module->tables());
    if (!s.ok()) return s;
  }
  if (sharded.empty()) {
    for (EmbeddingModule* module : model.embedding_modules()) {
      absl::Status s =
          add_tables(module->path(), module->pooled(), module->tables());
      if (!s.ok()) return s;
    }
  }
  for (const auto& [key, entry] : states) {
    if (model_tables.count(key.first) == 0) {
      return does_not_fit(absl::StrCat("it has table '", key.first,
                                       "', which the model does not"));
    }
  }
  // This rank's shards, and what each module gets.
  std::map<EmbeddingModule*, std::vector<std::pair<std::string, size_t>>>
      module_states;  // per module: ("<table>.<state>", target)
  for (const LocalTable& table : LocalTables(model, rank)) {
    absl::StatusOr<std::map<std::string, at::Tensor>> live = LiveStates(table);
    if (!live.ok()) return live.status();
    std::set<std::string> saved_states;
    for (const char* state : kTableStates) {
      if (states.count({table.fqn, state}) > 0) saved_states.insert(state);
    }
    for (const auto& [state, tensor] : *live) {
      auto it = states.find({table.fqn, state});
      if (it == states.end()) {
        return does_not_fit(
            absl::StrCat("table '", table.fqn, "' has no optimizer state '",
                         state, "' there (another sparse optimizer?)"));
      }
      saved_states.erase(state);
      module_states[table.module].emplace_back(
          absl::StrCat(table.table, ".", state), targets.size());
      targets.emplace_back(it->second, table.row_offset, table.local_rows,
                           table.col_offset, table.cols);
    }
    if (!saved_states.empty()) {
      return does_not_fit(absl::StrCat(
          "table '", table.fqn, "' has optimizer state '",
          *saved_states.begin(),
          "' there, which the model's sparse optimizer does not keep"));
    }
  }

  CheckpointInfo info;
  info.path = path;
  info.step = manifest.step();
  info.examples = manifest.examples();
  if (absl::Status s = Fill(
          opened->files, targets, &info.bytes,
          opened->legacy_tensors.empty() ? nullptr : &opened->legacy_tensors);
      !s.ok()) {
    return s;
  }
  try {
    at::NoGradGuard no_grad;
    for (auto& [live, target] : dense) live.copy_(targets[target].out);
    at::Tensor state_bytes =
        targets[optimizer_target].out.to(at::kCPU).contiguous();
    std::istringstream stream(std::string(
        static_cast<const char*>(state_bytes.data_ptr()), state_bytes.numel()));
    torch::serialize::InputArchive archive;
    archive.load_from(stream, model.device());
    dense_optimizer.load(archive);
  } catch (const c10::Error& e) {
    if (IsOutOfMemory(e)) return TorchErrorStatus(e);
    return does_not_fit(e.what_without_backtrace());
  }
  for (size_t i = 0; i < scaler.size(); ++i) {
    info.gradient_scaler_state.emplace_back(
        scaler[i]->key().substr(kGradScalerPrefix.size()),
        targets[scaler_targets + i].out);
  }
  for (auto& [module, names] : module_states) {
    std::vector<std::pair<std::string, at::Tensor>> loaded;
    for (auto& [name, target] : names) {
      loaded.emplace_back(name, targets[target].out);
    }
    if (absl::Status s = module->LoadStateTensors(loaded); !s.ok()) {
      return does_not_fit(std::string(s.message()));
    }
  }
  info.elapsed = absl::Now() - start;
  return info;
}

absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& path) {
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    // An old single file: tables named "<module path>.<table>".
    absl::StatusOr<std::map<std::string, at::Tensor>> tensors =
        ReadCheckpointTensors(path);
    if (!tensors.ok()) return tensors.status();
    CheckpointModel model;
    constexpr absl::string_view kSparse = "sparse.", kWeight = ".weight",
                                kDense = "dense.";
    for (auto& [key, tensor] : *tensors) {
      const bool table =
          absl::StartsWith(key, kSparse) && absl::EndsWith(key, kWeight);
      // What a reader's item() and size(1) need, or it would throw.
      if ((key == "meta.step" && tensor.numel() != 1) ||
          (table && tensor.dim() != 2)) {
        return absl::DataLossError(absl::StrCat("'", path, "': '", key, "' is ",
                                                c10::str(tensor.sizes())));
      }
      if (key == "meta.step") model.step = tensor.item<int64_t>();
      if (absl::StartsWith(key, kDense)) {
        model.dense[key.substr(kDense.size())] = tensor;
      } else if (table) {
        model.tables[key.substr(kSparse.size(), key.size() - kSparse.size() -
                                                    kWeight.size())] = tensor;
      }
    }
    if (model.step < 0) {
      return absl::DataLossError(absl::StrCat("'", path, "' has no meta.step"));
    }
    return model;
  }
  absl::StatusOr<OpenedCheckpoint> opened = Open(path, nullptr);
  if (!opened.ok()) return opened.status();
  std::vector<Target> targets;
  for (const v1::CheckpointTensor& entry : opened->manifest.tensors()) {
    if (!entry.parameter().empty()) {
      targets.emplace_back(&entry);
    } else if (!entry.table().empty() && entry.state() == "weight") {
      if (entry.shape_size() != 2) {
        return absl::DataLossError(absl::StrCat(
            "'", path, "': table '", entry.table(), "' is not 2-dimensional"));
      }
      targets.emplace_back(&entry, 0, entry.shape(0), 0, entry.shape(1));
    }
  }
  int64_t bytes = 0;
  if (absl::Status s = Fill(opened->files, targets, &bytes); !s.ok()) return s;
  CheckpointModel model;
  model.step = opened->manifest.step();
  for (Target& target : targets) {
    if (!target.entry->parameter().empty()) {
      model.dense[target.entry->parameter()] = target.out;
    } else {
      model.tables[target.entry->table()] = target.out;
    }
  }
  return model;
}

}  // namespace deltastream
