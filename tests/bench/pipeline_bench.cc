// Train pipelines side by side (issue 18): per pipeline, input type and
// tracking mode, on 1..N ranks (one process per rank, sharded DLRM; CPU
// ranks over Gloo on loopback, or with --device=cuda rank r on cuda:r over
// NCCL), the wall time per iteration (P50, P90), peak memory, QPS and the
// communication time left exposed on the training thread.
//
//   bazel run -c opt //tests/bench:pipeline_bench -- --ranks=1,2
//       --pipeline=base,sparse_dist --input=kjt,dict
//       --tracking=off,id_only [--accumulation=1] [--device=cpu] [--json]
//
// Every listed ranks value is one launch; within it every combination of
// --pipeline x --input x --tracking has its own model (same seed) and
// pipeline, and the combinations alternate round by round (--rounds rounds of
// --batches iterations, each after --warmup untimed ones; each round starts
// at the next combination, so that none always runs right after the same
// other), so they are measured side by side. vs_baseline, the figure for
// relative goals (dict vs KJT input, tracking overhead), is the median over
// rounds of the combination's P50 in that round divided by its baseline's
// in the same round (same pipeline, "kjt" input, tracking "off", when
// listed): a load burst hits both sides of a round's ratio alike, where it
// would shift the pooled P50 of one. Beside it the table prints the 95%
// confidence interval of that median (vs_baseline_ci_low, _ci_high: the
// order statistics n/2 -+ 0.98 sqrt(n) of the n per-round ratios, which
// hold whatever their distribution): a bound is met beyond noise when the
// whole interval is inside it, and more --rounds narrow it. The JSON also
// holds the ratios' interquartile range (vs_baseline_q1, _q3), their spread
// round to round. The same is done with
// the training thread's CPU time per iteration (cpu_p50_ms,
// vs_baseline_cpu): on a shared machine it leaves out the time the thread
// waited for a core, which with 2 ranks on 2 cores is where the tail comes
// from (preemptions_per_iteration: the training thread's involuntary
// context switches), but it also leaves out work done on other threads
// (sparse_dist's input distribution). An iteration is one Progress call (one
// micro-batch). exposed_comm_ms is the input distribution's time per
// iteration that the training thread spent in it or waiting for it
// (PipelineStats::exposed_input_dist). peak_memory_mb is the rank process's
// peak RSS when the combination finished (all combinations share the
// process: it only grows). "dict" input: each batch is held as a
// feature dict whose features own their tensors (as a data loader hands
// them over), which the pipeline converts to a KeyedJaggedTensor where it
// prepares the batch (sparse_dist: on its input distribution's thread).
// Tracking "embedding" needs --model=sequence (pooled tables have no EMBEDDING
// mode). Figures are rank 0's. Each launch prints the load average before and
// after it and the ranks' intra-op threads (at::get_num_threads(): 1 per rank
// with several ranks, torchrun's rule, trainer/comm/local_launcher.h).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <sys/resource.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/host_memory.h"
#include "tests/bench/timing.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "tracker_service/tracker.h"
#include "trainer/comm/core_binding.h"
#include "trainer/comm/process_group.h"
#include "trainer/comm/torchrun_env.h"
#include "trainer/data/synthetic.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/sequence_model.h"
#include "trainer/optim/dense_optimizer.h"
#include "trainer/pipeline/pipeline_factory.h"
#include "trainer/sparse/feature_dict.h"
#include "trainer/tracking/module_tracking.h"

ABSL_FLAG(std::string, ranks, "1,2", "world sizes (comma list)");
ABSL_FLAG(std::string, pipeline, "base,sparse_dist",
          "pipelines (comma list): sequential, base, sparse_dist");
ABSL_FLAG(std::string, input, "kjt,dict", "input types (comma list)");
ABSL_FLAG(std::string, tracking, "off,id_only",
          "tracking modes (comma list): off, id_only, embedding");
