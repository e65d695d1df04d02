#include "trainer/planner/partitioners.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

namespace deltastream::planner {
namespace {

Storage Free(const Storage& usable, const Storage& used) {
  return Storage{usable.hbm - used.hbm, usable.ddr - used.ddr};
}

Storage Missing(const Storage& needed, const Storage& free) {
  return Storage{std::max<int64_t>(0, needed.hbm - free.hbm),
                 std::max<int64_t>(0, needed.ddr - free.ddr)};
}

// The tier whose room decides: HBM on GPUs, else DDR.
int64_t Primary(const Storage& storage, const Topology& topology) {
  return topology.gpu ? storage.hbm : storage.ddr;
}

class Placer {
 public:
  Placer(absl::Span<const ShardingOption* const> options,
         const Topology& topology, const Storage& usable)
      : options_(options), topology_(topology), usable_(usable) {
    partition_.ranks.resize(options.size());
    partition_.used.assign(topology.world_size, Storage());
    partition_.cost.assign(topology.world_size, Cost());
    charged_.assign(topology.world_size, Storage());
  }

  Storage FreeOn(int rank) const {
    return Free(usable_, partition_.used[rank]);
  }

  void Put(size_t option, size_t shard, int rank) {
    const ShardEstimate& estimate = options_[option]->shards[shard];
    partition_.ranks[option][shard] = rank;
    partition_.used[rank] += estimate.storage;
    partition_.cost[rank] += estimate.cost;
  }

  void Unplaced(size_t option, size_t shard, int rank) {
    const ShardEstimate& estimate = options_[option]->shards[shard];
    partition_.ranks[option][shard] = -1;
    partition_.unplaced.push_back(UnplacedShard{
        options_[option]->table, static_cast<int>(shard), rank,
        estimate.storage, Missing(estimate.storage, FreeOn(rank))});
    // Charged to the rank, so that the next shard that does not fit goes
    // elsewhere and, in the end, `used` shows each rank's shortfall; shards
    // placed later still see the room really left (a small table is not
    // reported as unplaceable because a huge one did not fit).
    charged_[rank] += estimate.storage;
  }

  // The rank with the most room in the deciding tier, shards that found no
  // room counted (ties: lowest rank), among those not `taken` when there
  // are any.
  int RoomiestRank(const std::vector<bool>& taken) const {
    auto room = [&](int rank) {
      return Primary(FreeOn(rank), topology_) -
             Primary(charged_[rank], topology_);
    };
    int best = -1;
    for (bool skip_taken : {true, false}) {
      for (int rank = 0; rank < topology_.world_size; ++rank) {
        if (skip_taken && taken[rank]) continue;
        if (best < 0 || room(rank) > room(best)) best = rank;
      }
      if (best >= 0) break;
    }
    return best;
  }

  void PlaceFixed(size_t option) {
    const ShardingOption& o = *options_[option];
    for (size_t s = 0; s < o.shards.size(); ++s) {
      const int rank = o.shards[s].rank;
      if (o.shards[s].storage.FitsIn(FreeOn(rank))) {
        Put(option, s, rank);
      } else {
        Unplaced(option, s, rank);
      }
    }
  }

  void PlaceOnHost(size_t option) {
    const ShardingOption& o = *options_[option];
    const int local = topology_.ranks_per_host();
    int best_host = -1;
    double best_load = 0;
    for (int host = 0; host < topology_.hosts(); ++host) {
      bool fits = true;
      double load = 0;
      for (size_t s = 0; s < o.shards.size() && fits; ++s) {
        const int rank = host * local + static_cast<int>(s);
        fits = o.shards[s].storage.FitsIn(FreeOn(rank));
        load = std::max(load, partition_.cost[rank].total());
      }
      if (fits && (best_host < 0 || load < best_load)) {
        best_host = host;
        best_load = load;
      }
    }
    for (size_t s = 0; s < o.shards.size(); ++s) {
      if (best_host >= 0) {
        Put(option, s, best_host * local + static_cast<int>(s));
      } else {
        Unplaced(option, s, static_cast<int>(s));
      }
    }
  }

