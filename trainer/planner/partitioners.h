#ifndef DELTASTREAM_TRAINER_PLANNER_PARTITIONERS_H_
#define DELTASTREAM_TRAINER_PLANNER_PARTITIONERS_H_

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainer/planner/sharding_option.h"
#include "trainer/planner/topology.h"

namespace deltastream::planner {

// How a partitioner orders and places the shards that have no rank yet.
enum class PartitionStrategy {
  // TorchRec's GreedyPerfPartitioner: options by cost, the most expensive
  // first; each shard onto the rank with the least cost so far that has
  // room.
  kGreedyCost,
  // Options by storage, the largest first; each shard onto the rank with
  // the most room left (HBM on GPUs, else DDR).
  kMemoryBalanced,
};

absl::string_view PartitionStrategyName(PartitionStrategy strategy);

// A shard that found no room: on `rank` (the one with the most room left,
// or its fixed rank), `missing` bytes short when it was placed. It is
// charged to that rank's `used` all the same.
struct UnplacedShard {
  int table = 0;  // the option's table
  int shard = 0;  // index in the option's shards
  int rank = 0;
  Storage needed;
  Storage missing;
};

// Where a proposal's shards went, and each rank's totals.
struct Partition {
  // ranks[i][s]: the rank of shard s of options[i].
  std::vector<std::vector<int>> ranks;
  std::vector<Storage> used;  // per rank (over `usable` where shards failed)
  std::vector<Cost> cost;     // per rank
  std::vector<UnplacedShard> unplaced;
  double max_cost = 0;  // the largest per-rank total cost, ms

  bool ok() const { return unplaced.empty(); }
};

// Places `options` (one per table; shards with a rank stay there; the
// shards of a TABLE_ROW_WISE option go to one host, the one whose ranks
// carry the least cost among those with room) within `usable` storage per
// rank, never two shards of one table on one rank (the trainer refuses
// that; the enumerator's fixed ranks are distinct). Shards that find no
// room (or no rank without a shard of their table) are listed in
// `unplaced` and placing goes on with the rest, so that one pass names
// every shortfall. Pure: safe from any thread.
Partition PartitionShards(absl::Span<const ShardingOption* const> options,
                          const Topology& topology, const Storage& usable,
                          PartitionStrategy strategy);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_PARTITIONERS_H_
