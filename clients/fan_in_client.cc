#include "clients/fan_in_client.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sort.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/subscription_schedule.h"

namespace deltastream {
namespace {

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

// `pieces` (each with rows) ordered by their first ID when each one's IDs
// ascend strictly, as each rank's part does when its server keeps the
// protocol (checked: merging in order relies on it), and their ranges do not
// overlap, so that their rows, concatenated in that order, ascend: row-wise
// and table-row-wise shards (each rank serves one block of rows). Empty
// otherwise. Reads the IDs where they lie (no tensor op per ID: this runs on
// every table of every fan-in read).
std::vector<ReceivedTable*> DisjointInIdOrder(
    const std::vector<ReceivedTable*>& pieces) {
  struct Range {
    int64_t first;
    int64_t last;
    ReceivedTable* piece;
  };
  std::vector<Range> ranges;
  ranges.reserve(pieces.size());
  for (ReceivedTable* piece : pieces) {
    const at::Tensor& ids = piece->ids;
    if (ids.scalar_type() != at::kLong || ids.dim() != 1 ||
        !ids.device().is_cpu() || !ids.is_contiguous()) {
      return {};
    }
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t n = ids.numel();
    for (int64_t i = 1; i < n; ++i) {
      if (id[i] <= id[i - 1]) return {};
    }
    ranges.push_back({id[0], id[n - 1], piece});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.first < b.first; });
  std::vector<ReceivedTable*> in_order;
  in_order.reserve(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (i > 0 && ranges[i - 1].last >= ranges[i].first) return {};
    in_order.push_back(ranges[i].piece);
  }
  return in_order;
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
    // What every part covers: a part that starts later (its rank's cursor
    // moved on a read this consumer never got) is a gap, not hidden.
    header.set_start_batch(std::max(header.start_batch(), h.start_batch()));
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

// A merged delta without rows that tells the consumer to resync (read all
// rows): what a read gets when a column-wise table's blocks no longer carry
// the same IDs because the ranks' parts start at different batches (their
// cursors were restored from snapshots of different steps, or a commit
// reached one rank's snapshot and not another's) or a rank dropped rows.
ReceivedDelta ResyncOnly(v1::DeltaHeader header) {
  header.set_resync_required(true);
  header.clear_fqns();
  ReceivedDelta delta;
  delta.header = std::move(header);
  return delta;
}

absl::StatusOr<ReceivedDelta> MergeParts(const v1::TopologyResponse& topology,
                                         std::vector<ReceivedDelta> parts) {
  // A rank holding no shard of a table it was asked for (a read of chosen
  // tables goes to every rank) answers it with no rows: not a piece.
  std::map<std::string, std::set<int>> holders;
  absl::flat_hash_set<std::string> data_parallel;
  for (const v1::TableShard& shard : topology.shards()) {
    holders[shard.fqn()].insert(shard.rank());
    if (shard.sharding_type() == "DATA_PARALLEL") {
      data_parallel.insert(shard.fqn());
    }
  }
  std::map<std::string, std::vector<ReceivedTable*>> pieces;
  std::map<std::string, ReceivedTable*> not_held;  // the first, by table
  for (size_t r = 0; r < parts.size(); ++r) {
    for (auto& [fqn, table] : parts[r].tables) {
      auto held = holders.find(fqn);
      if (held == holders.end() || held->second.count(static_cast<int>(r)) ||
          HasRows(table)) {
        pieces[fqn].push_back(&table);
      } else {
        not_held.emplace(fqn, &table);
      }
    }
  }
  for (auto& [fqn, table] : not_held) {
    if (pieces[fqn].empty()) pieces[fqn].push_back(table);
  }
  bool same_start = true;
  for (const ReceivedDelta& part : parts) {
    same_start = same_start &&
                 part.header.start_batch() == parts[0].header.start_batch();
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
    if (!table.ok()) {
      // A read of all rows is the resync itself: it gets the error, never
      // an empty table set that would wipe the consumer's replica.
      if (columns && !merged.header.all_rows() &&
          (!same_start || merged.header.resync_required())) {
        return ResyncOnly(merged.header);
      }
      return table.status();
    }
    table->col_offset = 0;
    table->table_cols = 0;
    merged.tables[fqn] = *std::move(table);
    merged.header.add_fqns(fqn);
  }
  return merged;
}

// InvalidArgument when `request` asks top-k of a table split by columns
// across the ranks: each rank would score its own columns and pick its own
// rows, so the blocks could not be joined, and the ranks would have moved
// their cursors past the rows by then. Refused before any rank reads.
absl::Status RefuseTopKOfColumnBlocks(const v1::TopologyResponse& topology,
                                      const v1::GetDeltaRequest& request) {
  for (const v1::TableShard& shard : topology.shards()) {
    if (shard.sharding_type() != "COLUMN_WISE") continue;
    const std::string& fqn = shard.fqn();
    const bool read = request.fqns().empty() ||
                      std::find(request.fqns().begin(), request.fqns().end(),
                                fqn) != request.fqns().end();
    if (request.per_table_top_k().count(fqn) > 0 ||
        (read && request.has_top_k())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "top-k of table '", fqn, "', which ", topology.world_size(),
          " ranks hold split by columns: each would score its own columns "
          "and pick other rows; read it without top-k"));
    }
  }
  return absl::OkStatus();
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

FanInClient::FanInClient(std::string target, ClientOptions options)
    : target_(std::move(target)), options_(std::move(options)) {}

std::unique_ptr<FanInClient> FanInClient::Connect(const std::string& target,
                                                  ClientOptions options) {
  return std::unique_ptr<FanInClient>(
      new FanInClient(target, std::move(options)));
}

absl::StatusOr<std::unique_ptr<FanInClient>> FanInClient::Create(
    const std::string& target, ClientOptions options) {
  std::unique_ptr<FanInClient> client = Connect(target, std::move(options));
  if (absl::StatusOr<std::shared_ptr<const Ranks>> ranks =
          client->CurrentRanks();
      !ranks.ok()) {
    return ranks.status();
  }
  return client;
}

absl::StatusOr<std::shared_ptr<const FanInClient::Ranks>>
FanInClient::CurrentRanks() {
  {
    absl::MutexLock lock(&mu_);
    if (ranks_ != nullptr) return ranks_;
  }
  std::unique_ptr<DeltaClient> first = DeltaClient::Create(target_, options_);
  absl::StatusOr<v1::TopologyResponse> topology = first->Topology();
  if (!topology.ok()) return topology.status();
  auto ranks = std::make_shared<Ranks>();
  if (topology->world_size() <= 1) {
    ranks->clients.push_back(std::move(first));
  } else {
    if (topology->endpoints_size() != topology->world_size() ||
        topology->rank() < 0 || topology->rank() >= topology->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          target_, " answered a topology of ", topology->world_size(),
          " ranks with ", topology->endpoints_size(), " endpoints (rank ",
          topology->rank(), ")"));
    }
    for (int r = 0; r < topology->world_size(); ++r) {
      const v1::RankEndpoint& endpoint = topology->endpoints(r);
      if (endpoint.rank() != r || endpoint.address().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(target_, " answered no endpoint for rank ", r, ": ",
                         endpoint.ShortDebugString()));
      }
      ranks->clients.push_back(
          r == topology->rank()
              ? std::move(first)
              : DeltaClient::Create(endpoint.address(), options_));
    }
  }
  ranks->topology = *std::move(topology);
  absl::MutexLock lock(&mu_);
  if (ranks_ == nullptr) ranks_ = std::move(ranks);
  return ranks_;
}

