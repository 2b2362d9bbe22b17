#!/usr/bin/env bash
# The GPU bench in one prepared script: synthetic captures -> convert -> `dsbuild bench --device cuda`
# (host->device GB/s pinned vs pageable, data wait and GPU idle under a real calibrated matmul step),
# then the loader's worker-process sweep, the DataLoader and one-epoch comparisons (issue 39) and the training observatory's model step (issue 41),
# then the decoders (issue 44): a check that NVDEC's frames, converted and resized on the GPU, match the
# CPU decoder's within docs/gpu.md's bound (H.264 and HEVC, native and resized) with one decoder per
# stream configuration, then on 1080p clips and on mixed resolutions: NVDEC (`--decode-backend nvdec`,
# 2 loader threads) against the CPU loader at its best worker-process count on this host and a bare
# PyAV loop, with frames/s, host CPU cores used (rusage of the run) and NVDEC utilisation (nvidia-smi,
# where present), and what `--decode-backend auto` picks and why; decode-summary.json holds the figures.
#
#   benchmarks/gpu.sh [RESULTS_DIR]          (default: bench-out/gpu)
#
# Installs nothing and reaches no network: it needs only this tree and a Python with dsbuild's
# dependencies and a CUDA build of torch. It runs the package from the tree (PYTHONPATH), so it works
# whether or not dsbuild is installed. About 10 minutes on 16 cores with DSBUILD_BENCH_SECONDS=20;
# writes JSON (and HTML) into RESULTS_DIR.
#   PYTHON=...                 the interpreter (default: .venv/bin/python if present, else python3)
#   DSBUILD_BENCH_DEVICE=cpu   a dry run of the same steps on a machine without a GPU (the NVDEC parts
#                              run the device path's CPU twin, or record why they cannot)
#   DSBUILD_BENCH_SECONDS=N    seconds per bench run (default 60; decoder runs get N/2)
#   DSBUILD_BENCH_DECODE_SIZE=WxH   the decoder comparison's capture size (default 1920x1080)
#   DSBUILD_BENCH_WORKERS="4 8 16"  the CPU loader's worker-process counts tried (default: 4, 8, 16 up
#                              to the cores)
#   DSBUILD_BENCH_TINY=1       tiny captures and 1 round: checks the script, measures nothing
#   DSBUILD_BENCH_ONLY=decoders     only the decoder figures (the transfer/data-wait ones skipped)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/bench-out/gpu}" && cd "${1:-$ROOT/bench-out/gpu}" && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
DEVICE="${DSBUILD_BENCH_DEVICE:-cuda}"
SECONDS_PER_RUN="${DSBUILD_BENCH_SECONDS:-60}"
DECODE_SIZE="${DSBUILD_BENCH_DECODE_SIZE:-1920x1080}"
TINY="${DSBUILD_BENCH_TINY:-}"
ROUNDS=3
SESSIONS=24
if [ -n "$TINY" ]; then ROUNDS=1; SESSIONS=4; DECODE_SIZE=320x180; SECONDS_PER_RUN="${DSBUILD_BENCH_SECONDS:-6}"; fi
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
SWEEP="${DSBUILD_BENCH_WORKERS:-$(for w in 4 8 16; do if [ "$w" -le "$CORES" ]; then printf '%s ' "$w"; fi; done)}"
SWEEP="${SWEEP:-1}"

if [ "${DSBUILD_BENCH_ONLY:-}" != decoders ]; then
stamp "captures ($SESSIONS sessions x 10 s with grain: 5 clips each, enough batches per epoch for every thread)"
dsbuild samples "$WORK/captures" --sessions "$SESSIONS" --seconds 10 --noise 24 --seed 5 >&2
stamp "convert"
dsbuild convert "$WORK/captures" "$WORK/catalog" --clip-seconds 2 --json > "$OUT/convert.json"

stamp "bench: frames 224x224, batch 8, $WORKERS threads, 50 ms matmul step"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode frames --resize 224x224 --batch-size 8 \
  --threads "$WORKERS" --step-ms 50 --duration "$SECONDS_PER_RUN" --rounds "$ROUNDS" \
  --save "$OUT/bench-frames.json" --html "$OUT/bench-frames.html" >&2 || stamp "failed (see above)"
stamp "bench: bytes (encoded clips for GPU decoders), batch 16, 20 ms step"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode bytes --batch-size 16 --threads "$WORKERS" \
  --step-ms 20 --duration "$(( SECONDS_PER_RUN / 2 ))" --rounds "$ROUNDS" --save "$OUT/bench-bytes.json" >&2 || stamp "failed (see above)"
