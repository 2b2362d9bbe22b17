"""Shards planned while sessions finish (``Assembly``) are the shards planned over all samples at once,
whatever order the sessions finish in, and a build stages a few sessions' segments, not the version."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dsbuild.convert import ConvertConfig, convert
from dsbuild.convert.assemble import Assembly, SampleRef
from dsbuild.core.executor import ExecutorSpec
from dsbuild.formats import get_format
from dsbuild.formats.sample import key_prefix, sample_key
from dsbuild.formats.shards import plan_shards

FMT = get_format("webdataset")
# session ids as the capture contract allows them, with the "__" and "-" that make one session's keys
# sort between another's clips if sessions were ordered by id alone
session_ids = st.lists(st.text("ab_-0", min_size=1, max_size=6), min_size=1, max_size=12, unique=True)


def _refs(sid: str, clips: int, sizes: random.Random, tmp_path) -> list[SampleRef]:
    return [
        SampleRef(sample_key(sid, i), f"h{i}", (sizes.randint(1, 900),), tmp_path / f"{sid}.seg", 0, 1)
        for i in range(clips)
    ]


@settings(max_examples=150, deadline=None)
@given(session_ids, st.integers(0, 2**32), st.integers(200, 5000), st.integers(0, 4))
def test_the_shards_do_not_depend_on_the_order_sessions_finish_in(tmp_path_factory, ids, seed, target, reused):
    rng = random.Random(seed)
    tmp_path = tmp_path_factory.mktemp("segs")
    sessions = {sid: _refs(sid, rng.randint(0, 7), rng, tmp_path) for sid in ids}
    every = sorted((r for refs in sessions.values() for r in refs), key=lambda r: r.key)
    expected = [
        [every[i].key for i in rng_]
        for rng_ in plan_shards(
            [r.key for r in every], [FMT.planned_size(r.member_bytes) for r in every], target, FMT.max_overhead
        )
    ]
    order = list(ids)
    rng.shuffle(order)
    known, pending = order[:reused], order[reused:]  # reused sessions are known at once, never pending
    asm = Assembly(
        [key_prefix(s) for s in pending],
        [r for sid in known for r in sessions[sid]],
        FMT,
        "webdataset",
        target,
        {},
        tmp_path,
        lambda rec: None,
    )
    tasks = []
    for sid in pending:
        tasks += asm.add(sessions[sid], key_prefix(sid))
    tasks += asm.finish()
    assert [[r.key for r in g] for g in asm.plan.groups] == expected
    assert [[r.key for r in t.refs] for t in tasks] == expected and [t.number for t in tasks] == list(range(len(tasks)))


def test_a_segment_file_is_deleted_once_every_sample_in_it_is_in_a_written_shard(tmp_path):
    segs = {sid: tmp_path / f"{sid}.seg" for sid in ("a", "b")}
    for p in segs.values():
        p.write_bytes(b"x")
    refs = {sid: [SampleRef(sample_key(sid, i), "h", (1000,), segs[sid], 0, 1) for i in range(3)] for sid in segs}
    asm = Assembly([key_prefix("a"), key_prefix("b")], [], FMT, "webdataset", 1500, {}, tmp_path, lambda rec: None)
    assert asm.add(refs["b"], key_prefix("b")) == []  # "a" may still hold earlier keys: nothing is final
    tasks = asm.add(refs["a"], key_prefix("a")) + asm.finish()
    assert len(tasks) > 2 and segs["a"].exists()
    for t in tasks:
        asm.release(t.refs)
        done = {r.seg_path for t_ in tasks[: tasks.index(t) + 1] for r in t_.refs}
        waiting = {r.seg_path for t_ in tasks[tasks.index(t) + 1 :] for r in t_.refs}
        assert all(p.exists() == (p in waiting) for p in done)
    assert not any(p.exists() for p in segs.values())


def test_a_build_stages_a_few_sessions_segments_not_the_whole_version(copy_captures, tmp_path):
    """Every session's segment file was kept until the last session finished, then every shard was
    written: a convert needed free space for twice the version. Shards are now written as soon as their
    samples are known, and a segment is deleted once its samples are in shards."""
    caps = copy_captures()
    staged = []

    def look(_progress) -> None:
        staged.append(len(list((tmp_path / "cat").rglob("*.seg"))))

    r = convert(
        caps,
        tmp_path / "cat",
        ConvertConfig(clip_seconds=1.0, shard_size=100_000),
        executor=ExecutorSpec(workers=1),
        on_progress=look,
    )
    assert r.sessions == 6 and r.shards > 6
    assert max(staged) <= 2 and staged[-1] == 0  # (the session just finished, and one whose shard is open)
    assert not list((tmp_path / "cat").rglob("*.seg"))
