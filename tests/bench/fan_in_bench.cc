// Fan-in read throughput of a sharded trainer (issue 16, "Numbers"): the same
// total delta read from 1, 2 and 4 ranks through FanInClient, against a
// single-rank read of the same bytes through DeltaClient (the goal: no worse
// than 80% of it).
//
// The real trainer binary, twice at a time: one process (the baseline) and
// --nproc_per_node=N for each N of --ranks, the same model (--tables tables
// of --rows x --dim float32, every table row-wise over the N ranks by
// default, so that each rank holds 1/N; --sharding), the same global batch
// (--batch, split over the ranks) and --steps steps, tracking on (id_only,
// rows kept on read). Once both have trained their steps they keep serving
// (a consumer that never reads holds the drain open, 600 s at most) while the
// bench times, alternating the two trainers and their order:
//   - all_rows reads (every row of every table; repeatable);
//   - changed-rows reads, each by a consumer that has read nothing yet (so
//     each returns every row the --steps steps touched: repeatable too);
// and, for N >= 2, MergeRankDeltas alone on copies of the N parts of one
// read of each kind. The first read of each kind is a warm-up, checked to
// carry the baseline's tables and IDs; the largest difference of its values
// from the baseline's goes to the JSON lines (the runs train the same
// batches, split differently: float rounding).
//
// Reports per read kind and N: MB (1e6 bytes: IDs + values), median and
// min-max MB/s of --reads reads each, the ratio fan-in / single-rank of the
// medians and the merge's median; with --json also one JSON object per line.
// The machine's load average (/proc/loadavg) before and after.
//
// Every child is started in its own process group (the launcher and its
// ranks) and killed with it on exit, on error and on SIGINT/SIGTERM; every
// wait has a timeout. The children's stderr goes to --child_logs.<name>.log.
//
//   bazel run -c opt //tests/bench:fan_in_bench -- [--ranks=1,2,4 --reads=7
//       --json]
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/host_memory.h"
#include "clients/delta_client.h"
#include "clients/fan_in_client.h"
#include "google/protobuf/text_format.h"
#include "tests/bench/timing.h"
#include "tests/integration/server_process.h"
#include "trainer/sharding/sharding_plan.h"

ABSL_FLAG(std::string, ranks, "1,2,4", "world sizes of the fan-in trainer");
ABSL_FLAG(int, tables, 4, "tables of the model");
ABSL_FLAG(int64_t, rows, 131072, "rows per table");
ABSL_FLAG(int64_t, dim, 32, "embedding dimension (float32)");
ABSL_FLAG(int64_t, batch, 512, "global batch size (split over the ranks)");
ABSL_FLAG(std::string, sharding, "row_wise",
          "how every table is sharded: row_wise, column_wise, table_wise or "
          "mixed (table i row-wise, column-wise, table-wise in turn)");
ABSL_FLAG(int64_t, steps, 10, "steps each trainer trains before the reads");
ABSL_FLAG(int, reads, 7, "timed reads per kind, trainer and N (>= 5)");
ABSL_FLAG(int, start_timeout_s, 300,
          "how long a trainer may take to listen and train its steps");
ABSL_FLAG(bool, reuse_memory, true,
          "keep freed host memory for reuse (base/host_memory.h), as the "
          "other benchmarks and the servers do; false: glibc's defaults, "
          "under which every read faults its pages in afresh");
ABSL_FLAG(std::string, kinds, "all_rows,changed",
          "the kinds of read to time (all_rows, changed): e.g. changed alone "
          "with many --reads to profile it");
ABSL_FLAG(bool, bind_cores, false,
          "start the fan-in trainer with --bind_cores (each rank on cores of "
          "its own)");
ABSL_FLAG(bool, json, false, "also print one JSON object per line");
ABSL_FLAG(std::string, child_logs, "/tmp/fan_in_bench",
          "the trainers' stderr goes to <child_logs>.<name>.log");

