"""Starts the project's binaries for the Python tests: a process on a free
loopback port (--listen=127.0.0.1:0), its target read from the
"listening on HOST:PORT" line it prints, stopped with SIGTERM (SIGKILL after
a timeout) when the test ends."""

import os
import select
import signal
import subprocess
import time


def runfile(path: str) -> str:
    """A binary or file of this repository in the test's runfiles."""
    root = os.environ.get("TEST_SRCDIR")
    workspace = os.environ.get("TEST_WORKSPACE", "__main__")
    candidate = os.path.join(root, workspace, path) if root else path
    if not os.path.exists(candidate):
        raise FileNotFoundError(f"{path} not found (looked at {candidate})")
    return candidate


class ServerProcess:
    """A running server; `target` is its HOST:PORT. Use as a context manager."""

    def __init__(self, binary: str, flags, startup_timeout: float = 60.0):
        self._log = open(os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"),
                                      os.path.basename(binary) + ".log"), "ab")
        self._process = subprocess.Popen(
            [runfile(binary), "--listen=127.0.0.1:0"] + list(flags),
            stdout=subprocess.PIPE, stderr=self._log, bufsize=0)
        self.target = self._wait_for_address(binary, startup_timeout)

    def _wait_for_address(self, binary: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._process.stdout], [], [], 0.1)
            if ready:
                byte = self._process.stdout.read(1)
                if not byte:
                    break
                line += byte
                if byte == b"\n":
                    text = line.decode().strip()
                    if text.startswith("listening on "):
                        return text[len("listening on "):]
                    line = b""
            elif self._process.poll() is not None:
                break
        self.stop()
        with open(self._log.name, "rb") as log:
            tail = log.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"{binary} did not start (exit "
                           f"{self._process.returncode}):\n{tail}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL after `timeout` seconds; the exit code."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout)
        self._process.stdout.close()
        self._log.close()
        return self._process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
