"""The restart measurement's checkpoint: the loader's state as JSON, the model's and the optimizer's as
``.npz`` arrays (numpy, ``allow_pickle=False``: nothing is unpickled), written after every step.

A step's checkpoint is a folder ``step-N`` made whole under a temporary name and then renamed, so a rank
killed mid-write leaves the previous one intact; ``latest`` is the highest whole ``step-N``. Full (not
sharded) state dicts through ``torch.distributed.checkpoint.state_dict``: every rank takes part in
gathering them (FSDP shards them), rank 0 writes, and on restore every rank reads the same files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from dsbuild.core.errors import FormatError
from dsbuild.core.jsonio import loads_bounded

MAX_STATE = 1 << 20  # the loader's state is a few hundred bytes


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def save(model, opt, loader, actions: int, folder: str, step: int, write: bool) -> None:
    import numpy as np
    from torch.distributed.checkpoint.state_dict import get_state_dict

    got: Any = get_state_dict(model, opt, options=_options())
    model_sd, optim_sd = got
    if not write:
        return
    tmp = Path(folder) / f".step-{step}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{k}": v.float().numpy() for k, v in model_sd.items()}
    for name, slots in optim_sd["state"].items():
        for slot, v in slots.items():
            arrays[f"optim/{name}/{slot}"] = v.float().numpy()
    np.savez(tmp / "state.npz", **arrays)
    groups = [dict(g) for g in optim_sd["param_groups"]]
    doc = {"loader": loader.state_dict(), "actions": actions, "step": step, "param_groups": groups}
    (tmp / "meta.json").write_text(json.dumps(doc, default=float))
    os.replace(tmp, Path(folder) / f"step-{step}")


def latest(folder: str) -> Path:
    steps = sorted((int(p.name[5:]), p) for p in Path(folder).glob("step-*") if p.name[5:].isdigit() and p.is_dir())
    if not steps:
        raise FormatError(f"{folder}: no whole checkpoint to restart from")
    return steps[-1][1]


def read_loader(folder: str) -> dict:
    path = latest(folder) / "meta.json"
    doc = loads_bounded(path.read_bytes()[: MAX_STATE + 1], max_bytes=MAX_STATE, what=str(path))
    if not isinstance(doc, dict) or "loader" not in doc or not isinstance(doc.get("actions"), int):
        raise FormatError(f"{path}: not a bench checkpoint")
    return doc


def restore(model, opt, folder: str) -> None:
    import numpy as np
    import torch
    from torch.distributed.checkpoint.state_dict import set_state_dict

    where = latest(folder)
    meta = read_loader(folder)
    with np.load(where / "state.npz", allow_pickle=False) as z:
        model_sd: Any = {k[6:]: torch.from_numpy(z[k]) for k in z.files if k.startswith("model/")}
        state: Any = {}
        for k in z.files:
            if k.startswith("optim/"):
                name, _, slot = k[6:].rpartition("/")
                state.setdefault(name, {})[slot] = torch.from_numpy(z[k])
    set_state_dict(
        model,
        opt,
        model_state_dict=model_sd,
        optim_state_dict={"state": state, "param_groups": meta["param_groups"]},
        options=_options(),
    )


def clear(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
