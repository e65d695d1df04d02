#include "trainer/checkpoint.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_io.h"
#include "base/zip_checksums.h"

namespace deltastream {
namespace {

constexpr char kPrefix[] = "checkpoint-";
constexpr char kSuffix[] = ".pt";

std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (CheckpointStep(entry.path().string()).has_value()) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());  // fixed-width steps sort in order
  return files;
}

}  // namespace

absl::StatusOr<CheckpointInfo> SaveCheckpoint(
    const std::string& dir, int64_t step, int64_t examples, RecModel& model,
    torch::optim::Optimizer& dense_optimizer, int64_t keep) {
  const absl::Time start = absl::Now();
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create '", dir, "': ", error.message()));
  }
  CheckpointInfo info;
  info.step = step;
  info.examples = examples;
  info.path = absl::StrFormat("%s/%s%012d%s", dir, kPrefix, step, kSuffix);
  std::vector<char> bytes;
  try {
    c10::Dict<std::string, at::Tensor> tensors;
    tensors.insert("meta.step", at::scalar_tensor(step, at::kLong));
    tensors.insert("meta.examples", at::scalar_tensor(examples, at::kLong));
    for (const auto& item : model.dense().named_parameters()) {
      tensors.insert("dense." + item.key(), item.value().detach().cpu());
    }
    torch::serialize::OutputArchive archive;
    dense_optimizer.save(archive);
    std::ostringstream optimizer_bytes;
    archive.save_to(optimizer_bytes);
    const std::string state = optimizer_bytes.str();
    tensors.insert(
        "dense_optimizer",
        at::from_blob(const_cast<char*>(state.data()),
                      {static_cast<int64_t>(state.size())}, at::kByte)
            .clone());
    for (EmbeddingModule* module : model.embedding_modules()) {
      for (const auto& [name, tensor] : module->StateTensors()) {
        tensors.insert(absl::StrCat("sparse.", module->path(), ".", name),
                       tensor.cpu());
      }
    }
    bytes = torch::pickle_save(tensors);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("checkpoint of step ", step, ": ",
                                            e.what_without_backtrace()));
  }
  if (absl::Status status = WriteFileDurably(
          info.path, absl::string_view(bytes.data(), bytes.size()));
      !status.ok()) {
    return status;
  }
  info.bytes = static_cast<int64_t>(bytes.size());
  std::vector<std::string> files = CheckpointFiles(dir);
  for (size_t i = 0; i + keep < files.size(); ++i) {
    std::filesystem::remove(files[i], error);
  }
  info.elapsed = absl::Now() - start;
  return info;
}

std::optional<int64_t> CheckpointStep(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  const size_t prefix = sizeof(kPrefix) - 1, suffix = sizeof(kSuffix) - 1;
  if (name.size() <= prefix + suffix || name.rfind(kPrefix, 0) != 0 ||
      name.compare(name.size() - suffix, suffix, kSuffix) != 0) {
    return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(name.substr(prefix, name.size() - prefix - suffix),
                        &step)) {
    return std::nullopt;
  }
  return step;
}

std::optional<std::string> LatestCheckpoint(const std::string& dir) {
  std::vector<std::string> files = CheckpointFiles(dir);
  if (files.empty()) return std::nullopt;
  return files.back();
}

absl::StatusOr<std::map<std::string, at::Tensor>> ReadCheckpointTensors(
    const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  }
  std::vector<char> bytes;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) {
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  std::fclose(file);

  // torch::pickle_load does not check the archive's CRCs: a flipped byte in
  // a table would load as a wrong value.
  if (absl::Status s = VerifyZipChecksums(
          absl::string_view(bytes.data(), bytes.size()), path);
      !s.ok()) {
    return s;
  }
  std::map<std::string, at::Tensor> tensors;
  try {
    c10::IValue loaded = torch::pickle_load(bytes);
    for (const auto& entry : loaded.toGenericDict()) {
      tensors[entry.key().toStringRef()] = entry.value().toTensor();
    }
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(
        "'", path,
        "' is not a readable checkpoint: ", e.what_without_backtrace()));
  }
  return tensors;
}

