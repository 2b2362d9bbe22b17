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

from dsbuild.validators.html import html_page, render_html, write_html
from dsbuild.validators.model import CheckResult, Distribution, Offender, Report, Summary, Table
from dsbuild.validators.registry import CHECKS
from dsbuild.validators.report import to_json, to_junit
from dsbuild.validators.run import ValidateOptions, validate
from dsbuild.validators.spec import AcceptanceSpec, default_spec, load_spec, parse_spec
from dsbuild.validators.table import report_table, verdict_line

__all__ = ["CHECKS", "AcceptanceSpec", "CheckResult", "Distribution", "Offender", "Report", "Summary", "Table",
           "ValidateOptions", "default_spec", "load_spec", "parse_spec", "render_html", "report_table",
           "to_json", "to_junit", "validate", "verdict_line", "write_html", "html_page"]
