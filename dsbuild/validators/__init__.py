"""Validation of a dataset version: named checks, an acceptance spec, and reports.

Python::

    from dsbuild.core.executor import ExecutorSpec
    from dsbuild.validators import ValidateOptions, load_spec, validate, to_junit, write_html
    report = validate("catalog", None, load_spec("sample_data/acceptance.toml"),
                      ValidateOptions(level="full", split="main"), executor=ExecutorSpec(workers=2),
                      progress=lambda done, total, stage: print(stage, done, total))
    report.accepted, report.check("decode").offenders
    report.raise_if_rejected()          # CheckFailed naming the failed checks (the CLI's exit 1)

Every check is one ``base.Check`` in its module under ``checks/`` (``registry.CHECKS`` lists them): its
name, stage, what it proves, thresholds with defaults and reasons, severity, level, and the code that
runs it. ``model`` holds the report records; ``run`` orders the work; ``report`` writes JSON and JUnit
XML, ``table`` the terminal table, ``html`` one self-contained page.
"""

from __future__ import annotations

import importlib

# Names -> the module that defines them, imported on first use (PEP 562): a validation forks its workers
# before the report modules (HTML charts, JUnit) load, so the pass does not wait for them.
_EXPORTS = {
    "html_page": "html",
    "render_html": "html",
    "write_html": "html",
    "CheckResult": "model",
    "Distribution": "model",
    "Offender": "model",
    "Report": "model",
    "Summary": "model",
    "Table": "model",
    "CHECKS": "registry",
    "to_json": "report",
    "to_junit": "report",
    "ValidateOptions": "run",
    "validate": "run",
    "AcceptanceSpec": "spec",
    "default_spec": "spec",
    "load_spec": "spec",
    "parse_spec": "spec",
    "report_table": "table",
    "verdict_line": "table",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