stamp "bench: 2 simulated ranks sharing the GPU, frames 128x128"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode frames --resize 128x128 --batch-size 8 \
  --threads "$(( WORKERS / 2 > 0 ? WORKERS / 2 : 1 ))" --ranks 2 --step-ms 50 \
  --duration "$(( SECONDS_PER_RUN / 2 ))" --rounds "$ROUNDS" --save "$OUT/bench-ranks2.json" >&2 || stamp "failed (see above)"

# -- the loader's worker processes (issue 39): one interleaved sweep per mode, baselines at each N --------
PSWEEP="$(for w in 1 2 4 8 16; do if [ "$w" -le "$CORES" ]; then printf '%s,' "$w"; fi; done)"
PSWEEP="${PSWEEP%,}"
stamp "bench: worker-process sweep $PSWEEP, bytes"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode bytes --batch-size 16 --workers "$PSWEEP" --step-ms 0 \
  --duration "$SECONDS_PER_RUN" --rounds "$ROUNDS" --compare raw,sha256 \
  --save "$OUT/sweep-bytes.json" --html "$OUT/sweep-bytes.html" >&2 || stamp "failed (see above)"
stamp "bench: worker-process sweep $PSWEEP, frames 224x224"
dsbuild bench "$WORK/catalog" --device "$DEVICE" --decode frames --resize 224x224 --batch-size 8 --workers "$PSWEEP" \
  --step-ms 0 --duration "$SECONDS_PER_RUN" --rounds "$ROUNDS" --compare pyav-procs \
  --save "$OUT/sweep-frames.json" --html "$OUT/sweep-frames.html" >&2 || stamp "failed (see above)"
PMAX="${PSWEEP##*,}"
stamp "torch DataLoader over as_torch_dataset() against process mode, $PMAX workers (bytes, frames 64x64)"
"$PYTHON" "$ROOT/benchmarks/dataloader.py" "$WORK/catalog" --workers "$PMAX" --rounds "$ROUNDS" \
  --seconds "$(( SECONDS_PER_RUN / 10 + 1 ))" > "$OUT/dataloader.txt" || stamp "failed (see above)"
stamp "one epoch in bytes mode, open included, against LitData and webdataset"
"$PYTHON" "$ROOT/benchmarks/epoch.py" "$WORK/catalog" --rounds 5 --work "$WORK/epoch" > "$OUT/epoch.txt" \
  || stamp "failed (see above)"
stamp "loader: worker segments pinned for CUDA (cudaHostRegister)? process batches = thread batches on $DEVICE?"
"$PYTHON" - "$WORK/catalog" "$DEVICE" <<'PY' | tee "$OUT/pinned-check.json" || stamp "pinned check failed"
import json, sys, torch
from dsbuild.loader import Loader
ref, device = sys.argv[1], sys.argv[2]
kw = dict(decode="frames", resize=(64, 64), batch_size=4, seed=1, num_workers=2, device=device)
with Loader(ref, worker_mode="process", **kw) as procs, Loader(ref, worker_mode="thread", **kw) as threads:
    same, n = True, 0
    for a, b in zip(procs, threads):
        same = same and all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
        n += 1
    stats = procs.stats()
print(json.dumps({"device": device, "pinned": stats["workers"].get("pinned"), "pinned_expected": device.startswith("cuda"),
                  "batches": n, "same_as_threads": same, "notes": stats["notes"]}, indent=2))
PY

# -- the training observatory (issue 41): a real model step on the GPU, one rank per GPU ----------------
for model in $([ -n "$TINY" ] && echo tiny || echo tiny base); do
  stamp "bench --model $model: bf16, one rank, 64x64 clips of 8 frames"
  dsbuild bench "$WORK/catalog" --model "$model" --ranks 1 --dtype bf16 --resize 64x64 --clip-frames 8 \
    --batch-size 8 --steps "$([ -n "$TINY" ] && echo 3 || echo 20)" --save "$OUT/model-$model.json" \
    --html "$OUT/model-$model.html" >&2 || stamp "failed (see above)"
done
fi

# -- decoders (issue 44) -------------------------------------------------------------------------
MIXED="1920x1080:h264 1280x720:hevc 2560x1440:h264 854x480:hevc"
[ -n "$TINY" ] && MIXED="320x180:h264 256x144:hevc"
stamp "decoders: captures of $DECODE_SIZE (4 sessions x 8 s, H.264), and of mixed sizes ($MIXED), 1-s clips"
"$PYTHON" - "$WORK" "$DECODE_SIZE" "$MIXED" <<'PY'
import dataclasses, sys
from pathlib import Path
from dsbuild.samples.synthetic import generate, session_spec
from dsbuild.samples.writer import VideoSpec
work, size, mixed = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split()
def make(folder, kinds):
    specs = [dataclasses.replace(session_spec(11, i, 8.0), video=VideoSpec(int(w), int(h), 30, 60, codec=c))
             for i, (w, h, c) in enumerate(kinds)]
    generate(folder, sessions=len(specs), seconds=8.0, seed=11, specs=specs, noise=16)
