// deltactl: the operator CLI of the tracker service.
//
//   deltactl --target=HOST:PORT <command> [flags]
//
// Commands: push --json_file=F (- = stdin) | step |
//   get --consumer=C [--fqn=F,...] [--top_percentage=P] [--out=F.npz]
//       [--json] |
//   commit --consumer=C --end_batch=B | consumers list|add|remove [NAME] |
//   status | compact | clear [--consumer=C] | snapshot |
//   subscribe --consumer=C [--every_steps=N] [--every_ms=T] [--count=K] |
//   watch [--interval_ms=N]
// Connection: --token_file=F sends the token in F (first line) on every call;
// --tls_ca=F speaks TLS and trusts the PEM certificates in F.
// Every command that prints data takes --json. Errors: one line on stderr and
// a non-zero exit (1: the request failed, 2: bad usage).

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/command_line.h"
#include "base/process.h"
#include "clients/checkpoint_chain.h"
#include "clients/delta_client.h"
#include "clients/npz_file.h"
#include "clients/push_json.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "tracker server HOST:PORT");
ABSL_FLAG(bool, json, false, "print JSON instead of tables");
ABSL_FLAG(std::string, json_file, "", "push: the lookups, JSON ('-': stdin)");
ABSL_FLAG(std::string, consumer, "", "consumer name");
ABSL_FLAG(std::string, fqn, "", "get: comma-separated tables (default all)");
ABSL_FLAG(double, top_percentage, 0, "get: keep the top P% rows by score");
ABSL_FLAG(int64_t, top_count, 0, "get: keep the top N rows by score");
ABSL_FLAG(bool, scores, false, "get: include every row's score");
ABSL_FLAG(bool, states, true, "get: include the tracked states");
ABSL_FLAG(bool, values, true, "get: include the current values");
ABSL_FLAG(int64_t, end_batch, -1, "commit: the read's end batch");
ABSL_FLAG(int, interval_ms, 1000, "watch: refresh period");
ABSL_FLAG(int, timeout_ms, 10000, "deadline of each call");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the bearer token to send");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM certificates to trust: connect with TLS");
ABSL_FLAG(std::string, out, "",
          "get: write the delta to this .npz file (see clients/npz_file.h)");
ABSL_FLAG(int64_t, every_steps, 1, "subscribe: push every N steps");
ABSL_FLAG(int64_t, every_ms, 0, "subscribe: or every T ms (0: steps only)");
ABSL_FLAG(int64_t, count, 0, "subscribe: stop after K deltas (0: never)");
ABSL_FLAG(std::string, dir, "", "chain: a checkpoint chain's directory");

namespace deltastream {
namespace {

using nlohmann::json;

class UsageError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30))
    return absl::StrFormat("%.1f GiB", bytes / 1073741824.0);
  if (bytes >= (1 << 20)) return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
  if (bytes >= (1 << 10)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%d B", bytes);
}

// Prints rows as an aligned table; the first row is the header.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t c = 0; c < row.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += absl::StrFormat("%-*s", static_cast<int>(widths[c]) + 2, row[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

// A 1-D tensor as a list, a 2-D one as a list of rows, of T.
template <typename T>
json NumbersJson(const at::Tensor& tensor, at::ScalarType as) {
  at::Tensor t = tensor.to(as).contiguous();
  const T* data = t.data_ptr<T>();
  if (t.dim() == 1) return std::vector<T>(data, data + t.numel());
  json rows = json::array();
  const int64_t cols = t.numel() / std::max<int64_t>(1, t.size(0));
  for (int64_t r = 0; r < t.size(0); ++r) {
    rows.push_back(std::vector<T>(data + r * cols, data + (r + 1) * cols));
  }
  return rows;
}

// IDs as integers; float64 values as doubles; other floats as floats.
json TensorJson(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kLong:
      return NumbersJson<int64_t>(tensor, at::kLong);
    case at::kDouble:
      return NumbersJson<double>(tensor, at::kDouble);
    default:
      return NumbersJson<float>(tensor, at::kFloat);
  }
}

