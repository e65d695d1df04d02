#include "trainer/models/architecture_rule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltastream {

absl::Status ValidateArchitecture(int64_t num_dense,
                                  const std::vector<int64_t>& dense_arch,
                                  const std::vector<int64_t>& over_arch,
                                  const std::vector<TableShape>& tables) {
  if (num_dense < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_dense must be >= 1, got ", num_dense));
  }
  for (const auto* arch : {&dense_arch, &over_arch}) {
    if (arch->empty() || std::any_of(arch->begin(), arch->end(),
                                     [](int64_t w) { return w <= 0; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          arch == &dense_arch ? "dense_arch" : "over_arch",
          " needs positive widths, got [", absl::StrJoin(*arch, ", "), "]"));
    }
  }
  if (over_arch.back() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("over_arch must end in 1 (the logit), got [",
                     absl::StrJoin(over_arch, ", "), "]"));
  }
  if (tables.empty()) return absl::InvalidArgumentError("no tables");
  for (const TableShape& table : tables) {
    if (table.dim != dense_arch.back()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table.name, "' has dim ", table.dim,
                       " but dense_arch ends in ", dense_arch.back(),
                       ": the interaction needs one dim"));
    }
  }
  return absl::OkStatus();
}

}  // namespace deltastream
