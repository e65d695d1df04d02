#!/bin/bash
# Runs a Python test against the project's binaries: generates the client's
# protocol modules (clients/python/build.sh) into a copy of the package in
# the test's temporary directory, then runs the test with Debian's Python
# (the one with python3-grpcio, -protobuf, -numpy and -torch).
#   run_python_test.sh tests/python/<name>_test.py
set -euo pipefail
root="${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-__main__}"
pkg="${TEST_TMPDIR}/pythonpath"
rm -rf "${pkg}"
mkdir -p "${pkg}"
cp -rL "${root}/clients/python/deltastream" "${pkg}/deltastream"
chmod -R u+w "${pkg}"
bash "${root}/clients/python/build.sh" "${pkg}/deltastream/_proto" >/dev/null
export PYTHONPATH="${pkg}:${root}/tests/python"
cd "${root}"
exec /usr/bin/python3 -B "$1" -v