json SnapshotJson(const v1::SnapshotInfo& info) {
  return {{"generation", info.generation()},
          {"batch", info.batch()},
          {"written_unix_micros", info.written_unix_micros()},
          {"payload_bytes", info.payload_bytes()},
          {"seconds", info.seconds()}};
}

std::string DescribeSnapshot(const v1::SnapshotInfo& info) {
  const double age = std::max<double>(0, absl::ToUnixMicros(absl::Now()) -
                                             info.written_unix_micros()) /
                     1e6;
  return absl::StrFormat(
      "snapshot %d at batch %d, %s, written in %.2f s (%.0f MB/s), %.0f s ago",
      info.generation(), info.batch(), Bytes(info.payload_bytes()),
      info.seconds(),
      info.seconds() > 0 ? info.payload_bytes() / info.seconds() / 1e6 : 0.0,
      age);
}

json StatusJson(const v1::StatusResponse& s) {
  json out = {{"mode", s.mode()},
              {"current_batch", s.current_batch()},
              {"delete_on_read", s.delete_on_read()},
              {"auto_compact", s.auto_compact()},
              {"acknowledged_reads", s.acknowledged_reads()},
              {"bytes", s.bytes()},
              {"memory_cap_bytes", s.memory_cap_bytes()},
              {"cap_compactions", s.cap_compactions()},
              {"cap_drops", s.cap_drops()},
              {"dropped_ids", s.dropped_ids()},
              {"dropped_bytes", s.dropped_bytes()},
              {"consumers", json::array()},
              {"tables", json::object()}};
  for (const v1::ConsumerStatus& c : s.consumers()) {
    json consumer = {{"name", c.name()},
                     {"cursor", c.cursor()},
                     {"lag_steps", c.lag_steps()},
                     {"lag_seconds", c.lag_seconds()},
                     {"resync_required", c.resync_required()}};
    if (c.has_pending_read()) {
      consumer["pending_end"] = c.pending_end();
      consumer["pending_reads"] = c.pending_reads();
    }
    out["consumers"].push_back(consumer);
  }
  for (const v1::TableStatus& t : s.tables()) {
    out["tables"][t.fqn()] = {
        {"lookups", t.lookups()}, {"ids", t.ids()}, {"bytes", t.bytes()}};
  }
  if (!s.db().empty()) out["db"] = s.db();
  if (s.has_last_snapshot())
    out["last_snapshot"] = SnapshotJson(s.last_snapshot());
  return out;
}

void PrintStatus(const v1::StatusResponse& s) {
  std::printf(
      "mode %s, batch %lld, held %s%s, delete_on_read %s, "
      "auto_compact %s\n",
      s.mode().c_str(), static_cast<long long>(s.current_batch()),
      Bytes(s.bytes()).c_str(),
      s.memory_cap_bytes() > 0 ? (" of " + Bytes(s.memory_cap_bytes())).c_str()
                               : "",
      s.delete_on_read() ? "on" : "off", s.auto_compact() ? "on" : "off");
  if (s.cap_drops() > 0) {
    std::printf("memory cap: dropped %lld IDs (%s) in %lld drops\n",
                static_cast<long long>(s.dropped_ids()),
                Bytes(s.dropped_bytes()).c_str(),
                static_cast<long long>(s.cap_drops()));
  }
  if (!s.db().empty()) {
    std::printf("db %s: %s\n", s.db().c_str(),
                s.has_last_snapshot()
                    ? DescribeSnapshot(s.last_snapshot()).c_str()
                    : "no snapshot yet");
  }
  std::vector<std::vector<std::string>> consumers = {
      {"CONSUMER", "CURSOR", "LAG", "PENDING", "RESYNC"}};
  for (const v1::ConsumerStatus& c : s.consumers()) {
    consumers.push_back(
        {c.name(), std::to_string(c.cursor()),
         absl::StrFormat("%d steps, %.1f s", c.lag_steps(), c.lag_seconds()),
         !c.has_pending_read() ? "-"
         : c.pending_reads() > 1
             ? absl::StrCat(c.pending_reads(), " reads, newest end ",
                            c.pending_end())
             : absl::StrCat("end ", c.pending_end()),
         c.resync_required() ? "yes" : "no"});
  }
  PrintTable(consumers);
  std::vector<std::vector<std::string>> tables = {
      {"TABLE", "LOOKUPS", "IDS", "BYTES"}};
  for (const v1::TableStatus& t : s.tables()) {
    tables.push_back({t.fqn(), std::to_string(t.lookups()),
                      std::to_string(t.ids()), Bytes(t.bytes())});
  }
  if (tables.size() > 1) PrintTable(tables);
}

