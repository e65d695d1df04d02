#include "base/host_port.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace deltastream {

absl::StatusOr<HostPort> SplitHostPort(absl::string_view address) {
  const auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not HOST:PORT (", why, ")"));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return invalid("no port");
  absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (absl::StartsWith(host, "[")) {
    if (host.size() < 2 || host.back() != ']') {
      return invalid("unmatched bracket");
    }
    host = host.substr(1, host.size() - 2);
  } else if (absl::StrContains(host, ':')) {
    return invalid("an IPv6 host goes in brackets");
  }
  if (absl::StrContains(host, '[') || absl::StrContains(host, ']')) {
    return invalid("unmatched bracket");
  }
  HostPort split;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port, &split.port) || split.port > 65535) {
    return invalid("the port must be a number from 0 to 65535");
  }
  split.host = std::string(host);
  return split;
}

std::string HostProblem(absl::string_view host) {
  if (host.empty()) return "no host";
  for (char c : host) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return "space in host";
    }
  }
  return "";
}

absl::Status ValidateTarget(absl::string_view target) {
  absl::StatusOr<HostPort> split = SplitHostPort(target);
  if (!split.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("target ", split.status().message()));
  }
  std::string problem = HostProblem(split->host);
  if (problem.empty() && split->port == 0) problem = "port 0";
  if (!problem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("target '", target, "' is not HOST:PORT (", problem, ")"));
  }
  return absl::OkStatus();
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

std::string OffsetPort(const std::string& address, int offset) {
  absl::StatusOr<HostPort> split = SplitHostPort(address);
  if (offset == 0 || !split.ok() || split->port == 0) return address;
  return JoinHostPort(split->host, split->port + offset);
}

std::string FullHostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "";
  addrinfo hints = {};
  hints.ai_flags = AI_CANONNAME;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &found) != 0) return name;
  std::string full = found != nullptr && found->ai_canonname != nullptr &&
                             found->ai_canonname[0] != '\0'
                         ? found->ai_canonname
                         : name;
  freeaddrinfo(found);
  return full;
}

}  // namespace deltastream
