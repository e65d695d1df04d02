#ifndef DELTASTREAM_BASE_GRPC_SERVER_H_
#define DELTASTREAM_BASE_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// A handler's status on the wire: the same code (absl's and gRPC's codes are
// the same numbers) and message. The one conversion every gRPC service of
// the project (tracker, predictor lookup) uses.
grpc::Status ToGrpcStatus(const absl::Status& status);

// How every binary that serves gRPC (trainer, tracker_server, predictor)
// checks and binds its --listen address. One rule in one place.

// OK when `address` is HOST:PORT as SplitHostPort (base/host_port.h) reads
// it, with a non-empty host free of spaces (a name, an IPv4 address, or an
// IPv6 address in brackets) and a decimal PORT in 0..65535 (0: any free
// port). InvalidArgument, one line naming the value, otherwise.
absl::Status ValidateListenAddress(absl::string_view address);

// A started server and the address it listens on (with the bound port when
// 0 was asked for).
struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;
  int port = 0;
};

// What StartServer checks before gRPC binds: OK when `address` could be
// listened on now (port 0 always can; a host that does not resolve is left
// to gRPC); InvalidArgument for a malformed address; FailedPrecondition, one
// line, when it is in use or not local. Another process may still take it
// before the bind.
absl::Status CheckCanListen(const std::string& address);

// The shortest interval between a client's keepalive pings that servers
// started here accept while they send nothing (gRPC's default, 5 minutes,
// closes the connection of a client that pings an idle subscription every
// 20 s: clients/delta_client.h's keepalive).
inline constexpr int kMinPingIntervalMs = 5000;

// How often a server started here pings a client that has a call open, and
// how long it waits for the answer before it closes the connection and
// cancels the client's calls (gRPC's default: a ping every 2 hours). A
// subscriber whose host died or whose link was cut sends no FIN; without
// these pings its Subscribe call, and the server thread serving it, would
// stay open until the server stops. Found within twice this.
inline constexpr int kServerKeepaliveMs = 20000;

// OK when `pem` holds a PEM certificate (a client's --tls_ca roots, a
// server's --tls_cert); InvalidArgument "<what> holds no PEM certificate"
// otherwise, where gRPC would log lines of its own and fail every call as
// an unreachable server.
absl::Status CheckPemCertificates(const std::string& pem,
                                  absl::string_view what);

// OK when `keepalive_ms` > 0; InvalidArgument, one line, otherwise.
absl::Status ValidateKeepalive(int keepalive_ms);

// Adds `address` (validated first) to `builder`, with SO_REUSEPORT off,
// keepalive pings accepted every kMinPingIntervalMs and sent every
// `keepalive_ms` (> 0) to clients with calls open (a client that does not
// answer within `keepalive_ms` is dropped), and starts it. gRPC turns
// SO_REUSEPORT on by default, which lets a second server bind an address
// already in use and take half of its new connections; here such a bind fails
// instead. The caller sets everything else on `builder` (services, limits)
// before calling. InvalidArgument: a malformed address. FailedPrecondition:
// the address is in use or not local.
absl::StatusOr<StartedServer> StartServer(
    grpc::ServerBuilder& builder, const std::string& address,
    std::shared_ptr<grpc::ServerCredentials> credentials,
    int keepalive_ms = kServerKeepaliveMs);

// Server credentials from --tls_cert / --tls_key (PEM files): TLS when both
// are given, insecure when both are empty. InvalidArgument when only one is
// given, or (naming the files) when the certificate or the unencrypted
// private key does not parse or the key is not the certificate's; the
// file's error (NotFound, ...) naming it when one cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
ServerCredentialsFromFiles(const std::string& tls_cert,
                           const std::string& tls_key);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_GRPC_SERVER_H_
