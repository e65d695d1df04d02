#include "trainer/planner/proposers.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deltastream::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxChoiceBytes = int64_t{256} << 20;

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
    options_ = &options;
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

  void OrderByTotalCost() override {
    auto total = [&](const Proposal& proposal) {
      double sum = 0;
      for (size_t t = 0; t < proposal.size(); ++t) {
        sum += (*options_)[t][proposal[t]].total_cost;
      }
      return sum;
    };
    std::stable_sort(proposals_.begin() + static_cast<std::ptrdiff_t>(next_),
                     proposals_.end(),
                     [&](const Proposal& a, const Proposal& b) {
                       return total(a) < total(b);
                     });
  }

 private:
  const OptionsByTable* options_ = nullptr;
  std::vector<Proposal> proposals_;
  size_t next_ = 0;
};

class DynamicProgrammingProposer : public Proposer {
 public:
  explicit DynamicProgrammingProposer(int bins_per_device)
      : bins_per_device_(std::max(bins_per_device, 1)) {}

  absl::string_view name() const override { return "dp"; }

  void Load(const OptionsByTable& options, const Topology& topology,
            const Storage& usable) override {
    program_.reset();
    order_.clear();
    next_ = 0;
    if (options.empty()) return;
    // Every table lives in the ranks' device memory: HBM on GPUs, DDR on
    // CPUs (EstimateShardStorage).
    auto device_bytes = [&](const Storage& storage) {
      return topology.gpu ? storage.hbm : storage.ddr;
    };
    std::vector<std::vector<DpItem>> items(options.size());
    for (size_t t = 0; t < options.size(); ++t) {
      for (const ShardingOption& option : options[t]) {
        items[t].push_back(
            DpItem{device_bytes(option.total_storage), option.total_cost});
      }
    }
    const int64_t world = topology.world_size;
    // The backtracking table takes a byte per table and bin: coarser bins
    // keep it within kMaxChoiceBytes on very large worlds.
    const int64_t tables = static_cast<int64_t>(options.size());
    const int bins = static_cast<int>(std::max<int64_t>(
        1,
        std::min<int64_t>(bins_per_device_ * world, kMaxChoiceBytes / tables)));
    // The budget is exclusive: a selection may use up to every rank's
    // usable storage (saturating: a budget past int64 is no limit).
    const int64_t per_rank = device_bytes(usable);
    const int64_t budget =
        per_rank >= (std::numeric_limits<int64_t>::max() - 1) / world
            ? std::numeric_limits<int64_t>::max()
            : per_rank * world + 1;
    program_ = std::make_unique<DynamicProgram>(std::move(items), budget, bins);
    order_.resize(program_->finals().size());
    std::iota(order_.begin(), order_.end(), 0);
  }

  std::optional<Proposal> Propose() override {
    if (next_ >= order_.size()) return std::nullopt;
    return program_->Selection(program_->finals()[order_[next_]]);
  }

  void Feedback(bool) override { ++next_; }

  void OrderByTotalCost() override {
    if (!program_) return;
    const std::vector<DynamicProgram::Final>& finals = program_->finals();
    std::stable_sort(
        order_.begin() + static_cast<std::ptrdiff_t>(next_), order_.end(),
        [&](size_t a, size_t b) { return finals[a].cost < finals[b].cost; });
  }

 private:
  const int bins_per_device_;
  std::unique_ptr<DynamicProgram> program_;
  std::vector<size_t> order_;  // indices into finals()
  size_t next_ = 0;
};

}  // namespace

std::unique_ptr<Proposer> MakeGreedyProposer() {
  return std::make_unique<GreedyProposer>();
}

std::unique_ptr<Proposer> MakeUniformProposer() {
  return std::make_unique<UniformProposer>();
}

std::unique_ptr<Proposer> MakeDynamicProgrammingProposer(int bins_per_device) {
  return std::make_unique<DynamicProgrammingProposer>(bins_per_device);
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(absl::string_view name) {
  if (name == "dp") return MakeDynamicProgrammingProposer();
  if (name == "greedy") return MakeGreedyProposer();
  if (name == "uniform") return MakeUniformProposer();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown proposer '", name, "' (dp, greedy, uniform or all)"));
}

DynamicProgram::DynamicProgram(std::vector<std::vector<DpItem>> items,
                               int64_t budget, int bins)
    : items_(std::move(items)),
      budget_(budget),
      bins_(std::max(bins, 1)),
      per_byte_(budget > 0 ? bins_ / static_cast<double>(budget) : 0) {
  const size_t tables = items_.size();
  if (tables == 0 || budget_ <= 0) return;
  struct State {
    double cost = kInfinity;
    int64_t bytes = 0;
  };
  // Two layers of states: `current` (the tables so far, reached in the
  // bins listed in `reached`) and `next`, all unreached.
  const size_t bins_count = static_cast<size_t>(bins_);
  std::vector<State> current(bins_count), next(bins_count);
  choice_.assign(tables * bins_count, 0);
  std::vector<int> reached, next_reached;

  auto relax = [&](size_t t, const State& from, std::vector<State>& to_layer,
                   std::vector<int>& to_reached) {
    const std::vector<DpItem>& options = items_[t];
    uint8_t* choice = &choice_[t * bins_count];
    for (size_t j = 0; j < options.size() && j < 255; ++j) {
      const DpItem& item = options[j];
      // Within the budget, without overflow.
      if (item.bytes >= budget_ - from.bytes) continue;
      const int64_t bytes = from.bytes + item.bytes;
      const int64_t to = BinOf(bytes);
      const double cost = from.cost + item.cost;
      if (to_layer[to].cost > cost) {
        if (to_layer[to].cost == kInfinity) {
          to_reached.push_back(static_cast<int>(to));
        }
        to_layer[to] = State{cost, bytes};
        choice[to] = static_cast<uint8_t>(j);
      }
    }
  };
  relax(0, State{0, 0}, current, reached);
  for (size_t t = 1; t < tables; ++t) {
    for (int b : reached) relax(t, current[b], next, next_reached);
    for (int b : reached) current[b] = State();
    std::swap(current, next);
    std::swap(reached, next_reached);
    next_reached.clear();
  }
  std::sort(reached.begin(), reached.end(), std::greater<int>());
  for (int b : reached)
    finals_.push_back(Final{current[b].bytes, current[b].cost});
}

int64_t DynamicProgram::BinOf(int64_t bytes) const {
  return std::min<int64_t>(
      bins_ - 1, static_cast<int64_t>(static_cast<double>(bytes) * per_byte_));
}

Proposal DynamicProgram::Selection(const Final& final) const {
  // A state's predecessor is the state its exact storage came from: the
  // total less the chosen option, in the bin of that.
  Proposal selection(items_.size());
  int64_t bytes = final.bytes;
  for (size_t t = items_.size(); t-- > 0;) {
    const int j = choice_[t * static_cast<size_t>(bins_) + BinOf(bytes)];
    selection[t] = j;
    bytes -= items_[t][j].bytes;
  }
  return selection;
}

std::vector<Proposal> DynamicProgrammingSelections(
    const std::vector<std::vector<DpItem>>& items, int64_t budget, int bins) {
  const DynamicProgram program(items, budget, bins);
  std::vector<Proposal> selections;
  for (const DynamicProgram::Final& final : program.finals()) {
    selections.push_back(program.Selection(final));
  }
  return selections;
}

}  // namespace deltastream::planner
