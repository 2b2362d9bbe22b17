"""`dsbuild split`: assign the groups of a version to named splits and store the split set in the catalog."""

from __future__ import annotations

import typer

from dsbuild.cli.render import console, print_json


def split(
    ref: str = typer.Argument(..., help="Catalog folder, optionally PATH@VERSION (id, unique prefix or tag; "
                                        "default: the newest version)."),
    name: str = typer.Option(..., "--name", help="Name of the split set, e.g. main."),
    by: str = typer.Option(None, "--by", help="Group field: session_id, title, player, platform, build or "
                                              "conditions.<key>. A group is never in two splits. Default: player."),
    ratios: str = typer.Option(None, "--ratios", help="NAME=RATIO,... summing to 1. "
                                                      "Default: train=0.8,val=0.1,test=0.1."),
    salt: str = typer.Option(None, "--salt", help="Key of the hash; another salt gives another split. "
                                                  "Default: dsbuild."),
    stratify: str = typer.Option(None, "--stratify", help="Field (e.g. title) whose every value should reach "
                                                          "every split; '' turns off an inherited one."),
    pin: list[str] = typer.Option([], "--pin", help="SPLIT=FILE: a frozen split holding exactly the group "
                                                    "values listed in FILE, one per line (repeatable)."),
    from_split: str = typer.Option(None, "--from-split", help="Carry the assignments of a split set of another "
                                                              "version: VERSION/NAME, NAME or its folder."),
    check: bool = typer.Option(False, "--check", help="Recompute the stored split set and exit 1 unless it "
                                                      "matches its rule and no group is in two splits."),
    force: bool = typer.Option(False, "--force", help="Replace a different split set of the same name."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Split a version by a keyed hash of a group field: reproducible, and stable as captures are added."""
    from dsbuild.lineage.catalog import parse_ref
    from dsbuild.split import SplitOptions, check_split, make_split
    from dsbuild.split.check import SplitCheckFailed
    from dsbuild.split.params import parse_pin

    path, version = parse_ref(ref)
    pins = [parse_pin(p) for p in pin] or None
    options = SplitOptions(by=by, ratios=ratios, salt=salt, stratify=stratify, pins=pins, from_split=from_split)
    if check:
        result = check_split(path, version, name, options if (options.given() or from_split) else None)
        if as_json:
            print_json(result.to_json())
        else:
            _render_check(result)
        if not result.ok:
            raise SplitCheckFailed(f"split set {name!r} of version {result.version_id[:12]} does not match its "
                                   f"rule ({len(result.problems)} problem(s))")
        return
    result = make_split(path, version, name, options, force=force)
    if as_json:
        print_json(result.to_json())
    else:
        _render(result)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _render(r) -> None:
    from rich.table import Table

    m = r.manifest
    p = m["parameters"]
    console.print(f"[bold]split set {r.name}[/] {r.state} for version {r.version_id[:12]}  "
                  f"(hash {m['hash'][:12]})", highlight=False)
    console.print(f"by {p['by']}, salt {p['salt']!r}" + (f", stratified by {p['stratify']}" if p["stratify"] else "")
                  + (f", from {m['carried']['from'][:12]}/{p['from_split']['name']}" if m["carried"] else ""),
                  highlight=False)
    t = Table("split", "requested", "groups", "samples", "share (groups)", "share (samples)", "target ± std")
    for split, s in m["splits"].items():
        t.add_row(split + (" (pinned)" if s["pinned"] else ""), _fmt(s["requested"]), str(s["groups"]),
                  str(s["samples"]), _fmt(s["ratio_groups"]), _fmt(s["ratio_samples"]),
                  "-" if s["target"] is None else f"{s['target']:.3f} ± {s['expected_std_groups']:.3f}")
    console.print(t)
    tot = m["totals"]
    console.print(f"{tot['groups']} groups, {tot['assigned_samples']} of {tot['samples']} samples assigned; "
                  f"{len(m['unassigned']['sessions'])} session(s) unassigned", highlight=False)
    if m["carried"]:
        c = m["carried"]
        console.print(f"carried {c['carried_groups']} group(s); {len(c['new_groups'])} new, "
                      f"{len(c['removed_groups'])} removed, {len(c['reassigned_groups'])} reassigned", highlight=False)
        for g, s in list(c["new_groups"].items())[:20]:
            console.print(f"  new group {g} -> {s}", highlight=False)
    if m["stratification"]:
        st = m["stratification"]
        console.print(f"{len(st['strata'])} strata of {st['field']}; {len(st['repaired'])} group(s) moved to "
                      f"cover a split; {len(st['uncovered'])} strata do not reach every split", highlight=False)
    for w in m["warnings"]:
        console.print(f"[yellow]warning[/] {w}", highlight=False)
    console.print(f"written to {r.path}", highlight=False)


def _render_check(r) -> None:
    c = r.checked
    if r.ok:
        console.print(f"[green]ok[/] split set {r.name} of version {r.version_id[:12]} matches its rule: "
                      f"{c['splits']} splits, {c['groups']} groups, {c['samples']} samples, no group in two splits",
                      highlight=False)
        return
    for problem in r.problems:
        console.print(f"[red]problem[/] {problem}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("split")(split)

