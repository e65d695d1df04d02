// Test data for tests/python/checkpoint_chain_test.py, through the project's
// own C++ chain code (store/checkpoint_chain.h):
//
//   chain_tool write DIR      writes a chain with the C++ writer: a full link
//                             [0, 10) and increments [10, 20) and [20, 25)
//                             over tables of every dtype (and an empty one),
//                             with dense parameters, in small chunks (many
//                             records per tensor)
//   chain_tool load DIR OUT   LoadChain(DIR) (the trainer's restore) as a
//                             .npz: "<fqn>/ids", "<fqn>/values",
//                             "dense/<name>", "chain/end_batch",
//                             "chain/dense_batch"
//
// Exit 0 on success, 1 with one line on stderr on failure, 2 for bad usage.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "clients/npz_file.h"
#include "store/checkpoint_chain.h"

namespace deltastream {
namespace {

// Values exactly representable in every dtype the format has (bfloat16 has
// 8 significant bits): (id % 16) / 2 + column + link.
at::Tensor Rows(const at::Tensor& ids, int64_t dim, int link,
                at::ScalarType dtype) {
  at::Tensor base = (ids.remainder(16).to(at::kFloat) / 2).unsqueeze(1);
  at::Tensor columns = at::arange(dim, at::kFloat).unsqueeze(0);
  return (base + columns + link).to(dtype);
}

ChainTable Table(at::Tensor ids, int64_t dim, int link, at::ScalarType dtype) {
  return {ids, Rows(ids, dim, link, dtype)};
}

// A link of batches [start, end) served by run `run_id` (started at
// `run_start`), without tables yet.
ChainLinkContent Link(bool full, int64_t start, int64_t end,
                      const std::string& run_id, int64_t run_start = 0) {
  ChainLinkContent link;
  link.full = full;
  link.start_batch = start;
  link.end_batch = end;
  link.consumer = "chain_tool";
  link.run_id = run_id;
  link.run_start_batch = run_start;
  return link;
}

absl::Status Write(const std::string& dir) {
  ChainLinkContent full = Link(true, 0, 10, "run-1");
  full.tables["m.f32"] = Table(at::arange(0, 50, at::kLong), 4, 0, at::kFloat);
  full.tables["m.f16"] =
      Table(at::arange(0, 30, at::kLong) * 3, 3, 0, at::kHalf);
  full.tables["m.bf16"] =
      Table(at::arange(5, 25, at::kLong), 2, 0, at::kBFloat16);
  full.tables["m.f64"] =
      Table(at::arange(0, 8, at::kLong) * 1000003, 5, 0, at::kDouble);
  full.tables["m.empty"] = {at::empty({0}, at::kLong),
                            at::empty({0, 4}, at::kFloat)};
  full.dense = {{"mlp.weight", at::arange(6, at::kFloat).reshape({3, 2})},
                {"mlp.bias", at::ones({2}, at::kFloat)}};
  full.dense_batch = 10;

  // Replaces rows 40..59 of m.f32 (20 new), adds rows to the empty table.
  ChainLinkContent second = Link(false, 10, 20, "run-1");
  second.tables["m.f32"] =
      Table(at::arange(40, 60, at::kLong), 4, 1, at::kFloat);
  second.tables["m.bf16"] =
      Table(at::tensor({int64_t{1}, int64_t{7}}), 2, 1, at::kBFloat16);
  second.tables["m.empty"] =
      Table(at::tensor({int64_t{-3}, int64_t{9}}), 4, 1, at::kFloat);

  // A new run; a table with no rows; new dense parameters.
  ChainLinkContent third = Link(false, 20, 25, "run-2", 20);
  third.tables["m.f16"] = Table(
      at::tensor({int64_t{0}, int64_t{3}, int64_t{100}}), 3, 2, at::kHalf);
  third.tables["m.f32"] = {at::empty({0}, at::kLong),
                           at::empty({0, 4}, at::kFloat)};
  third.dense = {{"mlp.weight", at::full({3, 2}, 7.0f)},
                 {"mlp.bias", at::zeros({2}, at::kFloat)}};
  third.dense_batch = 25;

  ChainWriteOptions small;
  small.chunk_bytes = 40;  // a few rows per record
  for (const ChainLinkContent* link : {&full, &second, &third}) {
    absl::StatusOr<ChainLink> written =
        WriteChainLinkContent(dir, *link, small);
    if (!written.ok()) return written.status();
  }
  return absl::OkStatus();
}

absl::Status Load(const std::string& dir, const std::string& out) {
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  if (!loaded.ok()) return loaded.status();
  std::vector<std::pair<std::string, at::Tensor>> arrays;
  for (const auto& [fqn, table] : loaded->tables) {
    arrays.emplace_back(fqn + "/ids", table.ids);
    arrays.emplace_back(fqn + "/values", table.values);
  }
  for (const auto& [name, tensor] : loaded->dense) {
    arrays.emplace_back("dense/" + name, tensor);
  }
  arrays.emplace_back("chain/end_batch",
                      at::scalar_tensor(loaded->end_batch, at::kLong));
  arrays.emplace_back("chain/dense_batch",
                      at::scalar_tensor(loaded->dense_batch, at::kLong));
  return WriteNpz(out, arrays);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  absl::Status status;
  if (command == "write" && argc == 3) {
    status = deltastream::Write(argv[2]);
  } else if (command == "load" && argc == 4) {
    status = deltastream::Load(argv[2], argv[3]);
  } else {
    std::fprintf(stderr, "usage: chain_tool write DIR | load DIR OUT.npz\n");
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "chain_tool: %s\n",
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
