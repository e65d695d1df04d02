#!/bin/bash
# Generates the Python modules of the service's .proto files with Debian's
# protoc and grpc_python_plugin (apt-get install protobuf-compiler
# protobuf-compiler-grpc python3-grpcio python3-protobuf):
#
#   bash clients/python/build.sh [OUT_DIR]
#
# OUT_DIR defaults to clients/python/deltastream/_proto. Afterwards
# `PYTHONPATH=clients/python /usr/bin/python3 -c 'import deltastream'` works
# without the rest of this repository's build. Generated files are not
# committed: they must match the protoc that the installed python3-protobuf
# can load, which only the machine that runs them knows.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
out="${1:-${here}/deltastream/_proto}"
protoc="${PROTOC:-/usr/bin/protoc}"
plugin="${GRPC_PYTHON_PLUGIN:-/usr/bin/grpc_python_plugin}"
for tool in "${protoc}" "${plugin}"; do
  if [[ ! -x "${tool}" ]]; then
    echo "build.sh: ${tool} not found (apt-get install protobuf-compiler protobuf-compiler-grpc)" >&2
    exit 1
  fi
done
mkdir -p "${out}"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
(cd "${root}" && "${protoc}" --proto_path=. --python_out="${tmp}" \
  --grpc_python_out="${tmp}" --plugin=protoc-gen-grpc_python="${plugin}" \
  proto/tensor.proto proto/tracker.proto proto/snapshot.proto \
  proto/predictor.proto proto/checkpoint.proto)
# protoc writes imports of the form "from proto import tensor_pb2"; inside
# the package they are relative.
for f in "${tmp}"/proto/*.py; do
  sed -e 's/^from proto import /from . import /' "${f}" > "${out}/$(basename "${f}")"
done
[[ -f "${out}/__init__.py" ]] || echo '"""Generated from proto/*.proto by build.sh."""' > "${out}/__init__.py"
echo "build.sh: generated $(ls "${out}" | grep -c '_pb2') modules in ${out}"
