#ifndef DELTASTREAM_BASE_HOST_PORT_H_
#define DELTASTREAM_BASE_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// A network address "HOST:PORT" taken apart: the one place that knows where
// the host ends and the port begins (listen addresses, targets, the metrics
// endpoint, the addresses ranks publish). Plain functions of their
// arguments: safe to call from any thread.

struct HostPort {
  // A name ("localhost", "trainer-0.svc"), an IPv4 address, or an IPv6
  // address without its brackets ("::1"). May be empty (":50051").
  std::string host;
  // 0..65535; 0 asks a server for any free port.
  int port = 0;
};

// Splits `address` at the colon before the port. An IPv6 host goes in
// brackets ("[::1]:80", "[::]:0"); the brackets are not part of `host`.
// The host is taken as it is otherwise (no resolution, no character rule:
// that is the caller's, e.g. ValidateListenAddress).
// InvalidArgument, one line naming `address` and what is wrong, when there is
// no colon, an unbracketed host holds a colon, a bracket is unmatched, or the
// port is not a decimal number from 0 to 65535.
absl::StatusOr<HostPort> SplitHostPort(absl::string_view address);

// What is wrong with `host` as an address's host, "" when nothing: empty,
// or holding a space or a control character.
std::string HostProblem(absl::string_view host);

// OK when `target`, a server to connect to (--target, a predictor's
// address), is HOST:PORT with a host HostProblem accepts and a PORT in
// 1..65535. InvalidArgument, one line naming it, otherwise (gRPC would take
// port 99999 for 34463 and connect to whatever listens there).
absl::Status ValidateTarget(absl::string_view target);

// "HOST:PORT", with `host` in brackets when it holds a colon (IPv6), so that
// SplitHostPort(JoinHostPort(h, p)) gives back h and p.
std::string JoinHostPort(absl::string_view host, int port);

// `address` with its port moved up by `offset` (a local rank's own port of a
// server every rank of a machine runs, torchrun-style: PORT + LOCAL_RANK).
// `address` unchanged when its port is 0 (each rank picks a free one), the
// offset is 0, or it does not split; the port may pass 65535 (the listen
// address then fails validation, naming it).
std::string OffsetPort(const std::string& address, int offset);

// This machine's name as other hosts resolve it, as `hostname -f` gives it:
// the canonical name of gethostname()'s (through /etc/hosts or DNS: in a
// Kubernetes pod with a subdomain, "<pod>.<subdomain>.<namespace>.svc...",
// where the bare pod name resolves nowhere else); the bare name when that
// lookup fails; empty when there is no name.
std::string FullHostName();

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_HOST_PORT_H_