void FanInClient::Forget(const std::shared_ptr<const Ranks>& ranks) {
  absl::MutexLock lock(&mu_);
  if (ranks_ == ranks) ranks_ = nullptr;
}

absl::Status FanInClient::RankError(const std::shared_ptr<const Ranks>& ranks,
                                    int rank, const absl::Status& status) {
  if (absl::IsUnavailable(status)) Forget(ranks);
  if (ranks->clients.size() == 1) return status;
  return OfRank(rank, status);
}

absl::StatusOr<int> FanInClient::WorldSize() {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  return static_cast<int>((*ranks)->clients.size());
}

namespace {

// `call` on every rank's client at once (rank 0 on this thread); the
// results in rank order.
template <typename Result>
std::vector<Result> OnEveryRank(
    const std::vector<std::unique_ptr<DeltaClient>>& clients,
    const std::function<Result(DeltaClient&)>& call) {
  std::vector<Result> results(clients.size(), Result(absl::UnknownError("")));
  std::vector<std::thread> threads;
  for (size_t r = 1; r < clients.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = call(*clients[r]); });
  }
  results[0] = call(*clients[0]);
  for (std::thread& thread : threads) thread.join();
  return results;
}

// A cut id no other read names: random, nonzero.
int64_t NewCut() {
  thread_local std::mt19937_64 bits(std::random_device{}());
  int64_t cut = 0;
  while (cut == 0) cut = static_cast<int64_t>(bits());
  return cut;
}

}  // namespace

