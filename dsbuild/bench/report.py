"""The bench report: every figure as a median with spread, ratios against same-run baselines, the machine,
the versions of the software, the dataset version measured; and the CI regression gate over ratios."""

from __future__ import annotations

import os
import platform
import time

from dsbuild.bench.dataset import Dataset
from dsbuild.bench.options import BenchOptions
from dsbuild.bench.summary import paired_ratio, percentiles, rate_series, spread

FORMAT = "dsbuild.bench/1"
FIGURES = ("samples_per_s", "frames_per_s", "mb_per_s", "batches_per_s")
# Which of our figures each baseline does the same work for.
RATIOS = {"raw": ("samples_per_s", "mb_per_s"), "pyav": ("frames_per_s",),
          "webdataset": ("samples_per_s", "mb_per_s", "frames_per_s")}
FED_BELOW = 0.05  # the pipeline "keeps the accelerator fed" when it waits under 5% of wall time
HEAVY = ("timeline", "throughput", "training", "waits")


def machine(device: str | None) -> dict:
    gpu = None
    if device and device.startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name(torch.device(device))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": os.cpu_count(), "usable_cores": usable, "memory_bytes": memory, "gpu": gpu,
            "platform": platform.platform(), "python": platform.python_version()}


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("dsbuild", "av", "torch", "webdataset", "numpy", "pyarrow"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    if out["dsbuild"] is None:  # running from a source tree
        from dsbuild import __version__

        out["dsbuild"] = __version__
    return out


def _sum_decomposition(parts: list[dict]) -> dict:
    """Consumer and pipeline seconds summed over rounds, with fractions of the summed wall time."""
    consumer: dict = {}
    pipeline: dict = {"workers": {}}
    for p in parts:
        for k, v in p["consumer"].items():
            consumer[k] = consumer.get(k, 0.0) + v
        for k, v in p["pipeline"].items():
            if k != "workers":
                pipeline[k] = pipeline.get(k, 0.0) + v
        for name, w in p["pipeline"]["workers"].items():
            mine = pipeline["workers"].setdefault(name, {})
            for k, v in w.items():
                if k != "utilisation":
                    mine[k] = mine.get(k, 0) + v
    wall_c = consumer["wall"]
    consumer["fractions"] = {k: v / wall_c for k, v in consumer.items() if k != "wall"} if wall_c > 0 else {}
    pipeline["fractions"] = {k: pipeline[k] / pipeline["busy"] for k in ("read", "decode", "collate")} \
        if pipeline["busy"] > 0 else {}
    for w in pipeline["workers"].values():
        w["utilisation"] = w["busy"] / w["wall"] if w["wall"] > 0 else None
    # Workers are the same named threads in every round (rank<r>/ prefixed with --ranks).
    walls = sum(w["wall"] for w in pipeline["workers"].values())
    pipeline["utilisation"] = pipeline["busy"] / walls if walls > 0 else None
    return {"consumer": consumer, "pipeline": pipeline}


def _training(ours: list[dict], step_ms: float, calibration: dict) -> dict:
    tr = [x["training"] for x in ours if x.get("training")]
    if not tr:
        return {"skipped": "--step-ms 0: no training step simulated", "step": calibration}
    waits = [w for t in tr for w in t["waits"]]
    wait_fraction = spread([t["wait_fraction"] for t in tr])
    idle = spread([t["gpu_idle_fraction"] for t in tr])
    return {
        "step": calibration, "steps": sum(t["steps"] for t in tr),
        "samples_per_s": spread([t["samples_per_s"] for t in tr]),
        "frames_per_s": spread([t["frames_per_s"] for t in tr]),
        "data_wait_ms": {k: (v * 1000 if v is not None else None) for k, v in percentiles(waits).items()},
        "wait_fraction": wait_fraction,
        "gpu_idle_fraction": idle,
        "gpu_idle_reason": None if idle else "no CUDA device: the step is time.sleep, there is no GPU to be idle",
        "fed": wait_fraction["median"] < FED_BELOW, "fed_below": FED_BELOW,
    }


def _light(x: dict) -> dict:
    return {k: v for k, v in x.items() if k not in HEAVY}


def build(o: BenchOptions, data: Dataset, device: str | None, calibration: dict, results: dict[str, list[dict]],
          skipped: dict[str, str], per_rank: list[list[dict]] | None, h2d: dict, slice_s: float, *,
          started: float, seconds: float) -> dict:
    from dsbuild.bench.ranks import rank_summary

    ours = results["ours"]
    throughput = {f: spread([x[f] for x in ours]) for f in FIGURES}
    baselines: dict = {name: {"skipped": why} for name, why in skipped.items()}
    ratios: dict = {}
    for name, rounds in results.items():
        if name == "ours":
            continue
        baselines[name] = {f: spread([x[f] for x in rounds]) for f in ("samples_per_s", "frames_per_s", "mb_per_s")}
        ratios[name] = {f: paired_ratio(ours, rounds, f) for f in RATIOS[name]
                        if o.decode == "frames" or f != "frames_per_s"}
    batches = throughput["batches_per_s"]
    return {
        "format": FORMAT,
        "version_id": data.version_id,
        "dataset": data.to_json(),
        "config": {**o.to_json(), "device_resolved": device or "numpy", "slice_s": slice_s,
                   "bucket_by": data.bucket_by if o.decode == "frames" and o.resize is None else None},
        "machine": machine(device),
        "versions": versions(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": seconds,
        "throughput": throughput,
        # The shortest step this pipeline keeps fed, per rank: one batch per this many milliseconds.
        "batch_interval_ms": 1000 * o.ranks / batches["median"] if batches and batches["median"] else None,
        "latency": {k: spread([x[k] for x in ours]) for k in ("first_batch_s", "open_s", "resume_s")},
        "training": _training(ours, o.step_ms, calibration),
        "decomposition": {
            "throughput": _sum_decomposition([x["throughput"] for x in ours]),
            "training": _sum_decomposition([x["training"] for x in ours]) if ours[0].get("training") else None,
        },
        "h2d": h2d,
        "baselines": baselines,
        "ratios": ratios,
        "ranks": rank_summary(per_rank) if per_rank else None,
        "corrupt": sum(x["corrupt"] for x in ours),
        # About two batches per bin: finer bins would show the batch cadence, not the rate.
        "timeline": [rate_series(x["timeline"], bins=max(1, min(40, len(x["timeline"]) // 2))) for x in ours],
        "rounds": {name: [_light(x) for x in rounds] for name, rounds in results.items()},
    }


def regressions(current: dict, saved: dict, fail_below: float) -> list[dict]:
    """Ratios now below ``fail_below`` x the saved ones (a saved ratio not measured now also fails)."""
    out = []
    for name, figures in sorted(saved.get("ratios", {}).items()):
        for figure, was in sorted(figures.items()):
            if not was:
                continue
            now = (current.get("ratios", {}).get(name) or {}).get(figure)
            floor = fail_below * was["median"]
            if now is None:
                out.append({"ratio": f"{name}/{figure}", "saved": was["median"], "now": None, "floor": floor,
                            "problem": "not measured in this run"})
            elif now["median"] < floor:
                out.append({"ratio": f"{name}/{figure}", "saved": was["median"], "now": now["median"],
                            "floor": floor, "problem": f"below {fail_below:g} x saved"})
    return out


def num(x: float) -> str:
    """Readable without scientific notation: 12,345 / 123.4 / 1.23 / 0.0123."""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _fmt(s: dict | None, unit: str = "", scale: float = 1.0) -> tuple[str, str]:
    if not s:
        return "-", ""
    return f"{num(s['median'] * scale)}{unit}", f"{num(s['min'] * scale)}-{num(s['max'] * scale)}"


def table_rows(rep: dict) -> list[tuple[str, str, str, str]]:
    """(figure, median, min-max over rounds, ratios to baselines) for the final table."""
    def ratio_text(figure: str) -> str:
        parts = []
        for name, figs in rep["ratios"].items():
            r = figs.get(figure)
            if r:
                parts.append(f"{r['median']:.3g}x {name}")
        return ", ".join(parts)

    rows = []
    labels = {"samples_per_s": "samples/s", "frames_per_s": "frames/s", "mb_per_s": "MB/s",
              "batches_per_s": "batches/s"}
    for f, label in labels.items():
        rows.append((label, *_fmt(rep["throughput"][f]), ratio_text(f)))
    for k, label in (("first_batch_s", "time to first batch"), ("resume_s", "resume to first batch")):
        rows.append((label, *_fmt(rep["latency"][k], " s"), ""))
    tr = rep["training"]
    if "skipped" not in tr:
        w = tr["data_wait_ms"]
        rows.append((f"data wait per {tr['step']['ms']:g} ms step", f"p50 {num(w['p50'])} ms",
                     f"p95 {num(w['p95'])}, max {num(w['max'])} ms", ""))
        rows.append(("accelerator waiting", *_fmt(tr["wait_fraction"], "%", 100), "fed" if tr["fed"] else "starved"))
        rows.append(("GPU idle", *_fmt(tr["gpu_idle_fraction"], "%", 100),
                     "" if tr["gpu_idle_fraction"] else "n/a on CPU"))
    h = rep["h2d"]
    rows.append(("H2D pinned / pageable",
                 f"{h['pinned_gb_per_s']:.3g} / {h['pageable_gb_per_s']:.3g} GB/s" if h["pinned_gb_per_s"] else "-",
                 "", "" if h["pinned_gb_per_s"] else "n/a on CPU"))
    if rep["ranks"]:
        rk = rep["ranks"]
        rows.append((f"rank skew (slowest/fastest of {rk['world_size']})", f"{rk['skew']:.2f}" if rk["skew"] else "-",
                     "", "stragglers: " + (", ".join(rk["stragglers"]) or "none")))
    for name, b in rep["baselines"].items():
        if "skipped" in b:
            rows.append((f"baseline {name}", "skipped", "", b["skipped"]))
        else:
            rows.append((f"baseline {name} samples/s", *_fmt(b["samples_per_s"]), ""))
    return rows
