"""Synthetic captures: moving content and sound, several titles/players/resolutions/rates, injectable damage.

Everything is derived from (seed, session index) so the same arguments give byte-identical captures.
``DAMAGE`` lists every kind of broken capture convert must survive; tests inject them one at a time.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dsbuild.core.errors import UsageError
from dsbuild.samples.writer import AudioSource, SessionSpec, VideoSpec, write_jsonl, write_session

TITLES = ("Kart Storm", "Dungeon Drift", "Sky Rally")
RESOLUTIONS = ((160, 120), (320, 240), (640, 360))
BUTTONS = ("button_a", "button_b", "left", "right")
AXES = ("steer_x",)
DAMAGE = (
    "truncated_video",
    "zero_video",
    "not_video",
    "bad_json",
    "missing_field",
    "escape_dotdot",
    "escape_absolute",
    "escape_symlink",
    "duplicate_id",
    "malformed_lines",
    "out_of_order",
    "nan_telemetry",
    "bad_utf8",
    "missing_streams",
)


def parse_damage(items: list[str], sessions: int) -> dict[int, str]:
    """``["truncated_video", "2=bad_json"]`` -> {0: "truncated_video", 2: "bad_json"}: a bare KIND
    damages the session at its position in the list. Indices must name one of ``sessions``."""
    plan: dict[int, str] = {}
    for i, item in enumerate(items):
        index, eq, kind = str(item).rpartition("=")
        if kind not in DAMAGE:
            close = difflib.get_close_matches(kind, DAMAGE, n=1)
            raise UsageError(
                f"--damage {item!r}: unknown kind {kind!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                hint=f"kinds: {', '.join(DAMAGE)}",
            )
        try:
            at = int(index) if eq else i
        except ValueError:
            raise UsageError(f"--damage {item!r}: {index!r} is not a session index (use INDEX=KIND)") from None
        if not 0 <= at < sessions:
            raise UsageError(
                f"--damage {item!r}: session index {at} is out of range; --sessions {sessions} "
                f"gives indices 0..{sessions - 1}"
            )
        if at in plan:
            raise UsageError(f"--damage: session {at} is damaged twice ({plan[at]} and {kind})")
        plan[at] = kind
    return plan


def frames(spec: VideoSpec, n: int, rng: np.random.Generator, noise: int = 0) -> Iterator[np.ndarray]:
    """Moving gradient, a moving box, a HUD bar with a growing score; optional noise for bitrate."""
    h, w = spec.height, spec.width
    yy, xx = np.mgrid[0:h, 0:w]
    color = rng.integers(40, 255, size=3)
    vx, vy = rng.integers(1, 5, size=2)
    grain = rng.integers(0, max(noise, 1), size=(8, h, w, 3), dtype=np.uint8) if noise else None
    for i in range(n):
        img = np.empty((h, w, 3), np.uint8)
        img[..., 0] = (xx + 2 * i) % 256
        img[..., 1] = (yy + i) % 256
        img[..., 2] = 96
        bx, by = (i * vx) % max(w - w // 6, 1), (i * vy) % max(h - h // 6, 1)
        img[by : by + h // 6, bx : bx + w // 6] = color
        img[: h // 12, : (i % w)] = 255  # HUD: score bar
        if grain is not None:
            img += grain[i % 8]
        yield img


AUDIO_RATE = 48000
HUM_HZ = 110  # engine hum under everything
BEEP_HZ = {"button_a": 440, "button_b": 554, "left": 659, "right": 880}  # a beep per button press
BEEP_SECONDS = 0.06


def _triangle(i: np.ndarray, hz: int, amplitude: int) -> np.ndarray:
    """Integer triangle wave (no floating point: the same samples on every machine)."""
    phase = (i * hz * 65536 // AUDIO_RATE) % 65536
    return (np.abs(phase - 32768) - 16384) * amplitude // 16384


def soundtrack(actions: list[dict], samples: int) -> np.ndarray:
    """int16 [samples, 1] at AUDIO_RATE: a hum, and a beep at every button press (audio follows actions)."""
    i = np.arange(samples, dtype=np.int64)
    out = _triangle(i, HUM_HZ, 2000)
    beep = round(BEEP_SECONDS * AUDIO_RATE)
    for e in actions:
        if e["control"] in BEEP_HZ and e["value"] == 1.0:
            start = round(e["t"] * AUDIO_RATE)
            j = i[start : start + beep]
            out[start : start + beep] += _triangle(j, BEEP_HZ[e["control"]], 6000)
    return np.clip(out, -32768, 32767).astype(np.int16)[:, None]


def _events(rng: np.random.Generator, seconds: float, player: str) -> tuple[list, list, list]:
    actions = []
    for control in BUTTONS:
        t = float(rng.uniform(0, 1))
        while t < seconds:
            actions.append({"t": round(t, 4), "control": control, "value": 1.0})
            t += float(rng.uniform(0.05, 0.4))
            actions.append({"t": round(t, 4), "control": control, "value": 0.0})
            t += float(rng.uniform(0.2, 2.0))
    for control in AXES:
        for t in np.arange(0, seconds, 0.1):
            actions.append(
                {"t": round(float(t), 4), "control": control, "value": round(float(np.sin(t) * rng.uniform(0.5, 1)), 4)}
            )
    actions.sort(key=lambda e: (e["t"], e["control"]))
    telemetry = []
    pos = np.zeros(3)
    for k, t in enumerate(np.arange(0, seconds, 0.05)):
        speed = 10 + 5 * np.sin(t / 3)
        pos = pos + np.array([np.cos(t), np.sin(t), 0.01]) * speed * 0.05
        telemetry.append(
            {
                "t": round(float(t), 4),
                "pos": [round(float(x), 4) for x in pos],
                "speed": round(float(speed), 4),
                "lap": k // 400,
            }
        )
    lines = ("nice line", "watch the corner", "gg", "one more run", "ünïcödé ok")
    text = [
        {"t": round(float(t), 3), "speaker": player, "text": lines[j % len(lines)]}
        for j, t in enumerate(np.sort(rng.uniform(0, seconds, size=max(1, int(seconds // 4)))))
    ]
    return actions, telemetry, text


def session_spec(seed: int, index: int, seconds: float) -> SessionSpec:
    rng = np.random.default_rng([seed, index, 0])
    title = TITLES[index % len(TITLES)]
    w, h = RESOLUTIONS[int(rng.integers(len(RESOLUTIONS)))]
    fps = int(rng.choice([30, 60]))
    gop = int(fps * float(rng.choice([1.0, 1.5, 2.0])))
    abbr = "".join(word[0] for word in title.lower().split())
    return SessionSpec(
        session_id=f"{abbr}-{seed}-{index:04d}",
        title=title,
        player=f"p-{int(rng.integers(0, max(2, index // 2 + 2))):04x}",
        video=VideoSpec(w, h, fps, gop),
        build=f"1.{index % 3}.0",
        started_at=f"2026-11-{1 + index % 28:02d}T10:00:00Z",
        conditions={
            "track": str(rng.choice(["harbor", "canyon", "city"])),
            "weather": str(rng.choice(["rain", "clear"])),
            "difficulty": str(rng.choice(["easy", "hard"])),
        },
    )


def generate(
    out: Path,
    sessions: int = 3,
    seconds: float = 10.0,
    seed: int = 0,
    damage: dict[int, str] | None = None,
    noise: int = 0,
    specs: list[SessionSpec] | None = None,
) -> list[Path]:
    """Write ``sessions`` captures under ``out``; ``damage`` maps a session index to a DAMAGE kind."""
    out = Path(out)
    damage = damage or {}
    for kind in damage.values():
        if kind not in DAMAGE:
            raise UsageError(f"unknown damage {kind!r}; choose from {', '.join(DAMAGE)}")
    if damage.get(0) == "duplicate_id":  # refused before anything is written (a rerun would find it there)
        raise UsageError(
            "--damage 0=duplicate_id: duplicate_id damage needs a session before it",
            hint="damage a later session, e.g. --damage 1=duplicate_id",
        )
    if sessions < 1 or seconds <= 0:
        raise UsageError("--sessions must be >= 1 and --seconds > 0")
    paths: list[Path] = []
    for i in range(sessions):
        spec = specs[i] if specs else session_spec(seed, i, seconds)
        rng = np.random.default_rng([seed, i, 1])
        n = round(seconds * spec.video.fps)
        actions, telemetry, text = _events(rng, seconds, spec.player)
        sound = AudioSource.of(soundtrack(actions, n * AUDIO_RATE // spec.video.fps), AUDIO_RATE)
        d = write_session(
            out / spec.session_id,
            spec,
            frames(spec.video, n, rng, noise),
            actions,
            telemetry,
            text,
            seed=seed + i,
            audio=sound,
        )
        if i in damage:
            inject(d, damage[i], previous=paths[-1] if paths else None)
        paths.append(d)
    return paths


def inject(d: Path, kind: str, previous: Path | None = None) -> None:
    """Damage the session folder ``d`` in one specific way (see DAMAGE)."""
    doc = json.loads((d / "session.json").read_text())
    video = d / doc["video"]
    if kind == "truncated_video":
        data = video.read_bytes()
        video.write_bytes(data[: int(len(data) * 0.6)])
    elif kind == "zero_video":
        video.write_bytes(b"")
    elif kind == "not_video":
        video.write_bytes(b"this is a text file, not a video\n" * 100)
    elif kind == "bad_json":
        (d / "session.json").write_text("{ this is not json")
    elif kind == "missing_field":
        del doc["player"]
    elif kind == "escape_dotdot":
        doc["video"] = "../" + d.name + "/" + doc["video"]
    elif kind == "escape_absolute":
        doc["video"] = str(video.resolve())
    elif kind == "escape_symlink":
        outside = d.parent.parent / f"outside-{d.name}.mp4"
        os.replace(video, outside)
        video.symlink_to(outside.resolve())
    elif kind == "duplicate_id":
        if previous is None:
            raise UsageError("duplicate_id damage needs a session before it")
        doc["session_id"] = json.loads((previous / "session.json").read_text())["session_id"]
    elif kind == "malformed_lines":
        for name in ("actions.jsonl", "telemetry.jsonl"):
            lines = (d / name).read_text().splitlines()
            lines[1:1] = ["{not json", '{"t": "soon"}', "[1, 2, 3]", '{"control": "x", "value": 1}']
            (d / name).write_text("\n".join(lines) + "\n")
    elif kind == "out_of_order":
        events = [json.loads(x) for x in (d / "actions.jsonl").read_text().splitlines()]
        events[2], events[-3] = events[-3], events[2]
        write_jsonl(d / "actions.jsonl", events)
    elif kind == "nan_telemetry":
        with open(d / "telemetry.jsonl", "a") as f:
            f.write('{"t": 0.5, "speed": NaN, "pos": [1, "x", 3]}\n{"t": 0.6, "speed": "fast"}\n')
    elif kind == "bad_utf8":
        with open(d / "text.jsonl", "ab") as f:
            f.write(b'{"t": 1.0, "speaker": "p", "text": "bad \xff\xfe bytes"}\n')
    elif kind == "missing_streams":
        (d / "actions.jsonl").unlink()
        (d / "text.jsonl").unlink()
    if kind in ("missing_field", "escape_dotdot", "escape_absolute", "duplicate_id"):
        (d / "session.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