make(work / "hd", [(*size.split("x"), "h264")] * 4)
make(work / "mixed", [(*k.split(":")[0].split("x"), k.split(":")[1]) for k in mixed])
PY
dsbuild convert "$WORK/hd" "$WORK/hdcat" --clip-seconds 1 --json > "$OUT/convert-decode.json"
dsbuild convert "$WORK/mixed" "$WORK/mixedcat" --clip-seconds 1 --json > "$OUT/convert-mixed.json"

stamp "decoders: do NVDEC's frames (RGB and resize on the GPU) match the CPU decoder's? decoders reused?"
"$PYTHON" - "$WORK/mixedcat" "$DEVICE" <<'PY' | tee "$OUT/nvdec-check.json" || stamp "NVDEC check failed"
import json, sys, time
import numpy as np, torch
from dsbuild.loader import Loader
from dsbuild.loader.decode import decode_device, decode_nvdec, decode_pyav
from dsbuild.loader.gpu import DecoderCache
gpu = 0 if sys.argv[2].startswith("cuda") else None  # cpu: the device path's CPU twin
if gpu is not None:
    torch.zeros(1, device="cuda")  # torch holds the CUDA context first, as in a training process
def psnr(a, b):
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)
rows, cache = [], DecoderCache()
clips = {}
for batch in Loader(sys.argv[1], decode="bytes", batch_size=1, seed=0, verify="none", bucket_by="resolution"):
    import av, io
    with av.open(io.BytesIO(bytes(batch["video"][0]))) as c:
        s = c.streams.video[0]
        clips.setdefault((s.codec_context.name, s.width, s.height), bytes(batch["video"][0]))
    if len(clips) >= 4:
        break
idx = np.arange(0, 30, 3)
for (codec, w, h), clip in sorted(clips.items()):
    for size in (None, (224, 224)):
        cpu = decode_pyav(clip, idx, size)
        t = time.perf_counter(); got = decode_device(clip, idx, size, cache, gpu).cpu().numpy(); first = time.perf_counter() - t
        d = np.abs(cpu.astype(np.int16) - got.astype(np.int16))
        rows.append({"codec": codec, "size": f"{w}x{h}", "resize": size, "max_abs_diff": int(d.max()),
                     "mean_abs_diff": round(float(d.mean()), 3), "psnr_db": round(psnr(cpu, got), 2), "first_call_s": round(first, 4)})
    per = {}
    for name, fn in (("cpu_pyav", lambda: decode_pyav(clip, np.arange(30), (224, 224))),
                     ("device", lambda: decode_device(clip, np.arange(30), (224, 224), cache, gpu))):
        fn(); t = time.perf_counter()
        for _ in range(5):
            fn()
        if gpu is not None:
            torch.cuda.synchronize()
        per[name] = round((time.perf_counter() - t) / 5, 4)
    rows[-1]["one_thread_30_frame_clip_s"] = per
counts = {}
odd = None
try:
    import av, io
    from fractions import Fraction
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:  # H.264 4:4:4: NVDEC does not take it
        v = c.add_stream("libx264", rate=Fraction(30)); v.width, v.height, v.pix_fmt = 64, 48, "yuv444p"
        for i in range(4):
            for p in v.encode(av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 40, np.uint8), format="rgb24")):
                c.mux(p)
        for p in v.encode(None):
            c.mux(p)
    decode_nvdec(buf.getvalue(), np.arange(4), None, cache, gpu, key="yuv444p-probe", fallback=True, counts=counts)
except Exception as e:
    odd = f"{type(e).__name__}: {e}"
print(json.dumps({"device": "cuda:0" if gpu is not None else "cpu (the device path's CPU twin)", "checks": rows,
                  "decoders_opened": cache.opened, "configurations": len(clips),
                  "yuv444p_fallbacks": counts.get("fallback", 0), "yuv444p_error": odd}, indent=2))
PY

