"""Real Atari 2600 gameplay recorded with the Arcade Learning Environment (``ale-py``), as captures.

Each session is one player (a policy and its seed) playing one game for a fixed number of emulated
frames. The recording maps onto the capture contract like this:

- video: every emulated frame (frameskip 1) at the console's 60 fps, H.264 with a keyframe every second,
  optionally upscaled by an integer factor (nearest neighbour). Frame ``i`` is the screen the policy saw
  when it chose action ``i``.
- actions: the ALE action meaning the policy pressed on each frame (``FIRE``, ``LEFT``, ``UPFIRE``...) as a
  button: when the action changes on frame ``i``, the previous meaning is released (0.0) and the new one
  pressed (1.0) at frame ``i``'s time. ``NOOP`` is *no pressed control*: it is never written as a control,
  so a frame where every control reads 0 is a ``NOOP`` frame. On the frame that shows the end of an
  episode the policy is not asked and ``NOOP`` is recorded (the emulator is reset instead of stepped).
- telemetry, one line per frame: ``ram`` (the 128 bytes), ``reward`` (the reward of the step that led to
  this frame), ``score`` (cumulative within the episode), ``lives``, ``frame`` (the video frame number) and
  ``episode`` (0, 1, ... within the session).
- players: ``random`` (a new uniform action every frame), ``sticky`` (holds an action ~1/3 s; not to be
  confused with ALE's sticky actions, which are off) and ``scripted`` (a small RAM-reading player).
  Session ``j`` of every game is played by player ``<policy>-s<seed + j>``, so players span games.
- audio: the console's sound (ALE ``sound_obs``: 512 unsigned 8-bit samples per emulated frame, so
  30720 Hz mono), in the video file as FLAC; sample 0 plays with frame 0. A frame on which the emulator is
  reset instead of stepped is silent.
- text, speaker ``ale``: ``episode start``, ``life lost`` and ``episode end`` at the frame they are seen on.
  An episode that ends inside a session is followed by a reset and a new episode; the score restarts at 0.

Event times are frame times, ``i / 60`` correctly rounded. Convert computes a frame's time from its
timestamp with exact rational arithmetic (``dsbuild.formats.video.seconds``), which gives the same float,
so a zero-order hold (the last value at or before a frame time) gives frame ``i`` exactly action ``i``.

Determinism: ``repeat_action_probability`` is set to 0 (so the recorded action is the applied action),
the emulator and the policy are seeded from (seed, game, session) and the encoder is single-threaded, so
the same arguments give byte-identical captures.
"""

from __future__ import annotations

import re
import warnings
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsbuild.core.errors import DsbuildError, UsageError
from dsbuild.samples.writer import AudioSource, SessionSpec, VideoSpec, check_session_id, write_session

FPS = 60  # the Atari 2600's NTSC frame rate; with frameskip 1 every emulated frame is a video frame
AUDIO_PER_FRAME = 512  # ALE's sound_obs: samples the emulator renders per frame
AUDIO_RATE = AUDIO_PER_FRAME * FPS
DEFAULT_GAMES = ("Breakout", "Pong", "MsPacman")
POLICIES = ("random", "sticky", "scripted")
NOOP = "NOOP"
REPEAT_ACTION_PROBABILITY = 0.0  # ALE's sticky actions would apply an action other than the recorded one
MAX_EPISODE_FRAMES = 108_000  # ALE's customary cap (30 min at 60 fps), set explicitly for determinism
STICKY_KEEP = 0.95  # chance a sticky player keeps its action each frame: holds of ~1/3 s, like thumbs do
SCRIPTED_EPSILON = 0.05  # a scripted player's random presses; makes players with different seeds differ
INSTALL_HINT = "pip install 'dsbuild[atari]'"