int Push(DeltaClient& client) {
  const std::string file = absl::GetFlag(FLAGS_json_file);
  if (file.empty()) throw UsageError("push needs --json_file=F ('-': stdin)");
  std::stringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    if (!in)
      return Fail(kExitFailure, absl::NotFoundError("cannot read " + file));
    text << in.rdbuf();
  }
  auto tables = ParsePushJson(text.str(), file == "-" ? "stdin" : file);
  if (!tables.ok()) return Fail(kExitFailure, tables.status());
  auto batch = client.Record({*tables});
  if (!batch.ok()) return Fail(kExitFailure, batch.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "%s\n",
        json({{"batch", *batch}, {"tables", tables->size()}}).dump().c_str());
  } else {
    std::printf("recorded %zu tables into batch %lld\n", tables->size(),
                static_cast<long long>(*batch));
  }
  return 0;
}

// The read that get and subscribe ask for, from the flags.
v1::GetDeltaRequest ReadRequest(const std::string& command) {
  v1::GetDeltaRequest request;
  request.set_consumer(absl::GetFlag(FLAGS_consumer));
  if (request.consumer().empty()) {
    throw UsageError(command + " needs --consumer=C");
  }
  for (absl::string_view fqn :
       absl::StrSplit(absl::GetFlag(FLAGS_fqn), ',', absl::SkipEmpty())) {
    request.add_fqns(std::string(fqn));
  }
  if (absl::GetFlag(FLAGS_top_percentage) != 0) {
    request.mutable_top_k()->set_percentage(
        absl::GetFlag(FLAGS_top_percentage));
  } else if (absl::GetFlag(FLAGS_top_count) != 0) {
    request.mutable_top_k()->set_count(absl::GetFlag(FLAGS_top_count));
  }
  request.set_include_scores(absl::GetFlag(FLAGS_scores));
  request.set_omit_states(!absl::GetFlag(FLAGS_states));
  request.set_omit_values(!absl::GetFlag(FLAGS_values));
  return request;
}

