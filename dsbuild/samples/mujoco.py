"""Robot-style captures from real physics: dm_control suite tasks (MuJoCo) under random or scripted
policies, rendered offscreen, as captures.

Each session is one player (a policy and its seed) controlling one task (``walker-walk``,
``cheetah-run``, ``manipulator-bring_ball``...) for a fixed time. The recording maps onto the capture
contract like this:

- video: one frame per control step, so the video runs at the task's control rate (walker 40 fps,
  reacher 50, cheetah and manipulator 100), H.264 with a keyframe every second, square frames from the
  task's first camera, without shadows and reflections unless ``effects`` is set (they cost ~10x the
  render time on a CPU). Frame ``i`` is the scene the policy saw when it chose action ``i``.
- actions: every actuator is a declared continuous control (``session.json``'s ``controls``, with the
  actuator's range), named as the model names it (``right_hip``, ``grasp``). The command applied at step
  ``i`` is written at frame ``i``'s time for each actuator whose command changed, as a float32 value
  carried exactly, so a zero-order hold at frame ``i`` gives exactly the command applied at step ``i``.
- telemetry, one line per frame: ``qpos/<joint>`` and ``qvel/<joint>`` (a number for a hinge or slide
  joint, a list for a ball or free joint), ``reward`` (of the step that led to this frame), ``frame``
  and ``episode``.
- text, speaker ``dm_control``: ``episode start`` and ``episode end``. A task's time limit (or
  ``episode_seconds``) that ends inside a session resets the task: the frame after the last step of an
  episode shows the new episode.
- players: ``random`` (a new uniform command every step), ``smooth`` (commands that drift, correlated
  over about a quarter of a second, as a teleoperator's) and ``scripted`` (a periodic gait: each
  actuator a sine of its own frequency and phase, plus a little noise). Session ``j`` of every task is
  played by player ``<policy>-s<seed + j>``.

Rendering needs no GPU: ``MUJOCO_GL`` defaults to ``egl`` (Mesa's llvmpipe on a machine without one);
``osmesa`` works where Debian's ``libosmesa6`` is installed. A machine that cannot render gets one line
saying what to install (``MissingDevice``), a machine without the packages the install command
(``MissingDependency``).

Determinism: the task is seeded from (seed, task, session) and so is the policy, MuJoCo steps the same
way on the same inputs, and the encoder is single-threaded, so the same arguments give byte-identical
captures on one machine (a software rasterizer's pictures may differ between Mesa versions).
"""

from __future__ import annotations

import math
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsbuild.core.errors import DsbuildError, MissingDependency, MissingDevice, UsageError
from dsbuild.samples.atari import frame_times
from dsbuild.samples.writer import SessionSpec, VideoSpec, check_session_id, write_session

DEFAULT_TASKS = ("walker-walk", "cheetah-run", "manipulator-bring_ball")
POLICIES = ("random", "smooth", "scripted")
SMOOTH_SECONDS = 0.25  # a smooth player's commands are correlated over this time, whatever the control rate
SCRIPTED_HZ = (0.5, 2.0)  # range of a scripted player's per-actuator gait frequencies
SCRIPTED_NOISE = 0.05  # of the range: makes scripted players with different seeds differ beyond phase
RENDER_HINT = (
    "install Mesa's EGL (Debian: apt-get install libegl1 libgl1-mesa-dri) and use MUJOCO_GL=egl, "
    "or OSMesa (apt-get install libosmesa6) with MUJOCO_GL=osmesa"
)
_TASK_RE = re.compile(r"[a-z0-9_]+-[a-z0-9_]+")