@dataclass(frozen=True)
class AtariOptions:
    """What to record. ``sessions`` is per game; session ``j`` is played by player seed ``seed + j``."""

    games: tuple[str, ...] = DEFAULT_GAMES
    sessions: int = 2
    seconds: float = 10.0
    policies: tuple[str, ...] = ("sticky",)  # cycled over the sessions of each game
    seed: int = 0
    upscale: int = 1  # 160x210 is small; 2-4 gives a more typical input size at 4-16x the pixels
    difficulty: int = 0  # ALE's default difficulty switch
    mode: int | None = None  # None: the game's first available mode, set explicitly and recorded
    gop_seconds: float = 1.0  # keyframe every second: clips can be cut on any whole second

    def __post_init__(self) -> None:
        if not self.games:
            raise UsageError("--games needs at least one game, e.g. --games Breakout,Pong")
        for p in self.policies:
            if p not in POLICIES:
                raise UsageError(f"--policy must be one of {', '.join(POLICIES)} (or a comma list), not {p!r}")
        if not self.policies:
            raise UsageError(f"--policy needs one of {', '.join(POLICIES)}")
        if self.sessions < 1 or not self.seconds > 0:
            raise UsageError("--sessions must be >= 1 and --seconds > 0")
        if round(self.seconds * FPS) < 1:
            raise UsageError(f"--seconds {self.seconds} is less than one frame at {FPS} fps")
        if self.seed < 0:
            raise UsageError(f"--seed must be >= 0, not {self.seed}")
        if not 1 <= self.upscale <= 8:
            raise UsageError(f"--upscale must be an integer from 1 to 8, not {self.upscale}")


@dataclass(frozen=True)
class Recording:
    """One written session and what was played in it (kept out of the session folder: not contract data)."""

    path: Path
    session_id: str
    title: str
    player: str
    actions: tuple[str, ...]  # the action meaning pressed on each video frame, "NOOP" included
    episodes: int = 1


def require_ale():
    """Import ale_py or fail with one line that says how to install it."""
    try:
        import ale_py
    except ImportError:
        raise UsageError(f"--source atari needs the ale-py package: {INSTALL_HINT}") from None
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner on stderr
    return ale_py


