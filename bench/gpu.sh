#!/usr/bin/env bash
# The first GPU machine's tables (issue 28), in one command:
#
#   BACKEND=cuda bash bench/gpu.sh        # cuda | vulkan | rocm | metal | cpu
#
# 1. builds llama-cpp-python for the backend into its own venv, and llama-server from the
#    same llama.cpp sources (the sdist's vendor/llama.cpp), so both servers run the same
#    kernels;
# 2. runs the per-step comparison (bench/step_overhead.py: the tiny random-weight model,
#    1/4/16/64 streams, streamed and not, each server with and without sampling inside
#    llama.cpp), the engine's Python per token (bench/step_python.py) and the serving comparison
#    (bench/compare_servers.py: Gemma 3 270M, 1/4/16 streams), every layer on the device
#    (both servers' default);
# 3. leaves the tables in bench/results/ (step_overhead.json, compare_servers.json) and
#    prints them.
#
# Needs the backend's toolkit (nvcc for CUDA, the Vulkan SDK, ROCm's hipcc), cmake, a C++
# compiler and network access to PyPI. WORK (default ~/.cache/llamaserve/gpu-BACKEND)
# keeps the venv and the builds: a second run skips what is built. SKIP_BUILD=1 uses the
# current python and LLAMA_SERVER instead (a machine set up by hand). DRY=1 prints the
# commands without running them. No GPU figure is claimed before such a run.
set -euo pipefail

BACKEND=${BACKEND:-cuda}
case "$BACKEND" in
  cuda) FLAG="-DGGML_CUDA=on" ;;
  vulkan) FLAG="-DGGML_VULKAN=on" ;;
  rocm) FLAG="-DGGML_HIP=on" ;;
  metal) FLAG="-DGGML_METAL=on" ;;
  cpu) FLAG="" ;;
  *) echo "BACKEND must be cuda, vulkan, rocm, metal or cpu (got $BACKEND)" >&2; exit 2 ;;
esac
VERSION=${LLAMA_CPP_PYTHON:-0.3.36}  # the bindings the project is tested with
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$HOME/.cache/llamaserve/gpu-$BACKEND}
THREADS=${THREADS:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}

run() {
  echo "+ $*" >&2
  if [ -z "${DRY:-}" ]; then "$@"; fi
}

if [ -n "${SKIP_BUILD:-}" ]; then
  PY=${PYTHON:-python3}
  SERVER=${LLAMA_SERVER:?SKIP_BUILD=1 needs LLAMA_SERVER=/path/to/llama-server}
else
  run mkdir -p "$WORK"
  PY=$WORK/venv/bin/python
  if [ ! -x "$PY" ]; then
    run python3 -m venv "$WORK/venv"
    run "$PY" -m pip install -q --upgrade pip
  fi
  if ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    run env CMAKE_ARGS="$FLAG" "$PY" -m pip install -q --no-cache-dir \
      "llama-cpp-python==$VERSION"
  fi
  run "$PY" -m pip install -q -e "$ROOT"
  SRC=$WORK/llama_cpp_python-$VERSION
  if [ ! -d "$SRC" ]; then
    run "$PY" -m pip download -q --no-binary :all: --no-deps -d "$WORK" \
      "llama-cpp-python==$VERSION"
    run tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
  fi
  SERVER=$WORK/llama-build/bin/llama-server
  if [ ! -x "$SERVER" ]; then
    run cmake -S "$SRC/vendor/llama.cpp" -B "$WORK/llama-build" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF $FLAG
    run cmake --build "$WORK/llama-build" --target llama-server -j "$THREADS"
  fi
fi

run "$PY" -c "import llama_cpp; print('llama.cpp system info:', llama_cpp.llama_print_system_info().decode())"
# both servers with and without sampling inside llama.cpp (model.backend_sampling,
# llama-server's --backend-sampling), three interleaved rounds
run "$PY" "$ROOT/bench/step_overhead.py" --llama-server "$SERVER" --threads "$THREADS" \
  --rounds 3 --servers llamaserve,llama-server,llama-server-bs \
  --variant bs:model.backend_sampling=true
run "$PY" "$ROOT/bench/step_python.py" --concurrency 1,16,64 \
  --variant backend:backend_sampling=true
run "$PY" "$ROOT/server.py" pull gemma  # Gemma 3 270M from PyPI into the model cache
run "$PY" "$ROOT/bench/compare_servers.py" --llama-server "$SERVER" --threads "$THREADS"
echo "tables: $ROOT/bench/results/step_overhead.json, step_python.json, compare_servers.json" >&2
