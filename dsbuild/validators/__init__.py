"""Validation of a dataset version: named checks, an acceptance spec, and reports.

Python::

    from dsbuild.validators import ValidateOptions, load_spec, validate, to_junit, write_html
    report = validate("catalog", None, load_spec("sample_data/acceptance.toml"),
                      ValidateOptions(level="full", split="main", workers=2))
    report.accepted, report.check("decode").offenders

Every check is registered in ``spec.CHECKS`` (name, stage, what it proves, thresholds and defaults);
``model`` holds the result records; ``run`` orders the work; ``report`` writes JSON and JUnit XML;
``html`` writes one self-contained page.
"""

from dsbuild.validators.html import render_html, write_html
from dsbuild.validators.model import CheckResult, Offender, Report
from dsbuild.validators.report import to_json, to_junit
from dsbuild.validators.run import ValidateOptions, validate
from dsbuild.validators.spec import (
           CHECKS,
           AcceptanceSpec,
           default_spec,
           load_spec,
           parse_spec,
)

__all__ = ["CHECKS", "AcceptanceSpec", "CheckResult", "Offender", "Report", "ValidateOptions", "default_spec",
           "load_spec", "parse_spec", "render_html", "to_json", "to_junit", "validate", "write_html"]
