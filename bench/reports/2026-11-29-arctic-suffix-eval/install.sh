#!/usr/bin/env bash
# arctic-inference 0.3.0 (Snowflake's suffix decoding, what vLLM's `suffix` method imports) built from
# its sdist on a CPU machine, into a venv of its own that sees the system's torch (issue 57's evaluation).
# Its default isolated build would install torch>=2.10 into the build env; --no-build-isolation reuses
# the installed torch and needs the build tools installed first. cmake must be on PATH.
set -euo pipefail
venv=${1:-/tmp/arcvenv}
python -m venv "$venv" --system-site-packages
"$venv/bin/pip" install -q wheel nanobind==2.9.2 cmake ninja "protobuf==5.29.6" grpcio-tools
work=$(mktemp -d)
"$venv/bin/pip" download -q --no-deps --no-build-isolation --no-binary :all: arctic-inference==0.3.0 -d "$work"
tar xzf "$work"/arctic_inference-0.3.0.tar.gz -C "$work"
(cd "$work/arctic_inference-0.3.0" && PATH="$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --no-deps .)
