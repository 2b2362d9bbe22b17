"""From finished rounds to the report's figures: medians with quartiles, per-round ratios, the training
simulation's wait fractions, and the stage decomposition summed over rounds."""

from __future__ import annotations

from dsbuild.bench.compare import DESCRIPTIONS
from dsbuild.bench.harness import OursRound
from dsbuild.bench.measure import UNITS, Measured
from dsbuild.bench.report import BaselineResult, Machine, Ours, Training
from dsbuild.bench.stages import Stages, total
from dsbuild.bench.stats import paired_ratios, spread, summarise
from dsbuild.bench.step import StepInfo

FED_BELOW = 0.05  # the pipeline keeps the accelerator fed when it waits under 5% of the wall time
PACKAGE_OF = {
    "webdataset": "webdataset",
    "pyav": "av",
    "pyav-procs": "av",
    "litdata": "litdata",
    "mosaic": "mosaicml-streaming",
}
NO_GPU = "no CUDA device: the step is time.sleep, there is no GPU to be idle"


def unit(decode: str) -> str:
    return UNITS[decode][0]


def ours_figures(rounds: list[OursRound], decode: str, decoder_note: str | None) -> Ours | None:
    if not rounds:
        return None
    t = [r.throughput for r in rounds]
    frames = summarise([m.per_second("frames") for m in t])
    return Ours(
        figure=spread([m.figure(decode) for m in t], "our figure"),
        samples_per_s=spread([m.per_second("samples") for m in t], "our samples/s"),
        frames_per_s=frames,
        mb_per_s=spread([m.figure("bytes") for m in t], "our MB/s"),
        open_s=spread([r.open_s for r in rounds], "the open time"),
        first_batch_s=spread([r.first_batch_s for r in rounds], "the first batch time"),
        resume_s=spread([r.resume_s for r in rounds], "the resume time"),
        corrupt=sum(r.corrupt for r in rounds),
        decoder_note=decoder_note,
        notes=tuple(dict.fromkeys(n for r in rounds for n in r.notes)),
    )


def baseline_results(
    ours: list[OursRound], measured: dict[str, list[Measured]], skipped: dict[str, str], decode: str, machine: Machine
) -> tuple[BaselineResult, ...]:
    """Each baseline's figure and the ratio ours / it, paired round by round; skipped ones with why."""
    mine = [r.throughput.figure(decode) for r in ours]
    out = []
    for name, rounds in measured.items():
        theirs = [m.figure(decode) for m in rounds[: len(mine)]]
        out.append(
            BaselineResult(
                name,
                DESCRIPTIONS[name],
                machine.packages.get(PACKAGE_OF.get(name, "")),
                None,
                summarise(theirs),
                summarise(paired_ratios(mine, theirs)),
            )
        )
    for name, why in skipped.items():
        out.append(
            BaselineResult(name, DESCRIPTIONS[name], machine.packages.get(PACKAGE_OF.get(name, "")), why, None, None)
        )
    return tuple(out)


def training(rounds: list[OursRound], step: StepInfo) -> Training | None:
    runs = [(r, r.training) for r in rounds if r.training is not None]
    if not runs:
        return None
    fractions = spread([sum(r.step_waits_ms) / 1000 / (t.seconds * r.ranks) for r, t in runs], "the training wait")
    busy = [r.gpu_busy_s for r, _ in runs]
    idle = (
        summarise([max(0.0, 1 - b / t.seconds) for b, (_, t) in zip(busy, runs) if b is not None])
        if None not in busy
        else None
    )
    return Training(
        step=step,
        steps=sum(len(r.step_waits_ms) + 1 for r, _ in runs),
        wait_fraction=fractions,
        fed=fractions.median < FED_BELOW,
        fed_below=FED_BELOW,
        gpu_idle_fraction=idle,
        gpu_idle_reason=None if idle else NO_GPU,
    )


def stage_totals(rounds: list[OursRound]) -> dict[str, Stages]:
    out = {
        "throughput": total([r.throughput_stages for r in rounds]),
        "training": total([r.training_stages for r in rounds if r.training_stages is not None]),
    }
    return {k: v for k, v in out.items() if v is not None}


def waits(rounds: list[OursRound]) -> tuple[tuple[float, ...], str]:
    """The data waits the histogram shows: per training step, or per batch when there is no step."""
    steps = tuple(w for r in rounds for w in r.step_waits_ms)
    if steps:
        return steps, "per training step"
    return tuple(w for r in rounds for w in r.waits_ms), "per batch (no training step: the loop only waits)"


def measurements(rounds: list[OursRound], measured: dict[str, list[Measured]]) -> tuple[Measured, ...]:
    """Every measurement of the finished rounds, in the order they ran."""
    done = len(rounds)
    every = [m for r in rounds for m in (r.throughput, r.training) if m is not None]
    every += [m for ms in measured.values() for m in ms[:done]]
    return tuple(sorted(every, key=lambda m: m.start_s))