v1::StatusResponse MergeStatuses(std::vector<v1::StatusResponse> statuses) {
  v1::StatusResponse merged = std::move(statuses[0]);
  std::map<std::string, v1::TableStatus*> tables;
  for (v1::TableStatus& table : *merged.mutable_tables()) {
    tables[table.fqn()] = &table;
  }
  std::map<std::string, v1::ConsumerStatus*> consumers;
  for (v1::ConsumerStatus& consumer : *merged.mutable_consumers()) {
    consumers[consumer.name()] = &consumer;
  }
  for (size_t r = 1; r < statuses.size(); ++r) {
    const v1::StatusResponse& rank = statuses[r];
    merged.set_current_batch(
        std::min(merged.current_batch(), rank.current_batch()));
    merged.set_bytes(merged.bytes() + rank.bytes());
    merged.set_memory_cap_bytes(merged.memory_cap_bytes() +
                                rank.memory_cap_bytes());
    merged.set_cap_compactions(merged.cap_compactions() +
                               rank.cap_compactions());
    merged.set_cap_drops(merged.cap_drops() + rank.cap_drops());
    // The ranks expire the same consumers, each by its own clock (one may do
    // so a step before another): the most any rank removed.
    merged.set_consumers_expired(
        std::max(merged.consumers_expired(), rank.consumers_expired()));
    merged.set_dropped_ids(merged.dropped_ids() + rank.dropped_ids());
    merged.set_dropped_bytes(merged.dropped_bytes() + rank.dropped_bytes());
    merged.set_run_id(absl::StrCat(merged.run_id(), ",", rank.run_id()));
    merged.set_run_start_batch(
        std::max(merged.run_start_batch(), rank.run_start_batch()));
    merged.set_serves_live_rows(merged.serves_live_rows() &&
                                rank.serves_live_rows());
    for (const v1::TableStatus& table : rank.tables()) {
      auto it = tables.find(table.fqn());
      if (it == tables.end()) {
        v1::TableStatus* added = merged.add_tables();
        *added = table;
        tables[table.fqn()] = added;
        continue;
      }
      it->second->set_lookups(it->second->lookups() + table.lookups());
      it->second->set_ids(it->second->ids() + table.ids());
      it->second->set_bytes(it->second->bytes() + table.bytes());
    }
    for (const v1::ConsumerStatus& consumer : rank.consumers()) {
      auto it = consumers.find(consumer.name());
      if (it == consumers.end()) continue;  // not on rank 0: not listed
      v1::ConsumerStatus& into = *it->second;
      into.set_cursor(std::min(into.cursor(), consumer.cursor()));
      into.set_highest_cursor(
          std::max(into.highest_cursor(), consumer.highest_cursor()));
      into.set_lag_steps(std::max(into.lag_steps(), consumer.lag_steps()));
      into.set_lag_seconds(
          std::max(into.lag_seconds(), consumer.lag_seconds()));
      into.set_resync_required(into.resync_required() ||
                               consumer.resync_required());
      into.set_pending_reads(
          std::max(into.pending_reads(), consumer.pending_reads()));
      if (consumer.has_pending_read()) {
        into.set_pending_end(
            into.has_pending_read()
                ? std::min(into.pending_end(), consumer.pending_end())
                : consumer.pending_end());
        into.set_has_pending_read(true);
      }
    }
  }
  return merged;
}

