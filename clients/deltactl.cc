// deltactl: the operator CLI of the tracker service.
//
//   deltactl [--target=HOST:PORT] <command> [args] [flags]
//
// Each command takes its own flags and refuses the others (the table in
// Commands(); `deltactl <command> --help` lists them), the output flags
// (-o text|wide|json|yaml, --json = -o json) and, when it talks to a server,
// the connection flags (--target, else $DELTACTL_TARGET, else
// 127.0.0.1:50051; --timeout_ms; --token_file; --tls_ca). Flags may come
// before or after the command. Exit codes: 0 success, 1 a failed request,
// 2 bad usage, with one line on stderr (base/process.h). `status`, `compact`,
// `clear`, `snapshot` print their response message as protobuf's JSON
// mapping (clients/structured_output.h), so the output follows the proto.
// clients/deltactl_completion.bash completes commands and flags through the
// hidden `__complete` command.

#include <ATen/core/Tensor.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/command_line.h"
#include "base/host_port.h"
#include "base/process.h"
#include "clients/checkpoint_chain.h"
#include "clients/delta_client.h"
#include "clients/fan_in_client.h"
#include "clients/npz_file.h"
#include "clients/push_json.h"
#include "clients/structured_output.h"

// Connection flags (commands that talk to a server).
ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "tracker server HOST:PORT; when not given, $DELTACTL_TARGET if set");
ABSL_FLAG(int, timeout_ms, 10000,
          "deadline of each call; given, of streamed calls (get, push) too");
ABSL_FLAG(std::string, token_file, "",
          "file whose first line is the bearer token to send");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM certificates to trust: connect with TLS");
// Output flags (every command).
ABSL_FLAG(std::string, output, "text",
          "-o: text, wide (more columns), json (one object per result) or "
          "yaml (one document per result)");
ABSL_FLAG(bool, json, false, "the same as -o json");
// The commands' own flags.
ABSL_FLAG(std::string, json_file, "", "the lookups, JSON ('-': stdin)");
ABSL_FLAG(std::string, consumer, "", "consumer name");
ABSL_FLAG(std::string, fqn, "", "comma-separated tables (default all)");
ABSL_FLAG(double, top_percentage, 0, "keep the top P% rows by score");
ABSL_FLAG(int64_t, top_count, 0, "keep the top N rows by score");
ABSL_FLAG(bool, scores, false, "include every row's score");
ABSL_FLAG(bool, states, true, "include the tracked states");
ABSL_FLAG(bool, values, true, "include the current values");
ABSL_FLAG(int64_t, end_batch, -1, "the read's end batch");
ABSL_FLAG(int, interval_ms, 1000, "refresh period");
ABSL_FLAG(std::string, out, "",
          "write the delta to this .npz file (see clients/npz_file.h)");
ABSL_FLAG(int64_t, every_steps, 1, "push every N steps");
ABSL_FLAG(int64_t, every_ms, 0, "or every T ms (0: steps only)");
ABSL_FLAG(int64_t, count, 0, "stop after K deltas (0: never)");
ABSL_FLAG(std::string, dir, "", "a checkpoint chain's directory");

