"""`dsbuild split`: reproducible, leak-free split sets of a version."""

from __future__ import annotations

import typer

from dsbuild.cli.params import JSON, QUIET, REF
from dsbuild.cli.render import Out

EXAMPLES = """\b
Examples:
  dsbuild split catalog --name main --by player --ratios train=0.8,val=0.1,test=0.1 --stratify title
  dsbuild split catalog --name main --check
  dsbuild split catalog@new --name main --from-split gold/main     # carry groups to a new version
  dsbuild split catalog --name frozen --pin test=eval_players.txt
Exit: 0 written (or identical), 1 --check found a mismatch, 2 bad option or unknown version/split set."""


def split(
    ref: str = REF,
    name: str = typer.Option(..., "--name", "--split-set", metavar="NAME", help="Name of the split set, e.g. main."),
    by: str = typer.Option(
        None,
        "--by",
        metavar="FIELD",
        help="Group field: session_id, title, player, platform, build "
        "or conditions.<key> (default player). A group is never "
        "in two splits.",
    ),
    ratios: str = typer.Option(
        None, "--ratios", metavar="NAME=R,...", help="Ratios summing to 1 (default train=0.8,val=0.1,test=0.1)."
    ),
    salt: str = typer.Option(None, "--salt", metavar="TEXT", help="Key of the hash (default dsbuild)."),
    stratify: str = typer.Option(
        None,
        "--stratify",
        metavar="FIELD",
        help="Field whose every value should reach every split; '' turns an inherited one off.",
    ),
    pin: list[str] = typer.Option(
        [], "--pin", metavar="SPLIT=FILE", help="Freeze SPLIT to exactly the group values listed in FILE (repeatable)."
    ),
    from_split: str = typer.Option(
        None,
        "--from-split",
        metavar="VERSION/NAME",
        help="Carry the assignments of another version's split set (VERSION: id, prefix or tag).",
    ),
    check: bool = typer.Option(
        False, "--check", help="Recompute the stored split set; exit 1 unless it matches its rule."
    ),
    force: bool = typer.Option(False, "--force", help="Replace a different split set of the same name."),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Make or check a split set (reproducible, leak-free).

    Groups go to splits by a keyed hash of a group field: reproducible, and stable as captures are added."""
    from dsbuild.core.errors import CheckFailed
    from dsbuild.lineage.catalog import parse_ref
    from dsbuild.split import SplitOptions, check_split, make_split
    from dsbuild.split.params import parse_pin

    o = Out(as_json, quiet)
    path, version = parse_ref(ref)
    options = SplitOptions(
        by=by,
        ratios=ratios,
        salt=salt,
        stratify=stratify,
        pins=[parse_pin(p) for p in pin] or None,
        from_split=from_split,
    )
    if check:
        r = check_split(path, version, name, options if (options.given() or from_split) else None)
        if as_json:
            o.json(r.to_json())
        elif r.ok:
            c = r.checked
            o.line(
                ("ok", "green"),
                f" split set {name} of version {o.id(r.version_id)} matches its rule: "
                f"{c['splits']} splits, {c['groups']} groups, {c['samples']} samples, no group in two splits",
            )
        for problem in r.problems:
            o.note(("problem ", "red"), problem)
        if not r.ok:
            raise CheckFailed(
                f"split set {name!r} of version {r.version_id[:12]} does not match its rule "
                f"({len(r.problems)} problem(s))"
            )
        return
    made = make_split(path, version, name, options, force=force)
    if as_json:
        return o.json(made.to_json())
    _render(o, made)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _render(o: Out, r) -> None:
    m, p = r.manifest, r.manifest.parameters
    o.line(
        ("split set ", "bold"), (r.name, "bold"), f" {r.state} for version {o.id(r.version_id)} (hash {o.id(m.hash)})"
    )
    o.line(
        f"by {p.by}, salt {p.salt!r}",
        f", stratified by {p.stratify}" if p.stratify else "",
        f", carried from {o.id(m.carried.source)}" if m.carried else "",
    )
    o.table(
        ["split", "requested", "groups", "samples", "share (groups)", "share (samples)", "target ± std"],
        [
            (
                s + (" (pinned)" if x.pinned else ""),
                _fmt(x.requested),
                x.groups,
                x.samples,
                _fmt(x.ratio_groups),
                _fmt(x.ratio_samples),
                "-" if x.target is None else f"{x.target:.3f} ± {x.expected_std_groups:.3f}",
            )
            for s, x in m.splits.items()
        ],
    )
    t = m.totals
    o.line(
        f"{t.groups} groups, {t.assigned_samples} of {t.samples} samples assigned; "
        f"{len(m.unassigned.sessions)} session(s) unassigned"
    )
    if m.carried:
        c = m.carried
        o.line(
            f"carried {c.carried_groups} group(s); {len(c.new_groups)} new, {len(c.removed_groups)} "
            f"removed, {len(c.reassigned_groups)} reassigned"
        )
        o.table(["new group", "split"], list(c.new_groups.items())[:20])
    if m.stratification:
        st = m.stratification
        o.line(
            f"{len(st.strata)} strata of {st.field}; {len(st.repaired)} group(s) moved to cover a split; "
            f"{len(st.uncovered)} strata do not reach every split"
        )
    for w in m.warnings:
        o.note(("warning ", "yellow"), w)
    for h in r.hints:
        o.note(("hint ", "cyan"), h)
    o.line("written to ", r.path)


def register(app: typer.Typer) -> None:
    app.command("split", epilog=EXAMPLES)(split)