namespace deltastream {
namespace {

using bench::Clock;
using bench::Median;
using bench::Seconds;

// Process groups of the running children, for the signal handler.
constexpr int kMaxGroups = 8;
std::atomic<pid_t> running_groups[kMaxGroups];

void KillRunningGroups() {
  for (std::atomic<pid_t>& group : running_groups) {
    const pid_t pgid = group.exchange(0);
    if (pgid > 0) killpg(pgid, SIGKILL);
  }
}

void OnSignal(int signal) {
  KillRunningGroups();
  _exit(128 + signal);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The trainer binary (one process, or the --nproc_per_node launcher and its
// ranks) in a process group of its own, killed as a whole on destruction.
// Its stdout goes to a file (the "listening on" lines), its stderr to a log.
class TrainerGroup {
 public:
  TrainerGroup(std::string name, const std::vector<std::string>& flags,
               const std::string& log)
      : name_(std::move(name)), out_(log + ".out"), log_(log + ".log") {
    const std::string binary = RunfilePath("trainer/trainer");
    std::ofstream(out_, std::ios::trunc);  // no earlier run's lines
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (!freopen(out_.c_str(), "a", stdout) ||
          !freopen(log_.c_str(), "w", stderr)) {
        _exit(127);
      }
      std::vector<std::string> argv = {binary};
      argv.insert(argv.end(), flags.begin(), flags.end());
      std::vector<char*> args;
      for (std::string& arg : argv) args.push_back(arg.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    if (pid_ > 0) {
      setpgid(pid_, pid_);  // as the child does: no race with killpg
      for (std::atomic<pid_t>& group : running_groups) {
        pid_t free = 0;
        if (group.compare_exchange_strong(free, pid_)) break;
      }
    }
  }
  TrainerGroup(const TrainerGroup&) = delete;
  TrainerGroup& operator=(const TrainerGroup&) = delete;
  ~TrainerGroup() {
    if (pid_ <= 0) return;
    KillGroup();
    waitpid(pid_, nullptr, 0);
  }

  // The address of the first "listening on HOST:PORT" line, once `lines`
  // (one per rank) are printed. DeadlineExceeded after `timeout`; Internal
  // when the trainer exited first (naming its log).
  absl::StatusOr<std::string> WaitListening(int lines, absl::Duration timeout) {
    if (pid_ <= 0) return absl::InternalError("cannot fork the trainer");
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      std::vector<std::string> addresses;
      for (absl::string_view line : absl::StrSplit(ReadFile(out_), '\n')) {
        if (absl::ConsumePrefix(&line, "listening on ")) {
          addresses.emplace_back(line);
        }
      }
      if (static_cast<int>(addresses.size()) >= lines) return addresses[0];
      if (absl::Status exited = Exited(); !exited.ok()) return exited;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(name_, ": not listening after ",
                         absl::FormatDuration(timeout), "; see ", log_));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  // The CPU seconds the group's processes (the trainer, or the launcher and
  // its ranks) have used so far, exited threads included.
  double CpuSeconds() const {
    double seconds = 0;
    for (const std::filesystem::directory_entry& entry :
         std::filesystem::directory_iterator("/proc")) {
      pid_t pid = 0;
      if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
      // Fields after the command's closing parenthesis: state, ppid, pgrp.
      const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
      const size_t end = stat.rfind(')');
      if (end == std::string::npos) continue;
      std::vector<absl::string_view> fields =
          absl::StrSplit(absl::string_view(stat).substr(end + 2), ' ');
      pid_t group = 0;
      clockid_t clock;
      timespec used;
      if (fields.size() < 3 || !absl::SimpleAtoi(fields[2], &group) ||
          group != pid_ || clock_getcpuclockid(pid, &clock) != 0 ||
          clock_gettime(clock, &used) != 0) {
        continue;
      }
      seconds += used.tv_sec + used.tv_nsec * 1e-9;
    }
    return seconds;
  }

  // OK while the trainer runs.
  absl::Status Exited() {
    int status = 0;
    if (pid_ <= 0 || waitpid(pid_, &status, WNOHANG) != pid_) {
      return absl::OkStatus();
    }
    KillGroup();  // a rank the launcher left behind
    pid_ = -1;
    return absl::InternalError(
        absl::StrCat(name_, " exited (status ", status, "); see ", log_));
  }

 private:
  // Kills every process of the group and forgets it for the signal handler.
  void KillGroup() {
    for (std::atomic<pid_t>& group : running_groups) {
      pid_t mine = pid_;
      group.compare_exchange_strong(mine, 0);
    }
    killpg(pid_, SIGKILL);
  }

  std::string name_;
  std::string out_;
  std::string log_;
  pid_t pid_ = -1;
};

struct Model {
  int tables;
  int64_t rows;
  int64_t dim;
  int64_t batch;  // global
  int64_t steps;
};

std::vector<EmbeddingTableConfig> Tables(const Model& model) {
  std::vector<EmbeddingTableConfig> tables(model.tables);
  for (int t = 0; t < model.tables; ++t) {
    tables[t].name = absl::StrCat("t", t);
    tables[t].num_embeddings = model.rows;
    tables[t].embedding_dim = model.dim;
  }
  return tables;
}

constexpr const char* kShardings[] = {"row_wise", "column_wise", "table_wise",
                                      "mixed"};

// The plan of `model` over `ranks` ranks, every table sharded as `sharding`
// (one of kShardings) says.
v1::ShardingPlan PlanOf(const Model& model, int ranks,
                        const std::string& sharding) {
  std::vector<int> all(ranks);
  for (int r = 0; r < ranks; ++r) all[r] = r;
  v1::ShardingPlan plan;
  plan.set_world_size(ranks);
  const std::vector<EmbeddingTableConfig> tables = Tables(model);
  for (size_t t = 0; t < tables.size(); ++t) {
    const std::string type = sharding != "mixed" ? sharding : kShardings[t % 3];
    *plan.add_tables() = type == "row_wise" ? RowWisePlan(tables[t], ranks)
                         : type == "column_wise"
                             ? ColumnWisePlan(tables[t], all)
                             : TableWisePlan(tables[t], t % ranks);
  }
  return plan;
}

// The trainer config for `ranks` ranks (the per-rank batch), serving
// `consumers` (the first never reads: it keeps the trainer serving).
std::string ConfigText(const Model& model, int ranks,
                       const std::vector<std::string>& consumers) {
  std::string tables;
  for (const EmbeddingTableConfig& table : Tables(model)) {
    absl::StrAppend(&tables, "  tables { name: \"", table.name,
                    "\" num_embeddings: ", table.num_embeddings,
                    " embedding_dim: ", table.embedding_dim, " }\n");
  }
  std::string consumer_list;
  for (const std::string& consumer : consumers) {
    absl::StrAppend(&consumer_list, " consumers: \"", consumer, "\"");
  }
  return absl::StrCat(
      "model {\n  num_dense: 4\n  dense_arch: [16, ", model.dim,
      "]\n  over_arch: [16, 1]\n", tables, "}\n",
      "data { batch_size: ", model.batch / ranks,
      " synthetic { min_length: 1 max_length: 8 } eval_batches: 1 }\n",
      "tracker { mode: \"id_only\" keep_on_read: true drain_seconds: 600",
      consumer_list, " }\n", "steps: ", model.steps,
      "\nlog_every_steps: 1000\nseed: 7\n");
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Waits until `client` (every rank of `group`: a merged status says the
// lowest rank's batch) has trained `steps` steps.
absl::Status WaitTrained(TrackerClient& client, int64_t steps,
                         TrainerGroup& group, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<v1::StatusResponse> status = client.Status();
    if (!status.ok()) return status.status();
    if (status->current_batch() >= steps) return absl::OkStatus();
    if (absl::Status exited = group.Exited(); !exited.ok()) return exited;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          client.target(), " at batch ", status->current_batch(), " of ", steps,
          " after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

int64_t Bytes(const ReceivedDelta& delta) {
  int64_t bytes = 0;
  for (const auto& [fqn, table] : delta.tables) {
    for (const at::Tensor* tensor :
         {&table.ids, &table.states, &table.values, &table.scores}) {
      if (tensor->defined()) bytes += tensor->nbytes();
    }
  }
  return bytes;
}

// OK when `fan_in` holds the baseline's tables and IDs; `*max_diff` is the
// largest difference of their values.
absl::Status SameRows(const ReceivedDelta& baseline,
                      const ReceivedDelta& fan_in, double* max_diff) {
  *max_diff = 0;
  if (baseline.tables.size() != fan_in.tables.size()) {
    return absl::InternalError(
        absl::StrCat("fan-in read ", fan_in.tables.size(),
                     " tables, the baseline ", baseline.tables.size()));
  }
  for (const auto& [fqn, table] : baseline.tables) {
    auto other = fan_in.tables.find(fqn);
    if (other == fan_in.tables.end()) {
      return absl::InternalError(absl::StrCat("fan-in read no table ", fqn));
    }
    if (!table.ids.equal(other->second.ids)) {
      return absl::InternalError(absl::StrCat(
          "table ", fqn, ": fan-in read ", other->second.ids.numel(),
          " IDs, the baseline ", table.ids.numel(), " (or others)"));
    }
    if (table.values.defined() && table.values.numel() > 0) {
      *max_diff = std::max(
          *max_diff,
          (table.values - other->second.values).abs().max().item<double>());
    }
  }
  return absl::OkStatus();
}

ReceivedDelta Clone(const ReceivedDelta& delta) {
  ReceivedDelta copy;
  copy.header = delta.header;
  for (const auto& [fqn, table] : delta.tables) {
    ReceivedTable& to = copy.tables[fqn];
    to = table;
    for (at::Tensor ReceivedTable::*member :
         {&ReceivedTable::ids, &ReceivedTable::states, &ReceivedTable::values,
          &ReceivedTable::scores}) {
      if ((table.*member).defined()) to.*member = (table.*member).clone();
    }
  }
  return copy;
}

struct Series {
  std::vector<double> seconds;
  // The calling thread's CPU seconds of each read (the client's share).
  std::vector<double> client_cpu;
  // The server's CPU seconds over all reads (its process group's, idle
  // serving included), divided by their number.
  double server_cpu = 0;
  int64_t bytes = 0;

  double MBps(double s) const { return bytes / 1e6 / s; }
  double MedianMBps() const { return MBps(Median(seconds)); }
  double MinMBps() const {
    return MBps(*std::max_element(seconds.begin(), seconds.end()));
  }
  double MaxMBps() const {
    return MBps(*std::min_element(seconds.begin(), seconds.end()));
  }
};

struct Row {
  std::string read;
  int ranks;
  Series single;
  Series fan_in;
  std::optional<Series> merge;  // N >= 2
  double max_diff = 0;
};

std::string Spread(const Series& s) {
  return absl::StrFormat("%.0f (%.0f-%.0f)", s.MedianMBps(), s.MinMBps(),
                         s.MaxMBps());
}

// "server + client" CPU milliseconds per read.
std::string Cpu(const Series& s) {
  return absl::StrFormat("%.2f+%.2f", 1e3 * s.server_cpu,
                         1e3 * Median(s.client_cpu));
}

void PrintRows(const std::vector<Row>& rows, bool json) {
  absl::PrintF("%-9s %5s %8s %24s %24s %7s %10s %21s\n", "read", "ranks", "MB",
               "single-rank MB/s", "fan-in MB/s", "ratio", "merge ms",
               "cpu ms single/fan-in");
  for (const Row& row : rows) {
    const double ratio = row.fan_in.MedianMBps() / row.single.MedianMBps();
    absl::PrintF(
        "%-9s %5d %8.1f %24s %24s %6.0f%% %10s %21s\n", row.read, row.ranks,
        row.fan_in.bytes / 1e6, Spread(row.single) + " MB/s",
        Spread(row.fan_in) + " MB/s", 100 * ratio,
        row.merge ? absl::StrFormat("%.1f", 1e3 * Median(row.merge->seconds))
                  : "-",
        Cpu(row.single) + " " + Cpu(row.fan_in));
  }
  if (!json) return;
  for (const Row& row : rows) {
    absl::PrintF(
        "{\"bench\":\"fan_in\",\"read\":\"%s\",\"ranks\":%d,\"bytes\":%d,"
        "\"single_bytes\":%d,\"reads\":%d,"
        "\"single_mbps\":%.1f,\"single_mbps_min\":%.1f,"
        "\"single_mbps_max\":%.1f,\"fan_in_mbps\":%.1f,"
        "\"fan_in_mbps_min\":%.1f,\"fan_in_mbps_max\":%.1f,\"ratio\":%.3f,"
        "\"merge_ms\":%s,\"max_value_diff\":%g,"
        "\"single_server_cpu_ms\":%.3f,\"single_client_cpu_ms\":%.3f,"
        "\"fan_in_server_cpu_ms\":%.3f,\"fan_in_client_cpu_ms\":%.3f}\n",
        row.read, row.ranks, row.fan_in.bytes, row.single.bytes,
        row.fan_in.seconds.size(), row.single.MedianMBps(),
        row.single.MinMBps(), row.single.MaxMBps(), row.fan_in.MedianMBps(),
        row.fan_in.MinMBps(), row.fan_in.MaxMBps(),
        row.fan_in.MedianMBps() / row.single.MedianMBps(),
        row.merge ? absl::StrFormat("%.2f", 1e3 * Median(row.merge->seconds))
                  : "null",
        row.max_diff, 1e3 * row.single.server_cpu,
        1e3 * Median(row.single.client_cpu), 1e3 * row.fan_in.server_cpu,
        1e3 * Median(row.fan_in.client_cpu));
  }
}

double ThreadCpuSeconds() {
  timespec used;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &used);
  return used.tv_sec + used.tv_nsec * 1e-9;
}

// Times one read; its bytes go to `series`.
absl::StatusOr<ReceivedDelta> TimedRead(
    const std::function<absl::StatusOr<ReceivedDelta>()>& read,
    Series& series) {
  const double cpu_start = ThreadCpuSeconds();
  const Clock::time_point start = Clock::now();
  absl::StatusOr<ReceivedDelta> delta = read();
  const double seconds = Seconds(start);
  const double cpu = ThreadCpuSeconds() - cpu_start;
  if (!delta.ok()) return delta.status();
  series.seconds.push_back(seconds);
  series.client_cpu.push_back(cpu);
  series.bytes = Bytes(*delta);
  return delta;
}

v1::GetDeltaRequest ReadRequest(const std::string& consumer, bool all_rows) {
  v1::GetDeltaRequest request;
  request.set_consumer(consumer);
  request.set_all_rows(all_rows);
  return request;
}

// Both kinds of read from `single` and `fan_in`, alternated: a warm-up
// (checked), then `reads` timed each. Changed-rows reads go to consumers
// <changed_prefix><i> of the baseline and c<i> of the fan-in trainer.
absl::Status Measure(DeltaClient& single, const TrainerGroup& single_trainer,
                     FanInClient& fan_in, const TrainerGroup& fan_in_trainer,
                     int ranks, int reads, const std::string& changed_prefix,
                     const std::vector<bool>& kinds,
                     const ClientOptions& options, std::vector<Row>& rows) {
  for (const bool all_rows : kinds) {
    Row row{all_rows ? "all_rows" : "changed", ranks};
    double single_cpu = 0, fan_in_cpu = 0;  // the servers', from read 0
    for (int i = -1; i < reads; ++i) {
      if (i == 0) {
        single_cpu = single_trainer.CpuSeconds();
        fan_in_cpu = fan_in_trainer.CpuSeconds();
      }
      const std::string name = absl::StrCat("c", i + 1);
      const v1::GetDeltaRequest single_request =
          ReadRequest(all_rows ? "all" : changed_prefix + name, all_rows);
      const v1::GetDeltaRequest fan_in_request =
          ReadRequest(all_rows ? "all" : name, all_rows);
      Series warm_single, warm_fan_in;
      Series& single_series = i < 0 ? warm_single : row.single;
      Series& fan_in_series = i < 0 ? warm_fan_in : row.fan_in;
      absl::StatusOr<ReceivedDelta> a, b;
      auto read_single = [&] {
        a = TimedRead([&] { return single.GetDelta(single_request); },
                      single_series);
      };
      auto read_fan_in = [&] {
        b = TimedRead([&] { return fan_in.GetDelta(fan_in_request); },
                      fan_in_series);
      };
      if (i % 2 == 0) {
        read_single();
        read_fan_in();
      } else {
        read_fan_in();
        read_single();
      }
      if (!a.ok()) return a.status();
      if (!b.ok()) return b.status();
      if (i < 0) {
        absl::Status same = SameRows(*a, *b, &row.max_diff);
        if (!same.ok()) {
          return absl::InternalError(
              absl::StrCat(ranks, " ranks, ", row.read, ": ", same.message()));
        }
      }
    }
    row.single.server_cpu = (single_trainer.CpuSeconds() - single_cpu) / reads;
    row.fan_in.server_cpu = (fan_in_trainer.CpuSeconds() - fan_in_cpu) / reads;
    if (ranks > 1) {
      // The merge alone, on copies of one read's parts, each read from its
      // rank on its own.
      absl::StatusOr<v1::TopologyResponse> topology = fan_in.Topology();
      if (!topology.ok()) return topology.status();
      std::vector<ReceivedDelta> parts;
      for (const v1::RankEndpoint& endpoint : topology->endpoints()) {
        absl::StatusOr<ReceivedDelta> part =
            DeltaClient::Create(endpoint.address(), options)
                ->GetDelta(ReadRequest(all_rows ? "all" : "merge", all_rows));
        if (!part.ok()) return part.status();
        parts.push_back(*std::move(part));
      }
      Series merge;
      for (int i = 0; i < reads; ++i) {
        std::vector<ReceivedDelta> copies;
        for (const ReceivedDelta& part : parts) copies.push_back(Clone(part));
        absl::StatusOr<ReceivedDelta> merged = TimedRead(
            [&] { return MergeRankDeltas(*topology, std::move(copies)); },
            merge);
        if (!merged.ok()) return merged.status();
      }
      row.merge = std::move(merge);
    }
    rows.push_back(std::move(row));
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& status) {
  absl::FPrintF(stderr, "fan_in_bench: %s\n", status.message());
  return 1;
}

int Run() {
  const Model model{absl::GetFlag(FLAGS_tables), absl::GetFlag(FLAGS_rows),
                    absl::GetFlag(FLAGS_dim), absl::GetFlag(FLAGS_batch),
                    absl::GetFlag(FLAGS_steps)};
  const int reads = absl::GetFlag(FLAGS_reads);
  std::vector<int> world_sizes;
  for (absl::string_view n :
       absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',', absl::SkipEmpty())) {
    int size = 0;
    if (!absl::SimpleAtoi(n, &size) || size < 1 || model.batch % size != 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--ranks: '", n, "' is no world size dividing --batch")));
    }
    world_sizes.push_back(size);
  }
  std::vector<bool> kinds;  // all_rows or not
  for (absl::string_view kind :
       absl::StrSplit(absl::GetFlag(FLAGS_kinds), ',', absl::SkipEmpty())) {
    if (kind != "all_rows" && kind != "changed") {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--kinds: '", kind, "' is neither all_rows nor changed")));
    }
    kinds.push_back(kind == "all_rows");
  }
  const std::string sharding = absl::GetFlag(FLAGS_sharding);
  if (std::find(std::begin(kShardings), std::end(kShardings), sharding) ==
      std::end(kShardings)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--sharding: '", sharding, "' is none of ",
                     absl::StrJoin(kShardings, ", "))));
  }
  if (reads < 5 || model.tables < 1 || model.rows < 1 || model.dim < 1 ||
      model.steps < 1) {
    return Fail(absl::InvalidArgumentError(
        "--reads must be >= 5; --tables, --rows, --dim and --steps >= 1"));
  }
  const absl::Duration timeout =
      absl::Seconds(absl::GetFlag(FLAGS_start_timeout_s));
  const std::string logs = absl::GetFlag(FLAGS_child_logs);
  // The configs and plans; removed on every return.
  const std::string work = std::filesystem::temp_directory_path() /
                           absl::StrFormat("fan_in_bench.%d", getpid());
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  struct RemovedAtExit {
    std::string path;
    ~RemovedAtExit() { std::filesystem::remove_all(path); }
  } removed{work};
  ClientOptions options;
  options.max_receive_message_bytes = 256 << 20;
  options.stream_timeout = std::chrono::seconds(120);

  // Consumers: "hold" never reads (the trainers keep serving), "all" reads
  // all_rows, c<i> one changed-rows read each (the baseline's
  // s<k>c<i> for the k-th world size), "merge" the changed rows whose merge
  // alone is timed. Only those read are registered: every read costs the
  // tracker a pass over its consumers.
  std::vector<std::string> fan_in_consumers = {"hold", "all", "merge"};
  std::vector<std::string> single_consumers = {"hold", "all"};
  const bool changed_reads =
      std::find(kinds.begin(), kinds.end(), false) != kinds.end();
  for (int i = 0; changed_reads && i <= reads; ++i) {
    fan_in_consumers.push_back(absl::StrCat("c", i));
    for (size_t k = 0; k < world_sizes.size(); ++k) {
      single_consumers.push_back(absl::StrCat("s", k, "c", i));
    }
  }
  const std::string single_config = work + "/single.textproto";
  if (absl::Status s =
          WriteFile(single_config, ConfigText(model, 1, single_consumers));
      !s.ok()) {
    return Fail(s);
  }
  absl::PrintF(
      "fan_in_bench: %d tables x %d rows x %d float32, %s; global "
      "batch %d, %d steps; %d reads each; memory reused: %s; load %s\n",
      model.tables, model.rows, model.dim, sharding, model.batch, model.steps,
      reads, absl::GetFlag(FLAGS_reuse_memory) ? "yes" : "no",
      bench::LoadAverage());
  std::fflush(stdout);
  TrainerGroup single_trainer(
      "the one-process trainer",
      {"--config=" + single_config, "--listen=127.0.0.1:0"}, logs + ".single");
  absl::StatusOr<std::string> single_address =
      single_trainer.WaitListening(1, timeout);
  if (!single_address.ok()) return Fail(single_address.status());
  std::unique_ptr<DeltaClient> single =
      DeltaClient::Create(*single_address, options);
  if (absl::Status s =
          WaitTrained(*single, model.steps, single_trainer, timeout);
      !s.ok()) {
    return Fail(s);
  }

  std::vector<Row> rows;
  for (size_t k = 0; k < world_sizes.size(); ++k) {
    const int n = world_sizes[k];
    const std::string config = absl::StrCat(work, "/ranks", n, ".textproto");
    const std::string plan = absl::StrCat(work, "/ranks", n, ".plan");
    std::string plan_text;
    google::protobuf::TextFormat::PrintToString(PlanOf(model, n, sharding),
                                                &plan_text);
    for (const auto& [path, text] :
         {std::pair(config, ConfigText(model, n, fan_in_consumers)),
          std::pair(plan, plan_text)}) {
      if (absl::Status s = WriteFile(path, text); !s.ok()) return Fail(s);
    }
    TrainerGroup trainer(
        absl::StrCat("the trainer of ", n, " ranks"),
        {"--config=" + config, "--plan=" + plan,
         absl::StrCat("--nproc_per_node=", n), "--listen=127.0.0.1:0",
         absl::StrCat("--bind_cores=", absl::GetFlag(FLAGS_bind_cores))},
        absl::StrCat(logs, ".ranks", n));
    absl::StatusOr<std::string> address = trainer.WaitListening(n, timeout);
    if (!address.ok()) return Fail(address.status());
    absl::StatusOr<std::unique_ptr<FanInClient>> fan_in =
        FanInClient::Create(*address, options);
    if (!fan_in.ok()) return Fail(fan_in.status());
    absl::StatusOr<int> world_size = (*fan_in)->WorldSize();
    if (!world_size.ok()) return Fail(world_size.status());
    if (*world_size != n) {
      return Fail(absl::InternalError(
          absl::StrCat("the trainer of ", n, " ranks reports ", *world_size)));
    }
    if (absl::Status s = WaitTrained(**fan_in, model.steps, trainer, timeout);
        !s.ok()) {
      return Fail(s);
    }
    if (absl::Status s =
            Measure(*single, single_trainer, **fan_in, trainer, n, reads,
                    absl::StrCat("s", k), kinds, options, rows);
        !s.ok()) {
      return Fail(s);
    }
  }
  PrintRows(rows, absl::GetFlag(FLAGS_json));
  absl::PrintF("load after: %s\n", bench::LoadAverage());
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_reuse_memory)) {
    deltastream::KeepHostMemoryForReuse();
  }
  struct sigaction action = {};
  action.sa_handler = deltastream::OnSignal;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  const int code = deltastream::Run();
  deltastream::KillRunningGroups();
  return code;
}