namespace deltastream {
namespace {

using json = nlohmann::ordered_json;

constexpr char kProgram[] = "deltactl";
// The flags every command that talks to a server takes.
const std::vector<std::string>& ConnectionFlags() {
  static const auto* const flags = new std::vector<std::string>{
      "target", "timeout_ms", "token_file", "tls_ca"};
  return *flags;
}

// The flags every command takes.
const std::vector<std::string>& OutputFlags() {
  static const auto* const flags =
      new std::vector<std::string>{"output", "json"};
  return *flags;
}

// What a command's run gets.
struct Invocation {
  std::vector<std::string> args;  // positional arguments after the command
  OutputFormat format = OutputFormat::kText;
  // Null for a command that connects nowhere. The model: of a sharded
  // trainer, every rank as one (clients/fan_in_client.h: reads merged, IDs
  // ascending and full rows, at one consistent cut; commits on every rank).
  TrackerClient* client = nullptr;
  // The one server at the target, for producers' calls (push, step).
  DeltaClient* server = nullptr;
  std::string target;  // HOST:PORT, for messages
};

// One command. Adding a command is one entry in Commands().
struct Command {
  std::string name;
  std::string usage;               // what follows "deltactl <name>" in its help
  std::string summary;             // one line
  std::vector<std::string> flags;  // its own flags
  bool connects;                   // takes the connection flags
  size_t max_args;                 // positional arguments it takes
  int (*run)(const Invocation&);
};

const std::vector<Command>& Commands();

const Command* FindCommand(const std::string& name) {
  for (const Command& command : Commands()) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

int Usage(absl::string_view message) { return Fail(kExitUsage, message); }

bool Structured(OutputFormat format) {
  return format == OutputFormat::kJson || format == OutputFormat::kYaml;
}

// One result as one JSON line or one YAML document; `stream`: one of many
// (subscribe, watch), a YAML document then starts with "---".
void PrintStructured(const json& value, OutputFormat format,
                     bool stream = false) {
  if (format == OutputFormat::kYaml) {
    std::printf("%s%s", stream ? "---\n" : "", ToYaml(value).c_str());
  } else {
    std::printf(
        "%s\n",
        value.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
}

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

std::string UnixMicrosText(int64_t micros) {
  if (micros <= 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMicros(micros),
                          absl::UTCTimeZone());
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

// The header of a delta as its message, plus "batch" (= end_batch, which
// scripts read) and what `extra` adds.
json DeltaJson(const v1::DeltaHeader& header, const std::string& key,
               json extra) {
  json out = MessageToJson(header);
  out["batch"] = header.end_batch();
  out[key] = std::move(extra);
  return out;
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

void PrintStatus(const v1::StatusResponse& s, bool wide) {
  std::printf(
      "mode %s, batch %lld, held %s%s, delete_on_read %s, "
      "auto_compact %s\n",
      s.mode().c_str(), static_cast<long long>(s.current_batch()),
      Bytes(s.bytes()).c_str(),
      s.memory_cap_bytes() > 0 ? (" of " + Bytes(s.memory_cap_bytes())).c_str()
                               : "",
      s.delete_on_read() ? "on" : "off", s.auto_compact() ? "on" : "off");
  if (wide) {
    std::printf(
        "run %s from batch %lld, acknowledged_reads %s, live rows %s, "
        "%lld cap compactions\n",
        s.run_id().empty() ? "-" : s.run_id().c_str(),
        static_cast<long long>(s.run_start_batch()),
        s.acknowledged_reads() ? "on" : "off",
        s.serves_live_rows() ? "yes" : "no",
        static_cast<long long>(s.cap_compactions()));
  }
  if (s.cap_drops() > 0) {
    std::printf("memory cap: dropped %lld IDs (%s) in %lld drops\n",
                static_cast<long long>(s.dropped_ids()),
                Bytes(s.dropped_bytes()).c_str(),
                static_cast<long long>(s.cap_drops()));
  }
  if (s.consumers_expired() > 0) {
    std::printf("consumers expired (silent too long): %lld\n",
                static_cast<long long>(s.consumers_expired()));
  }
  if (!s.db().empty()) {
    std::printf("db %s: %s\n", s.db().c_str(),
                s.has_last_snapshot()
                    ? DescribeSnapshot(s.last_snapshot()).c_str()
                    : "no snapshot yet");
  }
  std::vector<std::vector<std::string>> consumers;
  if (wide) {
    consumers.push_back({"CONSUMER", "CURSOR", "LAG_STEPS", "LAG_SECONDS",
                         "PENDING_END", "PENDING_READS", "RESYNC"});
  } else {
    consumers.push_back({"CONSUMER", "CURSOR", "LAG", "PENDING", "RESYNC"});
  }
  for (const v1::ConsumerStatus& c : s.consumers()) {
    const std::string resync = c.resync_required() ? "yes" : "no";
    if (wide) {
      consumers.push_back(
          {c.name(), std::to_string(c.cursor()), std::to_string(c.lag_steps()),
           absl::StrFormat("%.3f", c.lag_seconds()),
           c.has_pending_read() ? std::to_string(c.pending_end()) : "-",
           std::to_string(c.pending_reads()), resync});
      continue;
    }
    consumers.push_back(
        {c.name(), std::to_string(c.cursor()),
         absl::StrFormat("%d steps, %.1f s", c.lag_steps(), c.lag_seconds()),
         !c.has_pending_read() ? "-"
         : c.pending_reads() > 1
             ? absl::StrCat(c.pending_reads(), " reads, newest end ",
                            c.pending_end())
             : absl::StrCat("end ", c.pending_end()),
         resync});
  }
  PrintTable(consumers);
  std::vector<std::vector<std::string>> tables = {
      {"TABLE", "LOOKUPS", "IDS", "BYTES"}};
  for (const v1::TableStatus& t : s.tables()) {
    tables.push_back({t.fqn(), std::to_string(t.lookups()),
                      std::to_string(t.ids()),
                      wide ? std::to_string(t.bytes()) : Bytes(t.bytes())});
  }
  if (tables.size() > 1) PrintTable(tables);
}

int ShowStatus(const absl::StatusOr<v1::StatusResponse>& status,
               OutputFormat format, bool stream = false) {
  if (!status.ok()) return Fail(kExitFailure, status.status());
  if (Structured(format)) {
    PrintStructured(MessageToJson(*status), format, stream);
  } else {
    PrintStatus(*status, format == OutputFormat::kWide);
  }
  return 0;
}

int RunPush(const Invocation& run) {
  const std::string file = absl::GetFlag(FLAGS_json_file);
  if (file.empty()) return Usage("push needs --json_file=F ('-': stdin)");
  std::stringstream text;
  if (file == "-") {
    text << std::cin.rdbuf();
  } else {
    // A directory opens as a stream that reads nothing: say what it is
    // rather than "bad JSON".
    std::error_code error;
    if (std::filesystem::is_directory(file, error)) {
      return Fail(kExitFailure,
                  absl::StrCat("cannot read '", file, "': it is a directory"));
    }
    std::ifstream in(file);
    if (!in) {
      return Fail(kExitFailure, absl::StrCat("cannot read '", file,
                                             "': ", std::strerror(errno)));
    }
    text << in.rdbuf();
    if (in.bad()) {
      return Fail(kExitFailure, absl::StrCat("cannot read '", file,
                                             "': ", std::strerror(errno)));
    }
  }
  auto tables = ParsePushJson(text.str(), file == "-" ? "stdin" : file);
  if (!tables.ok()) return Fail(kExitFailure, tables.status());
  auto batch = run.server->Record({*tables});
  if (!batch.ok()) return Fail(kExitFailure, batch.status());
  if (Structured(run.format)) {
    PrintStructured({{"batch", *batch}, {"tables", tables->size()}},
                    run.format);
  } else {
    std::printf("recorded %zu tables into batch %lld\n", tables->size(),
                static_cast<long long>(*batch));
  }
  return 0;
}

int RunStep(const Invocation& run) {
  auto batch = run.server->Step();
  if (!batch.ok()) return Fail(kExitFailure, batch.status());
  if (Structured(run.format)) {
    PrintStructured({{"batch", *batch}}, run.format);
  } else {
    std::printf("batch %lld\n", static_cast<long long>(*batch));
  }
  return 0;
}

// The read that get and subscribe ask for, from the flags; nullopt (after
// the usage line) without --consumer, with both kinds of top-k, or with a
// top-k value out of the range the wire allows (proto/tracker.proto's
// TopK: refused here as bad usage before anything is read).
std::optional<v1::GetDeltaRequest> ReadRequest(const std::string& command) {
  v1::GetDeltaRequest request;
  request.set_consumer(absl::GetFlag(FLAGS_consumer));
  if (request.consumer().empty()) {
    Usage(command + " needs --consumer=C");
    return std::nullopt;
  }
  for (absl::string_view fqn :
       absl::StrSplit(absl::GetFlag(FLAGS_fqn), ',', absl::SkipEmpty())) {
    request.add_fqns(std::string(fqn));
  }
  if (FlagGiven("top_percentage") && FlagGiven("top_count")) {
    Usage(command + " takes --top_percentage or --top_count, not both");
    return std::nullopt;
  }
  if (FlagGiven("top_percentage")) {
    const double percentage = absl::GetFlag(FLAGS_top_percentage);
    if (!(percentage > 0 && percentage <= 100)) {
      Usage(absl::StrCat("--top_percentage must be in (0, 100], got ",
                         percentage));
      return std::nullopt;
    }
    request.mutable_top_k()->set_percentage(percentage);
  } else if (FlagGiven("top_count")) {
    const int64_t count = absl::GetFlag(FLAGS_top_count);
    if (count < 1) {
      Usage(absl::StrCat("--top_count must be >= 1, got ", count));
      return std::nullopt;
    }
    request.mutable_top_k()->set_count(count);
  }
  request.set_include_scores(absl::GetFlag(FLAGS_scores));
  request.set_omit_states(!absl::GetFlag(FLAGS_states));
  request.set_omit_values(!absl::GetFlag(FLAGS_values));
  return request;
}

int64_t Rows(const ReceivedDelta& delta) {
  int64_t rows = 0;
  for (const auto& [fqn, table] : delta.tables) rows += table.ids.numel();
  return rows;
}

// ", RESYNC REQUIRED (why)" after a delta's text line when its header says
// so, else "". The header counts the rows the memory cap dropped
// (lost_rows); a resync with none dropped has another cause the header does
// not carry (a read that did not reach the consumer, a restart behind its
// cursor, ranks that disagree), so none is named.
std::string ResyncText(const v1::DeltaHeader& header) {
  if (!header.resync_required()) return "";
  if (header.lost_rows() > 0) {
    return absl::StrCat(", RESYNC REQUIRED (", header.lost_rows(),
                        " rows dropped under the memory cap)");
  }
  return ", RESYNC REQUIRED (changes this consumer never received are gone: "
         "read all rows)";
}

// A failed read (get, subscribe) as one line. A deadline that passed is not
// an unreachable server: the server may have delivered the read (moved the
// consumer's cursor) while its rows were still on their way, and the
// consumer's next read then says resync_required.
int FailRead(const Invocation& run, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kDeadlineExceeded) {
    return Fail(kExitFailure, status);
  }
  // The client library words a deadline as it words an unreachable server
  // ("cannot reach HOST: Deadline Exceeded"): the host is kept, the words
  // not. Other deadlines (a stream gone quiet) keep theirs.
  absl::string_view detail = status.message();
  std::string from = run.target;
  if (absl::ConsumePrefix(&detail, "cannot reach ")) {
    from = std::string(detail.substr(0, detail.find(": ")));
    detail = "";
  }
  return Fail(
      kExitFailure,
      absl::StrCat(
          "the deadline passed before the read from ", from, " finished",
          detail.empty() ? "" : absl::StrCat(" (", detail, ")"),
          FlagGiven("timeout_ms")
              ? absl::StrCat(" (--timeout_ms=", absl::GetFlag(FLAGS_timeout_ms),
                             ")")
              : "",
          "; the server may have delivered it (moved the consumer's cursor), "
          "and if so the consumer's next read says resync_required"));
}

int WriteNpz(const ReceivedDelta& delta, const std::string& file,
             OutputFormat format) {
  if (absl::Status s = WriteDeltaNpz(file, delta); !s.ok()) {
    return Fail(kExitFailure, s);
  }
  const v1::DeltaHeader& header = delta.header;
  if (Structured(format)) {
    json out = DeltaJson(header, "file", file);
    out["tables"] = delta.tables.size();
    out["rows"] = Rows(delta);
    PrintStructured(out, format);
  } else {
    std::printf("wrote batches [%lld, %lld): %lld rows of %zu tables to %s%s\n",
                static_cast<long long>(header.start_batch()),
                static_cast<long long>(header.end_batch()),
                static_cast<long long>(Rows(delta)), delta.tables.size(),
                file.c_str(), ResyncText(header).c_str());
  }
  return 0;
}

// OK when `file` can be written: its "<file>.tmp", as WriteDeltaNpz writes
// it first, can be created, and `file` is not a directory (nor a link to
// one), which the rename of the finished file could not replace. Checked
// before a read, which moves the consumer's cursor, so that a bad path loses
// no rows. The status carries errno's code (absl::ErrnoToStatusCode).
absl::Status CheckWritable(const std::string& file) {
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot write '", file, "': it is a directory; nothing was read"));
  }
  const std::string tmp = file + ".tmp";
  std::FILE* probe = std::fopen(tmp.c_str(), "wb");
  if (probe == nullptr) {
    const int code = errno;
    return absl::Status(
        absl::ErrnoToStatusCode(code),
        absl::StrCat("cannot write '", tmp, "': ", std::strerror(code),
                     "; nothing was read"));
  }
  std::fclose(probe);
  std::remove(tmp.c_str());
  return absl::OkStatus();
}

int RunGet(const Invocation& run) {
  std::optional<v1::GetDeltaRequest> request = ReadRequest("get");
  if (!request.has_value()) return kExitUsage;
  const std::string file = absl::GetFlag(FLAGS_out);
  if (!file.empty()) {
    // A path that cannot name the file is bad usage (2); a disk that fails
    // the probe (no space, an I/O error) a failure (1): one rule with the
    // servers' start-up (base/process.h).
    if (absl::Status writable = CheckWritable(file); !writable.ok()) {
      return Fail(StartFailureExitCode(writable), writable);
    }
  }
  auto delta = run.client->GetDelta(*request);
  if (!delta.ok()) return FailRead(run, delta.status());
  if (!file.empty()) return WriteNpz(*delta, file, run.format);
  const v1::DeltaHeader& header = delta->header;
  if (Structured(run.format)) {
    json tables = json::object();
    for (const auto& [fqn, table] : delta->tables) {
      json t = {{"ids", TensorJson(table.ids)}};
      if (table.states.defined()) t["states"] = TensorJson(table.states);
      if (table.values.defined()) t["values"] = TensorJson(table.values);
      if (table.scores.defined()) t["scores"] = TensorJson(table.scores);
      tables[fqn] = std::move(t);
    }
    PrintStructured(DeltaJson(header, "tables", std::move(tables)), run.format);
    return 0;
  }
  const bool wide = run.format == OutputFormat::kWide;
  std::printf(
      "consumer %s: batches [%lld, %lld)%s\n", header.consumer().c_str(),
      static_cast<long long>(header.start_batch()),
      static_cast<long long>(header.end_batch()), ResyncText(header).c_str());
  if (wide) {
    std::printf("run %s from batch %lld, changes from %s to %s\n",
                header.run_id().empty() ? "-" : header.run_id().c_str(),
                static_cast<long long>(header.run_start_batch()),
                UnixMicrosText(header.oldest_change_unix_micros()).c_str(),
                UnixMicrosText(header.newest_change_unix_micros()).c_str());
  }
  std::vector<std::vector<std::string>> rows = {
      {"TABLE", "ROWS", "STATES", "VALUES", "BYTES"}};
  if (wide) rows[0].insert(rows[0].end(), {"SCORES", "DTYPE"});
  for (const auto& [fqn, table] : delta->tables) {
    int64_t bytes = table.ids.nbytes();
    for (const at::Tensor* t : {&table.states, &table.values, &table.scores}) {
      if (t->defined()) bytes += t->nbytes();
    }
    auto shape = [](const at::Tensor& t) {
      return t.defined() ? absl::StrJoin(t.sizes(), "x") : std::string("-");
    };
    rows.push_back({fqn, std::to_string(table.ids.numel()), shape(table.states),
                    shape(table.values),
                    wide ? std::to_string(bytes) : Bytes(bytes)});
    if (wide) {
      const at::Tensor& typed =
          table.values.defined() ? table.values : table.states;
      rows.back().push_back(shape(table.scores));
      rows.back().push_back(
          typed.defined() ? std::string(c10::toString(typed.scalar_type()))
                          : "-");
    }
  }
  PrintTable(rows);
  return 0;
}

int RunSubscribe(const Invocation& run) {
  v1::SubscribeRequest request;
  std::optional<v1::GetDeltaRequest> read = ReadRequest("subscribe");
  if (!read.has_value()) return kExitUsage;
  *request.mutable_read() = *read;
  request.set_every_steps(absl::GetFlag(FLAGS_every_steps));
  request.set_every_ms(absl::GetFlag(FLAGS_every_ms));
  const int64_t count = absl::GetFlag(FLAGS_count);
  int64_t received = 0;
  absl::Status status =
      run.client->Subscribe(request, [&](ReceivedDelta&& delta) {
        const v1::DeltaHeader& h = delta.header;
        if (Structured(run.format)) {
          json tables = json::object();
          for (const auto& [fqn, table] : delta.tables) {
            tables[fqn] = table.ids.numel();
          }
          PrintStructured(DeltaJson(h, "rows", std::move(tables)), run.format,
                          /*stream=*/true);
        } else {
          std::printf("batches [%lld, %lld): %lld rows in %zu tables%s\n",
                      static_cast<long long>(h.start_batch()),
                      static_cast<long long>(h.end_batch()),
                      static_cast<long long>(Rows(delta)), delta.tables.size(),
                      ResyncText(h).c_str());
        }
        std::fflush(stdout);
        return count == 0 || ++received < count;
      });
  return status.ok() ? 0 : FailRead(run, status);
}

int RunCommit(const Invocation& run) {
  const std::string consumer = absl::GetFlag(FLAGS_consumer);
  const int64_t end_batch = absl::GetFlag(FLAGS_end_batch);
  if (consumer.empty() || !FlagGiven("end_batch")) {
    return Usage(
        "commit needs --consumer=C --end_batch=B (B: the end_batch of the "
        "read to make final)");
  }
  if (end_batch < 0) {
    return Usage(absl::StrCat(
        "--end_batch must be >= 0 (a read's end_batch), got ", end_batch));
  }
  if (absl::Status s = run.client->Commit(consumer, end_batch); !s.ok()) {
    return Fail(kExitFailure, s);
  }
  if (Structured(run.format)) {
    PrintStructured({{"consumer", consumer}, {"end_batch", end_batch}},
                    run.format);
  } else {
    std::printf("committed %s's read up to batch %lld\n", consumer.c_str(),
                static_cast<long long>(end_batch));
  }
  return 0;
}

int RunConsumers(const Invocation& run) {
  const std::string verb = run.args.empty() ? "list" : run.args[0];
  absl::StatusOr<std::vector<std::string>> names;
  if (verb == "list") {
    if (run.args.size() > 1 || FlagGiven("consumer")) {
      return Usage("consumers list takes no name");
    }
    names = run.client->ListConsumers();
  } else if (verb == "add" || verb == "remove") {
    // The name: the argument, or --consumer; both only when they agree.
    const std::string flag = absl::GetFlag(FLAGS_consumer);
    if (run.args.size() > 1 && FlagGiven("consumer") && flag != run.args[1]) {
      return Usage(absl::StrCat("consumers ", verb, " takes one name: '",
                                run.args[1], "' and --consumer=", flag,
                                " disagree"));
    }
    const std::string name = run.args.size() > 1 ? run.args[1] : flag;
    if (name.empty()) return Usage("consumers " + verb + " needs a name");
    names = verb == "add" ? run.client->AddConsumer(name)
                          : run.client->RemoveConsumer(name);
  } else {
    return Usage("consumers takes list, add or remove, not '" + verb + "'");
  }
  if (!names.ok()) return Fail(kExitFailure, names.status());
  if (Structured(run.format)) {
    PrintStructured({{"consumers", *names}}, run.format);
  } else {
    for (const std::string& name : *names) std::printf("%s\n", name.c_str());
  }
  return 0;
}

int RunStatus(const Invocation& run) {
  return ShowStatus(run.client->Status(), run.format);
}

int RunCompact(const Invocation& run) {
  return ShowStatus(run.client->Compact(), run.format);
}

int RunClear(const Invocation& run) {
  return ShowStatus(run.client->Clear(absl::GetFlag(FLAGS_consumer)),
                    run.format);
}

int RunSnapshot(const Invocation& run) {
  auto info = run.client->Snapshot();
  if (!info.ok()) return Fail(kExitFailure, info.status());
  if (Structured(run.format)) {
    PrintStructured(MessageToJson(*info), run.format);
  } else {
    std::printf("%s\n", DescribeSnapshot(*info).c_str());
  }
  return 0;
}

// The serving trainer's ranks and where each table's shards live: the
// answer of any rank (a one-process trainer: world size 1).
int RunTopology(const Invocation& run) {
  auto topology = run.client->Topology();
  if (!topology.ok()) return Fail(kExitFailure, topology.status());
  if (Structured(run.format)) {
    PrintStructured(MessageToJson(*topology), run.format);
    return 0;
  }
  std::printf("world size %d (answered by rank %d)\n", topology->world_size(),
              topology->rank());
  std::vector<std::vector<std::string>> ranks = {{"RANK", "ENDPOINT"}};
  for (const v1::RankEndpoint& endpoint : topology->endpoints()) {
    ranks.push_back({absl::StrCat(endpoint.rank()), endpoint.address()});
  }
  PrintTable(ranks);
  std::vector<std::vector<std::string>> shards = {
      {"TABLE", "SHARDING", "RANK", "ROWS", "COLUMNS", "TABLE SIZE"}};
  for (const v1::TableShard& shard : topology->shards()) {
    shards.push_back(
        {shard.fqn(), shard.sharding_type(), absl::StrCat(shard.rank()),
         absl::StrCat("[", shard.row_offset(), ", ",
                      shard.row_offset() + shard.rows(), ")"),
         absl::StrCat("[", shard.col_offset(), ", ",
                      shard.col_offset() + shard.cols(), ")"),
         absl::StrCat(shard.table_rows(), " x ", shard.table_cols())});
  }
  std::printf("\n");
  PrintTable(shards);
  if (run.format == OutputFormat::kWide && !topology->plan().empty()) {
    std::printf("\nplan:\n%s", topology->plan().c_str());
  }
  return 0;
}

int RunWatch(const Invocation& run) {
  const bool clear_screen = !Structured(run.format) && isatty(STDOUT_FILENO);
  for (;;) {
    auto status = run.client->Status();
    if (clear_screen) std::printf("\033[H\033[2J");
    if (int rc = ShowStatus(status, run.format, /*stream=*/true); rc != 0) {
      return rc;
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(absl::GetFlag(FLAGS_interval_ms)));
  }
}

// The links of a checkpoint chain (store/checkpoint_chain.h), the batches
// they cover, their sizes, whether they carry dense parameters, the trainer
// run that served them, which are superseded by a newer full link, and any
// gap or overlap, or link that fails what the loader verifies (checksums,
// decoding, content matching the name). Offline: no server. Exit 1 when
// there is a problem.
int RunChain(const Invocation& run) {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) return Usage("chain needs --dir=D");
  // ListChain takes a missing directory for a chain not started yet (the
  // job's first link creates it); here it is a wrong path, not 0 links. A
  // path that is not a directory fails in ListChain with the same words.
  std::error_code missing;
  if (!std::filesystem::exists(dir, missing)) {
    return Fail(
        kExitFailure,
        absl::StrCat("cannot list the checkpoint chain '", dir, "': ",
                     missing ? missing.message() : std::strerror(ENOENT)));
  }
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
  // Problems go to the output with the links, and the first to stderr too.
  const auto exit_code = [&] {
    if (problems.empty()) return 0;
    return Fail(kExitFailure,
                absl::StrCat("the chain in '", dir, "' has ", problems.size(),
                             " problem(s); the first: ", problems.front()));
  };
  if (Structured(run.format)) {
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
    PrintStructured(out, run.format);
    return exit_code();
  }
  // Text: the layout scripts and tests/store:checkpoint_chain_test read;
  // wide adds the consumer and the write time after RUN. Batches [START,
  // END), as in the JSON, the file names and every delta.
  const bool wide = run.format == OutputFormat::kWide;
  std::printf("%-10s %12s %12s %12s %6s  %s%s\n", "KIND", "START_BATCH",
              "END_BATCH", "BYTES", "DENSE", "RUN",
              wide ? "  CONSUMER  WRITTEN" : "");
  for (size_t i = 0; i < links->size(); ++i) {
    const ChainLink& link = (*links)[i];
    const std::optional<ChainLinkInfo>& info = infos[i];
    std::string run_text = "?";
    if (info.has_value()) {
      run_text = info->run_id.empty()
                     ? "-"
                     : absl::StrCat(info->run_id, " (from batch ",
                                    info->run_start_batch, ")");
    }
    if (wide) {
      absl::StrAppend(
          &run_text, "  ", info.has_value() ? info->consumer : "?", "  ",
          info.has_value() ? UnixMicrosText(info->written_unix_ms * 1000)
                           : "?");
    }
    std::printf("%-10s %12lld %12lld %12lld %6s  %s%s\n",
                link.full ? "full" : "increment",
                static_cast<long long>(link.start_batch),
                static_cast<long long>(link.end_batch),
                static_cast<long long>(link.bytes),
                !info.has_value()            ? "?"
                : info->dense_parameters > 0 ? "yes"
                                             : "no",
                run_text.c_str(),
                applied.count(link.path) == 0 ? "  superseded" : "");
  }
  std::printf("%zu links, %.1f MiB%s\n", links->size(), bytes / 1048576.0,
              problems.empty() ? ", no gaps" : "");
  for (const std::string& problem : problems) {
    std::printf("problem: %s\n", problem.c_str());
  }
  std::fflush(stdout);
  return exit_code();
}

const std::vector<Command>& Commands() {
  static const auto* const commands = new std::vector<Command>{
      {"push",
       "--json_file=F",
       "record lookups into the current batch",
       {"json_file"},
       true,
       0,
       RunPush},
      {"step", "", "close the current batch", {}, true, 0, RunStep},
      {"get",
       "--consumer=C [--fqn=F,...] [--top_percentage=P | --top_count=N] "
       "[--scores] [--states=false] [--values=false] [--out=F.npz]",
       "read the consumer's delta",
       {"consumer", "fqn", "top_percentage", "top_count", "scores", "states",
        "values", "out"},
       true,
       0,
       RunGet},
      {"commit",
       "--consumer=C --end_batch=B",
       "acknowledged mode: make a read final",
       {"consumer", "end_batch"},
       true,
       0,
       RunCommit},
      {"consumers",
       "[list | add NAME | remove NAME]",
       "list, add or remove consumers",
       {"consumer"},
       true,
       2,
       RunConsumers},
      {"status",
       "",
       "batch, memory, consumers and their lag, tables",
       {},
       true,
       0,
       RunStatus},
      {"watch",
       "[--interval_ms=N]",
       "status, refreshed",
       {"interval_ms"},
       true,
       0,
       RunWatch},
      {"topology",
       "",
       "the trainer's ranks, their endpoints and each table's shards",
       {},
       true,
       0,
       RunTopology},
      {"compact", "", "compact the held lookups", {}, true, 0, RunCompact},
      {"clear",
       "[--consumer=C]",
       "move every consumer (or C) to the present: rows it has not read are "
       "dropped for it, with no resync",
       {"consumer"},
       true,
       0,
       RunClear},
      {"snapshot",
       "",
       "write a snapshot to the server's database",
       {},
       true,
       0,
       RunSnapshot},
      {"subscribe",
       "--consumer=C [--every_steps=N] [--every_ms=T] [--count=K] [get's "
       "read flags]",
       "stream deltas as the server pushes them",
       {"consumer", "fqn", "top_percentage", "top_count", "scores", "states",
        "values", "every_steps", "every_ms", "count"},
       true,
       0,
       RunSubscribe},
      {"chain",
       "--dir=D",
       "show and verify a checkpoint chain (offline, no server)",
       {"dir"},
       false,
       0,
       RunChain},
  };
  return *commands;
}

// The flags `command` takes, in groups: its own, output, connection.
std::vector<std::vector<std::string>> FlagGroups(const Command& command) {
  std::vector<std::vector<std::string>> groups = {command.flags, OutputFlags()};
  if (command.connects) groups.push_back(ConnectionFlags());
  return groups;
}

std::vector<absl::CommandLineFlag*> Flags(
    const std::vector<std::string>& names) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const std::string& name : names) {
    flags.push_back(absl::FindCommandLineFlag(name));
  }
  return flags;
}

void PrintHelp(const Command* command) {
  const std::vector<std::string> titles = {"flags", "output flags",
                                           "connection flags"};
  std::vector<std::vector<std::string>> groups;
  if (command == nullptr) {
    std::printf(
        "usage: %s [--target=HOST:PORT] <command> [args] [flags]\n\n"
        "commands:\n",
        kProgram);
    size_t width = 0;
    for (const Command& c : Commands()) width = std::max(width, c.name.size());
    for (const Command& c : Commands()) {
      std::printf("  %-*s  %s\n", static_cast<int>(width), c.name.c_str(),
                  c.summary.c_str());
    }
    std::printf(
        "\n'%s <command> --help' lists a command's flags. Exit codes: 0 "
        "success, 1 a failed request, 2 bad usage.\n",
        kProgram);
    groups = {{}, OutputFlags(), ConnectionFlags()};
  } else {
    std::printf("usage: %s %s%s%s [flags]\n\n%s\n", kProgram,
                command->name.c_str(), command->usage.empty() ? "" : " ",
                command->usage.c_str(), command->summary.c_str());
    groups = FlagGroups(*command);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) continue;
    std::printf("\n%s:\n%s", titles[g].c_str(),
                FlagsHelp(Flags(groups[g])).c_str());
  }
}

// The hidden command the completion script calls: with no argument the
// commands and the global flags; with a command, its flags ("--name=" when
// it takes a value) and its words.
int Complete(const std::vector<std::string>& args) {
  std::vector<std::string> words;
  const Command* command = args.empty() ? nullptr : FindCommand(args[0]);
  if (command == nullptr) {
    for (const Command& c : Commands()) words.push_back(c.name);
  }
  std::vector<std::vector<std::string>> groups =
      command == nullptr
          ? std::vector<std::vector<std::string>>{OutputFlags(),
                                                  ConnectionFlags()}
          : FlagGroups(*command);
  groups.push_back({"help"});
  for (const std::vector<std::string>& group : groups) {
    for (const std::string& name : group) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      words.push_back(absl::StrCat(
          "--", name, flag != nullptr && !flag->IsOfType<bool>() ? "=" : ""));
    }
  }
  if (command != nullptr && command->name == "consumers") {
    words.insert(words.end(), {"list", "add", "remove"});
  }
  for (const std::string& word : words) std::printf("%s\n", word.c_str());
  return 0;
}

