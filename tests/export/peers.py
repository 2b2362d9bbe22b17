"""Checks every peer test shares: the right keys, metadata kept, videos that decode."""

from __future__ import annotations

import io

import pytest


def decoded_frames(mp4: bytes) -> int:
    import av

    with av.open(io.BytesIO(bytes(mp4))) as c:
        return sum(1 for _ in c.decode(video=0))


def check_samples(got: dict[str, tuple[dict, bytes]], expected: dict[str, dict]) -> None:
    """``got``: key -> (metadata document, mp4 bytes) as a peer library returned them."""
    assert sorted(got) == sorted(expected)
    for key, (meta, mp4) in got.items():
        assert meta["key"] == key
        assert meta["session"]["title"] == expected[key]["title"]
        assert meta["session"]["conditions"] == expected[key]["conditions"]
        assert decoded_frames(mp4) == meta["clip"]["frames"] > 0


def peer(module: str):
    """Import a peer library or skip, naming the extra that installs it (``make test`` does)."""
    return pytest.importorskip(
        module, reason=f"{module} is not installed: pip install -e '.[peers]' (make test installs it)"
    )
