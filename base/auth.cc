#include "base/auth.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_io.h"

namespace deltastream {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Equal strings, in time that depends on their lengths only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

absl::string_view ActionName(Action action) {
  switch (action) {
    case Action::kRecord:
      return "record or step";
    case Action::kRead:
      return "read";
    case Action::kInspect:
      return "inspect";
    case Action::kAdminister:
      return "administer (consumers, compact, clear, snapshot)";
  }
  return "?";
}

}  // namespace

absl::Status CheckToken(absl::string_view token) {
  bool printable = true;
  for (char c : token) printable = printable && c > ' ' && c < 127;
  if (token.size() < 16 || token.size() > 256 || !printable) {
    return absl::InvalidArgumentError(
        "a token must be 16 to 256 printable ASCII characters without spaces");
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenAuthorizer> TokenAuthorizer::Parse(
    absl::string_view text, NameRule consumer_names) {
  std::vector<Grant> grants;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file line ", line_number, ": ", what));
    };
    if (fields.size() < 2) return error("expected '<token> <role> [names]'");
    Grant grant;
    grant.token = std::string(fields[0]);
    if (absl::Status token = CheckToken(grant.token); !token.ok()) {
      return error(token.message());
    }
    if (fields[1] == "admin") {
      grant.role = Role::kAdmin;
    } else if (fields[1] == "producer") {
      grant.role = Role::kProducer;
    } else if (fields[1] == "consumer") {
      grant.role = Role::kConsumer;
      if (fields.size() != 3) {
        return error("a consumer token names its consumers: 'a,b' or '*'");
      }
      // Every name is a consumer name (or '*'): a line that grants no
      // consumer, or a typo such as 'a,,b', is refused, not ignored.
      grant.consumers = absl::StrSplit(fields[2], ',');
      for (const std::string& name : grant.consumers) {
        if (name == "*") continue;
        if (name.empty()) return error("an empty consumer name");
        if (consumer_names == nullptr) continue;
        if (absl::Status status = consumer_names("consumer name", name);
            !status.ok()) {
          return error(status.message());
        }
      }
    } else {
      return error(absl::StrCat("unknown role '", fields[1],
                                "' (admin, producer or consumer)"));
    }
    if (grant.role != Role::kConsumer && fields.size() != 2) {
      return error("only consumer tokens name consumers");
    }
    for (const Grant& other : grants) {
      if (other.token == grant.token) return error("the token is listed twice");
    }
    grants.push_back(std::move(grant));
  }
  if (grants.empty()) return absl::InvalidArgumentError("no tokens in file");
  return TokenAuthorizer(std::move(grants));
}

absl::StatusOr<TokenAuthorizer> TokenAuthorizer::FromFile(
    const std::string& path, NameRule consumer_names) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) {  // the OS's error: EIO is no refusal (StartFailureExitCode)
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read token file '", path,
                                     "': ", text.status().message()));
  }
  absl::StatusOr<TokenAuthorizer> parsed = Parse(*text, consumer_names);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

grpc::Status TokenAuthorizer::Check(const grpc::ServerContext& context,
                                    Action action,
                                    absl::string_view consumer) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing token: send 'authorization: Bearer <token>'");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, kBearer)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "malformed authorization: expected 'Bearer <token>'");
  }
  const Grant* grant = nullptr;
  for (const Grant& candidate : grants_) {
    // No early exit: the time taken does not tell which token matched.
    if (ConstantTimeEquals(candidate.token, value)) grant = &candidate;
  }
  if (grant == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown token");
  }
  bool allowed = false;
  switch (grant->role) {
    case Role::kAdmin:
      allowed = true;
      break;
    case Role::kProducer:
      allowed = action == Action::kRecord || action == Action::kInspect;
      break;
    case Role::kConsumer:
      allowed = action == Action::kInspect ||
                (action == Action::kRead &&
                 std::any_of(grant->consumers.begin(), grant->consumers.end(),
                             [&](const std::string& name) {
                               return name == "*" || name == consumer;
                             }));
      break;
  }
  if (allowed) return grpc::Status::OK;
  const char* role = grant->role == Role::kProducer ? "producer" : "consumer";
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      action == Action::kRead && grant->role == Role::kConsumer
          ? absl::StrCat("this consumer token may not read as '", consumer, "'")
          : absl::StrCat("a ", role, " token may not ", ActionName(action)));
}

}  // namespace deltastream
