"""Which baselines a run compares with: only readers doing the same work as ours in its decode mode.

  frames mode : pyav (decoded frames against a bare decode loop in threads; never against byte reads), or
                with worker processes (``--workers``), pyav-procs (the same loop in as many processes);
                ``--compare`` may name either
  bytes mode  : raw, sha256 (only when ours verifies), webdataset (tar shards), litdata, mosaic
Without ``--compare`` every one that applies runs, and one that cannot run here (a peer not installed,
webdataset on Parquet shards) is listed as skipped with the reason. Naming one that does not apply to
the mode is a usage error; naming a peer that is not installed is a missing dependency.
"""

from __future__ import annotations

from pathlib import Path

from dsbuild.bench import baselines, peers
from dsbuild.bench.dataset import Dataset
from dsbuild.bench.options import BenchOptions
from dsbuild.core.errors import UsageError

DESCRIPTIONS = {
    "pyav": "bare PyAV decode loop over the same clips in memory, same threads and resize",
    "pyav-procs": "bare PyAV decode loop in as many processes as ours has workers, each its share of the clips",
    "raw": "sequential read of the same shard files, 8 MiB reads, no parsing or hashing",
    "sha256": "the same reads + hashlib sha256 in as many threads as ours (the verify floor)",
    "webdataset": "the webdataset library iterating the same tar shards",
    "litdata": "LitData StreamingDataset over the same member bytes (its chunks, its writer)",
    "mosaic": "Mosaic Streaming StreamingDataset over the same member bytes (MDS shards, its writer)",
}
NAMES = tuple(DESCRIPTIONS)


def applicable(o: BenchOptions) -> tuple[str, ...]:
    """The baselines doing the same work as ours under these options (run without ``--compare``)."""
    if o.decode == "frames":
        return ("pyav-procs",) if o.workers is not None else ("pyav",)
    return ("raw", *(("sha256",) if o.verify != "none" else ()), "webdataset", *peers.PEERS)


def _cannot(name: str, data: Dataset) -> str | None:
    if name == "webdataset" and data.facts.shard_format != "webdataset":
        return f"the version's shards are {data.facts.shard_format}, not tar"
    if name in peers.PEERS:
        return peers.PEERS[name].missing()
    return None


def wanted(o: BenchOptions) -> list[str]:
    """The baselines these options ask for; a name that is unknown, does not fit the options or whose peer
    is not installed is refused here, from the options alone (a run checks before it starts anything)."""
    if o.compare is None:
        return list(applicable(o))
    fits = ("pyav", "pyav-procs") if o.decode == "frames" else applicable(o)
    for name in o.compare:
        if name not in NAMES:
            raise UsageError(
                f"--compare: unknown baseline {name!r}", hint=f"choose from {', '.join(NAMES)}, auto or none"
            )
        if name not in fits:
            raise UsageError(
                f"--compare {name}: not comparable with --decode {o.decode}"
                + (" --verify none" if name == "sha256" else ""),
                hint=f"with these options the baselines are: {', '.join(fits)}",
            )
        if name in peers.PEERS:
            peers.require(name)
    return list(o.compare)


def choose(o: BenchOptions, data: Dataset, scratch: Path) -> tuple[list[baselines.Baseline], dict[str, str]]:
    """(baselines to run, {name: why skipped}) for this run."""
    threads = o.threads * o.ranks
    active: list[baselines.Baseline] = []
    skipped: dict[str, str] = {}
    for name in wanted(o):
        why = _cannot(name, data)
        if why:
            if o.compare is not None:
                raise UsageError(f"--compare {name}: {why}")
            skipped[name] = why
        elif name == "pyav":
            active.append(baselines.PyAV(data, threads, o.resize))
        elif name == "pyav-procs":
            active.append(baselines.PyAVProcs(data, threads, o.resize, scratch))
        elif name == "raw":
            active.append(baselines.ShardReads("raw", data, threads, hashed=False))
        elif name == "sha256":
            active.append(baselines.sha256(data, threads))
        elif name == "webdataset":
            active.append(baselines.WebDatasetLib(data))
        else:
            active.append(peers.PEERS[name](data, scratch))
    return active, skipped
