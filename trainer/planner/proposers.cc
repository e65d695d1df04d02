#include "trainer/planner/proposers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deltastream::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Option indices of one table ordered by `less`.
template <typename Less>
std::vector<int> SortedIndices(const std::vector<ShardingOption>& options,
                               Less less) {
  std::vector<int> order(options.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return less(options[a], options[b]); });
  return order;
}

class GreedyProposer : public Proposer {
 public:
  absl::string_view name() const override { return "greedy"; }

  void Load(const OptionsByTable& options, const Topology&,
            const Storage&) override {
    options_ = &options;
    by_cost_.clear();
    for (const std::vector<ShardingOption>& table : options) {
      by_cost_.push_back(SortedIndices(
          table, [](const ShardingOption& a, const ShardingOption& b) {
            return a.total_cost < b.total_cost;
          }));
    }
    position_.assign(options.size(), 0);
    done_ = options.empty();
  }

  std::optional<Proposal> Propose() override {
    if (done_) return std::nullopt;
    Proposal proposal(position_.size());
    for (size_t t = 0; t < position_.size(); ++t) {
      proposal[t] = by_cost_[t][position_[t]];
    }
    return proposal;
  }

  bool uses_feedback() const override { return true; }

  void Feedback(bool partitionable) override {
    if (partitionable) {
      done_ = true;
      return;
    }
    int largest = -1;
    Storage most{-1, -1};
    for (size_t t = 0; t < position_.size(); ++t) {
      if (position_[t] + 1 >= static_cast<int>(by_cost_[t].size())) continue;
      const Storage& storage =
          (*options_)[t][by_cost_[t][position_[t]]].total_storage;
      if (std::make_pair(storage.hbm, storage.ddr) >
          std::make_pair(most.hbm, most.ddr)) {
        most = storage;
        largest = static_cast<int>(t);
      }
    }
    if (largest < 0) {
      done_ = true;
    } else {
      ++position_[largest];
    }
  }

 private:
  const OptionsByTable* options_ = nullptr;
  std::vector<std::vector<int>> by_cost_;
  std::vector<int> position_;
  bool done_ = true;
};

class UniformProposer : public Proposer {
 public:
  absl::string_view name() const override { return "uniform"; }

  void Load(const OptionsByTable& options, const Topology&,
            const Storage&) override {
    proposals_.clear();
    next_ = 0;
    if (options.empty()) return;
    for (v1::ShardingType type : kShardingTypes) {
      Proposal proposal(options.size(), -1);
      bool every_table = true;
      for (size_t t = 0; t < options.size() && every_table; ++t) {
        for (size_t j = 0; j < options[t].size(); ++j) {
          const ShardingOption& option = options[t][j];
          if (option.type != type) continue;
          if (proposal[t] < 0 ||
              option.total_cost < options[t][proposal[t]].total_cost) {
            proposal[t] = static_cast<int>(j);
          }
        }
        every_table = proposal[t] >= 0;
      }
      if (every_table) proposals_.push_back(std::move(proposal));
    }
  }

  std::optional<Proposal> Propose() override {
    if (next_ >= proposals_.size()) return std::nullopt;
    return proposals_[next_];
  }

  void Feedback(bool) override { ++next_; }

 private:
  std::vector<Proposal> proposals_;
  size_t next_ = 0;
};

class DynamicProgrammingProposer : public Proposer {
 public:
  DynamicProgrammingProposer(int bins_per_device, int64_t max_cells_2d)
      : bins_per_device_(std::max(bins_per_device, 1)),
        max_cells_2d_(std::max<int64_t>(max_cells_2d, 1)) {}

  absl::string_view name() const override { return "dp"; }

  void Load(const OptionsByTable& options, const Topology& topology,
            const Storage& usable) override {
    proposals_.clear();
    next_ = 0;
    if (options.empty()) return;
    bool uses_ddr_too = false;
    std::vector<std::vector<DpItem>> items(options.size());
    for (size_t t = 0; t < options.size(); ++t) {
      for (const ShardingOption& option : options[t]) {
        items[t].push_back(DpItem{option.total_storage.hbm,
                                  option.total_storage.ddr, option.total_cost});
        uses_ddr_too |=
            option.total_storage.hbm > 0 && option.total_storage.ddr > 0;
      }
    }
    const int64_t world = topology.world_size;
    const int64_t bins = bins_per_device_ * world;
    // Budgets are exclusive: a selection may use up to every rank's
    // usable storage.
    const int64_t hbm_budget = usable.hbm * world + 1;
    const int64_t ddr_budget = usable.ddr * world + 1;
    if (!topology.gpu) {
      // Everything in DDR: one dimension over DDR.
      for (auto& table : items) {
        for (DpItem& item : table) std::swap(item.hbm, item.ddr);
      }
      proposals_ = DynamicProgrammingSelections(items, ddr_budget, 1,
                                                static_cast<int>(bins), 1);
    } else if (!uses_ddr_too) {
      for (auto& table : items) {
        for (DpItem& item : table) item.ddr = 0;
      }
      proposals_ = DynamicProgrammingSelections(items, hbm_budget, 1,
                                                static_cast<int>(bins), 1);
    } else {
      const int64_t side = std::max<int64_t>(
          1,
          static_cast<int64_t>(std::sqrt(static_cast<double>(max_cells_2d_))));
      const int per_axis = static_cast<int>(std::min(bins, side));
      proposals_ = DynamicProgrammingSelections(items, hbm_budget, ddr_budget,
                                                per_axis, per_axis);
    }
  }