measure() {  # measure NAME CMD...: run CMD, recording wall seconds, host CPU seconds (itself and every
  # process it waited for: the whole bench run, start-up and any baseline included, so cores_used is an
  # upper bound; nvdec and auto runs have no baseline) and, on a GPU, nvidia-smi's decoder/GPU
  # utilisation every 0.5 s
  local name="$1"; shift
  local smi=""
  if command -v nvidia-smi >/dev/null 2>&1 && [ "$DEVICE" != cpu ]; then
    nvidia-smi --query-gpu=utilization.decoder,utilization.gpu,memory.used --format=csv,noheader,nounits \
      -lms 500 > "$OUT/smi-$name.csv" 2>/dev/null & smi=$!
  fi
  "$PYTHON" - "$OUT/cpu-$name.json" "$@" <<'PY' || stamp "$name failed"
import json, resource, subprocess, sys, time
t = time.time(); rc = subprocess.call(sys.argv[2:], stdout=sys.stderr)
r = resource.getrusage(resource.RUSAGE_CHILDREN); wall = time.time() - t
cpu = r.ru_utime + r.ru_stime
json.dump({"rc": rc, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cores_used": round(cpu / wall, 2)},
          open(sys.argv[1], "w"))
sys.exit(rc)
PY
  if [ -n "$smi" ]; then kill "$smi" 2>/dev/null || true; wait "$smi" 2>/dev/null || true; fi
}
bench_py=("$PYTHON" -c "import sys; from dsbuild.cli.app import main; sys.argv[0] = 'dsbuild'; main()" bench)
HALF="$(( SECONDS_PER_RUN / 2 > 2 ? SECONDS_PER_RUN / 2 : 2 ))"
for set in hd mixed; do
  cat="$WORK/${set}cat"
  common=(--device "$DEVICE" --decode frames --resize 224x224 --batch-size 8 --step-ms 0 --duration "$HALF" --rounds "$ROUNDS")
  for w in $SWEEP; do
    stamp "decoders ($set): the CPU loader, PyAV, $w worker processes (and the bare PyAV loop in $w processes)"
    measure "$set-pyav-w$w" "${bench_py[@]}" "$cat" "${common[@]}" --decode-backend pyav --workers "$w" \
      --compare pyav-procs --save "$OUT/decode-$set-pyav-w$w.json"
  done
  stamp "decoders ($set): NVDEC, frames on the GPU, 2 loader threads"
  measure "$set-nvdec" "${bench_py[@]}" "$cat" "${common[@]}" --decode-backend nvdec --threads 2 --compare none \
    --save "$OUT/decode-$set-nvdec.json"
  stamp "decoders ($set): --decode-backend auto, 2 threads: what it picks and why"
  measure "$set-auto" "${bench_py[@]}" "$cat" "${common[@]}" --decode-backend auto --threads 2 --compare none \
    --save "$OUT/decode-$set-auto.json"
done

"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/decode-summary.json"
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    f = out / name
    return json.loads(f.read_text()) if f.exists() else None
def fps(d):
    return d["ours"]["frames_per_s"]["median"] if d and d.get("ours") and d["ours"].get("frames_per_s") else None
def smi(name):
    f = out / f"smi-{name}.csv"
    rows = [r for r in csv.reader(f.open()) if len(r) >= 2] if f.exists() else []
    vals = [[float(x) for x in r[:2]] for r in rows if all(x.strip().replace(".", "").isdigit() for x in r[:2])]
    if not vals:
        return None
    return {"decoder_util_mean_pct": round(sum(v[0] for v in vals) / len(vals), 1), "decoder_util_max_pct": max(v[0] for v in vals),
            "gpu_util_mean_pct": round(sum(v[1] for v in vals) / len(vals), 1), "samples": len(vals)}
summary = {}
for s in ("hd", "mixed"):
    cpu = {}
    for f in sorted(out.glob(f"decode-{s}-pyav-w*.json")):
        w = int(f.stem.rsplit("-w", 1)[1]); d = json.loads(f.read_text())
        bare = next((b for b in d.get("baselines", []) if b["name"] == "pyav-procs"), None)
        cpu[w] = {"frames_per_s": fps(d), "cpu": load(f"cpu-{s}-pyav-w{w}.json"),
                  "bare_pyav_procs_frames_per_s": bare["figure"]["median"] if bare and bare.get("figure") else None}
    best = max((w for w in cpu if cpu[w]["frames_per_s"]), key=lambda w: cpu[w]["frames_per_s"], default=None)
    nv, auto = load(f"decode-{s}-nvdec.json"), load(f"decode-{s}-auto.json")
    row = {"cpu_loader": cpu, "cpu_best_workers": best, "nvdec_frames_per_s": fps(nv), "nvdec_host": load(f"cpu-{s}-nvdec.json"),
           "nvdec_gpu": smi(f"{s}-nvdec"), "nvdec_notes": nv["notes"] if nv else None,
           "auto_frames_per_s": fps(auto),
           "auto_notes": [n for n in [((auto or {}).get("ours") or {}).get("decoder_note"), *(auto or {}).get("notes", [])]
                          if n and n.startswith("auto:")]}
    if best is not None and row["nvdec_frames_per_s"]:
        row["nvdec_over_best_cpu_loader"] = round(row["nvdec_frames_per_s"] / cpu[best]["frames_per_s"], 3)
        cores = (row["nvdec_host"] or {}).get("cores_used")
        row["goal_met"] = row["nvdec_over_best_cpu_loader"] >= 1.5 and cores is not None and cores <= 2
    summary[s] = row
print(json.dumps(summary, indent=2))
PY
stamp "done: $(ls "$OUT" | tr '\n' ' ')"
