#ifndef DELTASTREAM_TRAINER_PLANNER_PROPOSERS_H_
#define DELTASTREAM_TRAINER_PLANNER_PROPOSERS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/planner/sharding_option.h"
#include "trainer/planner/topology.h"

namespace deltastream::planner {

// One choice per table: an index into that table's options.
using Proposal = std::vector<int>;
// Per table, its sharding options (EnumerateOptions).
using OptionsByTable = std::vector<std::vector<ShardingOption>>;

// Proposes plans one at a time (TorchRec's Proposer): Load, then Propose
// and Feedback in turns until Propose returns nothing. Not thread-safe; the
// options passed to Load must outlive the proposer's use.
class Proposer {
 public:
  virtual ~Proposer() = default;
  // "dp", "greedy" or "uniform".
  virtual absl::string_view name() const = 0;
  // `usable` is one rank's storage left to the tables (every rank alike).
  virtual void Load(const OptionsByTable& options, const Topology& topology,
                    const Storage& usable) = 0;
  // The next proposal; nullopt when there is none left.
  virtual std::optional<Proposal> Propose() = 0;
  // Whether the last proposal could be placed on the ranks.
  virtual void Feedback(bool partitionable) = 0;
  // False when Feedback changes nothing but moving to the next proposal:
  // the proposals can then be tried in any order.
  virtual bool uses_feedback() const { return false; }
  // Proposers that ignore feedback: from now on, propose what is left in
  // order of total cost (the sum of the options' costs), the cheapest first
  // (ties keep their order). Others: no effect.
  virtual void OrderByTotalCost() {}
};

// TorchRec's GreedyProposer: each table starts at its cheapest option
// (by total cost); after each proposal that did not fit, the table whose
// current option uses the most storage (HBM, then DDR) moves to its next
// cheapest option. Stops at the first proposal that fits, or when no table
// can move.
std::unique_ptr<Proposer> MakeGreedyProposer();

// TorchRec's UniformProposer: one proposal per sharding type that every
// table allows, each table at its cheapest option of that type.
std::unique_ptr<Proposer> MakeUniformProposer();

// The dynamic-programming proposer of TorchEasyRec (seed 003): the
// cheapest total cost for every total storage of the ranks' device memory
// (HBM on GPUs, DDR on CPUs: where every table lives), the storage of all
// ranks discretized into `bins_per_device` bins per rank (fewer when tables
// x bins would pass 256 MiB of backtracking); proposes the plan of every
// final state, from the largest total storage down.
std::unique_ptr<Proposer> MakeDynamicProgrammingProposer(
    int bins_per_device = 100);

// "dp", "greedy" or "uniform"; InvalidArgument otherwise.
absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(absl::string_view name);

// The dynamic program itself, on plain numbers (for the proposer and its
// tests). items[t][j]: option j of table t, using `bytes` at `cost`. A
// selection is feasible when its total bytes < budget. The budget is cut
// into `bins` bins; a state per bin keeps the cheapest selection reaching
// it (its exact storage, not the bin's). Memory: one byte per table and
// bin. Immutable once built: safe to read from several threads.
struct DpItem {
  int64_t bytes = 0;
  double cost = 0;
};
class DynamicProgram {
 public:
  // Solves at once; at most 255 options per table are considered.
  DynamicProgram(std::vector<std::vector<DpItem>> items, int64_t budget,
                 int bins);

  // A reachable final state: the totals of the cheapest selection of its
  // bin.
  struct Final {
    int64_t bytes = 0;
    double cost = 0;
  };
  // Every final state, from the highest bin down; empty when nothing is
  // feasible.
  const std::vector<Final>& finals() const { return finals_; }
  // The selection that reaches `final` (one of finals()), by backtracking.
  Proposal Selection(const Final& final) const;

 private:
  int64_t BinOf(int64_t bytes) const;

  std::vector<std::vector<DpItem>> items_;
  int64_t budget_;
  int bins_;
  double per_byte_;  // bins per byte
  // choice_[t * bins_ + b]: the option of table t on the way to bin b.
  std::vector<uint8_t> choice_;
  std::vector<Final> finals_;
};

// Every final state's selection, in finals() order.
std::vector<Proposal> DynamicProgrammingSelections(
    const std::vector<std::vector<DpItem>>& items, int64_t budget, int bins);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_PROPOSERS_H_
