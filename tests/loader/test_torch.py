"""The torch DataLoader adapter: the same stream for any number of process workers, checkpoints from
batches, payloads handed over in shared memory, and a killed worker that costs nothing on resume."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from dsbuild.loader import Loader
from tests.loader.conftest import run

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_gives_the_same_stream_and_checkpoints(cat, workers):
    ref, _ = cat
    expected, _ = run(ref)
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=workers)
    got, state = [], None
    for i, b in enumerate(dl):
        got.append(b["keys"])
        if i == 2:
            state = loader.state_after(b)
    assert got == expected
    rest, _ = run(ref, state=state)
    assert expected[:3] + rest == expected


def _passes(dl, count: int, stop_after: int | None = None) -> list[list]:
    """The keys of ``count`` passes over ``dl``; the first one broken off after ``stop_after`` batches."""
    out = []
    for n in range(count):
        keys = []
        for i, b in enumerate(dl):
            keys.append(b["keys"])
            if n == 0 and stop_after is not None and i + 1 == stop_after:
                break
        out.append(keys)
    return out


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_each_pass_over_a_dataloader_is_the_next_epoch(cat, workers, persistent):
    """Every pass used to start where the loader stood when the DataLoader was made: each epoch the first
    one again, and no checkpoint ever past epoch 0."""
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    epochs = [[b["keys"] for b in loader] for _ in range(3)]
    assert epochs[0] != epochs[1]
    again = Loader(ref, decode="bytes", batch_size=3, seed=5)
    dl = torch.utils.data.DataLoader(
        again.as_torch_dataset(), batch_size=None, num_workers=workers, persistent_workers=persistent
    )
    assert _passes(dl, 3) == epochs
    *_, last = dl
    assert again.state_after(last)["cursors"][0]["epoch"] == 3


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_broken_off_is_resumed_in_process_and_taken_again_with_workers(cat, workers):
    """Without workers the loader moves with every batch handed out (as ``for b in loader``); with them,
    the main process never learns which prefetched batches were used, so the pass is delivered again."""
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    epochs = [[b["keys"] for b in loader] for _ in range(2)]
    dl = torch.utils.data.DataLoader(
        Loader(ref, decode="bytes", batch_size=3, seed=5).as_torch_dataset(), batch_size=None, num_workers=workers
    )
    first, second, third = _passes(dl, 3, stop_after=2)
    assert first == epochs[0][:2]
    assert second == (epochs[0][2:] if workers == 0 else epochs[0])
    assert third == epochs[1]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_restore_in_the_main_process_is_where_the_next_pass_starts(cat, persistent):
    """Persistent workers keep their copy of the loader, which the restore did not move: the restore was
    dropped (a roll-back gave the next epoch; the documented recipe for a broken-off pass delivered its
    first batches twice)."""
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    stream = [b["keys"] for b in loader] + [b["keys"] for b in loader]
    there = Loader(ref, decode="bytes", batch_size=3, seed=5)
    dl = torch.utils.data.DataLoader(
        there.as_torch_dataset(), batch_size=None, num_workers=2, persistent_workers=persistent
    )
    states = [there.state_after(b) for b in dl]
    there.load_state_dict(states[1])  # roll back to after the second batch of epoch 0
    assert [b["keys"] for b in dl] == stream[2 : len(states)]
    got = []
    for b in dl:  # break a pass off after two batches, restore the last state_after (the README's recipe)
        got.append(b["keys"])
        if len(got) == 2:
            break
    there.load_state_dict(there.state_after(b))
    assert got + [b["keys"] for b in dl] == stream[len(states) :]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_restore_to_where_the_last_pass_started_is_not_taken_for_an_unmoved_loader(cat, persistent):
    """A roll-back to the start after a whole pass, or a retry restoring the same checkpoint twice, gave
    the next epoch: the workers saw the loader at the position the last pass had started from and took
    it for one that had not moved."""
    ref, _ = cat
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    epoch0, epoch1 = [b["keys"] for b in loader], [b["keys"] for b in loader]
    there = Loader(ref, decode="bytes", batch_size=3, seed=5)
    start = there.state_dict()
    dl = torch.utils.data.DataLoader(
        there.as_torch_dataset(), batch_size=None, num_workers=2, persistent_workers=persistent
    )
    assert [b["keys"] for b in dl] == epoch0
    there.load_state_dict(start)
    assert [b["keys"] for b in dl] == epoch0
    states = []
    for b in dl:
        states.append(there.state_after(b))
        if len(states) == 2:
            break
    for _ in range(2):  # the same checkpoint restored twice: the rest of epoch 1 both times
        there.load_state_dict(states[1])
        assert [b["keys"] for b in dl] == epoch1[2:]


def worker_block(t: torch.Tensor) -> tuple[int, int] | None:
    """The address range of the worker's shared block (a memfd the main process mapped) that ``t``'s
    memory lies in; None for memory of this process's own (a pickled copy)."""
    at = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            span, *rest = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= at < hi:
                return (lo, hi) if len(rest) == 5 and "memfd:dsbuild-batch" in rest[4] else None
    return None