// The values every command may read, checked for range: an empty string, or
// the first bad value as one line (bad usage). A negative subscription
// period is refused here too; the upper limits of the periods are the
// server's to check (its message names them). The top-k flags are checked
// in ReadRequest.
std::string FlagError() {
  if (absl::GetFlag(FLAGS_timeout_ms) <= 0) return "--timeout_ms must be > 0";
  if (absl::GetFlag(FLAGS_interval_ms) <= 0) {
    return "--interval_ms must be > 0";
  }
  if (absl::GetFlag(FLAGS_count) < 0) return "--count must be >= 0";
  if (const int64_t steps = absl::GetFlag(FLAGS_every_steps); steps < 0) {
    return absl::StrCat("--every_steps must be >= 0 (0: every step), got ",
                        steps);
  }
  if (const int64_t ms = absl::GetFlag(FLAGS_every_ms); ms < 0) {
    return absl::StrCat("--every_ms must be >= 0 (0: by steps only), got ", ms);
  }
  return "";
}

// --target when given (not empty), else $DELTACTL_TARGET when set and not
// empty, else the flag's default; HOST:PORT (ValidateTarget).
absl::StatusOr<std::string> Target() {
  std::string target = absl::GetFlag(FLAGS_target);
  if (FlagGiven("target")) {
    if (target.empty()) {
      return absl::InvalidArgumentError("--target must not be empty");
    }
  } else if (const char* from_environment = std::getenv("DELTACTL_TARGET");
             from_environment != nullptr && *from_environment != '\0') {
    target = from_environment;
  }
  if (absl::Status valid = ValidateTarget(target); !valid.ok()) return valid;
  return target;
}