def rom_id(name: str) -> str:
    """'MsPacman' / 'ms_pacman' / 'ms-pacman' -> 'ms_pacman' (ALE's ROM id)."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip()).replace("-", "_").lower()
    return re.sub(r"_+", "_", snake)


def title_of(rom: str) -> str:
    """'ms_pacman' -> 'MsPacman'."""
    return "".join(part[:1].upper() + part[1:] for part in rom.split("_"))


# ---- pure parts: the frame clock and the action events ----


def frame_times(n: int, fps: int) -> list[float]:
    """Seconds of frames 0..n-1: i / fps, correctly rounded (see top)."""
    return [i / fps for i in range(n)]


def press_change(held: str, action: str, t: float) -> list[dict]:
    """The events at time ``t`` that take the controller from pressing ``held`` to pressing ``action``."""
    if action == held:
        return []
    release = [{"t": t, "control": held, "value": 0.0}] if held != NOOP else []
    return release + ([{"t": t, "control": action, "value": 1.0}] if action != NOOP else [])


def action_events(actions: Sequence[str], times: Sequence[float]) -> list[dict]:
    """Press/release events that a zero-order hold turns back into ``actions`` (NOOP = nothing pressed)."""
    events = []
    for held, action, t in zip((NOOP, *actions), actions, times):
        events += press_change(held, action, t)
    return events


# ---- policies ----


class Policy:
    """Chooses an action (an index into the game's minimal action set) from the RAM each frame."""

    def __init__(self, names: Sequence[str], rom: str, rng: np.random.Generator):
        self.names, self.rom, self.rng = tuple(names), rom, rng
        self.index = {name: i for i, name in enumerate(self.names)}
        self.last = 0

    def choose(self, ram: np.ndarray, frame: int) -> int:
        raise NotImplementedError

    def act(self, ram: np.ndarray, frame: int) -> int:
        self.last = self.choose(ram, frame)
        return self.last


class RandomPolicy(Policy):
    """A new uniform action every frame: the classic random agent."""

    def choose(self, ram, frame):
        return int(self.rng.integers(len(self.names)))


class StickyPolicy(Policy):
    """Holds an action, switching to a uniform one with probability 1 - STICKY_KEEP each frame."""

    def choose(self, ram, frame):
        if frame == 0 or self.rng.random() >= STICKY_KEEP:
            return int(self.rng.integers(len(self.names)))
        return self.last


class ScriptedPolicy(Policy):
    """A simple RAM-reading player: tracks the ball in Breakout and Pong, turns when stuck in MsPacman
    (and any other game), with SCRIPTED_EPSILON random presses."""

    def __init__(self, names, rom, rng) -> None:
        super().__init__(names, rom, rng)
        self.direction = self.index.get("LEFT", 0)
        self.still = 0
        self.pos: tuple[int, int] | None = None

    def _pick(self, *names: str) -> int:
        for name in names:
            if name in self.index:
                return self.index[name]
        return 0

    def choose(self, ram, frame):
        if self.rng.random() < SCRIPTED_EPSILON:
            return int(self.rng.integers(len(self.names)))
        ram = ram.astype(np.int32)
        if self.rom == "breakout":  # paddle x ram[72], ball x ram[99], ball y ram[101] (0: not in play)
            if ram[101] == 0:
                return self._pick("FIRE")
            target = ram[99] - 10
            if ram[72] < target - 4:
                return self._pick("RIGHT")
            return self._pick("LEFT") if ram[72] > target + 4 else self._pick(NOOP)
        if self.rom == "pong":  # own paddle y ram[51], ball y ram[54] (0: not in play); RIGHT moves up
            if ram[54] == 0:
                return self._pick("FIRE")
            if ram[54] > ram[51] + 4:
                return self._pick("LEFT")
            return self._pick("RIGHT") if ram[54] < ram[51] - 4 else self._pick(NOOP)
        # Wander: hold a direction; after 8 frames without moving (player x ram[10], y ram[16] in MsPacman)
        # or 45 frames in other games, take another one.
        pos = (int(ram[10]), int(ram[16]))
        self.still = self.still + 1 if pos == self.pos else 0
        self.pos = pos
        if self.still >= (8 if self.rom == "ms_pacman" else 45):
            self.still = 0
            others = [i for i in range(1, len(self.names)) if i != self.direction] or [0]
            self.direction = int(others[int(self.rng.integers(len(others)))])
        return self.direction


_POLICY_CLASSES = {"random": RandomPolicy, "sticky": StickyPolicy, "scripted": ScriptedPolicy}


# ---- recording ----


def _seeds(seed: int, rom: str, index: int) -> tuple[int, np.random.Generator]:
    """(ALE seed, policy RNG), derived arithmetically from (seed, game, session index)."""
    root = np.random.default_rng([seed, zlib.crc32(rom.encode()), index])
    ale_seed = int(root.integers(0, 2**31 - 1))
    return ale_seed, np.random.default_rng([seed, zlib.crc32(rom.encode()), index, 1])


def _rom_path(ale_py, rom: str) -> str | None:
    with warnings.catch_warnings():  # ale-py warns about unknown ids as well as returning None
        warnings.simplefilter("ignore")
        return ale_py.roms.get_rom_path(rom)


def _emulator(ale_py, rom: str, ale_seed: int, difficulty: int, mode: int | None):
    path = _rom_path(ale_py, rom)
    if path is None:
        raise UsageError(f"unknown Atari game {rom!r}; e.g. {', '.join(DEFAULT_GAMES)}")
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", ale_seed)
    ale.setFloat("repeat_action_probability", REPEAT_ACTION_PROBABILITY)
    ale.setInt("frame_skip", 1)
    ale.setInt("max_num_frames_per_episode", MAX_EPISODE_FRAMES)
    ale.setBool("sound_obs", True)
    ale.loadROM(str(path))
    if difficulty not in ale.getAvailableDifficulties():
        raise UsageError(f"{rom}: difficulty {difficulty} not in {list(ale.getAvailableDifficulties())}")
    ale.setDifficulty(difficulty)
    modes = list(ale.getAvailableModes())
    mode = modes[0] if mode is None else mode
    if mode not in modes:
        raise UsageError(f"{rom}: mode {mode} not in {modes}")
    ale.setMode(mode)
    ale.reset_game()
    return ale, mode


@dataclass
class _Log:
    """The streams of one session, filled while its frames are being encoded."""

    played: list[str] = field(default_factory=list)  # action meaning per frame
    actions: list[dict] = field(default_factory=list)  # press/release events
    telemetry: list[dict] = field(default_factory=list)
    text: list[dict] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)  # uint8 sound of each frame, not yet encoded
    episodes: int = 1

    def take_audio(self) -> np.ndarray:
        """The sound logged since the last call, as int16 [samples, 1] (ALE's uint8 is offset by 128)."""
        chunks, self.audio = self.audio, []
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
        return ((pcm.astype(np.int16) - 128) << 8)[:, None]


