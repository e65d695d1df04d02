#include "clients/fan_in_client.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltastream {
namespace {

// Reads remembered per consumer for Commit, as many as the tracker keeps
// uncommitted.
constexpr size_t kRememberedReads = 64;

absl::Status OfRank(int rank, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("rank ", rank, ": ", status.message()));
}

absl::Status Mismatch(const std::string& fqn, const std::string& what) {
  return absl::DataLossError(absl::StrCat("table '", fqn, "': ", what));
}

bool HasRows(const ReceivedTable& table) {
  return table.ids.defined() && table.ids.numel() > 0;
}

constexpr at::Tensor ReceivedTable::*kRowTensors[] = {
    &ReceivedTable::states, &ReceivedTable::values, &ReceivedTable::scores};

// Column blocks of the same IDs (one per rank holding one), joined into full
// rows.
absl::StatusOr<ReceivedTable> JoinColumns(const std::string& fqn,
                                          std::vector<ReceivedTable*> blocks) {
  std::sort(blocks.begin(), blocks.end(),
            [](const ReceivedTable* a, const ReceivedTable* b) {
              return a->col_offset < b->col_offset;
            });
  const ReceivedTable& first = *blocks[0];
  const int64_t table_cols = first.table_cols;
  const int64_t rows = first.ids.defined() ? first.ids.size(0) : 0;
  int64_t next_col = 0;
  for (const ReceivedTable* block : blocks) {
    if (block->table_cols != table_cols) {
      return Mismatch(
          fqn, absl::StrCat("column blocks say the table is ", table_cols,
                            " and ", block->table_cols, " columns wide"));
    }
    const int64_t block_rows = block->ids.defined() ? block->ids.size(0) : 0;
    if (block_rows != rows || (rows > 0 && !block->ids.equal(first.ids))) {
      return Mismatch(
          fqn, absl::StrCat("the column block at column ", block->col_offset,
                            " holds other IDs (", block_rows,
                            " rows) than the one at column ", first.col_offset,
                            " (", rows, " rows)"));
    }
    if (first.values.defined() != block->values.defined() ||
        first.states.defined() != block->states.defined()) {
      return Mismatch(fqn, "column blocks differ in what they carry");
    }
    if (!block->values.defined()) continue;
    if (block->col_offset != next_col || block->values.dim() != 2) {
      return Mismatch(fqn,
                      absl::StrCat("a column block starts at column ",
                                   block->col_offset, ", expected ", next_col));
    }
    next_col += block->values.size(1);
  }
  if (first.values.defined() && next_col != table_cols) {
    return Mismatch(fqn, absl::StrCat("the column blocks cover ", next_col,
                                      " of its ", table_cols, " columns"));
  }
  ReceivedTable joined;
  joined.ids = first.ids;
  joined.scores = first.scores;
  auto join = [&](at::Tensor ReceivedTable::*member) {
    if (!(first.*member).defined() || (first.*member).dim() < 2) {
      return first.*member;
    }
    std::vector<at::Tensor> list;
    for (const ReceivedTable* block : blocks) list.push_back(block->*member);
    return at::cat(list, 1);
  };
  joined.values = join(&ReceivedTable::values);
  joined.states = join(&ReceivedTable::states);
  return joined;
}

// Whether `ids` (1-D int64) ascend strictly, as each rank's part does when
// its server keeps the protocol (checked: merging in order relies on it).
bool StrictlyAscending(const at::Tensor& ids) {
  if (ids.scalar_type() != at::kLong || ids.dim() != 1) return false;
  const at::Tensor dense = ids.contiguous();
  const int64_t* id = dense.data_ptr<int64_t>();
  for (int64_t i = 1; i < dense.numel(); ++i) {
    if (id[i] <= id[i - 1]) return false;
  }
  return true;
}

// `pieces` (each with rows) ordered by their first ID when each one's IDs
// ascend strictly and their ranges do not overlap, so that their rows,
// concatenated in that order, ascend: row-wise and table-row-wise shards
// (each rank serves one block of rows). Empty otherwise.
std::vector<ReceivedTable*> DisjointInIdOrder(
    std::vector<ReceivedTable*> pieces) {
  for (const ReceivedTable* piece : pieces) {
    if (!StrictlyAscending(piece->ids)) return {};
  }
  auto first = [](const ReceivedTable* piece) {
    return piece->ids[0].item<int64_t>();
  };
  std::sort(pieces.begin(), pieces.end(),
            [&](const ReceivedTable* a, const ReceivedTable* b) {
              return first(a) < first(b);
            });
  for (size_t i = 1; i < pieces.size(); ++i) {
    if (pieces[i - 1]->ids[-1].item<int64_t>() >= first(pieces[i])) return {};
  }
  return pieces;
}

// The pieces' `member` tensors, concatenated along the rows.
at::Tensor CatRows(const std::vector<ReceivedTable*>& pieces,
                   at::Tensor ReceivedTable::*member) {
  std::vector<at::Tensor> list;
  list.reserve(pieces.size());
  for (const ReceivedTable* piece : pieces) list.push_back(piece->*member);
  return at::cat(list);
}