int Run(int argc, char** argv) {
  CommandLineOptions options;
  options.allow_positional = true;
  options.short_names = {{"o", "output"}};
  absl::StatusOr<ParsedCommandLine> line =
      ParseCommandLine(argc, argv, options);
  if (!line.ok()) return Usage(line.status().message());
  std::vector<std::string> args = line->positional;
  if (!args.empty() && args[0] == "__complete") {
    return Complete({args.begin() + 1, args.end()});
  }
  if (!args.empty() && args[0] == "help") {
    args.erase(args.begin());
    line->help = true;
  }
  const Command* command = args.empty() ? nullptr : FindCommand(args[0]);
  if (!args.empty() && command == nullptr) {
    return Usage(absl::StrCat("unknown command '", args[0], "'; see ", kProgram,
                              " --help"));
  }
  if (line->help) {
    PrintHelp(command);
    return 0;
  }
  if (command == nullptr) {
    return Usage(absl::StrCat("no command; see ", kProgram, " --help"));
  }
  const std::vector<std::vector<std::string>> groups = FlagGroups(*command);
  for (const std::string& flag : line->flags) {
    bool applies = false;
    for (const std::vector<std::string>& group : groups) {
      applies = applies || std::count(group.begin(), group.end(), flag) > 0;
    }
    if (!applies) {
      return Usage(absl::StrCat("--", flag, " does not apply to ",
                                command->name, "; see ", kProgram, " ",
                                command->name, " --help"));
    }
  }
  args.erase(args.begin());
  if (args.size() > command->max_args) {
    return Usage(absl::StrCat("unexpected argument '", args[command->max_args],
                              "' to ", command->name));
  }
  Invocation run;
  run.args = std::move(args);
  absl::StatusOr<OutputFormat> format =
      ParseOutputFormat(absl::GetFlag(FLAGS_output));
  if (!format.ok()) return Usage(format.status().message());
  run.format = *format;
  if (absl::GetFlag(FLAGS_json)) {
    if (run.format != OutputFormat::kJson && FlagGiven("output")) {
      return Usage(absl::StrCat("--json and -o ", absl::GetFlag(FLAGS_output),
                                " disagree"));
    }
    run.format = OutputFormat::kJson;
  }
  if (const std::string error = FlagError(); !error.empty()) {
    return Usage(error);
  }
  if (!command->connects) return command->run(run);
  absl::StatusOr<std::string> target = Target();
  if (!target.ok()) return Usage(target.status().message());
  ClientOptions client_options;
  client_options.timeout =
      std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  // Given, it bounds streamed calls too (`get`, `push`: a hung rank fails a
  // read then); left out, a large read keeps the streams' own 10 minutes.
  if (FlagGiven("timeout_ms"))
    client_options.stream_timeout = client_options.timeout;
  if (absl::Status read =
          ReadCredentialFiles(absl::GetFlag(FLAGS_token_file),
                              absl::GetFlag(FLAGS_tls_ca), client_options);
      !read.ok()) {
    return FailStart(read);  // a bad token or roots: 2; unreadable: EIO 1
  }
  std::unique_ptr<FanInClient> client =
      FanInClient::Connect(*target, client_options);
  std::unique_ptr<DeltaClient> server =
      DeltaClient::Create(*target, client_options);
  run.client = client.get();
  run.server = server.get();
  run.target = *target;
  return command->run(run);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  try {
    return deltastream::Run(argc, argv);
  } catch (const c10::Error& e) {  // LibTorch's, converting tensors
    // One line, as every error: what() would add LibTorch's backtrace.
    return deltastream::Fail(deltastream::kExitFailure,
                             e.what_without_backtrace());
  } catch (const std::exception& e) {
    return deltastream::Fail(deltastream::kExitFailure, e.what());
  }
}
