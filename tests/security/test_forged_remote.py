"""A forged, re-pinned catalog on an object store is refused as the same catalog is on a local disk:
``push`` will not publish it, so the forger writes the bucket's objects directly; then ``verify`` reports
the shard (exit 1), and ``shards``, every export and ``pull`` refuse it in one line naming it (exit 3),
as does the loader (none of the damaged samples delivered). ``shards`` fetches the listed shards
through the local cache to check them, as ``verify`` reads them."""

from __future__ import annotations

from pathlib import Path

from dsbuild.lineage.catalog import Catalog
from dsbuild.loader import Loader
from tests.security.driver import drive
from tests.security.test_forged_shards import SWEEP, check_sweep, shard0

# The commands run per case: all of them over a link, those that fetch a shard through the cache (whose
# size it checks on arrival) over a truncated shard.
CASES = {"symlink": tuple(SWEEP), "truncated": ("verify", "shards", "pull")}


def upload(cat: Path, prefix: str) -> str:
    """Every object of the local catalog ``cat`` written under s3://data/``prefix`` as it is (no dsbuild
    check in the way, as an attacker with write access to the bucket would); returns the catalog's URL."""
    import boto3

    client = boto3.client("s3")
    for f in sorted(cat.rglob("*")):
        if f.is_file() and ".tmp" not in f.relative_to(cat).parts:
            client.put_object(Bucket="data", Key=f"{prefix}/{f.relative_to(cat).as_posix()}", Body=f.read_bytes())
    return f"s3://data/{prefix}"


def objects(prefix: str) -> list[str]:
    import boto3

    return [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="data", Prefix=prefix).get("Contents", [])]


def test_every_way_out_refuses_a_forged_catalog_on_an_object_store(s3, forged, tmp_path):
    cats = {case: forged(case) for case in CASES}
    pushes = [(case, "push", ["push", str(cat), f"s3://data/pushed-{case}"]) for case, (cat, _) in cats.items()]
    urls = {case: upload(cat, f"forged-{case}") for case, (cat, _) in cats.items()}
    plan = [
        (case, name, [name.split("-")[0], urls[case], *(a.format(out=tmp_path / f"{case}-{name}") for a in args)])
        for case, names in CASES.items()
        for name, (args, _) in SWEEP.items()
        if name in names
    ]
    results = drive([args for *_, args in pushes + plan])
    shards = {case: shard0(*cats[case]) for case in CASES}
    check_sweep(pushes + plan, results, shards, tmp_path)
    for case in CASES:  # push published nothing: no version, no shard
        assert not objects(f"pushed-{case}/"), objects(f"pushed-{case}/")
    damaged = {
        r["key"]
        for r in Catalog.open(urls["symlink"]).index(cats["symlink"][1]).to_pylist()
        if r["shard"] == shards["symlink"]
    }
    loader = Loader(urls["symlink"], decode="bytes", batch_size=2, seed=1)
    delivered = {k for b in loader for k in b["keys"]}
    refused = {k.split(":")[0] for k in loader.stats()["corrupt_keys"]}
    assert refused and refused <= damaged and not delivered & refused, loader.stats()