def _play(ale, policy: Policy, times: list[float], upscale: int, log: _Log) -> Iterator[np.ndarray]:
    """Yield frames 0..n-1 while stepping the emulator; frame i is the screen action i was chosen on."""
    minimal = ale.getMinimalActionSet()
    episode, score, reward, lives = 0, 0.0, 0.0, ale.lives()
    log.text.append({"t": times[0], "speaker": "ale", "text": "episode start"})
    for i, t in enumerate(times):
        ram = ale.getRAM()
        if ale.lives() < lives:
            log.text.append({"t": t, "speaker": "ale", "text": "life lost"})
        lives = ale.lives()
        over = ale.game_over()
        if over:
            log.text.append({"t": t, "speaker": "ale", "text": "episode end"})
        log.telemetry.append(
            {
                "t": t,
                "frame": i,
                "episode": episode,
                "reward": reward,
                "score": score,
                "lives": lives,
                "ram": [int(x) for x in ram],
            }
        )
        a = 0 if over else policy.act(ram, i)
        action = NOOP if over else minimal[a].name
        log.actions += press_change(log.played[-1] if log.played else NOOP, action, t)
        log.played.append(action)
        screen = ale.getScreenRGB()
        yield np.repeat(np.repeat(screen, upscale, axis=0), upscale, axis=1) if upscale > 1 else screen
        if over:
            ale.reset_game()
            log.audio.append(np.full(AUDIO_PER_FRAME, 128, np.uint8))
            episode, score, reward, lives = episode + 1, 0.0, 0.0, ale.lives()
            log.episodes += 1
            if i + 1 < len(times):
                log.text.append({"t": times[i + 1], "speaker": "ale", "text": "episode start"})
        else:
            reward = float(ale.act(minimal[a]))
            score += reward
            log.audio.append(np.asarray(ale.getAudio(), np.uint8).copy())


def _video_spec(ale, options: AtariOptions) -> VideoSpec:
    h, w = ale.getScreenDims()
    return VideoSpec(w * options.upscale, h * options.upscale, FPS, max(1, round(options.gop_seconds * FPS)))


def record_session(out: Path, ale_py, game: str, policy_id: str, index: int, options: AtariOptions) -> Recording:
    """Record session ``index`` of ``game`` into ``out/<session_id>``. ``clocks`` caches the container
    clock probe by video size across sessions."""
    rom = rom_id(game)
    title = title_of(rom)
    player_seed = options.seed + index
    player = f"{policy_id}-s{player_seed}"
    session_id = check_session_id(f"game {game!r}", f"{title.lower()}-{player}-{index:04d}")
    ale_seed, rng = _seeds(options.seed, rom, index)
    ale, mode = _emulator(ale_py, rom, ale_seed, options.difficulty, options.mode)
    video = _video_spec(ale, options)
    n = round(options.seconds * FPS)
    times = frame_times(n, FPS)
    policy = _POLICY_CLASSES[policy_id]([a.name for a in ale.getMinimalActionSet()], rom, rng)
    spec = SessionSpec(
        session_id=session_id,
        title=title,
        player=player,
        video=video,
        platform="atari2600",
        build=f"ale-py {ale_py.__version__}",
        started_at=f"2026-11-{1 + index % 28:02d}T10:00:00Z",
        conditions={
            "difficulty": str(options.difficulty),
            "mode": str(mode),
            "frameskip": "1",
            "repeat_action_probability": str(REPEAT_ACTION_PROBABILITY),
        },
    )
    log = _Log()
    # write_session encodes the frames first (stepping the emulator, which fills the lists in log) and
    # writes the streams after; the line count check below guards that order.
    directory = write_session(
        out / session_id,
        spec,
        _play(ale, policy, times, options.upscale, log),
        log.actions,
        log.telemetry,
        log.text,
        audio=AudioSource(AUDIO_RATE, 1, log.take_audio),
    )
    with open(directory / "telemetry.jsonl", "rb") as f:
        lines = sum(1 for _ in f)
    if len(log.played) != n or lines != n:
        raise DsbuildError(f"{directory}: wrote {lines} telemetry lines for {len(log.played)} of {n} frames")
    return Recording(directory, session_id, title, player, tuple(log.played), log.episodes)


def record(out: Path, options: AtariOptions) -> list[Recording]:
    """Record ``options.sessions`` sessions of each game under ``out``; returns them in write order."""
    ale_py = require_ale()
    out = Path(out)
    roms = [rom_id(g) for g in options.games]
    if len(set(roms)) != len(roms):
        raise UsageError(f"--games lists a game twice: {', '.join(options.games)}")
    unknown = [g for g, rom in zip(options.games, roms) if _rom_path(ale_py, rom) is None]
    if unknown:
        raise UsageError(
            f"unknown Atari game(s) {', '.join(unknown)}; e.g. {', '.join(DEFAULT_GAMES)} "
            f"(any ale-py ROM id such as space_invaders also works)"
        )
    recordings = []
    for game in options.games:
        for j in range(options.sessions):
            policy_id = options.policies[j % len(options.policies)]
            recordings.append(record_session(out, ale_py, game, policy_id, j, options))
    return recordings
