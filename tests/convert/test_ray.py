"""The Ray executor (a local Ray with 2 CPUs, started by convert itself) gives the same bytes as local
processes, and quarantines a deterministically broken capture exactly as local mode does."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.executor import ExecutorSpec
from dsbuild.samples.synthetic import generate
from tests.helpers import tree_bytes


def test_ray_and_local_executors_write_identical_catalogs(tmp_path):
    generate(tmp_path / "cap", sessions=4, seconds=3, seed=21, damage={2: "not_video"})
    config = ConvertConfig(clip_seconds=1.0, shard_size=200_000)
    local = convert(tmp_path / "cap", tmp_path / "local", config, executor=ExecutorSpec("local", workers=2))
    ray = convert(tmp_path / "cap", tmp_path / "ray", config, executor=ExecutorSpec("ray", workers=2))
    assert ray.version_id == local.version_id
    assert ray.quarantined == local.quarantined and len(ray.quarantined) == 1
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
