"""Write the LeRobot test datasets in this folder with the real `lerobot` writer (tests never need it).

    v21/  written by lerobot==0.3.3 (codebase_version v2.1: one episode per file)
    v30/  written by lerobot==0.4.4 (codebase_version v3.0: episodes share files; meta/episodes/*.parquet)

Each: 3 episodes (12, 15 and 10 frames at 10 fps), 64x64 synthetic frames for one camera stored as video
(`observation.images.front`, the writer's default codec: AV1 by libsvtav1) and one stored as PNG images in
the parquet (`observation.images.wrist`), `observation.state` (3 floats), `action` (2 floats, outside
[-1, 1]: joint targets in radians) and two tasks. 64x64 because SVT-AV1 refuses smaller pictures.

To remake them (Python 3.11; each version in its own venv, never the project's):

    python3.11 -m venv /tmp/lr033 && python3.11 -m venv /tmp/lr044
    pip download --no-deps -d /tmp/lrdl lerobot==0.3.3 ; pip download --no-deps -d /tmp/lrdl lerobot==0.4.4
    /tmp/lr033/bin/pip install --no-deps torch==2.13.0 /tmp/lrdl/lerobot-0.3.3-py3-none-any.whl
    /tmp/lr033/bin/pip install 'datasets<=3.6.0,>=2.19.0' 'huggingface-hub>=0.34.2' 'av>=14.2.0' jsonlines \
        pillow numpy draccus==0.10.0 'deepdiff>=7.0.1,<9' einops termcolor 'imageio[ffmpeg]' \
        filelock typing-extensions sympy networkx jinja2 fsspec 'setuptools>=77,<81' 'packaging<26'
    /tmp/lr044/bin/pip install --no-deps torch==2.13.0 /tmp/lrdl/lerobot-0.4.4-py3-none-any.whl
    /tmp/lr044/bin/pip install 'datasets<5,>=4.0.0' 'huggingface-hub>=0.34.2,<0.36' 'av>=15,<16' jsonlines \
        pillow numpy draccus==0.10.0 'deepdiff>=7.0.1,<9' einops termcolor 'imageio[ffmpeg]' \
        filelock typing-extensions sympy networkx jinja2 fsspec 'setuptools>=77,<81' 'packaging<26'
    rm -rf sample_data/lerobot/v21 sample_data/lerobot/v30
    /tmp/lr033/bin/python sample_data/lerobot/make.py sample_data/lerobot/v21
    /tmp/lr044/bin/python sample_data/lerobot/make.py sample_data/lerobot/v30

Made on 2026-12-06 with: v21 by lerobot 0.3.3, datasets 3.6.0, av 18.1.0 (SVT-AV1 4.1.0), pyarrow 26.0.1;
v30 by lerobot 0.4.4, datasets 4.8.5, av 15.1.0, pyarrow 26.0.1; both torch 2.13.0+cpu, numpy 2.4.6.

Why --no-deps: lerobot pins torch<2.8 (0.3.3) and <2.11 (0.4.4), whose PyPI builds are multi-GB CUDA
wheels; the writer runs on torch 2.13.0 (CPU) as it is. torchvision is not installed: PyPI's build does
not load beside that torch, and the writer never calls it. `lerobot.datasets.utils` and `video_utils`
import it at module level only for reading (`transforms.ToTensor` in `hf_transform_to_torch`, the
`torchvision` video backend); this script puts a stub module in its place whose every use raises, so a
write path that did call torchvision would fail here rather than write something else.
The AV1 encode is not bit-reproducible across SVT-AV1 builds: remade datasets may differ in video bytes,
never in what the tests check (frame count, times, parquet values).
"""

from __future__ import annotations

import shutil
import sys
import types
from importlib.metadata import version
from pathlib import Path

import numpy as np

FPS = 10
LENGTHS = (12, 15, 10)
TASKS = ("pick the red cube", "push the block to the left", "pick the red cube")
SIZE = 64


def _stub_torchvision() -> None:
    def refuse(*_a, **_k):
        raise RuntimeError("torchvision was called by the writer: install a real torchvision")

    def attr(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return refuse

    tv = types.ModuleType("torchvision")
    for name in ("transforms", "io"):
        sub = types.ModuleType(f"torchvision.{name}")
        sub.__getattr__ = attr  # type: ignore[method-assign]
        setattr(tv, name, sub)
        sys.modules[f"torchvision.{name}"] = sub
    tv.set_video_backend = refuse  # type: ignore[attr-defined]
    tv.__version__ = "0.0-stub"  # type: ignore[attr-defined]
    sys.modules["torchvision"] = tv


def frame(episode: int, i: int, camera: int) -> np.ndarray:
    """A moving square over a gradient: every frame differs, and the picture compresses to little."""
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    img = np.stack([(x * 4 + i * 8) % 256, (y * 4 + episode * 60) % 256, np.full_like(x, 80 * camera)], -1)
    at = (i * 4) % (SIZE - 16)
    img[at : at + 16, at : at + 16] = (255, 255 - 60 * episode, 0)
    return img.astype(np.uint8)


def values(episode: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """observation.state (3 floats) and action (2 floats, radians, outside [-1, 1])."""
    t = i / FPS
    state = np.array([np.sin(t + episode), np.cos(t) * 2.0, 0.1 * i - episode], dtype=np.float32)
    action = np.array([2.5 * np.sin(0.7 * t) + episode, -3.0 + 0.25 * i], dtype=np.float32)
    return state, action


def main(root: Path) -> None:
    import datasets  # noqa: F401  (before the stub: it looks for torchvision once, and finds none)

    _stub_torchvision()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    image = {"shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]}
    features = {
        "observation.images.front": {"dtype": "video", **image},
        "observation.images.wrist": {"dtype": "image", **image},
        "observation.state": {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["shoulder", "elbow"]},
    }
    ds = LeRobotDataset.create("dsbuild/synthetic", FPS, features, root=root, robot_type="synthetic_arm")
    v3 = hasattr(ds, "finalize")  # 0.4 (v3.0) takes the task in the frame and closes files in finalize()
    for ep, (n, task) in enumerate(zip(LENGTHS, TASKS, strict=True)):
        for i in range(n):
            state, action = values(ep, i)
            row = {
                "observation.images.front": frame(ep, i, 0),
                "observation.images.wrist": frame(ep, i, 1),
                "observation.state": state,
                "action": action,
            }
            if v3:
                ds.add_frame({**row, "task": task})
            else:
                ds.add_frame(row, task=task)
        ds.save_episode()
    if v3:
        ds.finalize()
    shutil.rmtree(root / "images")  # the writer's scratch PNGs of the image feature: the parquet holds their bytes
    print(f"lerobot {version('lerobot')} wrote {root}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