ABSL_FLAG(std::string, model, "dlrm", "dlrm or sequence");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, or cuda: rank r trains on cuda:r (its local rank)");
ABSL_FLAG(int64_t, tables, 4, "embedding tables");
ABSL_FLAG(int64_t, rows, 20000, "rows per table");
ABSL_FLAG(int64_t, dim, 32, "embedding dim");
ABSL_FLAG(int64_t, features_per_table, 1, "features per table");
ABSL_FLAG(int64_t, pooling, 16, "IDs per example and feature");
ABSL_FLAG(int64_t, batch, 512, "examples per rank per iteration");
ABSL_FLAG(int64_t, batches, 10, "timed iterations per round");
ABSL_FLAG(int64_t, warmup, 2, "untimed iterations at the start of a round");
ABSL_FLAG(int64_t, rounds, 16, "rounds (each runs every combination)");
ABSL_FLAG(int, accumulation, 1, "accumulation steps K");
ABSL_FLAG(int, read_every_ms, 0,
          "a consumer thread reads the deltas of the combination being "
          "trained every this many ms, in-process (as the tracker service's "
          "StreamDelta would: closed batches, states filled in); 0: no reads");
ABSL_FLAG(bool, json, false, "also print one JSON object per line");
ABSL_FLAG(bool, bind_cores, false,
          "bind each rank to its own cores, as the trainer's --bind_cores");

namespace deltastream {
namespace {

void Check(const absl::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
}

std::vector<std::string> List(const std::string& flag) {
  return absl::StrSplit(flag, ',', absl::SkipEmpty());
}

// Peak resident set of this process (VmHWM), MiB.
double PeakRssMb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmHWM:")) {
      int64_t kb = 0;
      std::vector<std::string> parts =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) {
        return kb / 1024.0;
      }
    }
  }
  return 0;
}

// Pregenerated batches, cycled; "dict" hands them over as feature dicts
// (Batch::sparse_dict, each feature in tensors of its own), which the
// pipeline converts.
class CyclingSource : public BatchSource {
 public:
  CyclingSource(std::vector<Batch> batches, bool dict)
      : batches_(std::move(batches)) {
    if (!dict) return;
    for (Batch& batch : batches_) {
      FeatureDict features;
      for (int64_t k = 0; k < batch.sparse.num_keys(); ++k) {
        const JaggedTensor feature = batch.sparse.At(k);
        std::optional<at::Tensor> weights;
        if (feature.has_weights()) weights = feature.weights()->clone();
        absl::StatusOr<JaggedTensor> own = JaggedTensor::FromLengths(
            feature.values().clone(), feature.lengths().clone(), weights);
        Check(own.status());
        Check(features.Add(batch.sparse.keys()[k], *std::move(own)));
      }
      batch.sparse = KeyedJaggedTensor();
      batch.sparse_dict = std::move(features);
    }
  }
  absl::StatusOr<std::optional<Batch>> Next() override {
    return batches_[next_++ % batches_.size()];
  }

 private:
  std::vector<Batch> batches_;
  size_t next_ = 0;
};

struct Combination {
  std::string pipeline, input, tracking;
  std::unique_ptr<RecModel> model;
  std::unique_ptr<torch::optim::Optimizer> dense;
  std::unique_ptr<ModuleRowsReader> reader;
  std::unique_ptr<Tracker> tracker;
  std::unique_ptr<TrainPipeline> train;
  std::unique_ptr<CyclingSource> source;
  std::vector<double> seconds;      // wall time per iteration
  std::vector<double> cpu_seconds;  // the training thread's CPU time
  std::vector<double> round_p50;    // per round, seconds
  std::vector<double> round_cpu_p50;
  int64_t preemptions = 0;  // the training thread's, timed iterations
  double peak_mb = 0;
};

// The training thread's CPU time (seconds) and involuntary context switches
// so far.
struct ThreadUsage {
  double cpu_seconds = 0;
  int64_t preemptions = 0;
  static ThreadUsage Now() {
    ThreadUsage usage;
    timespec cpu{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    usage.cpu_seconds = cpu.tv_sec + cpu.tv_nsec * 1e-9;
    rusage counts{};
    getrusage(RUSAGE_THREAD, &counts);
    usage.preemptions = counts.ru_nivcsw;
    return usage;
  }
};

// What `c` is compared with: the combination of the same pipeline with
// "kjt" input and tracking "off" (null when that was not measured).
const Combination* Baseline(const std::vector<Combination>& all,
                            const Combination& c) {
  for (const Combination& other : all) {
    if (other.pipeline == c.pipeline && other.input == "kjt" &&
        other.tracking == "off") {
      return &other;
    }
  }
  return nullptr;
}

// Per-round ratios of a combination's round P50 to its baseline's: their
// median, its 95% confidence interval, and their interquartile range.
struct Ratio {
  double median = 0, ci_low = 0, ci_high = 0, q1 = 0, q3 = 0;
};
Ratio RatioToBaseline(const std::vector<double>& round_p50,
                      const std::vector<double>& baseline_round_p50) {
  std::vector<double> ratios;
  for (size_t r = 0; r < round_p50.size(); ++r) {
    ratios.push_back(round_p50[r] / baseline_round_p50[r]);
  }
  std::sort(ratios.begin(), ratios.end());
  const int64_t n = static_cast<int64_t>(ratios.size());
  // The median lies between the order statistics of ranks (1-based)
  // n/2 - 0.98 sqrt(n) and n/2 + 1 + 0.98 sqrt(n) with 95% probability
  // (the binomial's normal approximation; no assumption on the ratios).
  const double half_width = 0.98 * std::sqrt(static_cast<double>(n));
  const int64_t low = std::clamp<int64_t>(
      static_cast<int64_t>(std::floor(n / 2.0 - half_width)) - 1, 0, n - 1);
  const int64_t high = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(n / 2.0 + 1 + half_width)) - 1, 0, n - 1);
  return {ratios[n / 2], ratios[low], ratios[high], ratios[n / 4],
          ratios[(3 * n) / 4]};
}

