#include "trainer/comm/torchrun_env.h"

#include <cstdlib>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

std::optional<std::string> Env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// The integer in `name`, or `fallback` when unset.
absl::StatusOr<int> IntEnv(const char* name, int fallback) {
  std::optional<std::string> value = Env(name);
  if (!value) return fallback;
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", *value, "' is not an integer"));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<TorchrunEnvironment> TorchrunEnvironmentFromEnv() {
  TorchrunEnvironment env;
  const bool has_rank = Env("RANK").has_value();
  const bool has_world = Env("WORLD_SIZE").has_value();
  if (has_rank != has_world) {
    return absl::InvalidArgumentError(
        "RANK and WORLD_SIZE must be set together (torchrun sets both)");
  }
  absl::StatusOr<int> rank = IntEnv("RANK", 0);
  absl::StatusOr<int> world = IntEnv("WORLD_SIZE", 1);
  if (!rank.ok()) return rank.status();
  if (!world.ok()) return world.status();
  env.rank = *rank;
  env.world_size = *world;
  if (env.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE=", env.world_size, " must be at least 1"));
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RANK=", env.rank, " outside [0, WORLD_SIZE=", env.world_size, ")"));
  }
  absl::StatusOr<int> local_world = IntEnv("LOCAL_WORLD_SIZE", env.world_size);
  absl::StatusOr<int> local_rank = IntEnv("LOCAL_RANK", env.rank);
  if (!local_world.ok()) return local_world.status();
  if (!local_rank.ok()) return local_rank.status();
  env.local_world_size = *local_world;
  env.local_rank = *local_rank;
  if (env.local_world_size < 1 || env.local_rank < 0 ||
      env.local_rank >= env.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LOCAL_RANK=", env.local_rank,
        " outside [0, LOCAL_WORLD_SIZE=", env.local_world_size, ")"));
  }
  if (std::optional<std::string> addr = Env("MASTER_ADDR")) {
    env.master_addr = *addr;
  }
  absl::StatusOr<int> port = IntEnv("MASTER_PORT", 0);
  if (!port.ok()) return port.status();
  env.master_port = *port;
  if (env.master_port < 0 || env.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", env.master_port, " outside [0, 65535]"));
  }
  if (env.master_port == 0 && env.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MASTER_PORT must be set for WORLD_SIZE=", env.world_size));
  }
  if (std::optional<std::string> agent = Env("TORCHELASTIC_USE_AGENT_STORE")) {
    env.use_agent_store = absl::AsciiStrToLower(*agent) == "true";
  }
  absl::StatusOr<int> restarts = IntEnv("TORCHELASTIC_RESTART_COUNT", 0);
  if (!restarts.ok()) return restarts.status();
  env.restart_count = *restarts;
  return env;
}

}  // namespace deltastream
