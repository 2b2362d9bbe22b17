"""Memory is bounded before it is taken: a long single-GOP clip (one keyframe: convert keeps it whole) whose
frames batch would need more than ``max_batch_bytes`` (default: half the memory the process may use) is
refused in one line naming the clip, the size and the options that lower it, before any frame is decoded
or any batch allocated; the same options then make it fit. ``validate`` warns about such clips from the index."""

from __future__ import annotations

import numpy as np
import pytest

from dsbuild.convert import ConvertConfig, convert
from dsbuild.core.errors import UsageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.loader import Loader
from dsbuild.loader.decode import usable_memory
from dsbuild.samples.synthetic import frames as moving_frames
from dsbuild.samples.writer import SessionSpec, VideoSpec, write_session
from tests.cli.clitools import run_json


@pytest.fixture(scope="session")
def single_gop(tmp_path_factory):
    """A catalog of one 8 s screen recording with a single keyframe: one clip of 240 frames."""
    root = tmp_path_factory.mktemp("gop")
    spec = SessionSpec("screen", "Desktop", "p-0", VideoSpec(64, 48, 30, 100_000), conditions={})
    write_session(
        root / "caps" / "screen",
        spec,
        moving_frames(spec.video, 240, np.random.default_rng(0)),
        [{"t": 0.0, "control": "button_a", "value": 1.0}],
        [{"t": 0.0, "speed": 0.0}],
        [],
    )
    r = convert(root / "caps", root / "cat", ConvertConfig(clip_seconds=1.0), executor=ExecutorSpec(workers=1))
    return str(root / "cat"), r.version_id


def test_a_batch_over_the_bound_is_refused_naming_the_clip_and_the_options(single_gop):
    cat, _ = single_gop
    loader = Loader(cat, batch_size=4, max_batch_bytes=5_000_000)
    with pytest.raises(UsageError) as e:
        next(iter(loader))
    msg = str(e.value)
    assert "clip screen__000000" in msg and "240 frames of 48x64x3 x batch_size 4" in msg and "\n" not in msg
    assert all(opt in msg for opt in ("max_frames=", "clip_frames=", "resize=", "batch_size="))
    batch = next(iter(Loader(cat, batch_size=4, max_batch_bytes=5_000_000, max_frames=60)))
    assert batch["frames"].shape == (1, 60, 48, 64, 3)


def test_the_default_bound_is_a_share_of_the_memory_the_process_may_use(single_gop):
    cat, _ = single_gop
    side = int((usable_memory() / 240 / 3) ** 0.5) + 1  # one clip of this size needs all of it
    with pytest.raises(UsageError, match="half of the .* this process may use"):
        next(iter(Loader(cat, batch_size=1, resize=(side, side))))


def test_validate_warns_about_the_clip_naming_its_bytes_and_the_options(single_gop, tmp_path):
    """Against the training machine's bound (``max_clip_frames_bytes``): a warning (exit 0) naming the clip,
    the bytes its frames take at native size and the options that lower them; 0 keeps the loader's default."""
    cat, _ = single_gop
    spec = tmp_path / "spec.toml"
    spec.write_text('format = "dsbuild.acceptance/1"\n[thresholds]\nmax_clip_frames_bytes = 1000000\n')
    checks = {c["name"]: c for c in run_json("validate", cat, "--acceptance", spec, "-q")["checks"]}
    got = checks["clip_memory"]
    assert got["status"] == "warn" and got["measured"] == 240 * 48 * 64 * 3, got
    (clip,) = got["offenders"]
    assert clip["item"] == "screen__000000", clip
    assert "needs 2,211,840 bytes decoded at native size (240 frames of 48x64x3), over 1,000,000" in clip["detail"]
    assert all(opt in clip["detail"] for opt in ("max_frames=", "clip_frames=", "frame_stride=", "resize="))
