"""SQL over a version with duckdb, in a sandbox.

Views, created only when the SQL names them (so a query costs what it touches, not the history):
``samples`` (the per-sample index, read in place), ``shards`` and ``sources`` (from the manifest),
``lineage`` (every sample joined with its source files, config hash and tool version) and
``versions`` (every version of the catalog, from the commit records).

The sandbox: after the views are registered, duckdb may read only the (proven) index file itself
(``allowed_paths``), external access is disabled and the configuration locked. File functions
(``read_csv``, ``glob``), ``COPY ... TO``, ``ATTACH`` and ``INSTALL``/``LOAD`` then fail with one
line, so a query taken from a pull request cannot read or write the machine. ``unsafe=True`` (the
CLI's ``--unsafe``) skips the sandbox for an analyst's own queries on their own machine.
"""

from __future__ import annotations

import difflib
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dsbuild.core.arrow import array
from dsbuild.core.errors import UsageError
from dsbuild.lineage.catalog import Catalog
from dsbuild.lineage.history import log_entries

VIEWS = ("samples", "shards", "sources", "lineage", "versions")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _mentions(sql: str, name: str) -> bool:
    return re.search(rf"\b{name}\b", sql, re.IGNORECASE) is not None


def _arrow(rows: list[dict], columns: dict[str, str]):
    """A table of ``rows``' ``columns`` ({name: "string" or "int64"}) built from buffers (``pyarrow.table``
    of Python lists imports pandas: 0.16 s a query)."""
    import pyarrow as pa

    return pa.table({c: array([r.get(c) for r in rows], getattr(pa, kind)()) for c, kind in columns.items()})


@contextmanager
def connect(catalog: Catalog, version_id: str, sql: str, *, unsafe: bool = False) -> Iterator:
    """A sandboxed duckdb connection with the views ``sql`` names.

    The index duckdb reads is the very bytes proven against the manifest, written to a private file
    whose name holds no glob or quote characters (a catalog path like ``cat[1]*`` can then neither
    break the view nor widen it to other catalogs)."""
    import duckdb

    needed = {v for v in VIEWS if _mentions(sql, v)}
    if "lineage" in needed:
        needed |= {"samples", "sources"}
    con = duckdb.connect(":memory:")
    allowed = []
    scratch = Path(tempfile.mkdtemp(prefix="dsbuild-query-"))
    try:
        if "samples" in needed:
            path = scratch / "index.parquet"
            path.write_bytes(catalog.index_data(version_id))
            allowed.append(str(path))
            con.execute(f"CREATE VIEW samples AS SELECT * FROM read_parquet({_literal(str(path))})")
        _views(con, catalog, version_id, needed)
        if not unsafe:
            # duckdb allows its spill folder (".tmp" in the working directory unless set): make it private
            con.execute(f"SET temp_directory={_literal(str(scratch / 'spill'))}")
            con.execute(f"SET allowed_paths=[{', '.join(_literal(p) for p in allowed)}]")
            con.execute("SET enable_external_access=false")
            con.execute("SET lock_configuration=true")
        yield con
    finally:
        con.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _views(con, catalog: Catalog, version_id: str, needed: set[str]) -> None:
    m = catalog.manifest(version_id) if needed & {"shards", "sources", "lineage"} else None
    if "shards" in needed and m is not None:  # (m is read whenever one of its views is needed)
        con.register(
            "shards",
            _arrow(
                [s.to_json() for s in m.shards],
                {"path": "string", "sha256": "string", "bytes": "int64", "samples": "int64"},
            ),
        )
    if "sources" in needed:
        con.register(
            "sources",
            _arrow(
                [s.to_json() for s in catalog.sessions(version_id).sources],
                {"session": "string", "role": "string", "path": "string", "sha256": "string", "bytes": "int64"},
            ),
        )
    if "lineage" in needed and m is not None:
        con.execute(f"""CREATE VIEW lineage AS
            SELECT s.key, s.sha256 AS sample_sha256, s.session_id, s.t_start, s.t_end, s.shard, s.byte_offset,
                   s.byte_length, s.row_group, s.row_index, src.role, src.path AS source_path,
                   src.sha256 AS source_sha256, {_literal(m.config_hash)} AS config_hash,
                   {_literal(m.tool_version)} AS tool_version
            FROM samples s JOIN sources src ON src.session = s.session_id""")
    if "versions" in needed:
        con.register(
            "versions",
            _arrow(
                log_entries(catalog),
                {
                    "version_id": "string",
                    "content_id": "string",
                    "created_at": "string",
                    "parent": "string",
                    "format": "string",
                    "samples": "int64",
                    "bytes": "int64",
                },
            ),
        )


