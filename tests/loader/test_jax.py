"""``as_jax_iterator``: global jax.Arrays with the given NamedSharding, on 4 host CPU devices in one
process and on two processes on localhost (``jax.distributed``), with exact resume. Each case runs in
a fresh interpreter, since XLA's device count is fixed at import."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dsbuild.loader import Loader

pytest.importorskip("jax", reason="the jax extra is not installed (pip install 'dsbuild[jax]')")

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    ref, procs, pid, port, take, state_in = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \\
        int(sys.argv[5]), sys.argv[6]
    if procs > 1:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=procs, process_id=pid,
                                   initialization_timeout=120)
    from dsbuild.loader import Loader
    loader = Loader(ref, batch_size=4, seed=3, resize=(8, 8), rank=pid, world_size=procs)
    if state_in != "-":
        loader.load_state_dict(json.loads(state_in))
    sharding = NamedSharding(jax.make_mesh((len(jax.devices()),), ("data",)), P("data"))
    out = []
    for i, b in enumerate(loader.as_jax_iterator(sharding)):
        assert b["frames"].sharding == sharding and b["timestamps"].shape[0] == 4 * procs
        rows = {k: multihost_utils.process_allgather(b[k], tiled=True).tolist() for k in ("timestamps", "valid")}
        frames = float(jax.jit(lambda x: x.astype("float32").sum())(b["frames"]))
        out.append({"rows": rows, "frames": frames, "keys": b["keys"], "state": b["state"]})
        if len(out) == take:
            break
    print(json.dumps(out))
    if procs > 1:
        jax.distributed.shutdown()
""")


def launch(ref, procs, devices, take, state="-"):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, ref, str(procs), str(i), str(number), str(take), state],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(procs)
    ]
    outs = []
    for p in ps:
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def expected_rows(ref, procs, take):
    """The global batches the numpy loaders of every rank give, padded like the JAX iterator does."""
    longest = max(Loader(ref, decode="bytes").open().plans[0].lengths)
    per_rank = []
    for rank in range(procs):
        rows = []
        for b in Loader(ref, batch_size=4, seed=3, resize=(8, 8), rank=rank, world_size=procs):
            ts = np.zeros((4, longest))
            ts[: len(b["timestamps"]), : b["timestamps"].shape[1]] = b["timestamps"]
            rows.append(ts)
            if len(rows) == take:
                break
        per_rank.append(rows + [np.zeros((4, longest))] * (take - len(rows)))  # a rank past the end: padding
    # JAX without jax_enable_x64 holds float64 timestamps as float32
    return [np.concatenate([per_rank[r][i] for r in range(procs)]).astype(np.float32) for i in range(take)]


def test_one_process_builds_global_arrays_sharded_over_four_devices(cat):
    ref, _ = cat
    (out,) = launch(ref, 1, 4, 2)
    for got, want in zip(out, expected_rows(ref, 1, 2)):
        assert np.array_equal(np.array(got["rows"]["timestamps"], np.float32), want)
        assert sum(got["rows"]["valid"]) == len(got["keys"])


def test_two_processes_build_one_global_batch_and_resume_exactly(cat):
    """25 samples, 2 x 4 per global step: the 4th step has one sample, so rank 1 pads (it still takes part)."""
    ref, _ = cat
    first = launch(ref, 2, 2, 4)
    for i, want in enumerate(expected_rows(ref, 2, 4)):
        assert first[0][i]["rows"] == first[1][i]["rows"]  # both hosts see the same global array
        assert np.array_equal(np.array(first[0][i]["rows"]["timestamps"], np.float32), want)
        assert first[0][i]["frames"] == first[1][i]["frames"]
    assert first[0][1]["state"] == first[1][1]["state"]  # the same checkpoint on every process
    resumed = launch(ref, 2, 2, 2, json.dumps(first[0][1]["state"]))
    for k in range(2):
        assert [r["rows"] for r in resumed[k]] == [r["rows"] for r in first[k][2:4]]
        assert [r["keys"] for r in resumed[k]] == [r["keys"] for r in first[k][2:4]]


def test_nvdec_frames_are_refused_before_the_loader_opens(cat):
    """NVDEC batches hold frames in torch's CUDA memory, not numpy: one line, even where no GPU is."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from dsbuild.core.errors import UsageError

    ref, _ = cat
    sharding = NamedSharding(jax.make_mesh((1,), ("data",), devices=jax.devices()[:1]), P("data"))
    with pytest.raises(UsageError, match="decode_backend='nvdec' keeps frames in torch's CUDA memory"):
        next(iter(Loader(ref, resize=(8, 8), decode_backend="nvdec").as_jax_iterator(sharding)))
