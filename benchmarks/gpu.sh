#!/usr/bin/env bash
# The GPU bench in one prepared script: synthetic captures -> convert -> `dsbuild bench --device cuda`
# (host->device GB/s pinned vs pageable, data wait and GPU idle under a real calibrated matmul step),
# then the decoders: NVDEC (`--decode-backend nvdec`) against PyAV on CPU threads and a bare PyAV loop,
# on 1080p clips, after a check that NVDEC gives the CPU decoder's frames.
#
#   benchmarks/gpu.sh [RESULTS_DIR]          (default: bench-out/gpu)
#
# Installs nothing and reaches no network: it needs only this tree and a Python with dsbuild's
# dependencies and a CUDA build of torch. It runs the package from the tree (PYTHONPATH), so it works
# whether or not dsbuild is installed. About 6 minutes on 16 cores with DSBUILD_BENCH_SECONDS=40 (the run in
# benchmarks/RESULTS.md), 8 with the default; writes JSON (and HTML) into RESULTS_DIR.
#   PYTHON=...                 the interpreter (default: .venv/bin/python if present, else python3)
#   DSBUILD_BENCH_DEVICE=cpu   a dry run of the same steps on a machine without a GPU
#   DSBUILD_BENCH_SECONDS=N    seconds per bench run (default 60)
#   DSBUILD_BENCH_DECODE_SIZE=WxH   the decoder comparison's capture size (default 1920x1080)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/bench-out/gpu}" && cd "${1:-$ROOT/bench-out/gpu}" && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
DEVICE="${DSBUILD_BENCH_DEVICE:-cuda}"
SECONDS_PER_RUN="${DSBUILD_BENCH_SECONDS:-60}"
DECODE_SIZE="${DSBUILD_BENCH_DECODE_SIZE:-1920x1080}"
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
from av.codec.hwaccel import hwdevices_available
info = {"dsbuild": dsbuild.__version__, "av": av.__version__, "torch": torch.__version__,
        "ffmpeg_hwdevices": hwdevices_available(),
        "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "cores": os.cpu_count()}
print(json.dumps(info, indent=2))
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit("gpu.sh: torch sees no CUDA device (set DSBUILD_BENCH_DEVICE=cpu for a dry run)")
PY
CORES="$("$PYTHON" -c 'import os; print(len(os.sched_getaffinity(0)))')"
WORKERS=$(( CORES >= 16 ? 8 : (CORES >= 4 ? CORES / 2 : 1) ))

stamp "captures (24 sessions x 10 s with grain: 120 clips, enough batches per epoch for every thread)"
dsbuild samples "$WORK/captures" --sessions 24 --seconds 10 --noise 24 --seed 5 >&2
stamp "convert"
dsbuild convert "$WORK/captures" "$WORK/catalog" --clip-seconds 2 --json > "$OUT/convert.json"

stamp "bench: frames 224x224, batch 8, $WORKERS threads, 50 ms matmul step"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode frames --resize 224x224 --batch-size 8 \
  --threads "$WORKERS" --step-ms 50 --duration "$SECONDS_PER_RUN" --rounds 3 \
  --save "$OUT/bench-frames.json" --html "$OUT/bench-frames.html" >&2 || stamp "failed (see above)"
stamp "bench: bytes (encoded clips for GPU decoders), batch 16, 20 ms step"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode bytes --batch-size 16 --threads "$WORKERS" \
  --step-ms 20 --duration "$(( SECONDS_PER_RUN / 2 ))" --rounds 3 --save "$OUT/bench-bytes.json" >&2 || stamp "failed (see above)"
stamp "bench: 2 simulated ranks sharing the GPU, frames 128x128"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode frames --resize 128x128 --batch-size 8 \
  --threads "$(( WORKERS / 2 > 0 ? WORKERS / 2 : 1 ))" --ranks 2 --step-ms 50 \
  --duration "$(( SECONDS_PER_RUN / 2 ))" --rounds 3 --save "$OUT/bench-ranks2.json" >&2 || stamp "failed (see above)"

stamp "decoders: captures of $DECODE_SIZE (4 sessions x 8 s with grain), 1-s clips"
"$PYTHON" - "$WORK/hd" "$DECODE_SIZE" <<'PY'
import dataclasses, sys
from pathlib import Path
from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
w, h = (int(x) for x in sys.argv[2].split("x"))
specs = [dataclasses.replace(session_spec(11, i, 8.0), video=VideoSpec(w, h, 30, 60)) for i in range(4)]
generate(Path(sys.argv[1]), sessions=4, seconds=8.0, seed=11, specs=specs, noise=16)
PY
dsbuild convert "$WORK/hd" "$WORK/hdcat" --clip-seconds 1 --json > "$OUT/convert-decode.json"
stamp "decoders: does NVDEC give the CPU decoder's frames?"
"$PYTHON" - "$WORK/hdcat" <<'PY' | tee "$OUT/nvdec-check.json" || stamp "NVDEC check failed"
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import torch
from dsbuild.loader import Loader
from dsbuild.loader.decode import decode_pyav
torch.zeros(1, device="cuda")  # torch holds the CUDA context first, as in a training process
clip = next(iter(Loader(sys.argv[1], decode="bytes", batch_size=1, seed=0, verify="none")))["video"][0]
idx = np.arange(0, 30, 3)
cpu = decode_pyav(clip, idx, (224, 224))
with ThreadPoolExecutor(1) as pool:  # a loader thread: NVDEC in torch's context, made current there
    t = time.perf_counter(); gpu = pool.submit(decode_pyav, clip, idx, (224, 224), gpu=0).result()
    first = time.perf_counter() - t
    def per_clip(device, n=8):
        t = time.perf_counter()
        for _ in range(n):
            pool.submit(decode_pyav, clip, np.arange(30), (224, 224), gpu=device).result()
        return (time.perf_counter() - t) / n
    cpu_s, gpu_s = per_clip(None), per_clip(0)
full_cpu, full_gpu = decode_pyav(clip, idx), decode_pyav(clip, idx, gpu=0)
diff = np.abs(full_cpu.astype(np.int16) - full_gpu.astype(np.int16))
print(json.dumps({"frames": len(idx), "shape": list(full_gpu.shape), "first_call_s": round(first, 3),
                  "one_thread_30_frame_clip_s": {"cpu": round(cpu_s, 4), "nvdec": round(gpu_s, 4)},
                  "resized_equal": bool(np.array_equal(cpu, gpu)), "native_max_abs_diff": int(diff.max()),
                  "native_mean_abs_diff": float(diff.mean())}))
PY
for backend in pyav nvdec; do
  stamp "decoders: bench frames 224x224 with --decode-backend $backend, $WORKERS threads, no step"
  dsbuild bench "$WORK/hdcat" --device "$DEVICE" --decode frames --decode-backend "$backend" --resize 224x224 \
    --batch-size 8 --threads "$WORKERS" --step-ms 0 --compare pyav --duration "$(( SECONDS_PER_RUN / 2 ))" \
    --rounds 3 --save "$OUT/decode-$backend.json" >&2 || stamp "decoders: $backend failed"
done
"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/decode-summary.json"
import json, sys
from pathlib import Path
rows = {}
for b in ("pyav", "nvdec"):
    f = Path(sys.argv[1]) / f"decode-{b}.json"
    if f.exists():
        d = json.loads(f.read_text())
        base = next(x for x in d["baselines"] if x["name"] == "pyav")
        rows[b] = {"frames_per_s": d["ours"]["frames_per_s"]["median"], "decoder": d["ours"]["decoder_note"],
                   "bare_pyav_cpu_frames_per_s": base["figure"]["median"], "ratio_to_bare_pyav": base["ratio"]["median"]}
if len(rows) == 2:
    rows["nvdec_over_pyav_loader"] = rows["nvdec"]["frames_per_s"] / rows["pyav"]["frames_per_s"]
print(json.dumps(rows, indent=2))
PY
stamp "done: $(ls "$OUT" | tr '\n' ' ')"
