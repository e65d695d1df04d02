#include "trainer/checkpoint_format.h"

#include <caffe2/serialize/inline_container.h>
#include <google/protobuf/util/json_util.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <filesystem>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"
#include "trainer/sharding/sharding_plan.h"

namespace deltastream {

std::string CheckpointDirName(int64_t step) {
  return absl::StrFormat("checkpoint-%012d", step);
}

std::string LegacyCheckpointFileName(int64_t step) {
  return absl::StrCat(CheckpointDirName(step), ".pt");
}

std::string CheckpointRankFileName(int rank, int world_size) {
  return absl::StrFormat("rank-%05d-of-%05d.pt", rank, world_size);
}

absl::StatusOr<std::string> PickleTensorDict(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  try {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
    for (const auto& [key, tensor] : tensors) {
      dict.insert_or_assign(key, tensor.detach().cpu());
    }
    // No type tags (tag_aggregates = false): torch::pickle_save tags typed
    // dicts with torch.jit._pickle.restore_type_tag, which
    // torch.load(weights_only=True) refuses.
    std::vector<char> pickle;
    torch::jit::Pickler pickler(
        [&](const char* bytes, size_t n) {
          pickle.insert(pickle.end(), bytes, bytes + n);
        },
        /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
        /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
        /*tag_aggregates=*/false);
    pickler.protocol();
    pickler.pushIValue(dict);
    pickler.stop();
    std::string container;
    {
      caffe2::serialize::PyTorchStreamWriter writer(
          [&](const void* bytes, size_t n) -> size_t {
            container.append(static_cast<const char*>(bytes), n);
            return n;
          });
      torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(),
                                         pickler.tensorData(), writer);
      writer.writeEndOfFile();
    }
    return container;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("pickling tensors: ", e.what_without_backtrace()));
  }
}

std::string DtypeName(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kByte:
      return "uint8";
    default:
      return c10::toString(tensor.scalar_type());
  }
}

absl::Status WriteCheckpointManifest(const std::string& checkpoint_dir,
                                     const v1::CheckpointManifest& manifest) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (auto status =
          google::protobuf::util::MessageToJsonString(manifest, &json, options);
      !status.ok()) {
    return absl::InternalError(
        absl::StrCat("manifest of '", checkpoint_dir,
                     "' as JSON: ", std::string(status.message())));
  }
  return WriteFileDurably(
      absl::StrCat(checkpoint_dir, "/", kCheckpointManifestName), json);
}

namespace {

// The first problem of `tensor`'s blocks for its merge rule, "" when none:
// TILE blocks tile its 2-D shape exactly, so that counting the elements
// they fill proves every element filled (a block listed twice and another
// not at all would leave memory unwritten); COLUMN_MEAN blocks lie inside
// its rows and do not overlap in rows x table columns, so that no block
// weighs twice in a mean.
std::string ManifestBlocksProblem(const v1::CheckpointTensor& tensor) {
  if (tensor.merge() != v1::TILE && tensor.merge() != v1::COLUMN_MEAN) {
    return "";
  }
  const std::string what = absl::StrCat("'", tensor.key(), "'");
  if (tensor.shape_size() != 2 || tensor.shape(0) < 1 || tensor.shape(1) < 1 ||
      (tensor.merge() == v1::COLUMN_MEAN && tensor.shape(1) != 1)) {
    return absl::StrCat(what, " has the shape [",
                        absl::StrJoin(tensor.shape(), ", "), "]");
  }
  std::vector<TensorBlock> blocks;
  for (const v1::CheckpointBlock& block : tensor.blocks()) {
    blocks.push_back(
        {block.row_offset(), block.rows(), block.col_offset(), block.cols()});
  }
  if (tensor.merge() == v1::TILE) {
    return BlocksProblem(blocks, tensor.shape(0), tensor.shape(1),
                         /*cover=*/true, what, "block");
  }
  return BlocksProblem(blocks, tensor.shape(0),
                       std::numeric_limits<int64_t>::max(),
                       /*cover=*/false, what, "block");
}

}  // namespace

absl::StatusOr<v1::CheckpointManifest> ReadCheckpointManifest(
    const std::string& checkpoint_dir) {
  const std::string path =
      absl::StrCat(checkpoint_dir, "/", kCheckpointManifestName);
  absl::StatusOr<std::string> json = ReadSmallFile(path);
  if (!json.ok()) return json.status();
  v1::CheckpointManifest manifest;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (auto status = google::protobuf::util::JsonStringToMessage(
          *json, &manifest, options);
      !status.ok()) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is not a manifest: ", std::string(status.message())));
  }
  if (manifest.format_version() != kCheckpointFormatVersion ||
      manifest.world_size() < 1 ||
      manifest.files_size() != manifest.world_size()) {
    return absl::DataLossError(
        absl::StrCat("'", path, "': format version ", manifest.format_version(),
                     " with ", manifest.files_size(), " files for world size ",
                     manifest.world_size(), " (this code reads version ",
                     kCheckpointFormatVersion, ", one file per rank)"));
  }
  for (const v1::CheckpointFile& file : manifest.files()) {
    if (file.name().empty() || file.name().find('/') != std::string::npos ||
        file.name()[0] == '.') {
      return absl::DataLossError(
          absl::StrCat("'", path, "' names the file '", file.name(), "'"));
    }
  }
  for (const v1::CheckpointTensor& tensor : manifest.tensors()) {
    if (std::string problem = ManifestBlocksProblem(tensor); !problem.empty()) {
      return absl::DataLossError(absl::StrCat("'", path, "': ", problem));
    }
  }
  return manifest;
}

absl::Status CheckCheckpointFiles(const std::string& checkpoint_dir,
                                  const v1::CheckpointManifest& manifest) {
  for (const v1::CheckpointFile& file : manifest.files()) {
    const std::string path = absl::StrCat(checkpoint_dir, "/", file.name());
    std::error_code error;
    const uintmax_t bytes = std::filesystem::file_size(path, error);
    if (error == std::errc::no_such_file_or_directory) {
      return absl::DataLossError(absl::StrCat("checkpoint '", checkpoint_dir,
                                              "' lacks '", file.name(), "'"));
    }
    if (error) {
      return absl::ErrnoToStatus(error.value(),
                                 absl::StrCat("cannot stat '", path, "'"));
    }
    if (static_cast<int64_t>(bytes) != file.bytes()) {
      return absl::DataLossError(absl::StrCat("'", path, "' has ", bytes,
                                              " bytes, its manifest says ",
                                              file.bytes()));
    }
  }
  return absl::OkStatus();
}

}  // namespace deltastream