def test_process_workers_hand_payloads_over_in_shared_memory(cat):
    ref, _ = cat
    direct = list(Loader(ref, decode="bytes", batch_size=3, seed=5))
    loader = Loader(ref, decode="bytes", batch_size=3, seed=5)
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=2)
    for mine, b in zip(direct, dl):
        tensors = {k: v for k, v in b.items() if isinstance(v, torch.Tensor)}
        assert {"actions", "telemetry", "timestamps", "lengths", "video_data", "video_offsets"} <= set(tensors)
        blocks = {k: worker_block(t) for k, t in tensors.items()}
        assert all(blocks.values()), blocks  # a worker's block crossed as a handle, not a pickled copy
        # the small arrays are views of one shared block (one handle for all of them, not one per array);
        # the clips are a block of their own, so keeping a small tensor does not keep the clips alive
        small = {blocks[k] for k in tensors if k != "video_data"}
        assert len(small) == 1 and blocks["video_data"] not in small
        clips = [bytes(b["video_data"][a:z].numpy()) for a, z in zip(b["video_offsets"][:-1], b["video_offsets"][1:])]
        assert clips == [bytes(v) for v in mine["video"]]
        for k, v in mine.items():
            if isinstance(v, np.ndarray):
                assert tensors[k].dtype == torch.from_numpy(v).dtype and np.array_equal(tensors[k].numpy(), v), k


def test_frames_cross_in_shared_memory_too(cat):
    ref, _ = cat
    loader = Loader(ref, batch_size=2, seed=1, resize=(8, 8))
    b = next(iter(torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=1)))
    assert worker_block(b["frames"]) and b["frames"].dtype == torch.uint8 and b["frames"].shape[2:] == (8, 8, 3)


def test_a_kept_small_tensor_does_not_keep_the_frames_alive(cat):
    """A training loop that keeps ``lengths`` (or ``actions``) for its metrics holds only the batch's
    small block: frames of BIG bytes or more cross in a block of the worker's ring."""
    from dsbuild.loader.torch import BIG

    ref, _ = cat
    loader = Loader(ref, batch_size=2, seed=1, resize=(240, 320))
    b = next(iter(torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=1)))
    assert b["frames"].nbytes >= BIG
    small = worker_block(b["lengths"])
    assert small and worker_block(b["frames"]) != small and worker_block(b["actions"]) == small
    assert small[1] - small[0] < BIG


def test_a_killed_worker_is_a_clear_error_and_resume_is_exact(wds_catalog):
    ref = str(wds_catalog[0])
    expected = [b["keys"] for b in Loader(ref, decode="bytes", batch_size=1, seed=4)]
    loader = Loader(ref, decode="bytes", batch_size=1, seed=4)
    # No ``timeout``: without one the DataLoader looks at its workers every 5 s while it waits (with one, it
    # waits the whole timeout before it looks), so the death is reported within seconds.
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=2)
    got, state = [], loader.state_dict()
    stream = iter(dl)
    with pytest.raises(RuntimeError, match="(?i)worker"):
        for i, b in enumerate(stream):
            got.append(b["keys"])
            state = loader.state_after(b)
            if i == 2:
                os.kill(stream._workers[0].pid, signal.SIGKILL)
                stream._workers[0].join()  # dead before the next batch is asked for
    resumed = Loader(ref, decode="bytes", batch_size=1, seed=4)
    resumed.load_state_dict(state)
    assert got + [b["keys"] for b in resumed] == expected


def test_packed_frames_cross_whole_with_their_segments(cat):
    """Packed batches (frames, segment ids, per-item cu_seqlens) from a process worker equal the
    loader's own, field by field."""
    ref, _ = cat
    opts = dict(batch_size=2, seed=1, resize=(8, 8), pack_frames=200)
    direct = list(Loader(ref, **opts))
    dl = torch.utils.data.DataLoader(Loader(ref, **opts).as_torch_dataset(), batch_size=None, num_workers=1)
    got = list(dl)
    assert len(got) == len(direct)
    for mine, b in zip(direct, got):
        assert b["cu_seqlens"] == [x.tolist() for x in mine["cu_seqlens"]] and b["keys"] == mine["keys"]
        for k, v in mine.items():
            if isinstance(v, np.ndarray):
                assert worker_block(b[k]) and np.array_equal(b[k].numpy(), v), k


def test_nvdec_in_dataloader_worker_processes_is_refused_in_one_line(cat):
    """NVDEC frames are CUDA tensors: a worker process can neither start CUDA after a fork nor hand them
    over. The refusal comes before the device is looked for, so it is the same on any machine."""
    ref, _ = cat
    loader = Loader(ref, batch_size=2, resize=(8, 8), decode_backend="nvdec")
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=1)
    with pytest.raises(Exception, match="decode_backend='nvdec' in DataLoader worker processes"):
        next(iter(dl))