@dataclass(frozen=True)
class MujocoOptions:
    """What to record. ``sessions`` is per task; session ``j`` is played by player seed ``seed + j``."""

    tasks: tuple[str, ...] = DEFAULT_TASKS
    sessions: int = 2
    seconds: float = 10.0
    policies: tuple[str, ...] = ("smooth",)  # cycled over the sessions of each task
    seed: int = 0
    size: int = 128  # square frames: dm_control's pixel benchmarks use 64-84, a camera stream more
    camera: int = 0  # the task's first camera (each suite task has one that follows its robot)
    gop_seconds: float = 1.0  # keyframe every second: clips can be cut on any whole second
    # Shadows and reflections: about 10x the render time on a software rasterizer (each frame draws the
    # suite models' 2048x2048 shadow map and the scene twice), whatever the frame size.
    effects: bool = False
    episode_seconds: float | None = None  # None: the task's own time limit (10-25 s in the suite)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise UsageError("--tasks needs at least one task, e.g. --tasks walker-walk,cheetah-run")
        for t in self.tasks:
            if not _TASK_RE.fullmatch(t):
                raise UsageError(f"--tasks takes DOMAIN-TASK names such as {DEFAULT_TASKS[0]}, not {t!r}")
        if len(set(self.tasks)) != len(self.tasks):
            raise UsageError(f"--tasks lists a task twice: {', '.join(self.tasks)}")
        if not self.policies:
            raise UsageError(f"--policy needs one of {', '.join(POLICIES)}")
        for p in self.policies:
            if p not in POLICIES:
                raise UsageError(f"--policy must be one of {', '.join(POLICIES)} (or a comma list), not {p!r}")
        if self.sessions < 1 or not self.seconds > 0:
            raise UsageError("--sessions must be >= 1 and --seconds > 0")
        if self.seed < 0:
            raise UsageError(f"--seed must be >= 0, not {self.seed}")
        if self.episode_seconds is not None and not self.episode_seconds > 0:
            raise UsageError(f"an episode must last more than 0 s, not {self.episode_seconds}")
        if not (16 <= self.size <= 1024 and self.size % 2 == 0):
            raise UsageError(f"--size must be an even number of pixels from 16 to 1024, not {self.size}")


@dataclass(frozen=True)
class Recording:
    """One written session (kept out of the session folder: not contract data)."""

    path: Path
    session_id: str
    title: str
    player: str
    fps: int
    frames: int
    episodes: int = 1


def require_mujoco():
    """dm_control's suite, set up to render offscreen, or one line saying what is missing."""
    os.environ.setdefault("MUJOCO_GL", "egl")  # read when dm_control is first imported; no display needed
    try:
        import dm_control  # noqa: F401  (the package, before its renderer is chosen)
    except ImportError:
        raise MissingDependency("--source mujoco", "mujoco", "dm-control and mujoco") from None
    try:
        from absl import logging as absl_logging
        from dm_control import suite
    except ImportError:
        raise MissingDependency("--source mujoco", "mujoco", "dm-control and mujoco") from None
    except Exception as e:  # dm_control picks and loads the GL backend on import: an absent library fails here
        raise _render_error(e) from None
    absl_logging.set_verbosity(absl_logging.ERROR)  # the suite's models log deprecation notes on load
    return suite


def _render_error(e: BaseException) -> MissingDevice:
    gl = os.environ.get("MUJOCO_GL", "")
    detail = " ".join(str(e).split())[:160]
    return MissingDevice(
        f"--source mujoco cannot render offscreen with MUJOCO_GL={gl} ({type(e).__name__}: {detail})",
        hint=RENDER_HINT,
    )


# ---- policies: commands in [-1, 1], scaled to each actuator's range ----


class Policy:
    """Chooses each step's command from the step's index; ``unit`` is in [-1, 1] per actuator."""

    def __init__(self, n: int, fps: int, rng: np.random.Generator):
        self.n, self.fps, self.rng = n, fps, rng

    def unit(self, step: int) -> np.ndarray:
        raise NotImplementedError


class RandomPolicy(Policy):
    """A new uniform command every step: the classic random agent."""

    def unit(self, step):
        return self.rng.uniform(-1.0, 1.0, self.n)


class SmoothPolicy(Policy):
    """Commands that drift (an autoregressive walk, stationary spread 0.5, kept in [-1, 1]), correlated
    over ``SMOOTH_SECONDS`` at any control rate."""

    def __init__(self, n, fps, rng):
        super().__init__(n, fps, rng)
        self.keep = math.exp(-1.0 / (SMOOTH_SECONDS * fps))
        self.x = rng.normal(0.0, 0.5, n)

    def unit(self, step):
        if step:
            self.x = self.keep * self.x + math.sqrt(1 - self.keep**2) * self.rng.normal(0.0, 0.5, self.n)
        return np.clip(self.x, -1.0, 1.0)


