"""Epoch order as pure arithmetic: a keyed bijection on [0, n), so no worker ever holds an O(n) table.

``global_order`` is a 4-round Feistel network over the smallest even-bit power of two >= n, with cycle
walking back into [0, n) (a standard format-preserving permutation). ``block_order`` trades randomness
for I/O locality: it permutes blocks of consecutive samples (which live in the same shards) and
shuffles samples only within a window of a few blocks. Both are vectorised over positions.
"""

from __future__ import annotations

import hashlib

import numpy as np

ROUNDS = 4


def derive_key(*parts: object) -> int:
    """A 64-bit key from the user's seed and context (epoch, version, split): never time or pid."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _mix(x: np.ndarray, key: int) -> np.ndarray:
    """splitmix64 finaliser of (x + key): a fast, well-distributed round function."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(key)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _feistel(x: np.ndarray, half_bits: int, key: int) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    left, right = x >> np.uint64(half_bits), x & mask
    for r in range(ROUNDS):
        left, right = right, left ^ (_mix(right, derive_round(key, r)) & mask)
    return (left << np.uint64(half_bits)) | right


def derive_round(key: int, r: int) -> int:
    return (key * 0x9E3779B97F4A7C15 + r * 0xD1B54A32D192ED03) & 0xFFFFFFFFFFFFFFFF


def permute(positions: np.ndarray, n: int, key: int) -> np.ndarray:
    """The keyed permutation of [0, n) evaluated at ``positions`` (int array). Pure and O(len)."""
    if n <= 1:
        return np.zeros(len(positions), dtype=np.int64)
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    x = np.asarray(positions, dtype=np.uint64)
    out = _feistel(x, half_bits, key)
    todo = out >= np.uint64(n)
    while todo.any():  # cycle walking: expected < 4 extra rounds since the domain is < 4n
        out[todo] = _feistel(out[todo], half_bits, key)
        todo = out >= np.uint64(n)
    return out.astype(np.int64)


def global_order(n: int, key: int, start: int, count: int) -> np.ndarray:
    """Sample indices at epoch positions [start, start + count)."""
    stop = min(n, start + count)
    return permute(np.arange(start, stop, dtype=np.int64), n, key)


def block_order(n: int, key: int, start: int, count: int, block: int, window: int) -> np.ndarray:
    """Locality mode: blocks of ``block`` consecutive samples in permuted order, samples shuffled
    within windows of ``window`` blocks. Reads stay within ~window blocks at a time."""
    stop = min(n, start + count)
    n_blocks = -(-n // block)
    span = block * window
    out = []
    pos = start
    while pos < stop:
        w = pos // span
        members = _window_samples(n, key, w, block, window, n_blocks)
        lo = pos - w * span
        take = members[lo : lo + (stop - pos)]
        out.append(take)
        pos += len(take)
        if len(take) == 0:
            break
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _window_samples(n: int, key: int, w: int, block: int, window: int, n_blocks: int) -> np.ndarray:
    """Samples of window ``w`` in their shuffled order. Only the last block of the dataset may be short,
    so every window but one holds exactly block*window samples; the short one is last in the epoch."""
    full = n // block  # blocks with `block` samples; block index `full` (if any) is the short tail
    slots = np.arange(w * window, min((w + 1) * window, n_blocks), dtype=np.int64)
    blocks = _block_permutation(slots, n_blocks, full, key)
    samples = (blocks[:, None] * block + np.arange(block)[None, :]).reshape(-1)
    samples = samples[samples < n]
    inner = permute(np.arange(len(samples)), len(samples), derive_key(key, "window", w))
    return samples[inner]


def _block_permutation(slots: np.ndarray, n_blocks: int, full: int, key: int) -> np.ndarray:
    """Permute the full blocks; a short tail block keeps the last slot so window sizes stay computable."""
    out = slots.copy()
    is_full_slot = slots < full
    out[is_full_slot] = permute(slots[is_full_slot], full, derive_key(key, "blocks"))
    return out