  std::optional<Proposal> Propose() override {
    if (next_ >= proposals_.size()) return std::nullopt;
    return proposals_[next_];
  }

  void Feedback(bool) override { ++next_; }

 private:
  const int bins_per_device_;
  const int64_t max_cells_2d_;
  std::vector<Proposal> proposals_;
  size_t next_ = 0;
};

}  // namespace

std::unique_ptr<Proposer> MakeGreedyProposer() {
  return std::make_unique<GreedyProposer>();
}

std::unique_ptr<Proposer> MakeUniformProposer() {
  return std::make_unique<UniformProposer>();
}

std::unique_ptr<Proposer> MakeDynamicProgrammingProposer(int bins_per_device,
                                                         int64_t max_cells_2d) {
  return std::make_unique<DynamicProgrammingProposer>(bins_per_device,
                                                      max_cells_2d);
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(absl::string_view name) {
  if (name == "dp") return MakeDynamicProgrammingProposer();
  if (name == "greedy") return MakeGreedyProposer();
  if (name == "uniform") return MakeUniformProposer();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown proposer '", name, "' (dp, greedy, uniform or all)"));
}

std::vector<Proposal> DynamicProgrammingSelections(
    const std::vector<std::vector<DpItem>>& items, int64_t hbm_budget,
    int64_t ddr_budget, int hbm_bins, int ddr_bins) {
  std::vector<Proposal> selections;
  const size_t tables = items.size();
  if (tables == 0 || hbm_budget <= 0 || ddr_budget <= 0) return selections;
  hbm_bins = std::max(hbm_bins, 1);
  ddr_bins = std::max(ddr_bins, 1);
  const double hbm_bin = static_cast<double>(hbm_budget) / hbm_bins;
  const double ddr_bin = static_cast<double>(ddr_budget) / ddr_bins;
  const size_t cells = static_cast<size_t>(hbm_bins) * ddr_bins;
  // The cell of a feasible total; -1 when over a budget.
  auto cell_of = [&](int64_t hbm, int64_t ddr) -> int64_t {
    if (hbm >= hbm_budget || ddr >= ddr_budget) return -1;
    const int64_t h = std::min<int64_t>(
        hbm_bins - 1, static_cast<int64_t>(static_cast<double>(hbm) / hbm_bin));
    const int64_t d = std::min<int64_t>(
        ddr_bins - 1, static_cast<int64_t>(static_cast<double>(ddr) / ddr_bin));
    return h * ddr_bins + d;
  };

  struct State {
    double cost = kInfinity;
    int64_t hbm = 0;
    int64_t ddr = 0;
  };
  // Two layers of states: `current` (the tables so far, reached in the
  // cells listed in `reached`) and `next`, all unreached.
  std::vector<State> current(cells), next(cells);
  // choice[t * cells + c]: the option of table t on the way to cell c.
  // Predecessors follow from the exact storage of the state.
  std::vector<uint8_t> choice(tables * cells, 0);
  std::vector<int> reached, next_reached;

  auto relax = [&](size_t t, const State& from, std::vector<State>& to_layer,
                   std::vector<int>& to_reached) {
    for (size_t j = 0; j < items[t].size() && j < 255; ++j) {
      const DpItem& item = items[t][j];
      const int64_t hbm = from.hbm + item.hbm;
      const int64_t ddr = from.ddr + item.ddr;
      const int64_t to = cell_of(hbm, ddr);
      if (to < 0) continue;
      const double cost = from.cost + item.cost;
      if (to_layer[to].cost > cost) {
        if (to_layer[to].cost == kInfinity) {
          to_reached.push_back(static_cast<int>(to));
        }
        to_layer[to] = State{cost, hbm, ddr};
        choice[t * cells + to] = static_cast<uint8_t>(j);
      }
    }
  };
  relax(0, State{0, 0, 0}, current, reached);
  for (size_t t = 1; t < tables; ++t) {
    for (int c : reached) relax(t, current[c], next, next_reached);
    for (int c : reached) current[c] = State();
    std::swap(current, next);
    std::swap(reached, next_reached);
    next_reached.clear();
  }
  std::sort(reached.begin(), reached.end(), std::greater<int>());
  for (int c : reached) {
    Proposal selection(tables);
    int64_t hbm = current[c].hbm;
    int64_t ddr = current[c].ddr;
    for (size_t t = tables; t-- > 0;) {
      const int64_t cell = cell_of(hbm, ddr);
      const int j = choice[t * cells + cell];
      selection[t] = j;
      hbm -= items[t][j].hbm;
      ddr -= items[t][j].ddr;
    }
    selections.push_back(std::move(selection));
  }
  return selections;
}

}  // namespace deltastream::planner
