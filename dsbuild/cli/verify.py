"""`dsbuild verify`: re-hash shards against the manifest and check the index; exit 1 on any problem."""

from __future__ import annotations

import typer

from dsbuild.cli.render import console, print_json


def verify(
    ref: str = typer.Argument(..., help="PATH[@VERSION]"),
    sample: int = typer.Option(None, "--sample", help="Check only N shards, chosen by --seed."),
    seed: int = typer.Option(0, "--seed", help="Seed for --sample."),
    threads: int = typer.Option(4, "--threads", help="Shards hashed at once."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Detect missing, truncated and altered shards and index entries that miss their sample."""
    from dsbuild.lineage.catalog import open_ref
    from dsbuild.lineage.verify import verify as run_verify

    catalog, version = open_ref(ref)
    report = run_verify(catalog, version, sample=sample, seed=seed, threads=threads)
    if as_json:
        print_json(report.to_json())
    else:
        state = "[green]OK[/]" if report.ok else f"[red]{len(report.problems)} problem(s)[/]"
        console.print(f"version {version[:12]}: {report.shards_checked} shards, {report.bytes_checked:,} bytes, "
                      f"{report.samples_checked} samples checked: {state}")
        for p in report.problems:
            what = p.get("shard") or p.get("sample") or p.get("index")
            console.print(f"  {p['problem']}: {what}" + (f" ({p['detail']})" if "detail" in p else ""),
                          highlight=False)
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
