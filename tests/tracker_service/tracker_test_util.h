#ifndef DELTASTREAM_TESTS_TRACKER_SERVICE_TRACKER_TEST_UTIL_H_
#define DELTASTREAM_TESTS_TRACKER_SERVICE_TRACKER_TEST_UTIL_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/tensor_values.h"
#include "tracker_service/live_rows_reader.h"

namespace deltastream {

// The tracker tests' names for tests/testing/tensor_values.h's helpers.
inline std::vector<int64_t> ToIds(const at::Tensor& t) { return Longs(t); }
inline std::vector<float> ToFloats(const at::Tensor& t) { return Floats(t); }

// Live rows held in plain tensors: the part of a trainer the tracker reads.
// Tests change rows as an optimizer would.
class TensorRowsReader : public LiveRowsReader {
 public:
  void SetTable(const std::string& fqn, at::Tensor embeddings,
                at::Tensor optimizer_states = at::Tensor()) {
    embeddings_[fqn] = embeddings;
    optimizer_states_[fqn] = optimizer_states;
  }
  at::Tensor& embeddings(const std::string& fqn) { return embeddings_[fqn]; }
  at::Tensor& optimizer_states(const std::string& fqn) {
    return optimizer_states_[fqn];
  }

  absl::StatusOr<int64_t> NumRows(absl::string_view fqn) override {
    auto it = embeddings_.find(std::string(fqn));
    if (it == embeddings_.end() || !it->second.defined()) {
      return absl::NotFoundError(absl::StrCat("no table '", fqn, "'"));
    }
    return it->second.size(0);
  }
  absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                            const at::Tensor& ids) override {
    return Read(embeddings_, fqn, ids);
  }
  void SetDense(std::vector<std::pair<std::string, at::Tensor>> dense) {
    dense_ = std::move(dense);
  }
  absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> ReadDense()
      override {
    if (dense_.empty()) return LiveRowsReader::ReadDense();
    std::vector<std::pair<std::string, at::Tensor>> copies;
    for (const auto& [name, tensor] : dense_) {
      copies.emplace_back(name, tensor.clone());
    }
    return copies;
  }
  absl::StatusOr<at::Tensor> ReadOptimizerStates(
      absl::string_view fqn, const at::Tensor& ids) override {
    return Read(optimizer_states_, fqn, ids);
  }

 private:
  static absl::StatusOr<at::Tensor> Read(
      const std::map<std::string, at::Tensor>& tables, absl::string_view fqn,
      const at::Tensor& ids) {
    auto it = tables.find(std::string(fqn));
    if (it == tables.end() || !it->second.defined()) {
      return absl::NotFoundError(absl::StrCat("no table '", fqn, "'"));
    }
    if (ids.numel() > 0 && ids.max().item<int64_t>() >= it->second.size(0)) {
      return absl::InvalidArgumentError("ID out of range");
    }
    return it->second.index_select(0, ids).clone();
  }
  std::map<std::string, at::Tensor> embeddings_;
  std::map<std::string, at::Tensor> optimizer_states_;
  std::vector<std::pair<std::string, at::Tensor>> dense_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRACKER_SERVICE_TRACKER_TEST_UTIL_H_
