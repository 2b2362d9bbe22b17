"""From ``torch.profiler`` events to the parts of each step (``dsbuild.bench.train.decompose``).

The step loop marks its own ranges with ``record_function``: ``dsbuild.step`` (the window),
``dsbuild.data_wait`` (the loader's ``next``), ``dsbuild.h2d`` (the copy to the device) and
``dsbuild.injected_delay`` (``--inject-delay``'s sleep, a slow device: counted as compute). Everything else
is named by torch: ``aten::`` operators on the step's thread and kernels on the device are compute; a
collective is any event named as one by gloo, NCCL, c10d or FSDP, on whatever thread it ran.
"""

from __future__ import annotations

import re

from dsbuild.bench.train.decompose import Interval, Parts, split_step

STEP, DATA, H2D, INJECTED = "dsbuild.step", "dsbuild.data_wait", "dsbuild.h2d", "dsbuild.injected_delay"
COMM = re.compile(
    r"^(gloo:|c10d::|nccl|record_param_comms)|^FSDP::(all_gather(?!_copy)|.*_wait|post_backward_reduce)", re.I
)


def is_comm(name: str) -> bool:
    return bool(COMM.search(name))


def step_parts(events) -> list[Parts]:
    """The parts of each ``dsbuild.step`` window among ``events`` (``prof.events()``), in step order."""
    steps = sorted((e for e in events if e.name == STEP), key=lambda e: e.time_range.start)
    if not steps:
        return []
    main = steps[0].thread
    spans: dict[str, list[Interval]] = {"data": [], "h2d": [], "compute": [], "comm": []}
    for e in events:
        span = (e.time_range.start / 1e6, e.time_range.end / 1e6)
        on_device = str(getattr(e, "device_type", "")).endswith("CPU") is False
        if e.name == DATA:
            spans["data"].append(span)
        elif e.name == H2D:
            spans["h2d"].append(span)
        elif is_comm(e.name):
            spans["comm"].append(span)
        elif e.name == INJECTED or (on_device or (e.thread == main and e.name.startswith("aten::"))):
            spans["compute"].append(span)
    return [
        split_step(
            (s.time_range.start / 1e6, s.time_range.end / 1e6),
            spans["data"],
            spans["h2d"],
            spans["compute"],
            spans["comm"],
        )
        for s in steps
    ]