class ScriptedPolicy(Policy):
    """A periodic gait: actuator k follows 0.8 sin(2 pi f_k t + phase_k), plus ``SCRIPTED_NOISE``."""

    def __init__(self, n, fps, rng):
        super().__init__(n, fps, rng)
        self.freq = rng.uniform(*SCRIPTED_HZ, n)
        self.phase = rng.uniform(0.0, 2 * math.pi, n)

    def unit(self, step):
        wave = 0.8 * np.sin(2 * math.pi * self.freq * (step / self.fps) + self.phase)
        return np.clip(wave + self.rng.normal(0.0, SCRIPTED_NOISE, self.n), -1.0, 1.0)


_POLICY_CLASSES = {"random": RandomPolicy, "smooth": SmoothPolicy, "scripted": ScriptedPolicy}


def scale(unit: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[-1, 1] -> [low, high] per actuator, as float32 (the values the capture carries exactly), within
    the range after rounding too."""
    value = (low + (unit + 1.0) * 0.5 * (high - low)).astype(np.float32)
    return np.clip(value, low.astype(np.float32), high.astype(np.float32))


def command_events(names: Sequence[str], previous: np.ndarray | None, command: np.ndarray, t: float) -> list[dict]:
    """The action events at time ``t``: one per actuator whose command differs from ``previous``."""
    return [
        {"t": t, "control": name, "value": float(v)}
        for k, (name, v) in enumerate(zip(names, command.tolist()))
        if previous is None or previous[k] != command[k]
    ]


# ---- the model: names of actuators and joints ----

_QPOS_WIDTH = {0: 7, 1: 4}  # mjtJoint: free, ball; slide and hinge have one coordinate
_QVEL_WIDTH = {0: 6, 1: 3}


def _names(model, kind: str, count: int, prefix: str) -> list[str]:
    return [model.id2name(i, kind) or f"{prefix}{i}" for i in range(count)]


def joint_slices(model) -> list[tuple[str, slice, slice]]:
    """(joint name, its qpos slice, its qvel slice) for every joint of the model."""
    out = []
    for j, name in enumerate(_names(model, "joint", model.njnt, "joint")):
        kind = int(model.jnt_type[j])
        qpos, qvel = int(model.jnt_qposadr[j]), int(model.jnt_dofadr[j])
        out.append((name, slice(qpos, qpos + _QPOS_WIDTH.get(kind, 1)), slice(qvel, qvel + _QVEL_WIDTH.get(kind, 1))))
    return out


def _reading(values: np.ndarray) -> float | list[float]:
    return float(values[0]) if len(values) == 1 else [float(x) for x in values]


# ---- recording ----


def _seeds(seed: int, task: str, index: int) -> tuple[int, np.random.Generator]:
    """(task seed, policy RNG), derived arithmetically from (seed, task, session index)."""
    root = np.random.default_rng([seed, zlib.crc32(task.encode()), index])
    return int(root.integers(0, 2**31 - 1)), np.random.default_rng([seed, zlib.crc32(task.encode()), index, 1])


@dataclass
class _Log:
    """The streams of one session, filled while its frames are being encoded."""

    actions: list[dict] = field(default_factory=list)
    telemetry: list[dict] = field(default_factory=list)
    text: list[dict] = field(default_factory=list)
    frames: int = 0
    episodes: int = 1


def _play(env, policy: Policy, times: list[float], options: MujocoOptions, log: _Log) -> Iterator[np.ndarray]:
    """Yield frames 0..n-1 while stepping the task; frame i is the scene command i was chosen on."""
    physics = env.physics
    spec = env.action_spec()
    low, high = np.asarray(spec.minimum, np.float64), np.asarray(spec.maximum, np.float64)
    actuators = _names(physics.model, "actuator", physics.model.nu, "actuator")
    joints = joint_slices(physics.model)
    flags = {} if options.effects else {"shadow": False, "reflection": False}
    previous: np.ndarray | None = None
    episode, reward = 0, 0.0
    log.text.append({"t": times[0], "speaker": "dm_control", "text": "episode start"})
    for i, t in enumerate(times):
        qpos, qvel = physics.data.qpos, physics.data.qvel
        line: dict = {"t": t, "frame": i, "episode": episode, "reward": reward}
        for name, p, v in joints:
            line[f"qpos/{name}"] = _reading(qpos[p])
            line[f"qvel/{name}"] = _reading(qvel[v])
        log.telemetry.append(line)
        try:
            frame = physics.render(options.size, options.size, camera_id=options.camera, render_flag_overrides=flags)
        except Exception as e:  # a GL context that cannot be made fails on the first render
            if i == 0:
                raise _render_error(e) from None
            raise
        command = scale(policy.unit(i), low, high)
        log.actions += command_events(actuators, previous, command, t)
        previous = command
        log.frames += 1
        yield frame
        step = env.step(command.astype(np.float64))
        reward = float(step.reward or 0.0)
        if step.last():  # the task's time limit: a new episode starts on the next frame
            env.reset()
            if i + 1 < len(times):
                log.text.append({"t": times[i + 1], "speaker": "dm_control", "text": "episode end"})
                log.text.append({"t": times[i + 1], "speaker": "dm_control", "text": "episode start"})
                episode += 1
                log.episodes += 1


def _control_rate(env, task: str) -> int:
    rate = 1.0 / env.control_timestep()
    if abs(rate - round(rate)) > 1e-6:
        raise UsageError(f"task {task}: control rate {rate:.3f} Hz is not a whole number of frames per second")
    return round(rate)


def record_session(out: Path, suite, task: str, policy_id: str, index: int, options: MujocoOptions) -> Recording:
    """Record session ``index`` of ``task`` into ``out/<session_id>``."""
    from importlib.metadata import version

    import mujoco

    domain, name = task.split("-", 1)
    player = f"{policy_id}-s{options.seed + index}"
    session_id = check_session_id(f"task {task!r}", f"{task}-{player}-{index:04d}")
    task_seed, rng = _seeds(options.seed, task, index)
    limit = {} if options.episode_seconds is None else {"time_limit": options.episode_seconds}
    env = suite.load(domain, name, task_kwargs={"random": task_seed, **limit})
    env.reset()
    fps = _control_rate(env, task)
    n = max(1, round(options.seconds * fps))
    spec = env.action_spec()
    if not (np.isfinite(spec.minimum).all() and np.isfinite(spec.maximum).all()):
        raise UsageError(f"task {task}: its actuators have no bounded range to sample commands from")
    actuators = _names(env.physics.model, "actuator", env.physics.model.nu, "actuator")
    controls = {
        a: {"kind": "continuous", "range": [float(lo), float(hi)]}
        for a, lo, hi in zip(actuators, spec.minimum.tolist(), spec.maximum.tolist())
    }
    session = SessionSpec(
        session_id=session_id,
        title=task,
        player=player,
        video=VideoSpec(options.size, options.size, fps, max(1, round(options.gop_seconds * fps))),
        platform="mujoco",
        build=f"dm-control {version('dm-control')}, mujoco {mujoco.__version__}",
        started_at=f"2026-11-{1 + index % 28:02d}T10:00:00Z",
        conditions={
            "domain": domain,
            "task": name,
            "control_hz": str(fps),
            "physics_hz": str(round(1.0 / env.physics.timestep())),
            "camera": str(options.camera),
        },
        controls=controls,
    )
    policy = _POLICY_CLASSES[policy_id](len(actuators), fps, rng)
    log = _Log()
    # write_session encodes the frames first (stepping the task, which fills the lists in log) and writes
    # the streams after; the count check below guards that order.
    directory = write_session(
        out / session_id,
        session,
        _play(env, policy, frame_times(n, fps), options, log),
        log.actions,
        log.telemetry,
        log.text,
    )
    if log.frames != n or len(log.telemetry) != n:
        raise DsbuildError(f"{directory}: wrote {len(log.telemetry)} telemetry lines for {log.frames} of {n} frames")
    return Recording(directory, session_id, task, player, fps, n, log.episodes)


def record(out: Path, options: MujocoOptions) -> list[Recording]:
    """Record ``options.sessions`` sessions of each task under ``out``; returns them in write order."""
    suite = require_mujoco()
    known = {f"{d}-{t}" for d, t in suite.ALL_TASKS}
    unknown = [t for t in options.tasks if t not in known]
    if unknown:
        raise UsageError(
            f"unknown dm_control task(s) {', '.join(unknown)}; e.g. {', '.join(DEFAULT_TASKS)} "
            f"(any suite task, e.g. reacher-easy, also works)"
        )
    recordings = []
    for task in options.tasks:
        for j in range(options.sessions):
            policy_id = options.policies[j % len(options.policies)]
            recordings.append(record_session(Path(out), suite, task, policy_id, j, options))
    return recordings