// Full-width rows of several ranks, sorted by ID; duplicates are dropped
// for a data-parallel table and an error otherwise. Rows of disjoint ID
// ranges (row-wise shards) are concatenated in order, not sorted: one copy
// of each row.
absl::StatusOr<ReceivedTable> ConcatRows(const std::string& fqn,
                                         std::vector<ReceivedTable*> pieces,
                                         bool data_parallel) {
  std::vector<ReceivedTable*> filled;
  for (ReceivedTable* piece : pieces) {
    if (HasRows(*piece)) filled.push_back(piece);
  }
  if (filled.empty()) return std::move(*pieces[0]);
  for (at::Tensor ReceivedTable::*member : kRowTensors) {
    for (const ReceivedTable* piece : filled) {
      if ((piece->*member).defined() != (filled[0]->*member).defined()) {
        return Mismatch(fqn, "ranks differ in what they carry");
      }
    }
  }
  if (filled.size() == 1) return std::move(*filled[0]);
  ReceivedTable merged;
  if (std::vector<ReceivedTable*> in_order = DisjointInIdOrder(filled);
      !in_order.empty()) {
    merged.ids = CatRows(in_order, &ReceivedTable::ids);
    for (at::Tensor ReceivedTable::*member : kRowTensors) {
      if ((filled[0]->*member).defined()) {
        merged.*member = CatRows(in_order, member);
      }
    }
    return merged;
  }
  auto [sorted, order] = at::sort(CatRows(filled, &ReceivedTable::ids),
                                  /*stable=*/c10::optional<bool>(true),
                                  /*dim=*/0);
  const at::Tensor repeated = sorted.narrow(0, 1, sorted.size(0) - 1) ==
                              sorted.narrow(0, 0, sorted.size(0) - 1);
  if (repeated.any().item<bool>()) {
    if (!data_parallel) {
      const int64_t at_index = repeated.nonzero()[0][0].item<int64_t>();
      return Mismatch(fqn,
                      absl::StrCat("two ranks serve row ID ",
                                   sorted[at_index].item<int64_t>(),
                                   " of a table that is not data-parallel"));
    }
    const at::Tensor keep =
        at::cat({at::ones({1}, repeated.options()), at::logical_not(repeated)});
    sorted = sorted.masked_select(keep);
    order = order.masked_select(keep);
  }
  merged.ids = sorted;
  for (at::Tensor ReceivedTable::*member : kRowTensors) {
    if ((filled[0]->*member).defined()) {
      merged.*member = CatRows(filled, member).index_select(0, order);
    }
  }
  return merged;
}

v1::DeltaHeader MergeHeaders(const std::vector<ReceivedDelta>& parts) {
  v1::DeltaHeader header = parts[0].header;
  header.clear_fqns();
  std::vector<std::string> run_ids;
  int64_t oldest = 0;
  for (const ReceivedDelta& part : parts) {
    const v1::DeltaHeader& h = part.header;
    header.set_start_batch(std::min(header.start_batch(), h.start_batch()));
    header.set_end_batch(std::min(header.end_batch(), h.end_batch()));
    header.set_resync_required(header.resync_required() || h.resync_required());
    header.set_all_rows(header.all_rows() && h.all_rows());
    if (h.oldest_change_unix_micros() > 0) {
      oldest = oldest == 0 ? h.oldest_change_unix_micros()
                           : std::min(oldest, h.oldest_change_unix_micros());
    }
    header.set_newest_change_unix_micros(std::max(
        header.newest_change_unix_micros(), h.newest_change_unix_micros()));
    header.set_run_start_batch(
        std::max(header.run_start_batch(), h.run_start_batch()));
    run_ids.push_back(h.run_id());
  }
  int64_t lost_rows = 0;
  for (const ReceivedDelta& part : parts) lost_rows += part.header.lost_rows();
  header.set_lost_rows(lost_rows);
  header.set_oldest_change_unix_micros(oldest);
  header.set_run_id(absl::StrJoin(run_ids, ","));
  header.set_dense_parameters(parts[0].header.dense_parameters());
  return header;
}

absl::StatusOr<ReceivedDelta> MergeParts(const v1::TopologyResponse& topology,
                                         std::vector<ReceivedDelta> parts) {
  absl::flat_hash_set<std::string> data_parallel;
  for (const v1::TableShard& shard : topology.shards()) {
    if (shard.sharding_type() == "DATA_PARALLEL") {
      data_parallel.insert(shard.fqn());
    }
  }
  std::map<std::string, std::vector<ReceivedTable*>> pieces;
  for (ReceivedDelta& part : parts) {
    for (auto& [fqn, table] : part.tables) pieces[fqn].push_back(&table);
  }
  ReceivedDelta merged;
  merged.header = MergeHeaders(parts);
  merged.dense = std::move(parts[0].dense);
  for (auto& [fqn, list] : pieces) {
    const bool columns = list[0]->table_cols > 0;
    for (const ReceivedTable* piece : list) {
      if ((piece->table_cols > 0) != columns) {
        return Mismatch(fqn, "some ranks serve column blocks, others rows");
      }
    }
    absl::StatusOr<ReceivedTable> table =
        columns ? JoinColumns(fqn, list)
                : ConcatRows(fqn, list, data_parallel.contains(fqn));
    if (!table.ok()) return table.status();
    table->col_offset = 0;
    table->table_cols = 0;
    merged.tables[fqn] = *std::move(table);
    merged.header.add_fqns(fqn);
  }
  return merged;
}

}  // namespace