std::string CheckpointTableName(absl::string_view fqn) {
  std::string name(fqn);
  for (const std::string part : {".embedding_bags.", ".embeddings."}) {
    const size_t at = name.find(part);
    if (at != std::string::npos) return name.replace(at, part.size(), ".");
  }
  return name;
}

absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& path) {
  absl::StatusOr<std::map<std::string, at::Tensor>> tensors =
      ReadCheckpointTensors(path);
  if (!tensors.ok()) return tensors.status();
  CheckpointModel model;
  constexpr absl::string_view kSparse = "sparse.", kWeight = ".weight",
                              kDense = "dense.";
  for (auto& [key, tensor] : *tensors) {
    if (key == "meta.step") model.step = tensor.item<int64_t>();
    if (absl::StartsWith(key, kDense)) {
      model.dense[key.substr(kDense.size())] = tensor;
    } else if (absl::StartsWith(key, kSparse) && absl::EndsWith(key, kWeight)) {
      model.tables[key.substr(kSparse.size(), key.size() - kSparse.size() -
                                                  kWeight.size())] = tensor;
    }
  }
  if (model.step < 0) {
    return absl::DataLossError(absl::StrCat("'", path, "' has no meta.step"));
  }
  return model;
}

absl::StatusOr<CheckpointInfo> LoadCheckpoint(
    const std::string& path, RecModel& model,
    torch::optim::Optimizer& dense_optimizer) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::map<std::string, at::Tensor>> read =
      ReadCheckpointTensors(path);
  if (!read.ok()) return read.status();
  std::map<std::string, at::Tensor>& tensors = *read;
  auto take = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' has no '", name,
                       "': it is not a checkpoint of this model"));
    }
    at::Tensor tensor = it->second;
    tensors.erase(it);
    return tensor;
  };

  CheckpointInfo info;
  info.path = path;
  absl::StatusOr<at::Tensor> step = take("meta.step");
  if (!step.ok()) return step.status();
  absl::StatusOr<at::Tensor> examples = take("meta.examples");
  if (!examples.ok()) return examples.status();
  info.step = step->item<int64_t>();
  info.examples = examples->item<int64_t>();
  try {
    torch::NoGradGuard no_grad;
    for (auto& item : model.dense().named_parameters()) {
      absl::StatusOr<at::Tensor> saved = take("dense." + item.key());
      if (!saved.ok()) return saved.status();
      if (saved->sizes() != item.value().sizes()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", path, "': dense.", item.key(), " is ",
                         c10::str(saved->sizes()), ", the model's is ",
                         c10::str(item.value().sizes())));
      }
      item.value().copy_(*saved);
    }
    absl::StatusOr<at::Tensor> optimizer_state = take("dense_optimizer");
    if (!optimizer_state.ok()) return optimizer_state.status();
    at::Tensor state_bytes = optimizer_state->contiguous();
    std::istringstream stream(std::string(
        static_cast<const char*>(state_bytes.data_ptr()), state_bytes.numel()));
    torch::serialize::InputArchive archive;
    archive.load_from(stream, model.device());
    dense_optimizer.load(archive);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' does not fit the model: ", e.what_without_backtrace()));
  }
  for (EmbeddingModule* module : model.embedding_modules()) {
    std::vector<std::pair<std::string, at::Tensor>> states;
    for (const auto& [name, live] : module->StateTensors()) {
      absl::StatusOr<at::Tensor> saved =
          take(absl::StrCat("sparse.", module->path(), ".", name));
      if (!saved.ok()) return saved.status();
      states.emplace_back(name, *saved);
    }
    if (absl::Status status = module->LoadStateTensors(states); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "': ", status.message()));
    }
  }
  if (!tensors.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' holds '", tensors.begin()->first,
                     "', which this model does not have"));
  }
  std::error_code error;
  info.bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  info.elapsed = absl::Now() - start;
  return info;
}

}  // namespace deltastream