// `ratio`'s JSON fields, prefixed `key` (null without a baseline).
std::string RatioFields(const std::string& key, const Ratio* ratio) {
  const Ratio r = ratio != nullptr ? *ratio : Ratio{};
  const std::pair<const char*, double> values[] = {{"", r.median},
                                                   {"_ci_low", r.ci_low},
                                                   {"_ci_high", r.ci_high},
                                                   {"_q1", r.q1},
                                                   {"_q3", r.q3}};
  std::string fields;
  for (const auto& [suffix, value] : values) {
    absl::StrAppend(
        &fields, fields.empty() ? "" : ", ", "\"", key, suffix,
        "\": ", ratio ? absl::StrFormat("%.4f", value) : std::string("null"));
  }
  return fields;
}

// This rank's device: the CPU, or for --device=cuda the CUDA device of its
// local rank.
c10::Device RankDevice() {
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cpu") return c10::Device(c10::kCPU);
  if (device != "cuda") {
    Check(absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, got '", device, "'")));
  }
  absl::StatusOr<TorchrunEnvironment> env = TorchrunEnvironmentFromEnv();
  Check(env.status());
  return c10::Device(c10::kCUDA,
                     static_cast<c10::DeviceIndex>(env->local_rank));
}

int RunRank() {
  KeepHostMemoryForReuse();  // as the trainer's ranks do
  if (absl::GetFlag(FLAGS_bind_cores)) {
    absl::StatusOr<TorchrunEnvironment> env = TorchrunEnvironmentFromEnv();
    Check(env.status());
    Check(
        BindToLocalRankCores(env->local_rank, env->local_world_size).status());
  }
  const c10::Device device = RankDevice();
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      testing::RankGroupFromEnv(absl::Seconds(120), device);
  Check(group.status());
  ProcessGroup& pg = **group;
  const int64_t tables = absl::GetFlag(FLAGS_tables);
  const int64_t per_table = absl::GetFlag(FLAGS_features_per_table);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  const bool sequence = absl::GetFlag(FLAGS_model) == "sequence";
  RecModelConfig config;
  config.num_dense = 13;
  config.dense_arch = {64, dim};
  config.over_arch = {64, 1};
  config.sparse_optimizer.type = SparseOptimizerType::kRowwiseAdagrad;
  config.seed = 1;
  config.group = &pg;
  config.device = device;
  SyntheticOptions data;
  data.batch_size = absl::GetFlag(FLAGS_batch);
  data.seed = 100 + pg.rank();
  for (int64_t t = 0; t < tables; ++t) {
    EmbeddingTableConfig table;
    table.name = absl::StrCat("t", t);
    table.num_embeddings = absl::GetFlag(FLAGS_rows);
    table.embedding_dim = dim;
    for (int64_t f = 0; f < per_table; ++f) {
      const std::string name = absl::StrCat("f", t, "_", f);
      table.feature_names.push_back(name);
      data.features.push_back({name, table.num_embeddings,
                               absl::GetFlag(FLAGS_pooling),
                               absl::GetFlag(FLAGS_pooling)});
    }
    config.tables.push_back(table);
  }
  absl::StatusOr<std::unique_ptr<SyntheticSource>> synthetic =
      SyntheticSource::Create(data);
  Check(synthetic.status());
  std::vector<Batch> batches;
  for (int i = 0; i < 8; ++i) batches.push_back(*(*synthetic)->Next().value());

  TrainPipelineOptions options;
  options.accumulation_steps = absl::GetFlag(FLAGS_accumulation);
  std::vector<Combination> combinations;
  for (const std::string& pipeline : List(absl::GetFlag(FLAGS_pipeline))) {
    for (const std::string& input : List(absl::GetFlag(FLAGS_input))) {
      for (const std::string& tracking : List(absl::GetFlag(FLAGS_tracking))) {
        Combination c;
        c.pipeline = pipeline;
        c.input = input;
        c.tracking = tracking;
        if (sequence) {
          absl::StatusOr<std::unique_ptr<SequenceModel>> m =
              SequenceModel::Create(config);
          Check(m.status());
          c.model = *std::move(m);
        } else {
          absl::StatusOr<std::unique_ptr<Dlrm>> m = Dlrm::Create(config);
          Check(m.status());
          c.model = *std::move(m);
        }
        c.dense =
            *MakeDenseOptimizer("sgd", 0.01, c.model->dense().parameters());
        TrainPipelineParts parts;
        parts.model = c.model.get();
        parts.dense_optimizer = c.dense.get();
        parts.group = &pg;
        if (tracking != "off") {
          std::vector<EmbeddingModule*> modules = c.model->embedding_modules();
          c.reader = std::make_unique<ModuleRowsReader>(modules);
          TrackerOptions tracker_options;
          absl::StatusOr<TrackingMode> mode = ParseTrackingMode(tracking);
          Check(mode.status());
          tracker_options.mode = *mode;
          tracker_options.auto_compact = true;
          tracker_options.modules = DescribeModules(modules);
          absl::StatusOr<std::unique_ptr<Tracker>> tracker =
              Tracker::Create(tracker_options, c.reader.get());
          Check(tracker.status());
          c.tracker = *std::move(tracker);
          Check(AttachTracker(*c.tracker, modules));
          parts.rows_reader = c.reader.get();
          parts.tracker = c.tracker.get();
        }
        options.pipeline = pipeline;
        absl::StatusOr<std::unique_ptr<TrainPipeline>> made =
            MakeTrainPipeline(options, parts);
        Check(made.status());
        c.train = *std::move(made);
        c.source = std::make_unique<CyclingSource>(batches, input == "dict");
        combinations.push_back(std::move(c));
      }
    }
  }
  const int64_t warmup = absl::GetFlag(FLAGS_warmup);
  const int64_t timed = absl::GetFlag(FLAGS_batches);
  std::map<Combination*, absl::Duration> exposed;
  std::map<Combination*, int64_t> exposed_count;
  const int64_t rounds = absl::GetFlag(FLAGS_rounds);
  if (timed < 1 || rounds < 1)
    Check(absl::InvalidArgumentError("--batches and --rounds must be >= 1"));
  // --read_every_ms: reads of the tracked combination being trained.
  std::atomic<Combination*> training{nullptr};
  std::atomic<bool> reading{true};
  std::atomic<int64_t> reads{0};
  std::thread reader;
  if (const int every = absl::GetFlag(FLAGS_read_every_ms); every > 0) {
    reader = std::thread([&, every] {
      while (reading.load()) {
        absl::SleepFor(absl::Milliseconds(every));
        Combination* c = training.load();
        if (c == nullptr || c->tracker == nullptr) continue;
        // As the service's StreamDelta reads: closed batches only, states
        // filled in while the IDs would be sent; the read ends with its last
        // row (~StatesFill waits for it).
        DeltaRequest read;
        read.consumer = "default";
        read.through_current_batch = false;
        std::unique_ptr<StatesFill> fill;
        Check(c->tracker->GetDeltaFilling(read, &fill).status());
        fill.reset();
        reads.fetch_add(1);
      }
    });
  }
  for (int64_t round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < combinations.size(); ++j) {
      Combination& c = combinations[(round + j) % combinations.size()];
      training.store(&c);
      for (int64_t i = 0; i < warmup; ++i) {
        Check(c.train->Progress(*c.source).status());
      }
      const absl::Duration before = c.train->stats().exposed_input_dist;
      std::vector<double> this_round, this_round_cpu;
      for (int64_t i = 0; i < timed; ++i) {
        const ThreadUsage usage = ThreadUsage::Now();
        const bench::Clock::time_point start = bench::Clock::now();
        absl::StatusOr<std::optional<TrainedStep>> step =
            c.train->Progress(*c.source);
        Check(step.status());
        (*step)->loss.item<float>();  // the step is done
        this_round.push_back(bench::Seconds(start));
        const ThreadUsage after = ThreadUsage::Now();
        this_round_cpu.push_back(after.cpu_seconds - usage.cpu_seconds);
        c.preemptions += after.preemptions - usage.preemptions;
      }
      c.seconds.insert(c.seconds.end(), this_round.begin(), this_round.end());
      c.cpu_seconds.insert(c.cpu_seconds.end(), this_round_cpu.begin(),
                           this_round_cpu.end());
      c.round_p50.push_back(bench::Median(std::move(this_round)));
      c.round_cpu_p50.push_back(bench::Median(std::move(this_round_cpu)));
      exposed[&c] += c.train->stats().exposed_input_dist - before;
      exposed_count[&c] += timed;
      c.peak_mb = PeakRssMb();
    }
  }
  training.store(nullptr);
  reading.store(false);
  if (reader.joinable()) reader.join();
  if (pg.rank() == 0) {
    std::printf("THREADS %d\n", at::get_num_threads());
    std::printf("READS %lld\n", static_cast<long long>(reads.load()));
  }
  for (Combination& c : combinations) {
    std::vector<double> sorted = c.seconds;
    std::sort(sorted.begin(), sorted.end());
    const double p50 = sorted[sorted.size() / 2];
    const double p90 = sorted[sorted.size() * 9 / 10];
    double mean = 0;
    for (double seconds : sorted) mean += seconds / sorted.size();
    const Combination* baseline = Baseline(combinations, c);
    std::optional<Ratio> wall, cpu;
    if (baseline != nullptr) {
      wall = RatioToBaseline(c.round_p50, baseline->round_p50);
      cpu = RatioToBaseline(c.round_cpu_p50, baseline->round_cpu_p50);
    }
    std::printf(
        "RESULT {\"pipeline\": \"%s\", \"input\": \"%s\", \"tracking\": "
        "\"%s\", \"ranks\": %d, \"accumulation\": %d, \"p50_ms\": %.3f, "
        "\"p90_ms\": %.3f, \"mean_ms\": %.3f, \"peak_memory_mb\": %.1f, "
        "\"qps\": %.0f, "
        "\"exposed_comm_ms\": %.3f, %s, \"cpu_p50_ms\": %.3f, %s, "
        "\"preemptions_per_iteration\": %.2f}\n",
        c.pipeline.c_str(), c.input.c_str(), c.tracking.c_str(),
        pg.world_size(), absl::GetFlag(FLAGS_accumulation), p50 * 1e3,
        p90 * 1e3, mean * 1e3, c.peak_mb,
        // Throughput: a stall in one iteration of ten, which leaves the P50
        // alone, counts.
        absl::GetFlag(FLAGS_batch) * pg.world_size() / mean,
        absl::ToDoubleMilliseconds(exposed[&c]) / exposed_count[&c],
        RatioFields("vs_baseline", wall ? &*wall : nullptr).c_str(),
        bench::Median(c.cpu_seconds) * 1e3,
        RatioFields("vs_baseline_cpu", cpu ? &*cpu : nullptr).c_str(),
        static_cast<double>(c.preemptions) / c.seconds.size());
  }
  return 0;
}

