"""The demo's captures have sound: synthetic sessions a hum with a beep per button press, Atari sessions
the console's own sound; both byte-identical for the same arguments, and carried into every clip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsbuild.formats.audio import decode_audio
from dsbuild.formats.video import DemuxReport, VideoSource
from dsbuild.samples.synthetic import AUDIO_RATE, BEEP_SECONDS, generate, soundtrack


def test_synthetic_captures_with_sound_are_byte_identical_for_the_same_arguments(tmp_path):
    a = generate(tmp_path / "a", sessions=2, seconds=2, seed=3)
    b = generate(tmp_path / "b", sessions=2, seconds=2, seed=3)
    for x, y in zip(a, b):
        assert sorted(p.name for p in x.iterdir()) == sorted(p.name for p in y.iterdir())
        assert all((x / p.name).read_bytes() == (y / p.name).read_bytes() for p in x.iterdir())


def test_the_soundtrack_beeps_where_buttons_are_pressed_and_clips_carry_it(tmp_path):
    [d] = generate(tmp_path, sessions=1, seconds=4, seed=5)
    doc = json.loads((d / "session.json").read_text())
    actions = [json.loads(x) for x in (d / "actions.jsonl").read_text().splitlines()]
    presses = [e["t"] for e in actions if e["control"].startswith("button") and e["value"] == 1.0]
    pcm = soundtrack(actions, 4 * AUDIO_RATE)[:, 0].astype(np.float64)
    quiet = np.abs(pcm).max() / 4
    for t in presses:
        beep = pcm[round(t * AUDIO_RATE) : round((t + BEEP_SECONDS) * AUDIO_RATE)]
        assert np.abs(beep).max() > quiet
    with VideoSource(d / doc["video"]) as src:
        assert src.info.audio is not None and src.info.audio.codec == "flac"
        clips = list(src.clips(1.0, DemuxReport()))
    assert all(c.audio is not None for c in clips)
    heard = np.concatenate([decode_audio(c.data, AUDIO_RATE)[:, 0] for c in clips])
    assert abs(len(heard) - len(pcm)) <= 1024 and np.abs(heard).max() > 0.1


def test_atari_captures_carry_the_console_sound(tmp_path):
    pytest.importorskip("ale_py", reason="ale-py is not installed (pip install 'dsbuild[atari]')")
    from dsbuild.samples.atari import AUDIO_RATE, AtariOptions, record

    [rec] = record(tmp_path, AtariOptions(games=("Pong",), sessions=1, seconds=2))
    with VideoSource(rec.path / "video.mp4") as src:
        assert src.info.audio is not None and src.info.audio.sample_rate == AUDIO_RATE == 30720
        clips = list(src.clips(1.0, DemuxReport()))
    sound = np.concatenate([decode_audio(c.data, AUDIO_RATE)[:, 0] for c in clips])
    assert len(sound) == 2 * AUDIO_RATE and sound.std() > 0.01  # the game makes noise