int Get(DeltaClient& client) {
  auto delta = client.GetDelta(ReadRequest("get"));
  if (!delta.ok()) return Fail(kExitFailure, delta.status());
  const v1::DeltaHeader& header = delta->header;
  if (const std::string file = absl::GetFlag(FLAGS_out); !file.empty()) {
    if (absl::Status s = WriteDeltaNpz(file, *delta); !s.ok())
      return Fail(kExitFailure, s);
    int64_t rows = 0;
    for (const auto& [fqn, table] : delta->tables) rows += table.ids.numel();
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", json({{"file", file},
                                {"start_batch", header.start_batch()},
                                {"end_batch", header.end_batch()},
                                {"tables", delta->tables.size()},
                                {"rows", rows}})
                              .dump()
                              .c_str());
    } else {
      std::printf("wrote batches [%lld, %lld): %lld rows of %zu tables to %s\n",
                  static_cast<long long>(header.start_batch()),
                  static_cast<long long>(header.end_batch()),
                  static_cast<long long>(rows), delta->tables.size(),
                  file.c_str());
    }
    return 0;
  }
  if (absl::GetFlag(FLAGS_json)) {
    json out = {{"consumer", header.consumer()},
                {"batch", header.end_batch()},
                {"start_batch", header.start_batch()},
                {"end_batch", header.end_batch()},
                {"resync_required", header.resync_required()},
                {"tables", json::object()}};
    for (const auto& [fqn, table] : delta->tables) {
      json t = {{"ids", TensorJson(table.ids)}};
      if (table.states.defined()) t["states"] = TensorJson(table.states);
      if (table.values.defined()) t["values"] = TensorJson(table.values);
      if (table.scores.defined()) t["scores"] = TensorJson(table.scores);
      out["tables"][fqn] = t;
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("consumer %s: batches [%lld, %lld)%s\n",
              header.consumer().c_str(),
              static_cast<long long>(header.start_batch()),
              static_cast<long long>(header.end_batch()),
              header.resync_required()
                  ? absl::StrCat(", RESYNC REQUIRED (", header.lost_rows(),
                                 " rows dropped under the memory cap)")
                        .c_str()
                  : "");
  std::vector<std::vector<std::string>> rows = {
      {"TABLE", "ROWS", "STATES", "VALUES", "BYTES"}};
  for (const auto& [fqn, table] : delta->tables) {
    int64_t bytes = table.ids.nbytes();
    for (const at::Tensor* t : {&table.states, &table.values, &table.scores}) {
      if (t->defined()) bytes += t->nbytes();
    }
    auto shape = [](const at::Tensor& t) {
      return t.defined() ? absl::StrJoin(t.sizes(), "x") : std::string("-");
    };
    rows.push_back({fqn, std::to_string(table.ids.numel()), shape(table.states),
                    shape(table.values), Bytes(bytes)});
  }
  PrintTable(rows);
  return 0;
}

int Subscribe(DeltaClient& client) {
  v1::SubscribeRequest request;
  *request.mutable_read() = ReadRequest("subscribe");
  request.set_every_steps(absl::GetFlag(FLAGS_every_steps));
  request.set_every_ms(absl::GetFlag(FLAGS_every_ms));
  const int64_t count = absl::GetFlag(FLAGS_count);
  int64_t received = 0;
  absl::Status status = client.Subscribe(request, [&](ReceivedDelta&& delta) {
    int64_t rows = 0;
    for (const auto& [fqn, table] : delta.tables) rows += table.ids.numel();
    const v1::DeltaHeader& h = delta.header;
    if (absl::GetFlag(FLAGS_json)) {
      json tables = json::object();
      for (const auto& [fqn, table] : delta.tables) {
        tables[fqn] = table.ids.numel();
      }
      std::printf("%s\n", json({{"start_batch", h.start_batch()},
                                {"end_batch", h.end_batch()},
                                {"resync_required", h.resync_required()},
                                {"rows", tables}})
                              .dump()
                              .c_str());
    } else {
      std::printf("batches [%lld, %lld): %lld rows in %zu tables%s\n",
                  static_cast<long long>(h.start_batch()),
                  static_cast<long long>(h.end_batch()),
                  static_cast<long long>(rows), delta.tables.size(),
                  h.resync_required() ? ", RESYNC REQUIRED" : "");
    }
    std::fflush(stdout);
    return count == 0 || ++received < count;
  });
  return status.ok() ? 0 : Fail(kExitFailure, status);
}

int PrintConsumers(const absl::StatusOr<std::vector<std::string>>& names) {
  if (!names.ok()) return Fail(kExitFailure, names.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", json({{"consumers", *names}}).dump().c_str());
  } else {
    for (const std::string& name : *names) std::printf("%s\n", name.c_str());
  }
  return 0;
}

int ShowStatus(const absl::StatusOr<v1::StatusResponse>& status) {
  if (!status.ok()) return Fail(kExitFailure, status.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", StatusJson(*status).dump().c_str());
  } else {
    PrintStatus(*status);
  }
  return 0;
}

// The links of a checkpoint chain (store/checkpoint_chain.h), the batches
// they cover, their sizes, whether they carry dense parameters, the trainer
// run that served them, which are superseded by a newer full link, and any
// gap or overlap, or link that fails what the loader verifies (checksums,
// decoding, content matching the name). Offline: no server. Exit 1 when
// there is a problem.
int ShowChain() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) throw UsageError("chain needs --dir=D");
  absl::StatusOr<std::vector<ChainLink>> links = ListChain(dir);
  if (!links.ok()) return Fail(kExitFailure, links.status());
  std::vector<std::string> problems = ChainProblems(*links);
  std::set<std::string> applied;
  for (const ChainLink& link : AppliedLinks(*links)) applied.insert(link.path);
  std::vector<std::optional<ChainLinkInfo>> infos;
  int64_t bytes = 0;
  for (const ChainLink& link : *links) {
    bytes += link.bytes;
    absl::StatusOr<ChainLinkInfo> info = ReadChainLinkInfo(link.path);
    // Every byte is checked as LoadChain checks it (checksums, decoding, the
    // batches the name says), superseded links included.
    absl::Status verified =
        info.ok() ? VerifyChainLink(link) : absl::OkStatus();
    if (!info.ok()) problems.emplace_back(info.status().message());
    if (!verified.ok()) problems.emplace_back(verified.message());
    infos.push_back(info.ok() ? std::optional<ChainLinkInfo>(*info)
                              : std::nullopt);
  }
  if (absl::GetFlag(FLAGS_json)) {
    json out = {{"dir", dir},
                {"links", json::array()},
                {"problems", problems},
                {"bytes", bytes}};
    for (size_t i = 0; i < links->size(); ++i) {
      const ChainLink& link = (*links)[i];
      json entry = {{"kind", link.full ? "full" : "increment"},
                    {"start_batch", link.start_batch},
                    {"end_batch", link.end_batch},
                    {"bytes", link.bytes},
                    {"superseded", applied.count(link.path) == 0}};
      if (const std::optional<ChainLinkInfo>& info = infos[i]) {
        entry["dense"] = info->dense_parameters;
        entry["dense_batch"] = info->dense_batch;
        entry["run_id"] = info->run_id;
        entry["run_start_batch"] = info->run_start_batch;
        entry["consumer"] = info->consumer;
        entry["written_unix_ms"] = info->written_unix_ms;
      }
      out["links"].push_back(std::move(entry));
    }
    std::printf("%s\n", out.dump().c_str());
    return problems.empty() ? 0 : 1;
  }
  std::printf("%-10s %12s %12s %12s %6s  %s\n", "KIND", "FROM_BATCH",
              "TO_BATCH", "BYTES", "DENSE", "RUN");
  for (size_t i = 0; i < links->size(); ++i) {
    const ChainLink& link = (*links)[i];
    const std::optional<ChainLinkInfo>& info = infos[i];
    std::string run = "?";
    if (info.has_value()) {
      run = info->run_id.empty() ? "-"
                                 : absl::StrCat(info->run_id, " (from batch ",
                                                info->run_start_batch, ")");
    }
    std::printf("%-10s %12lld %12lld %12lld %6s  %s%s\n",
                link.full ? "full" : "increment",
                static_cast<long long>(link.start_batch),
                static_cast<long long>(link.end_batch - 1),
                static_cast<long long>(link.bytes),
                !info.has_value()            ? "?"
                : info->dense_parameters > 0 ? "yes"
                                             : "no",
                run.c_str(),
                applied.count(link.path) == 0 ? "  superseded" : "");
  }
  std::printf("%zu links, %.1f MiB%s\n", links->size(), bytes / 1048576.0,
              problems.empty() ? ", no gaps" : "");
  for (const std::string& problem : problems) {
    std::printf("problem: %s\n", problem.c_str());
  }
  return problems.empty() ? 0 : 1;
}