def _unknown_table_hint(error: str) -> str | None:
    """For a table that does not exist, the views there are (duckdb's own suggestion only knows the
    views this query named: they are created on demand)."""
    missing = re.match(r"Catalog Error: Table with name (\S+) does not exist", error)
    if missing is None:
        return None
    close = difflib.get_close_matches(missing.group(1).lower(), VIEWS, n=1)
    return (f"did you mean {close[0]!r}? " if close else "") + f"the views are {', '.join(VIEWS)}"


@contextmanager
def _signals_interrupt(con) -> Iterator[list[BaseException]]:
    """Ctrl-C or SIGTERM while ``con`` runs SQL interrupts the query itself, then runs the handler there was;
    yields the list of what that handler raised (duckdb answers it with a bare "Query interrupted").
    duckdb's own answer to the handler's KeyboardInterrupt only cancels the query's tasks and waits for
    them, and a task that a worker thread runs goes on to its end (a large join: minutes, the process deaf
    to Ctrl-C meanwhile); an interrupted connection ends every task at its next chunk. Only handlers set in
    Python are wrapped (an ignored signal stays ignored); off the main thread signals cannot be set."""
    raised: list[BaseException] = []
    if threading.current_thread() is not threading.main_thread():
        yield raised
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    wrapped = {sig: handler for sig, handler in before.items() if callable(handler)}

    def interrupt(signum, frame) -> None:
        con.interrupt()
        try:
            wrapped[signum](signum, frame)
        except BaseException as e:
            raised.append(e)
            raise

    try:
        for sig in wrapped:
            signal.signal(sig, interrupt)
        yield raised
    finally:
        for sig, handler in wrapped.items():
            signal.signal(sig, handler)


def run_query(catalog: Catalog, version_id: str, sql: str, *, unsafe: bool = False) -> tuple[list[str], list[tuple]]:
    import duckdb

    if not sql.strip().strip(";").strip():
        raise UsageError("the query is empty", hint='e.g. "select title, count(*) from samples group by title"')
    with connect(catalog, version_id, sql, unsafe=unsafe) as con, _signals_interrupt(con) as raised:
        try:
            cur = con.execute(sql)
        except RuntimeError as e:  # duckdb's answer to Ctrl-C (or SIGTERM) while it runs: an interrupt
            if "interrupt" in str(e).lower():
                raise (raised[-1] if raised else KeyboardInterrupt()) from None
            raise
        except duckdb.PermissionException as e:
            raise UsageError(
                f"query refused: {str(e).splitlines()[0][:200]}",
                hint="queries run sandboxed (no file access); --unsafe lifts that for your own queries",
            ) from None
        except duckdb.Error as e:
            first = (str(e).splitlines() or [""])[0]
            raise UsageError(f"query failed: {first[:200]}", hint=_unknown_table_hint(first)) from None
        if cur is None:  # nothing but comments: duckdb ran no statement
            raise UsageError(
                "the query has no statement", hint='e.g. "select title, count(*) from samples group by title"'
            )
        if cur.description is None:
            return [], []
        return [d[0] for d in cur.description], cur.fetchall()
