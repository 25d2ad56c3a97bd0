#!/usr/bin/env bash
# One prepared check for a lent GPU host (an H200; under 8 minutes): install the project,
# run the CUDA correctness tests (tests/gpu: against numpy, TVM's LLVM build, PyTorch eager,
# ONNX Runtime), then print our latency next to TVM's default CUDA pipeline and PyTorch
# eager (scripts/gpu_bench.py).  Every step has its own timeout; the first failure stops it.
#
#   bash scripts/device_check.sh            # from anywhere; logs to $OUT/ when OUT is set
#
# Offline hosts: pip cannot fetch apache-tvm there.  Put the wheels (apache-tvm,
# apache-tvm-ffi, and what `pip install` lists as missing) in .whl/ beside this repo's
# pyproject.toml; they are installed with --no-index first.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
LOG_DIR=${OUT:-/tmp/aicf_device_check}
mkdir -p "$LOG_DIR"
PY=${PYTHON:-python3}
step() { echo; echo "=== [$(date +%T), ${SECONDS}s] $*"; }

step "host"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi failed"
"$PY" --version

step "install"
if [ -d .whl ] && compgen -G ".whl/*.whl" > /dev/null; then
    timeout 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/aicf_site .whl/*.whl
    export PYTHONPATH=/tmp/aicf_site${PYTHONPATH:+:$PYTHONPATH}
fi
# An installed torch is kept: the `torch` extra pins a build that would replace it.
EXTRAS="test,torch"
if "$PY" -c "import torch" 2> /dev/null; then EXTRAS="test"; fi
if ! timeout 300 "$PY" -m pip install -q -e ".[$EXTRAS]" > "$LOG_DIR/pip.log" 2>&1; then
    echo "pip install -e .[$EXTRAS] failed (offline, or Python $("$PY" -c 'import sys; print(sys.version.split()[0])') outside the pin); tail:"
    tail -n 5 "$LOG_DIR/pip.log"
    echo "falling back to the packages already on this host plus PYTHONPATH=$PWD"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PY" -c "import tvm, aicf_tvm, schedules, relax_passes; assert tvm.cuda(0).exist, 'TVM sees no CUDA device'"; then
    echo "device_check: cannot import the project with a CUDA-enabled TVM here; see the install step" >&2
    exit 2
fi
"$PY" -c "import tvm; print('tvm', tvm.__version__, tvm.cuda(0).device_name, 'compute', tvm.cuda(0).compute_version)"

step "CUDA correctness tests (tests/gpu)"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/gpu -ra 2>&1 | tee "$LOG_DIR/gpu_tests.log"

step "latency: AICF vs TVM default CUDA pipeline vs PyTorch eager"
AICF_DEBUG=0 timeout 200 "$PY" scripts/gpu_bench.py --number 20 --repeat 10 2>&1 \
    | grep -v "missing 'max_shared_memory_per_block'" | tee "$LOG_DIR/gpu_bench.log"

step "done in ${SECONDS}s"
