"""Collation into preallocated arrays: with an uninitialised frames array (reused memory), every byte of
it is either a sample's frame or zero padding, packed or not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.loader.collate import collate


def poisoned(shape, dtype):
    """Memory as a reused buffer hands it out: full of an earlier batch's bytes."""
    return np.full(shape, 0xAB, dtype)


def sample(rng: np.random.Generator, n: int) -> dict:
    return {"frames": rng.integers(1, 256, (n, 4, 6, 3), dtype=np.uint8), "timestamps": np.arange(n) / 30.0,
            "actions": rng.random((n, 2), dtype=np.float32), "telemetry": rng.random((n, 1), dtype=np.float32)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3), min_size=1, max_size=4),
       st.sampled_from([None, 8, 20]), st.integers(0, 2**32 - 1))
def test_frames_in_reused_memory_are_the_samples_then_zeros(lengths, pack, seed):
    rng = np.random.default_rng(seed)
    items = [[sample(rng, n) for n in (item if pack else item[:1])] for item in lengths]
    maps = [[(None, None)] * len(item) for item in items]
    want, _ = collate(items, maps, (2, 1), pack)  # np.zeros throughout: the reference
    got, _ = collate(items, maps, (2, 1), pack, np.zeros, poisoned)
    assert got["frames"].shape == want["frames"].shape
    assert np.array_equal(got["frames"], want["frames"])
    for b, item in enumerate(items):  # and the reference is the samples' frames, then zeros
        real = np.concatenate([s["frames"] for s in item])[: got["frames"].shape[1]]
        assert np.array_equal(got["frames"][b, :len(real)], real)
        assert not got["frames"][b, len(real):].any()
