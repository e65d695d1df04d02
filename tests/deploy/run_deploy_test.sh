#!/bin/bash
# Debian's Python (python3-yaml), not whatever python3 is first on PATH.
set -euo pipefail
cd "${TEST_SRCDIR:?run me with bazel test}/${TEST_WORKSPACE:-__main__}"
exec /usr/bin/python3 -B tests/deploy/deploy_test.py -v
