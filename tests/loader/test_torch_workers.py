"""torch DataLoader workers and torchdata's StatefulDataLoader over ``as_torch_dataset()``: the batches
of the loader's own process mode, and an exact resume that reads no skipped batch again."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from dsbuild.core.errors import UsageError
from dsbuild.loader import Loader

torch = pytest.importorskip("torch")

KW = {"decode": "bytes", "batch_size": 3, "seed": 5}


def as_numpy(batch: dict) -> dict:
    """A batch of either path in one form: arrays as numpy, clips as bytes, no checkpoint."""
    out = {}
    for k, v in batch.items():
        if k in ("state", "video_offsets", "video_data"):
            continue
        out[k] = v.numpy().copy() if isinstance(v, torch.Tensor) else v
    if "video_data" in batch:
        data, offsets = batch["video_data"].numpy(), batch["video_offsets"].tolist()
        out["video"] = [data[a:b].tobytes() for a, b in zip(offsets, offsets[1:])]
    elif "video" in batch:
        out["video"] = [bytes(v) for v in batch["video"]]
    out.pop("container", None)
    return out


def same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k, x in a.items():
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, b[k]) and x.dtype == b[k].dtype, k
        else:
            assert x == b[k], k


def test_dataloader_workers_deliver_the_batches_of_process_mode(cat):
    ref, _ = cat
    with Loader(ref, worker_mode="process", num_workers=2, **KW) as procs:
        expected = [as_numpy(b) for b in procs]
    loader = Loader(ref, **KW)
    dl = torch.utils.data.DataLoader(loader.as_torch_dataset(), batch_size=None, num_workers=2)
    got = [as_numpy(b) for b in dl]
    assert len(got) == len(expected) > 3
    for a, b in zip(expected, got):
        same(a, b)


def with_decoding_threads(batch):
    """(``collate_fn``: run in the DataLoader worker) the batch, and its worker's FFmpeg decoding threads."""
    loader = torch.utils.data.get_worker_info().dataset.loader
    return {"batch": batch, "threads": loader._io()[1].threads}


def test_dataloader_workers_share_the_cores_out_among_their_decoders(cat, monkeypatch):
    """As the loader's own worker processes do (``probe.decoder_threads``); a lone worker keeps FFmpeg's."""
    from dsbuild.formats.probe import decoder_threads

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    ds = Loader(cat[0], decode="frames", resize=(16, 16), batch_size=3).as_torch_dataset()
    for n in (1, 2):
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=n, collate_fn=with_decoding_threads)
        assert {item["threads"] for item in dl} == {decoder_threads(n)}
    assert decoder_threads(1) == 0


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly_without_fast_forward(cat, workers, caplog):
    """The resumed epoch goes on from the checkpoint, and the epoch after it is the uninterrupted run's
    second epoch (the resumed workers record where their pass ends, as a pass begun afresh does)."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    ref, _ = cat
    dl = sdl.StatefulDataLoader(Loader(ref, **KW).as_torch_dataset(), batch_size=None, num_workers=workers)
    it = iter(dl)
    head = [next(it)["keys"] for _ in range(3)]
    state = json.loads(json.dumps(dl.state_dict()))  # (as a checkpoint file holds it)
    rest = [b["keys"] for b in it]
    second = [b["keys"] for b in dl]
    own = Loader(ref, **KW)
    assert head + rest == [b["keys"] for b in own]
    assert second == [b["keys"] for b in own] != head + rest

    again = sdl.StatefulDataLoader(Loader(ref, **KW).as_torch_dataset(), batch_size=None, num_workers=workers)
    again.load_state_dict(state)
    with caplog.at_level(logging.WARNING):
        resumed = [b["keys"] for b in again]
    assert resumed == rest
    assert [b["keys"] for b in again] == second
    assert "fast-forwarding" not in caplog.text
    assert len(json.dumps(state)) < 2000 + 1500 * workers  # the loader's part: a few hundred bytes a worker


def test_an_iterator_checkpoint_refuses_another_worker_count(cat):
    ref, _ = cat
    ds = Loader(ref, **KW).as_torch_dataset()
    it = iter(ds)
    next(it)
    state = it.state_dict()
    assert state["workers"] == 1
    with pytest.raises(UsageError, match="saved with 3 DataLoader worker"):
        iter(ds).load_state_dict({**state, "workers": 3, "worker": 0})


def test_an_iterator_restored_in_process_goes_on_from_its_checkpoint(cat):
    ref, _ = cat
    full = [b["keys"] for b in Loader(ref, **KW)]
    it = iter(Loader(ref, **KW).as_torch_dataset())
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(it.state_dict()))
    other = iter(Loader(ref, **KW).as_torch_dataset())
    other.load_state_dict(state)
    assert [b["keys"] for b in other] == full[2:]


def arrive(batch: dict) -> dict:
    """A batch as the main process receives it from a worker: through the pickler of torch's queue."""
    from multiprocessing.reduction import ForkingPickler

    return ForkingPickler.loads(ForkingPickler.dumps(batch))


