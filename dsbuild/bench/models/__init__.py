"""The small world models ``dsbuild bench --model NAME`` trains: a video encoder and an action head.

A clip of T frames is cut into P x P patches; each patch becomes a token (a linear patch embedding),
each frame's controller state one more; learned positions for patch, frame and token kind; ``depth``
pre-norm transformer blocks over all of a clip's tokens; a head that predicts, from each frame's action
token, the controller state of the next frame (mean squared error). One family, sizes by width and
depth, so the steps of two sizes differ in arithmetic, not in kind.

The registry (``sizes``, no torch import) holds the names, shapes and exact parameter counts, which
``bench --model list`` prints. ``build`` makes the torch module (``dsbuild.bench.models.world``).
"""

from __future__ import annotations

from dsbuild.bench.models.sizes import (
    LIST_SHAPE,
    MLP,
    PATCH,
    SIZES,
    Size,
    check_shape,
    memory_bytes,
    parameters,
    size,
    tokens,
)

__all__ = [
    "LIST_SHAPE",
    "MLP",
    "PATCH",
    "SIZES",
    "Size",
    "build",
    "check_shape",
    "memory_bytes",
    "parameters",
    "size",
    "tokens",
]


def build(name: str, frames: int, height: int, width: int, actions: int):
    """The torch module of size ``name`` for clips of ``frames`` x ``height`` x ``width`` with ``actions``
    controller dims (imports torch)."""
    from dsbuild.bench.models.world import WorldModel

    check_shape(frames, height, width)
    return WorldModel(size(name), frames, height, width, actions)