  // What orders the ranks for a free shard: least cost first (greedy) or
  // most room first (memory-balanced).
  double RankKey(int rank, PartitionStrategy strategy) const {
    return strategy == PartitionStrategy::kGreedyCost
               ? partition_.cost[rank].total()
               : -static_cast<double>(Primary(FreeOn(rank), topology_));
  }

  // Each shard onto the first rank in `ranked` order that has room and no
  // shard of the table yet (the trainer holds at most one shard of a table
  // per rank: a shard that finds no such rank is unplaced); the set is kept
  // ordered as ranks fill (ties: the lower rank).
  void PlaceFree(size_t option, PartitionStrategy strategy,
                 std::set<std::pair<double, int>>& ranked) {
    const ShardingOption& o = *options_[option];
    std::vector<bool> taken(topology_.world_size, false);
    for (size_t s = 0; s < o.shards.size(); ++s) {
      const Storage& needed = o.shards[s].storage;
      int best = -1;
      for (const auto& [key, rank] : ranked) {
        if (!taken[rank] && needed.FitsIn(FreeOn(rank))) {
          best = rank;
          break;
        }
      }
      const int target = best >= 0 ? best : RoomiestRank(taken);
      taken[target] = true;
      ranked.erase({RankKey(target, strategy), target});
      if (best >= 0) {
        Put(option, s, target);
      } else {
        Unplaced(option, s, target);
      }
      ranked.insert({RankKey(target, strategy), target});
    }
  }

  Partition Run(PartitionStrategy strategy) {
    std::vector<size_t> order(options_.size());
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](size_t i) {
      return strategy == PartitionStrategy::kGreedyCost
                 ? options_[i]->total_cost
                 : static_cast<double>(
                       Primary(options_[i]->total_storage, topology_));
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key(a) > key(b); });
    for (size_t i = 0; i < options_.size(); ++i) {
      partition_.ranks[i].assign(options_[i]->shards.size(), -1);
    }
    // Shards whose rank is fixed first, then host-bound, then the rest.
    for (size_t i : order) {
      const v1::ShardingType type = options_[i]->type;
      if (type == v1::DATA_PARALLEL || type == v1::ROW_WISE) PlaceFixed(i);
    }
    for (size_t i : order) {
      if (options_[i]->type == v1::TABLE_ROW_WISE) PlaceOnHost(i);
    }
    std::set<std::pair<double, int>> ranked;
    for (int rank = 0; rank < topology_.world_size; ++rank) {
      ranked.insert({RankKey(rank, strategy), rank});
    }
    for (size_t i : order) {
      const v1::ShardingType type = options_[i]->type;
      if (type == v1::TABLE_WISE || type == v1::COLUMN_WISE) {
        PlaceFree(i, strategy, ranked);
      }
    }
    for (const Cost& cost : partition_.cost) {
      partition_.max_cost = std::max(partition_.max_cost, cost.total());
    }
    for (int rank = 0; rank < topology_.world_size; ++rank) {
      partition_.used[rank] += charged_[rank];
    }
    return std::move(partition_);
  }

 private:
  absl::Span<const ShardingOption* const> options_;
  const Topology& topology_;
  const Storage usable_;
  Partition partition_;
  // Per rank, the shards charged to it that found no room (Unplaced).
  std::vector<Storage> charged_;
};

}  // namespace

absl::string_view PartitionStrategyName(PartitionStrategy strategy) {
  return strategy == PartitionStrategy::kGreedyCost ? "greedy"
                                                    : "memory_balanced";
}

Partition PartitionShards(absl::Span<const ShardingOption* const> options,
                          const Topology& topology, const Storage& usable,
                          PartitionStrategy strategy) {
  return Placer(options, topology, usable).Run(strategy);
}

}  // namespace deltastream::planner