absl::StatusOr<ReceivedDelta> FanInClient::ReadAtCut(
    const std::shared_ptr<const Ranks>& ranks,
    const v1::GetDeltaRequest& request, const CallCanceller* cancel) {
  if (!request.all_rows()) {  // top-k does not apply to all_rows
    if (absl::Status refused =
            RefuseTopKOfColumnBlocks(ranks->topology, request);
        !refused.ok()) {
      return refused;
    }
  }
  v1::GetDeltaRequest at_cut = request;
  if (at_cut.cut() == 0) at_cut.set_cut(NewCut());
  std::vector<DeltaClient*> clients;
  for (const std::unique_ptr<DeltaClient>& client : ranks->clients) {
    clients.push_back(client.get());
  }
  size_t failed = 0;
  absl::StatusOr<std::vector<ReceivedDelta>> parts =
      DeltaClient::GetDeltaFromEach(clients, at_cut, &failed, cancel);
  if (!parts.ok()) {
    if (cancel != nullptr && cancel->cancelled()) return parts.status();
    return RankError(ranks, static_cast<int>(failed), parts.status());
  }
  for (size_t r = 1; r < parts->size(); ++r) {
    if ((*parts)[r].header.end_batch() != (*parts)[0].header.end_batch()) {
      return absl::AbortedError(absl::StrCat(
          "rank 0's part ends at batch ", (*parts)[0].header.end_batch(),
          ", rank ", r, "'s at ", (*parts)[r].header.end_batch(),
          ": not one cut (a trainer whose ranks do not hold at step "
          "boundaries?)"));
    }
  }
  absl::StatusOr<ReceivedDelta> merged =
      MergeRankDeltas(ranks->topology, *std::move(parts));
  if (!merged.ok()) return merged.status();
  absl::MutexLock lock(&mu_);
  if (!last_run_id_.empty() && merged->header.run_id() != last_run_id_ &&
      ranks_ == ranks) {
    ranks_ = nullptr;  // another run: the group may have moved
  }
  last_run_id_ = merged->header.run_id();
  return merged;
}

absl::StatusOr<ReceivedDelta> FanInClient::GetDelta(
    const v1::GetDeltaRequest& request, const CallCanceller* cancel) {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  if ((*ranks)->clients.size() == 1) {
    absl::StatusOr<ReceivedDelta> delta =
        (*ranks)->clients[0]->GetDelta(request, cancel);
    if (!delta.ok()) return RankError(*ranks, 0, delta.status());
    return delta;
  }
  return ReadAtCut(*ranks, request, cancel);
}

absl::Status FanInClient::Subscribe(
    const v1::SubscribeRequest& request,
    const std::function<bool(ReceivedDelta&&)>& on_delta,
    CallCanceller* subscription) {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  if ((*ranks)->clients.size() == 1) {
    absl::Status status =
        (*ranks)->clients[0]->Subscribe(request, on_delta, subscription);
    return status.ok() ? status : RankError(*ranks, 0, status);
  }
  CallCanceller own;
  return PollingSubscribe(*ranks, request, on_delta,
                          subscription != nullptr ? *subscription : own);
}

