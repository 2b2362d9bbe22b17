#!/usr/bin/env bash
# The GPU bench in one prepared script: synthetic captures -> convert -> `dsbuild bench --device cuda`
# (host->device GB/s pinned vs pageable, data wait and GPU idle under a real calibrated matmul step).
#
#   benchmarks/gpu.sh [RESULTS_DIR]          (default: bench-out/gpu)
#
# Installs nothing and reaches no network: it needs only this tree and a Python with dsbuild's
# dependencies and a CUDA build of torch. It runs the package from the tree (PYTHONPATH), so it works
# whether or not dsbuild is installed. About 4-5 minutes; writes JSON (and HTML) into RESULTS_DIR.
#   PYTHON=...                 the interpreter (default: .venv/bin/python if present, else python3)
#   DSBUILD_BENCH_DEVICE=cpu   a dry run of the same steps on a machine without a GPU
#   DSBUILD_BENCH_SECONDS=N    seconds per bench run (default 60)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/bench-out/gpu}" && cd "${1:-$ROOT/bench-out/gpu}" && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
DEVICE="${DSBUILD_BENCH_DEVICE:-cuda}"
SECONDS_PER_RUN="${DSBUILD_BENCH_SECONDS:-60}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/dsbuild-gpu-bench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

dsbuild() { "$PYTHON" -c "import sys; from dsbuild.cli.app import main; sys.argv[0] = 'dsbuild'; main()" "$@"; }
stamp() { echo "[gpu.sh $(date +%H:%M:%S)] $*" >&2; }

stamp "python: $PYTHON; results: $OUT; device: $DEVICE"
"$PYTHON" - "$DEVICE" <<'PY' | tee "$OUT/environment.json"
import json, os, sys
import av, torch
import dsbuild
device = sys.argv[1]
info = {"dsbuild": dsbuild.__version__, "av": av.__version__, "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "cores": os.cpu_count()}
print(json.dumps(info, indent=2))
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit("gpu.sh: torch sees no CUDA device (set DSBUILD_BENCH_DEVICE=cpu for a dry run)")
PY
CORES="$("$PYTHON" -c 'import os; print(len(os.sched_getaffinity(0)))')"
WORKERS=$(( CORES >= 16 ? 8 : (CORES >= 4 ? CORES / 2 : 1) ))

stamp "captures (8 sessions x 15 s with grain)"
dsbuild samples "$WORK/captures" --sessions 8 --seconds 15 --noise 24 --seed 5 >&2
stamp "convert"
dsbuild convert "$WORK/captures" "$WORK/catalog" --clip-seconds 2 --json > "$OUT/convert.json"

stamp "bench: frames 224x224, batch 8, $WORKERS threads, 50 ms matmul step"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode frames --resize 224x224 --batch-size 8 \
  --threads "$WORKERS" --step-ms 50 --duration "$SECONDS_PER_RUN" --rounds 3 \
  --save "$OUT/bench-frames.json" --html "$OUT/bench-frames.html" >&2
stamp "bench: bytes (encoded clips for GPU decoders), batch 32, 20 ms step"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode bytes --batch-size 32 --threads "$WORKERS" \
  --step-ms 20 --duration "$(( SECONDS_PER_RUN / 2 ))" --rounds 3 --save "$OUT/bench-bytes.json" >&2
stamp "bench: 2 simulated ranks sharing the GPU, frames 128x128"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode frames --resize 128x128 --batch-size 8 \
  --threads "$(( WORKERS / 2 > 0 ? WORKERS / 2 : 1 ))" --ranks 2 --step-ms 50 \
  --duration "$(( SECONDS_PER_RUN / 2 ))" --rounds 3 --save "$OUT/bench-ranks2.json" >&2
stamp "done: $(ls "$OUT" | tr '\n' ' ')"
