// Checks, bit for bit, that predictors' replicas and checkpoint chains equal
// a trainer's model: the operator's (and the main job's) proof that the
// delta stream lost nothing and applied nothing twice.
//
//   verify_model --checkpoint=PATH|--checkpoint_dir=DIR
//       --predictors=HOST:PORT,... and/or --chain=DIR
//
// --checkpoint_dir takes the newest checkpoint of a trainer's
// <checkpoint dir>/checkpoints. Prints one line per copy ("... matches the
// trainer: yes"). Exit codes: 0 all match, 1 a copy differs or cannot be
// read (the trainer's checkpoint too: a damaged archive), 2 bad flags:
// among them nothing to compare (neither --predictors nor --chain: exit 0
// would read as "verified") and an empty entry in --predictors.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/command_line.h"
#include "base/host_port.h"
#include "base/process.h"
#include "trainer/checkpoint.h"
#include "trainer/model_verification.h"

ABSL_FLAG(std::string, checkpoint, "",
          "a trainer checkpoint (a checkpoint-<step> directory, or an old "
          "single file)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "a trainer's checkpoints directory: its newest checkpoint");
ABSL_FLAG(std::string, predictors, "",
          "comma-separated predictor lookup APIs, HOST:PORT (this and/or "
          "--chain: at least one copy to compare)");
ABSL_FLAG(std::string, chain, "",
          "a checkpoint chain directory (this and/or --predictors)");

namespace deltastream {
namespace {

int Main() {
  // The flags first, before anything is read: a run that would compare
  // nothing is refused, not reported as a success.
  if (absl::GetFlag(FLAGS_checkpoint).empty() &&
      absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
    return Fail(kExitUsage, "--checkpoint or --checkpoint_dir is required");
  }
  std::vector<std::string> predictors;
  if (const std::string list = absl::GetFlag(FLAGS_predictors); !list.empty()) {
    predictors = absl::StrSplit(list, ',');
    for (const std::string& target : predictors) {
      if (target.empty()) {
        return Fail(kExitUsage,
                    "--predictors: an empty HOST:PORT (a leading, trailing or "
                    "doubled comma)");
      }
      if (absl::Status valid = ValidateTarget(target); !valid.ok()) {
        return Fail(kExitUsage,
                    absl::StrCat("--predictors: ", valid.message()));
      }
    }
  }
  const std::string chain = absl::GetFlag(FLAGS_chain);
  if (predictors.empty() && chain.empty()) {
    return Fail(kExitUsage,
                "nothing to compare with the trainer's checkpoint: pass "
                "--predictors=HOST:PORT,... and/or --chain=DIR");
  }

  std::string path = absl::GetFlag(FLAGS_checkpoint);
  if (path.empty()) {
    absl::StatusOr<std::optional<std::string>> latest =
        LatestCheckpoint(absl::GetFlag(FLAGS_checkpoint_dir));
    if (!latest.ok()) return Fail(kExitFailure, latest.status());
    path = latest->value_or("");
    if (path.empty()) {
      return Fail(kExitUsage,
                  absl::StrCat("no checkpoint in '",
                               absl::GetFlag(FLAGS_checkpoint_dir), "'"));
    }
  }
  absl::StatusOr<CheckpointModel> model = ReadCheckpointModel(path);
  if (!model.ok()) {
    // A damaged checkpoint is a copy that cannot be read, not a bad flag.
    return Fail(model.status().code() == absl::StatusCode::kDataLoss
                    ? kExitFailure
                    : kExitUsage,
                model.status());
  }
  int64_t rows = 0;
  for (const auto& [name, table] : model->tables) rows += table.size(0);
  std::printf(
      "trainer checkpoint at step %lld: %zu tables, %lld rows, %zu "
      "dense parameters\n",
      static_cast<long long>(model->step), model->tables.size(),
      static_cast<long long>(rows), model->dense.size());
  int exit_code = 0;
  auto report = [&](const std::string& what,
                    const absl::StatusOr<Verified>& verified) {
    if (verified.ok()) {
      std::printf(
          "%s (version %lld: %lld tables, %lld rows, %lld dense "
          "parameters) matches the trainer: yes\n",
          what.c_str(), static_cast<long long>(verified->version),
          static_cast<long long>(verified->tables),
          static_cast<long long>(verified->rows),
          static_cast<long long>(verified->dense_parameters));
    } else {
      std::printf("%s matches the trainer: NO: %s\n", what.c_str(),
                  std::string(verified.status().message()).c_str());
      exit_code = 1;
    }
  };
  for (const std::string& target : predictors) {
    absl::StatusOr<Verified> verified = VerifyReplica(*model, target);
    if (verified.ok()) {
      const v1::PredictorStatus& p = verified->predictor;
      std::printf(
          "predictor %s (consumer %s): %lld versions applied, %lld rows and "
          "%.1f MiB received; freshness p50 %.0f ms, p99 %.0f ms, max %.0f ms "
          "over %lld deltas; %lld resyncs, %lld reconnects\n",
          target.c_str(), p.consumer().c_str(),
          static_cast<long long>(p.applied_deltas()),
          static_cast<long long>(p.applied_rows()),
          p.bytes_received() / 1048576.0, p.freshness_p50_ms(),
          p.freshness_p99_ms(), p.freshness_max_ms(),
          static_cast<long long>(p.freshness_samples()),
          static_cast<long long>(p.resyncs()),
          static_cast<long long>(p.reconnects()));
    }
    report("replica of predictor " + target, verified);
  }
  if (!chain.empty()) {
    report("checkpoint chain " + chain, VerifyChain(*model, chain));
  }
  return exit_code;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "verify_model --checkpoint_dir=DIR --predictors=HOST:PORT,... "
      "and/or --chain=DIR");
  if (std::optional<int> exit_code =
          deltastream::HandleCommandLine(argc, argv)) {
    return *exit_code;
  }
  return deltastream::Main();
}
