#ifndef DELTASTREAM_TRACKER_SERVICE_SERVICE_TOPOLOGY_H_
#define DELTASTREAM_TRACKER_SERVICE_SERVICE_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace deltastream {

// Who serves which rows of a (possibly sharded) trainer's tables: what the
// Topology RPC answers (proto/tracker.proto, TopologyResponse, documents each
// field). Plain data; the trainer fills it, the service serves it.
struct ServiceTopology {
  struct Shard {
    std::string fqn;            // cleaned table FQN
    std::string sharding_type;  // "TABLE_WISE", "ROW_WISE", ...
    int rank = 0;
    int64_t row_offset = 0;
    int64_t rows = 0;
    int64_t col_offset = 0;
    int64_t cols = 0;
    int64_t table_rows = 0;  // 0: not known
    int64_t table_cols = 0;
  };
  int world_size = 1;
  int rank = 0;                        // the rank serving this topology
  std::vector<std::string> endpoints;  // HOST:PORT by rank
  std::vector<Shard> shards;
  std::string plan;  // protobuf text; empty: unsharded
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_SERVICE_TOPOLOGY_H_