def test_a_kept_batch_never_changes_and_a_dropped_ones_block_is_reused(cat):
    """The worker's ring writes a block again only once no batch made from it is left: a kept batch keeps
    its block (the next batch gets another), a dropped one frees it (its tensors' lease of the block goes,
    in this process as in any other)."""
    from dsbuild.loader.torch import PAGE, Ring, shared_batch

    ref, _ = cat
    loader = Loader(ref, **KW)
    ring, small = Ring(), Ring(PAGE)
    steps = [s for s, _ in loader.steps() if s is not None]
    first = arrive(shared_batch(loader.build(steps[0]), ring, small))
    kept = first["video_data"].clone()
    second = arrive(shared_batch(loader.build(steps[1]), ring, small))
    assert ring.made == 2 and torch.equal(first["video_data"], kept)
    del first, second
    made = []
    for _ in range(2):  # (a later batch's small arrays may need a larger block: the second pass needs none)
        for step in steps[2:]:
            arrive(shared_batch(loader.build(step), ring, small))
        made.append(small.made)
    assert ring.made == 2 and made[0] == made[1] < len(steps)


def test_a_batch_on_its_way_keeps_its_block_even_past_a_full_ring(cat):
    """Until the main process has opened a batch's block (the pickled batch may wait in the queue), no
    other open of it exists: the block's pending byte keeps the ring from writing it again or giving it
    up, however many batches follow. Each arrives as it was built."""
    from dsbuild.loader.torch import PAGE, SLOTS, Ring, shared_batch

    ref, _ = cat
    loader = Loader(ref, **{**KW, "batch_size": 1})
    ring, small = Ring(), Ring(PAGE)
    steps = [s for s, _ in loader.steps() if s is not None][: SLOTS + 2]
    assert len(steps) == SLOTS + 2
    sent = [shared_batch(loader.build(step), ring, small) for step in steps]
    assert ring.made == small.made == SLOTS + 2
    for step, batch in zip(steps, sent):
        same(as_numpy(arrive(batch)), as_numpy(loader.build(step)))


def test_a_block_written_again_before_its_batch_arrived_is_an_error_not_other_data(cat):
    """The main process checks each block's token before it maps it: a block whose batch was overwritten
    in flight (never by design) is refused in one line, never delivered as another batch's data."""
    from dsbuild.loader.torch import PAGE, Ring, shared_batch

    ref, _ = cat
    loader = Loader(ref, **KW)
    ring = Ring()
    step = next(s for s, _ in loader.steps() if s is not None)
    sent = shared_batch(loader.build(step), ring, Ring(PAGE))
    ring.blocks[0].raw[:8] ^= 0xFF  # another token where the batch's was
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\): a batch's block was written again"):
        arrive(sent)


