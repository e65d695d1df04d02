#include "base/grpc_server.h"

#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/host_port.h"

namespace deltastream {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status ValidateListenAddress(absl::string_view address) {
  absl::StatusOr<HostPort> split = SplitHostPort(address);
  if (!split.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address ", split.status().message()));
  }
  if (std::string problem = HostProblem(split->host); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", address, "' is not HOST:PORT (", problem, ")"));
  }
  return absl::OkStatus();
}

namespace {

// Binds (and closes) a TCP socket on each address `listen` (named `address`
// in messages) resolves to, as gRPC will (SO_REUSEADDR, no SO_REUSEPORT), so
// that an address in use or not local is refused with one line before gRPC
// logs its own multi-line error. OK for port 0 and for hosts that do not
// resolve (gRPC decides those).
absl::Status ProbeBind(const std::string& address, const HostPort& listen) {
  if (listen.port == 0) return absl::OkStatus();
  const std::string port = absl::StrCat(listen.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(listen.host.c_str(), port.c_str(), &hints, &resolved) != 0) {
    return absl::OkStatus();
  }
  bool in_use = false;
  bool bound = false;
  bool not_local = false;
  for (addrinfo* ai = resolved; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      bound = true;
    } else if (errno == EADDRINUSE) {
      in_use = true;
    } else if (errno == EADDRNOTAVAIL) {
      not_local = true;
    }
    close(fd);
  }
  freeaddrinfo(resolved);
  if (in_use) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", address, ": address in use"));
  }
  if (not_local && !bound) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", address, ": not a local address"));
  }
  return absl::OkStatus();
}

// The first PEM certificate in `pem`; null when there is none.
std::unique_ptr<X509, decltype(&X509_free)> FirstCertificate(
    const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), &X509_free);
  ERR_clear_error();
  return cert;
}

// InvalidArgument, naming the files, unless `cert_pem` begins with a PEM
// certificate and `key_pem` holds the private key of that certificate:
// what gRPC would find out only when the server starts, with lines of its
// own and a failure that reads like a bound port.
absl::Status CheckKeyCertPair(const std::string& cert_pem,
                              const std::string& cert_path,
                              const std::string& key_pem,
                              const std::string& key_path) {
  std::unique_ptr<X509, decltype(&X509_free)> cert = FirstCertificate(cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert '", cert_path, "' holds no PEM certificate"));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())),
      &BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr),
      &EVP_PKEY_free);
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key '", key_path, "' holds no PEM private key (unencrypted)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key '", key_path,
        "' is not the key of the certificate in --tls_cert '", cert_path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPemCertificates(const std::string& pem,
                                  absl::string_view what) {
  if (FirstCertificate(pem) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds no PEM certificate"));
  }
  return absl::OkStatus();
}

absl::Status ValidateKeepalive(int keepalive_ms) {
  if (keepalive_ms > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the keepalive interval must be > 0 ms, got ", keepalive_ms));
}

absl::Status CheckCanListen(const std::string& address) {
  if (absl::Status s = ValidateListenAddress(address); !s.ok()) return s;
  return ProbeBind(address, *SplitHostPort(address));
}

absl::StatusOr<StartedServer> StartServer(
    grpc::ServerBuilder& builder, const std::string& address,
    std::shared_ptr<grpc::ServerCredentials> credentials, int keepalive_ms) {
  if (absl::Status s = CheckCanListen(address); !s.ok()) return s;
  if (absl::Status s = ValidateKeepalive(keepalive_ms); !s.ok()) return s;
  const HostPort listen = *SplitHostPort(address);
  StartedServer started;
  builder.AddListeningPort(address, std::move(credentials), &started.port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      kMinPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  // Keep pinging a call with nothing to send (an idle subscription): gRPC
  // stops after 2 pings without data by default.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    if (started.server != nullptr) started.server->Shutdown();
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen on ", address, " (address in use or not local)"));
  }
  started.address = JoinHostPort(listen.host, started.port);
  return started;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
ServerCredentialsFromFiles(const std::string& tls_cert,
                           const std::string& tls_key) {
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both or neither");
  }
  if (tls_cert.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert_pem = ReadSmallFile(tls_cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadSmallFile(tls_key);
  if (!key_pem.ok()) return key_pem.status();
  if (absl::Status pair =
          CheckKeyCertPair(*cert_pem, tls_cert, *key_pem, tls_key);
      !pair.ok()) {
    return pair;
  }
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key_pem, *cert_pem});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace deltastream