// The client-side flags every command that talks to a server may read,
// checked for range: an empty string, or the first bad value as one line.
// (Values sent to the server, like --top_percentage or --every_ms, are the
// server's to check: one rule in one place.)
std::string FlagError() {
  if (absl::GetFlag(FLAGS_target).empty()) return "--target must not be empty";
  if (absl::GetFlag(FLAGS_timeout_ms) <= 0) return "--timeout_ms must be > 0";
  if (absl::GetFlag(FLAGS_interval_ms) <= 0) {
    return "--interval_ms must be > 0";
  }
  if (absl::GetFlag(FLAGS_count) < 0) return "--count must be >= 0";
  return "";
}

int Run(const std::vector<std::string>& args) {
  if (args.empty()) throw UsageError("no command; see --help");
  if (args[0] == "chain") return ShowChain();
  if (const std::string error = FlagError(); !error.empty()) {
    return Fail(kExitUsage, error);
  }
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  if (absl::Status read =
          ReadCredentialFiles(absl::GetFlag(FLAGS_token_file),
                              absl::GetFlag(FLAGS_tls_ca), options);
      !read.ok()) {
    return Fail(kExitFailure, read);
  }
  auto client = DeltaClient::Create(absl::GetFlag(FLAGS_target), options);
  const std::string& command = args[0];
  if (command == "push") return Push(*client);
  if (command == "step") {
    auto batch = client->Step();
    if (!batch.ok()) return Fail(kExitFailure, batch.status());
    std::printf(
        absl::GetFlag(FLAGS_json) ? "{\"batch\":%lld}\n" : "batch %lld\n",
        static_cast<long long>(*batch));
    return 0;
  }
  if (command == "get") return Get(*client);
  if (command == "commit") {
    if (absl::GetFlag(FLAGS_consumer).empty() ||
        absl::GetFlag(FLAGS_end_batch) < 0) {
      throw UsageError("commit needs --consumer=C --end_batch=B");
    }
    absl::Status s = client->Commit(absl::GetFlag(FLAGS_consumer),
                                    absl::GetFlag(FLAGS_end_batch));
    return s.ok() ? 0 : Fail(kExitFailure, s);
  }
  if (command == "consumers") {
    const std::string verb = args.size() > 1 ? args[1] : "list";
    if (verb == "list") return PrintConsumers(client->ListConsumers());
    const std::string name =
        args.size() > 2 ? args[2] : absl::GetFlag(FLAGS_consumer);
    if (name.empty()) throw UsageError("consumers " + verb + " needs a name");
    if (verb == "add") return PrintConsumers(client->AddConsumer(name));
    if (verb == "remove") return PrintConsumers(client->RemoveConsumer(name));
    throw UsageError("consumers takes list, add or remove");
  }
  if (command == "status") return ShowStatus(client->Status());
  if (command == "compact") return ShowStatus(client->Compact());
  if (command == "clear") {
    return ShowStatus(client->Clear(absl::GetFlag(FLAGS_consumer)));
  }
  if (command == "snapshot") {
    auto info = client->Snapshot();
    if (!info.ok()) return Fail(kExitFailure, info.status());
    std::printf("%s\n", absl::GetFlag(FLAGS_json)
                            ? SnapshotJson(*info).dump().c_str()
                            : DescribeSnapshot(*info).c_str());
    return 0;
  }
  if (command == "subscribe") return Subscribe(*client);
  if (command == "watch") {
    const bool tty = isatty(STDOUT_FILENO);
    for (;;) {
      auto status = client->Status();
      if (tty) std::printf("\033[H\033[2J");
      if (int rc = ShowStatus(status); rc != 0) return rc;
      std::fflush(stdout);
      std::this_thread::sleep_for(
          std::chrono::milliseconds(absl::GetFlag(FLAGS_interval_ms)));
    }
  }
  throw UsageError("unknown command '" + command + "'; see --help");
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "deltactl --target=HOST:PORT <push|step|get|commit|consumers|status|"
      "compact|clear|snapshot|subscribe|watch> [flags]\n"
      "deltactl chain --dir=D [--json]   (a checkpoint chain; no server)");
  deltastream::CommandLineOptions options;
  options.allow_positional = true;
  absl::StatusOr<deltastream::ParsedCommandLine> parsed =
      deltastream::ParseCommandLine(argc, argv, options);
  if (!parsed.ok()) {
    return deltastream::Fail(deltastream::kExitUsage, parsed.status());
  }
  const std::vector<std::string>& args = parsed->positional;
  try {
    return deltastream::Run(args);
  } catch (const deltastream::UsageError& e) {
    std::fprintf(stderr, "deltactl: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deltactl: %s\n", e.what());
    return 1;
  }
}