absl::Status FanInClient::TouchEveryRank(
    const std::shared_ptr<const Ranks>& ranks, const std::string& consumer,
    const CallCanceller* cancel) {
  std::vector<absl::Status> results = OnEveryRank<absl::Status>(
      ranks->clients,
      [&](DeltaClient& rank) { return rank.Touch(consumer, cancel); });
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      return RankError(ranks, static_cast<int>(r), results[r]);
    }
  }
  return absl::OkStatus();
}

absl::Status FanInClient::PollingSubscribe(
    const std::shared_ptr<const Ranks>& ranks,
    const v1::SubscribeRequest& request,
    const std::function<bool(ReceivedDelta&&)>& on_delta,
    CallCanceller& subscription) {
  // How often the tracker's batch is looked at while a push waits for steps.
  constexpr absl::Duration kPoll = absl::Milliseconds(10);
  // How often the consumer is kept on every rank while a push waits, as the
  // server's Subscribe touches its own: a schedule longer than the ranks'
  // consumer expiry keeps its consumer, and one removed (or expired) on any
  // rank ends the subscription then, not at the next push, which may be
  // hours away.
  constexpr absl::Duration kKeepConsumerEvery = absl::Seconds(1);
  absl::StatusOr<SubscriptionSchedule> schedule = SubscriptionSchedule::Create(
      {request.every_steps(), request.every_ms(), request.dense_every_steps(),
       request.dense_every_ms()},
      absl::Now(),
      request.read().has_continue_from()
          ? std::optional<int64_t>(request.read().continue_from())
          : std::nullopt);
  if (!schedule.ok()) return schedule.status();
  const v1::GetDeltaRequest& base = request.read();
  // A read is contact on every rank as well (NotFound when one lacks it).
  absl::Time consumer_kept = absl::Now();
  while (!subscription.cancelled()) {
    absl::StatusOr<v1::StatusResponse> status = ranks->clients[0]->Status();
    if (!status.ok()) return RankError(ranks, 0, status.status());
    const int64_t current = status->current_batch();
    absl::Time now = absl::Now();
    if (!schedule->Due(current, now)) {
      if (now - consumer_kept >= kKeepConsumerEvery) {
        if (absl::Status kept =
                TouchEveryRank(ranks, base.consumer(), &subscription);
            !kept.ok()) {
          return subscription.cancelled() ? absl::OkStatus() : kept;
        }
        consumer_kept = now;
      }
      const SubscriptionSchedule::Wake wake = schedule->NextWake(now, kPoll);
      // Waiting for a step: look again after kPoll; for the timer: sleep
      // until it.
      const absl::Duration sleep =
          current > wake.after_batch ? kPoll : wake.deadline - now;
      if (!subscription.Sleep(std::max(sleep, absl::Milliseconds(1)))) break;
      continue;
    }
    const SubscriptionSchedule::Push push =
        schedule->NextPush(base.all_rows(), base.include_dense(), current, now);
    v1::GetDeltaRequest read = base;
    read.set_all_rows(push.all_rows);
    read.clear_continue_from();
    if (push.continue_from.has_value()) {
      read.set_continue_from(*push.continue_from);
    }
    read.set_include_dense(push.include_dense);
    absl::StatusOr<ReceivedDelta> delta = ReadAtCut(ranks, read, &subscription);
    if (!delta.ok()) {
      return subscription.cancelled() ? absl::OkStatus() : delta.status();
    }
    schedule->Pushed(push, delta->header.end_batch(), now);
    consumer_kept = now;
    if (!on_delta(*std::move(delta))) break;
  }
  return absl::OkStatus();
}

absl::Status FanInClient::Commit(const std::string& consumer,
                                 int64_t end_batch) {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  std::vector<absl::Status> results = OnEveryRank<absl::Status>(
      (*ranks)->clients,
      [&](DeltaClient& rank) { return rank.Commit(consumer, end_batch); });
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      return RankError(*ranks, static_cast<int>(r), results[r]);
    }
  }
  return absl::OkStatus();
}

absl::Status FanInClient::Touch(const std::string& consumer,
                                const CallCanceller* cancel) {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  return TouchEveryRank(*ranks, consumer, cancel);
}

