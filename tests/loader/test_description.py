"""A loader described in JSON for worker processes: every option round-trips, the map function crosses by
its import path, and a function without one is refused in one line."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from dsbuild.core.errors import UsageError
from dsbuild.loader import Loader, Mixture
from dsbuild.loader.description import (
    WorkerSpec,
    describe,
    import_path,
    options_from_json,
    options_to_json,
    rebuild,
    resolve,
)
from dsbuild.loader.options import LoaderOptions
from dsbuild.loader.parallel import Parallel


def noisy(sample: dict, rng) -> dict:
    return sample


class Maps:
    @staticmethod
    def inner(sample: dict, rng) -> dict:
        return sample


def test_every_option_round_trips_through_json():
    o = LoaderOptions(
        seed=7,
        batch_size=3,
        shuffle="blocks",
        pack_frames=40,
        clip_frames=4,
        rank=1,
        world_size=4,
        parallel=Parallel(tp=2),
        worker_mode="process",
        num_workers=3,
        shm_bytes=1 << 30,
        resize=(24, 32),
        device="cpu",
        verify=False,
        text=True,
        map=noisy,
    )
    doc = options_to_json(o)
    assert doc["map"] == "tests.loader.test_description:noisy" and doc["resize"] == [24, 32]
    assert doc["parallel"] == dataclasses.asdict(Parallel(tp=2))
    assert options_from_json(doc) == o
    assert len(doc) == len(dataclasses.fields(LoaderOptions))  # (a new field is covered or this fails)


def test_a_spec_reads_back_from_its_text_and_rebuilds_the_loader(cat):
    ref, _ = cat
    loader = Mixture([(ref, None, 0.3), (ref, None, 0.7)], decode="bytes", batch_size=2, map=Maps.inner)
    spec = describe(loader, worker=2, prefix="dsb1x2", slots=5, budget=None)
    assert WorkerSpec.read(spec.text()) == spec
    again = rebuild(spec)
    assert type(again) is Mixture and again.options == loader.options
    assert again.weights.tolist() == loader.weights.tolist() and again._specs == loader._specs
    assert type(rebuild(describe(Loader(ref)))) is Loader


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda s, rng: s, "a lambda or a nested function"),
        (functools.partial(noisy), "a partial has no module and name"),
        (type("M", (), {"__call__": noisy})(), "a M has no module and name"),
    ],
)
def test_a_function_without_an_import_path_is_refused_in_one_line(fn, why):
    with pytest.raises(UsageError, match=f"'package.module:function'\\): {why}") as e:
        import_path(fn)
    assert "\n" not in str(e.value) and "worker_mode='thread'" in e.value.hint


def test_a_function_of_main_is_refused():
    def f(sample, rng):
        return sample

    f.__module__, f.__qualname__ = "__main__", "f"
    with pytest.raises(UsageError, match="defined in __main__"):
        import_path(f)


def test_resolve_names_what_it_cannot_import():
    assert resolve("tests.loader.test_description:Maps.inner") is Maps.inner
    with pytest.raises(UsageError, match="'no_such_module_x:f' cannot be imported"):
        resolve("no_such_module_x:f")
    with pytest.raises(UsageError, match="names a int, not a function"):
        resolve("dsbuild.loader.description:MAX_SPEC_BYTES")