absl::StatusOr<ReceivedDelta> MergeRankDeltas(
    const v1::TopologyResponse& topology, std::vector<ReceivedDelta> parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no rank's delta");
  if (parts.size() == 1) return std::move(parts[0]);
  // Tensors of shapes the checks did not foresee (a server's bug) make
  // LibTorch throw; the caller gets a status.
  try {
    return MergeParts(topology, std::move(parts));
  } catch (const c10::Error& error) {
    return absl::DataLossError(absl::StrCat("the ranks' deltas do not fit: ",
                                            error.what_without_backtrace()));
  }
}

FanInClient::FanInClient(v1::TopologyResponse topology,
                         std::vector<std::unique_ptr<DeltaClient>> ranks)
    : topology_(std::move(topology)), ranks_(std::move(ranks)) {}

absl::StatusOr<std::unique_ptr<FanInClient>> FanInClient::Create(
    const std::string& target, ClientOptions options) {
  std::unique_ptr<DeltaClient> first = DeltaClient::Create(target, options);
  absl::StatusOr<v1::TopologyResponse> topology = first->Topology();
  if (!topology.ok()) return topology.status();
  std::vector<std::unique_ptr<DeltaClient>> ranks;
  if (topology->world_size() <= 1) {
    ranks.push_back(std::move(first));
  } else {
    if (topology->endpoints_size() != topology->world_size() ||
        topology->rank() < 0 || topology->rank() >= topology->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          target, " answered a topology of ", topology->world_size(),
          " ranks with ", topology->endpoints_size(), " endpoints (rank ",
          topology->rank(), ")"));
    }
    for (int r = 0; r < topology->world_size(); ++r) {
      const v1::RankEndpoint& endpoint = topology->endpoints(r);
      if (endpoint.rank() != r || endpoint.address().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(target, " answered no endpoint for rank ", r, ": ",
                         endpoint.ShortDebugString()));
      }
      ranks.push_back(r == topology->rank()
                          ? std::move(first)
                          : DeltaClient::Create(endpoint.address(), options));
    }
  }
  return std::unique_ptr<FanInClient>(
      new FanInClient(*std::move(topology), std::move(ranks)));
}

absl::StatusOr<ReceivedDelta> FanInClient::GetDelta(
    const v1::GetDeltaRequest& request) {
  if (ranks_.size() == 1) return ranks_[0]->GetDelta(request);
  std::vector<absl::StatusOr<ReceivedDelta>> results(ranks_.size());
  {
    std::vector<std::thread> readers;
    for (size_t r = 1; r < ranks_.size(); ++r) {
      readers.emplace_back(
          [&, r] { results[r] = ranks_[r]->GetDelta(request); });
    }
    results[0] = ranks_[0]->GetDelta(request);
    for (std::thread& reader : readers) reader.join();
  }
  std::vector<ReceivedDelta> parts;
  RankEnds ends;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      return OfRank(static_cast<int>(r), results[r].status());
    }
    ends.ends.push_back(results[r]->header.end_batch());
    parts.push_back(*std::move(results[r]));
  }
  absl::StatusOr<ReceivedDelta> merged =
      MergeRankDeltas(topology_, std::move(parts));
  if (!merged.ok()) return merged.status();
  ends.end_batch = merged->header.end_batch();
  absl::MutexLock lock(&mu_);
  std::deque<RankEnds>& reads = reads_[request.consumer()];
  reads.push_back(std::move(ends));
  if (reads.size() > kRememberedReads) reads.pop_front();
  return merged;
}

absl::Status FanInClient::Commit(const std::string& consumer,
                                 int64_t end_batch) {
  if (ranks_.size() == 1) return ranks_[0]->Commit(consumer, end_batch);
  std::vector<int64_t> ends(ranks_.size(), end_batch);
  {
    absl::MutexLock lock(&mu_);
    auto reads = reads_.find(consumer);
    if (reads != reads_.end()) {
      // The newest read that ended there.
      for (auto read = reads->second.rbegin(); read != reads->second.rend();
           ++read) {
        if (read->end_batch == end_batch) {
          ends = read->ends;
          break;
        }
      }
    }
  }
  absl::Status first_error;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    absl::Status status = ranks_[r]->Commit(consumer, ends[r]);
    if (!status.ok() && first_error.ok()) {
      first_error = OfRank(static_cast<int>(r), status);
    }
  }
  return first_error;
}

}  // namespace deltastream
