"""The models' registry (no torch import): names, shapes, exact parameter counts, memory estimates."""

from __future__ import annotations

from dataclasses import dataclass

from dsbuild.core.errors import UsageError

PATCH = 8  # pixels per patch side: a 64x64 frame is 64 tokens
MLP = 4  # hidden width of a block's MLP, in multiples of the model width
LIST_SHAPE = (8, 64, 64, 5)  # frames, height, width, action dims: the shape the parameter counts are given at


@dataclass(frozen=True, slots=True)
class Size:
    name: str
    dim: int  # model width
    depth: int  # transformer blocks
    heads: int


SIZES = {
    s.name: s
    for s in (
        Size("tiny", 128, 4, 4),  # ~1 M: seconds on a CPU
        Size("small", 256, 6, 4),  # ~5 M
        Size("medium", 512, 8, 8),  # ~25 M
        Size("base", 768, 14, 12),  # ~100 M
    )
}


def size(name: str) -> Size:
    """The named size; an unknown name lists the known ones."""
    if name not in SIZES:
        raise UsageError(f"--model {name!r} is not a model here; known: {', '.join(SIZES)}", hint="bench --model list")
    return SIZES[name]


def tokens(frames: int, height: int, width: int) -> int:
    """Tokens of one clip: a patch of a frame or an action step each."""
    return frames * (height // PATCH) * (width // PATCH) + frames


def parameters(s: Size, frames: int, height: int, width: int, actions: int) -> int:
    """Exact parameter count of ``build(s, ...)`` (tested equal to the module's own count)."""
    d, n_patch = s.dim, (height // PATCH) * (width // PATCH)
    embed = (3 * PATCH * PATCH * d + d) + (actions * d + d) + n_patch * d + frames * d + 2 * d
    block = 2 * (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (d * MLP * d + MLP * d) + (MLP * d * d + d)
    head = 2 * d + d * actions + actions
    return embed + s.depth * block + head


def memory_bytes(s: Size, frames: int, height: int, width: int, actions: int, batch: int, shards: int = 1) -> int:
    """A rank's training memory, estimated high: fp32 weights, gradients and AdamW's two moments (divided
    among ``shards`` ranks under FSDP), ~20 saved activations of the model width per token per block, and
    the attention scores per head (the math path keeps them for the backward pass)."""
    state = 16 * parameters(s, frames, height, width, actions) // shards
    n = tokens(frames, height, width)
    activations = 4 * batch * n * s.depth * (20 * s.dim + s.heads * n)
    return state + activations


def check_shape(frames: int, height: int, width: int) -> None:
    if height % PATCH or width % PATCH or min(height, width) < PATCH:
        raise UsageError(
            f"--resize {height}x{width}: the models cut frames into {PATCH}x{PATCH} patches",
            hint=f"use multiples of {PATCH}, e.g. --resize 64x64",
        )
    if frames < 2:
        raise UsageError(f"--clip-frames {frames}: predicting the next action needs 2 frames or more")
