"""The dataset card at a catalog's root (``README.md``): what Hugging Face ``datasets`` reads when a user
points ``load_dataset`` at the catalog folder.

Without a card, ``load_dataset("catalog")`` guesses data files from the folder's names and loaded the split
sets' index rows (``splits/.../train.parquet``: columns ``shard``, ``byte_offset``), or every version's
shards at once. The card's ``configs`` name the files to read instead:

- shards HF reads exactly as they are (Parquet: one row a sample, the metadata a JSON string): the newest
  version's shard files, relative to the catalog root, as the split ``train``;
- other shards (WebDataset tars: HF's webdataset builder infers the JSON columns from the first samples,
  so a condition key first seen in a later sample is dropped and a missing one becomes null): a config
  HF refuses while reading the card, its error naming ``dsbuild export --to hf``.

The card is rewritten after each version is published (a commit, a push or pull into the catalog), in one
atomic write, and is no part of any version: version ids, shards, ``verify`` and ``gc`` never read it. A
``README.md`` dsbuild did not write (its second line is not :data:`MARK`) is left as it is, with a note
on stderr, never overwritten.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dsbuild.core.errors import DsbuildError
from dsbuild.core.store import Store
from dsbuild.formats import get_format
from dsbuild.lineage.manifest import Manifest

CARD = "README.md"
MARK = "# dsbuild dataset card, rewritten on every commit: a README.md without this line is left alone"
HF_READS_EXACTLY = ("parquet",)  # shard file extensions HF's builder for that extension reads sample for sample


def card_text(version_id: str, m: Manifest) -> str:
    """The card for the catalog's newest version ``version_id`` (manifest ``m``): the same versions give
    the same bytes, wherever the catalog is (no path in it)."""
    ext = get_format(m.shard_format).ext
    head = ["---", MARK, "configs:"]
    if ext in HF_READS_EXACTLY:
        head += ["- config_name: default", "  data_files:", "  - split: train", "    path:"]
        head += [f"    - {s.path}" for s in m.shards]
        how = f'`datasets.load_dataset(CATALOG, split="train")` reads its {m.stats.samples} samples, one row each.'
    else:
        refusal = (
            f"this dsbuild catalog holds {m.shard_format} shards, which Hugging Face datasets cannot read as they are; "
            f"write a version for it with `dsbuild export CATALOG@VERSION DEST --to hf` and load DEST"
        )
        head += [f"- error: {json.dumps(refusal)}"]
        how = f"Hugging Face datasets cannot read its {m.shard_format} shards as they are: `dsbuild export --to hf` writes them."
    body = [
        "---",
        "",
        "# dsbuild catalog",
        "",
        f"Newest version: `{version_id}` ({m.stats.samples} samples in {len(m.shards)} {ext} shards). {how}",
        "Older versions, tags and split sets: `dsbuild log`, `dsbuild info`.",
        "",
    ]
    return "\n".join(head + body)


def write_card(store: Store, root: Path | None, url: str, version_id: str, m: Manifest) -> None:
    """Write the card for the newest version (under the commit lock, after a version is published) into
    the catalog at ``url`` (``root``: its local folder, None on an object store). Never fails the commit
    that called it: a card that cannot be written is a note on stderr."""
    try:
        if _foreign(store, root):
            _note(
                f"note: {url}/{CARD} is not a card dsbuild wrote: left as it is (Hugging Face datasets "
                "pointed at the catalog reads what it says); remove it for dsbuild's card on the next commit"
            )
            return
        store.write(CARD, card_text(version_id, m).encode())
    except (OSError, DsbuildError) as e:
        _note(f"note: {url}/{CARD}: the dataset card was not written ({e})")


def _foreign(store: Store, root: Path | None) -> bool:
    """Something other than dsbuild's card is at the root under the card's name."""
    head = f"---\n{MARK}\n".encode()
    if root is not None:
        path = root / CARD
        if not os.path.lexists(path):
            return False
        if path.is_symlink() or not path.is_file():
            return True
    elif not store.exists(CARD):
        return False
    return store.read_range(CARD, 0, len(head)) != head


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
