#ifndef DELTASTREAM_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define DELTASTREAM_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "base/host_port.h"
#include "tests/testing/test_dirs.h"

namespace deltastream {

// A file of this workspace (a binary): from the runfiles of a test
// (TEST_SRCDIR), or of a binary that `bazel run` started (RUNFILES_DIR) or
// that was started by hand (the runfiles tree beside /proc/self/exe); else
// `path` itself, relative to the working directory (the workspace root, or
// CMake's build directory).
inline std::string RunfilePath(const std::string& path) {
  const char* workspace = std::getenv("TEST_WORKSPACE");
  const std::string in_runfiles =
      std::string("/") + (workspace ? workspace : "deltastream") + "/" + path;
  for (const char* dir :
       {std::getenv("TEST_SRCDIR"), std::getenv("RUNFILES_DIR")}) {
    if (dir != nullptr) return dir + in_runfiles;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    const std::string beside = std::string(exe, n) + ".runfiles" + in_runfiles;
    if (access(beside.c_str(), F_OK) == 0) return beside;
  }
  return path;
}

// The real tracker_server (or another serving binary of the workspace that
// takes --listen and prints "listening on HOST:PORT" first, e.g. the
// trainer), started on a free loopback port; killed on destruction. Its
// stderr goes to `stderr_path` when given, else to the test's.
class ServerProcess {
 public:
  explicit ServerProcess(
      std::vector<std::string> flags,
      const std::string& binary = "tracker_service/tracker_server",
      const std::string& stderr_path = "") {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      if (!stderr_path.empty()) {
        const int err =
            open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (err >= 0) dup2(err, STDERR_FILENO);
      }
      std::vector<std::string> argv = {RunfilePath(binary),
                                       "--listen=127.0.0.1:0"};
      argv.insert(argv.end(), flags.begin(), flags.end());
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    FILE* stream = fdopen(out[0], "r");
    char line[256];
    if (stream != nullptr &&
        std::fgets(line, sizeof(line), stream) != nullptr) {
      absl::string_view text = absl::StripTrailingAsciiWhitespace(line);
      if (absl::ConsumePrefix(&text, "listening on ")) {
        absl::StatusOr<HostPort> target = SplitHostPort(text);
        if (target.ok()) port_ = target->port;
      }
    }
    stream_ = stream;
  }
  ~ServerProcess() { Stop(SIGKILL); }

  // Sends `signal` and waits; returns the exit status (as waitpid gives it).
  int Stop(int signal = SIGTERM) {
    if (pid_ <= 0) return -1;
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (stream_ != nullptr) std::fclose(stream_);
    stream_ = nullptr;
    return status;
  }

  // Sends `signal` without waiting.
  void Signal(int signal) {
    if (pid_ > 0) kill(pid_, signal);
  }

  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  FILE* stream_ = nullptr;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a shell command line; captures stdout and stderr.
inline CommandResult RunCommand(const std::string& command) {
  const std::string err_file =
      TestTempDir() + "/stderr." + std::to_string(getpid());
  CommandResult result;
  FILE* pipe = popen((command + " 2>" + err_file).c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.out.append(buffer, n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (FILE* err = std::fopen(err_file.c_str(), "r")) {
    while ((n = std::fread(buffer, 1, sizeof(buffer), err)) > 0) {
      result.err.append(buffer, n);
    }
    std::fclose(err);
  }
  return result;
}

// The whole text of a file; empty when it cannot be read.
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Replaces the file at `path` with `text`.
inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// How many times `what` occurs in `text` (overlaps counted).
inline int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// A command running in the background, stdout and stderr to files.
class Background {
 public:
  Background(const std::string& command, const std::string& prefix)
      : out_(prefix + ".out"), err_(prefix + ".err") {
    pid_ = fork();
    if (pid_ == 0) {
      const int out = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, STDOUT_FILENO);
      dup2(err, STDERR_FILENO);
      const std::string line = "exec " + command;
      execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Background() { Stop(SIGKILL); }

  // Sends `signal`, waits; the exit code (-1 when killed by a signal).
  int Stop(int signal) {
    if (pid_ <= 0) return -1;
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Sends `signal` without waiting.
  void Signal(int signal) {
    if (pid_ > 0) kill(pid_, signal);
  }
  std::string out() const { return ReadText(out_); }
  std::string err() const { return ReadText(err_); }

 private:
  pid_t pid_ = -1;
  std::string out_;
  std::string err_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_INTEGRATION_SERVER_PROCESS_H_