def test_a_forkserver_worker_which_is_not_our_child_hands_its_batches_over_too(cat):
    """A worker started by ``forkserver`` is a child of the fork server, not of the main process, which
    still opens the worker's blocks through /proc (same user): the batches are the loader's own."""
    ref, _ = cat
    expected = [as_numpy(b) for b in Loader(ref, **KW)]
    dl = torch.utils.data.DataLoader(
        Loader(ref, **KW).as_torch_dataset(), batch_size=None, num_workers=2, multiprocessing_context="forkserver"
    )
    got = [as_numpy(b) for b in dl]
    assert len(got) == len(expected) > 3
    for a, b in zip(expected, got):
        same(a, b)


def test_a_dataset_crosses_to_a_spawned_worker_as_plain_data(cat):
    """What torch pickles for a worker started by spawn or forkserver: strings and ints, from which the
    dataset is rebuilt where it stands (its loader's checkpoint)."""
    from dsbuild.loader.torch import TorchDataset

    ref, _ = cat
    loader = Loader(ref, **KW)
    full = [b["keys"] for b in Loader(ref, **KW)]
    stream = iter(loader)
    next(stream)
    state = loader.as_torch_dataset().__getstate__()
    assert all(type(v) in (str, int) for v in state.values()), state
    copy = TorchDataset.__new__(TorchDataset)
    copy.__setstate__(state)
    assert copy.loader.options == loader.options and copy.loader.state_dict() == loader.state_dict()
    assert [b["keys"] for b in copy] == full[1:]


def test_the_main_process_maps_each_block_once_and_forgets_gone_workers_blocks(cat):
    """A worker's block is mapped here on its first batch and kept for the next ones (a map and an unmap
    each batch cost as much as the rest of the hand-over); the blocks of workers that are gone (a
    DataLoader without persistent workers starts new ones every pass) are forgotten as new ones come."""
    from dsbuild.loader import torch as ours

    ref, _ = cat
    ours._MAPPED.clear()
    kept = torch.utils.data.DataLoader(
        Loader(ref, **KW).as_torch_dataset(), batch_size=None, num_workers=2, persistent_workers=True
    )
    batches = sum(1 for _ in range(4) for _ in kept)
    assert 2 <= len(ours._MAPPED) <= 2 * 2 * ours.SLOTS < batches  # (two rings a worker)
    del kept
    fresh = torch.utils.data.DataLoader(Loader(ref, **KW).as_torch_dataset(), batch_size=None, num_workers=2)
    for _ in range(3):
        assert sum(1 for _ in fresh) > 0
        assert len({pid for pid, _ in ours._MAPPED}) <= 2  # this pass's workers only


def test_a_batchs_checkpoint_is_the_one_the_loader_gives_at_that_position(cat):
    """Each batch a worker yields carries ``state_at`` its position, made from a kept copy of the fields
    that do not move: it is exactly ``state_dict()`` there, and a fresh dict every time."""
    ref, _ = cat
    loader = Loader(ref, **{**KW, "shuffle": "blocks"})
    other = Loader(ref, **{**KW, "shuffle": "blocks"})
    other.open()
    for _, after in [s for s in loader.steps() if s[0] is not None]:
        other.position = after
        state = loader.state_at(after)
        assert state == other.state_dict() and json.dumps(state) == json.dumps(other.state_dict())
        state["sources"][0]["weight"] = -1.0  # a caller's change stays its own
    assert loader.state_at(after)["sources"][0]["weight"] == 1.0


def test_a_process_forked_while_a_batch_is_held_does_not_free_its_block(cat):
    """A DataLoader forks its next workers while the training loop may still hold batches: the copies a
    child inherits go when it drops them, and that must not tell the ring the block is free."""
    import gc
    import os

    from dsbuild.loader.torch import PAGE, Ring, shared_batch

    ref, _ = cat
    loader = Loader(ref, **KW)
    ring = Ring()
    step = next(s for s, _ in loader.steps() if s is not None)
    held = arrive(shared_batch(loader.build(step), ring, Ring(PAGE)))
    pid = os.fork()
    if pid == 0:  # the child: drops its copy of the batch, then leaves without the parent's exit handlers
        del held
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert not ring.blocks[0].released() and held["video_data"].numel() > 0
    del held
    assert ring.blocks[0].released()