// The value of "key": in one RESULT line (numbers and strings alike).
std::string Field(const std::string& json, const std::string& key) {
  const std::string quoted = absl::StrCat("\"", key, "\": ");
  size_t at = json.find(quoted);
  if (at == std::string::npos) return "";
  at += quoted.size();
  size_t end = json.find_first_of(",}", at);
  std::string value = json.substr(at, end - at);
  if (!value.empty() && value.front() == '"') {
    value = value.substr(1, value.size() - 2);
  }
  return value;
}

// A ratio's table column from its JSON fields `key`, `key`_ci_low,
// `key`_ci_high: "+0.7% [-0.5..+1.9]", or "-" without a baseline.
std::string RatioColumn(const std::string& json, const std::string& key) {
  double median = 0, low = 0, high = 0;
  if (!absl::SimpleAtod(Field(json, key), &median) ||
      !absl::SimpleAtod(Field(json, key + "_ci_low"), &low) ||
      !absl::SimpleAtod(Field(json, key + "_ci_high"), &high)) {
    return "-";
  }
  return absl::StrFormat("%+.1f%% [%+.1f..%+.1f]", (median - 1) * 100,
                         (low - 1) * 100, (high - 1) * 100);
}

int Main(int argc, char** argv) {
  if (testing::ScenarioFromEnv()) {
    // Ranks get the launcher's flags through the environment.
    std::vector<std::string> args =
        absl::StrSplit(std::getenv("PIPELINE_BENCH_ARGS"), '\x1f');
    std::vector<char*> rank_argv;
    for (std::string& arg : args) rank_argv.push_back(arg.data());
    absl::ParseCommandLine(static_cast<int>(rank_argv.size()),
                           rank_argv.data());
    return RunRank();
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(argv, argv + argc);
  const std::string joined = absl::StrJoin(args, "\x1f");
  std::vector<std::string> json_lines;
  std::vector<std::string> table;
  for (const std::string& ranks : List(absl::GetFlag(FLAGS_ranks))) {
    int world = 0;
    if (!absl::SimpleAtoi(ranks, &world) || world < 1) {
      std::fprintf(stderr, "bad --ranks entry '%s'\n", ranks.c_str());
      return 1;
    }
    const std::string load_before = bench::LoadAverage();
    std::vector<testing::RankResult> results = testing::RunRanks(
        "bench", world, absl::Minutes(20), {{"PIPELINE_BENCH_ARGS", joined}},
        absl::GetFlag(FLAGS_bind_cores));
    for (size_t r = 0; r < results.size(); ++r) {
      if (results[r].exit_code != 0) {
        std::fprintf(stderr, "rank %zu of %d failed:\n%s\n", r, world,
                     results[r].output.c_str());
        return 1;
      }
    }
    std::string threads = "?", reads = "0";
    for (absl::string_view line : absl::StrSplit(results[0].output, '\n')) {
      if (absl::StartsWith(line, "THREADS "))
        threads = std::string(line.substr(8));
      if (absl::StartsWith(line, "READS ")) reads = std::string(line.substr(6));
    }
    std::printf(
        "%d rank(s): intra-op threads per rank %s; rank 0's consumer reads "
        "%s; load average %s before, %s after\n",
        world, threads.c_str(), reads.c_str(), load_before.c_str(),
        bench::LoadAverage().c_str());
    for (absl::string_view line : absl::StrSplit(results[0].output, '\n')) {
      if (!absl::StartsWith(line, "RESULT ")) continue;
      const std::string json(line.substr(7));
      json_lines.push_back(json);
      double p50 = 0, p90 = 0, mb = 0, qps = 0, comm = 0;
      (void)absl::SimpleAtod(Field(json, "p50_ms"), &p50);
      (void)absl::SimpleAtod(Field(json, "p90_ms"), &p90);
      (void)absl::SimpleAtod(Field(json, "peak_memory_mb"), &mb);
      (void)absl::SimpleAtod(Field(json, "qps"), &qps);
      (void)absl::SimpleAtod(Field(json, "exposed_comm_ms"), &comm);
      double cpu = 0, preemptions = 0;
      (void)absl::SimpleAtod(Field(json, "cpu_p50_ms"), &cpu);
      (void)absl::SimpleAtod(Field(json, "preemptions_per_iteration"),
                             &preemptions);
      table.push_back(absl::StrFormat(
          "%-12s %-5s %-9s %5s %3s %8.2f %8.2f %9.1f %7.0f %9.3f %-21s "
          "%8.2f %-21s %8.1f",
          Field(json, "pipeline"), Field(json, "input"),
          Field(json, "tracking"), Field(json, "ranks"),
          Field(json, "accumulation"), p50, p90, mb, qps, comm,
          RatioColumn(json, "vs_baseline"), cpu,
          RatioColumn(json, "vs_baseline_cpu"), preemptions));
    }
  }
  // vs base: median [95% confidence interval] of the per-round ratios; cpu:
  // the training thread's CPU time; preempt: its involuntary context
  // switches.
  std::printf(
      "%-12s %-5s %-9s %5s %3s %8s %8s %9s %7s %9s %-21s %8s %-21s %8s\n",
      "pipeline", "input", "tracking", "ranks", "K", "P50 ms", "P90 ms",
      "peak MiB", "QPS", "exposed", "vs base [95% CI]", "cpu ms",
      "cpu vs base [95% CI]", "preempt");
  for (const std::string& line : table) std::printf("%s\n", line.c_str());
  if (absl::GetFlag(FLAGS_json)) {
    for (const std::string& json : json_lines)
      std::printf("%s\n", json.c_str());
  }
  (void)positional;
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) { return deltastream::Main(argc, argv); }