absl::StatusOr<std::vector<std::string>> FanInClient::ListConsumers() {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  absl::StatusOr<std::vector<std::string>> list =
      (*ranks)->clients[0]->ListConsumers();
  if (!list.ok()) return RankError(*ranks, 0, list.status());
  return list;
}

absl::StatusOr<std::vector<std::string>> FanInClient::ChangeConsumers(
    const std::function<absl::StatusOr<std::vector<std::string>>(DeltaClient&)>&
        call,
    absl::StatusCode benign) {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  std::vector<absl::StatusOr<std::vector<std::string>>> results =
      OnEveryRank<absl::StatusOr<std::vector<std::string>>>((*ranks)->clients,
                                                            call);
  int benign_ranks = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    if (results[r].ok()) continue;
    if (results[r].status().code() == benign) {
      ++benign_ranks;
      continue;
    }
    return RankError(*ranks, static_cast<int>(r), results[r].status());
  }
  if (benign_ranks == static_cast<int>(results.size())) {
    return results[0].status();
  }
  for (auto& result : results) {
    if (result.ok()) return *std::move(result);
  }
  return results[0].status();
}

absl::StatusOr<std::vector<std::string>> FanInClient::AddConsumer(
    const std::string& consumer) {
  return ChangeConsumers(
      [&](DeltaClient& rank) { return rank.AddConsumer(consumer); },
      absl::StatusCode::kAlreadyExists);
}

absl::StatusOr<std::vector<std::string>> FanInClient::RemoveConsumer(
    const std::string& consumer) {
  return ChangeConsumers(
      [&](DeltaClient& rank) { return rank.RemoveConsumer(consumer); },
      absl::StatusCode::kNotFound);
}

absl::StatusOr<v1::StatusResponse> FanInClient::MergedStatus(
    const std::function<absl::StatusOr<v1::StatusResponse>(DeltaClient&)>&
        call) {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  std::vector<absl::StatusOr<v1::StatusResponse>> results =
      OnEveryRank<absl::StatusOr<v1::StatusResponse>>((*ranks)->clients, call);
  std::vector<v1::StatusResponse> statuses;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      return RankError(*ranks, static_cast<int>(r), results[r].status());
    }
    statuses.push_back(*std::move(results[r]));
  }
  return MergeStatuses(std::move(statuses));
}

absl::StatusOr<v1::StatusResponse> FanInClient::Status() {
  return MergedStatus([](DeltaClient& rank) { return rank.Status(); });
}

absl::StatusOr<v1::StatusResponse> FanInClient::Compact() {
  return MergedStatus([](DeltaClient& rank) { return rank.Compact(); });
}

absl::StatusOr<v1::StatusResponse> FanInClient::Clear(
    const std::string& consumer) {
  return MergedStatus([&](DeltaClient& rank) { return rank.Clear(consumer); });
}

absl::StatusOr<v1::TopologyResponse> FanInClient::Topology() {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  if ((*ranks)->clients.size() == 1) {
    // A one-process server's own answer.
    absl::StatusOr<v1::TopologyResponse> topology =
        (*ranks)->clients[0]->Topology();
    if (!topology.ok()) return RankError(*ranks, 0, topology.status());
    return topology;
  }
  return (*ranks)->topology;
}

absl::StatusOr<v1::SnapshotInfo> FanInClient::Snapshot() {
  absl::StatusOr<std::shared_ptr<const Ranks>> ranks = CurrentRanks();
  if (!ranks.ok()) return ranks.status();
  std::vector<absl::StatusOr<v1::SnapshotInfo>> results =
      OnEveryRank<absl::StatusOr<v1::SnapshotInfo>>(
          (*ranks)->clients, [](DeltaClient& rank) { return rank.Snapshot(); });
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) {
      return RankError(*ranks, static_cast<int>(r), results[r].status());
    }
  }
  return *std::move(results[0]);
}

}  // namespace deltastream
