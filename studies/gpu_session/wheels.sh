#!/usr/bin/env bash
# Put in .gpu_wheels/ (ignored by git) the Python packages the GPU machine lacks for
# `python -m studies.gpu_check`, so that a session can carry the folder there and install it offline.
#
#   studies/gpu_session/wheels.sh            # from the repository root, after the venv is set up (prepare.sh runs it)
#
# The GPU machine (no network) has torch, numpy, msgpack, ninja, psutil, py-cpuinfo, packaging, tqdm and
# einops but not DeepSpeed and its pydantic/hjson stack, and not autosp (studies.bootstrap maps autosp.*
# onto this checkout) or optuna (the check does not import it). Its python3 is CPython 3.12 on x86-64.
#
# - deepspeed: PyPI has only its source; this builds a pure-Python wheel with no ops compiled in
#   (DS_BUILD_OPS=0: DeepSpeed compiles an op on first use, and the check needs only CPU Adam, built
#   there in the background by studies/gpu_check/cpu_adam.py).
# - its dependencies the machine lacks, at the versions this venv resolved (pydantic pins its
#   pydantic-core exactly): pure-Python wheels, and pydantic-core's CPython 3.12 manylinux x86-64 wheel.
#   typing-extensions comes along because pydantic needs a recent one and the machine's is unknown.
#
# Install there (studies/README.md has the whole device command):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu_wheels/*.whl
#   export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=.gpu_wheels
DEPS=(hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions)

version() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

rm -rf "$OUT"
mkdir -p "$OUT"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "deepspeed==$(version deepspeed)"
pins=()
for dep in "${DEPS[@]}"; do pins+=("$dep==$(version "$dep")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" "${pins[@]}"
ls -l "$OUT"
du -sh "$OUT"
