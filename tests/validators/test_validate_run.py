"""How a validation runs: the per-sample pass through core.executor (in-process, local worker processes or
Ray) gives the same report whatever runs it; options are checked up front."""

from __future__ import annotations

import pytest

from dsbuild.core.errors import UsageError
from dsbuild.core.executor import ExecutorSpec
from dsbuild.validators import ValidateOptions, validate

FULL = ValidateOptions(level="full")


def _comparable(report) -> dict:
    doc = report.to_json()
    doc["summary"].pop("seconds")
    return doc


def test_the_report_does_not_depend_on_the_number_of_workers(wds_catalog):
    one = validate(*wds_catalog, options=FULL, executor=ExecutorSpec(workers=1))
    two = validate(*wds_catalog, options=FULL, executor=ExecutorSpec(workers=2))
    assert _comparable(one) == _comparable(two) and one.accepted


def test_ray_runs_the_same_pass_through_the_same_executor_spec(wds_catalog):
    pytest.importorskip("ray")
    local = validate(*wds_catalog, options=FULL, executor=ExecutorSpec(workers=2))
    ray = validate(*wds_catalog, options=FULL, executor=ExecutorSpec(kind="ray", workers=2))
    assert _comparable(ray) == _comparable(local)


def test_options_are_checked_before_any_work():
    with pytest.raises(UsageError, match="level 'deep': use structural or full"):
        ValidateOptions(level="deep")
    with pytest.raises(UsageError, match="threads must be a whole number >= 0"):
        ValidateOptions(threads=-1)
    with pytest.raises(UsageError, match="workers must be a whole number >= 0"):
        ExecutorSpec(workers=-1)


def test_what_a_validation_needs_before_its_workers_fork_leaves_the_report_modules_unloaded():
    """The parent imports on one core before it forks the workers; the HTML report (charts, thumbnails),
    JUnit's XML and the split modules are loaded only when used (a validation without a split set never
    loads the last)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dsbuild.validators import ValidateOptions, load_spec, validate, verdict_line\n"
        "import dsbuild.validators.run\n"
        "later = ['dsbuild.validators.html', 'dsbuild.validators.charts', 'dsbuild.validators.thumbs',\n"
        "         'xml.etree.ElementTree', 'dsbuild.lineage.splitsets', 'dsbuild.split']\n"
        "print(sorted(m for m in later if m in sys.modules))\n"
        "from dsbuild.validators import html_page\n"
        "print('dsbuild.validators.html' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "True"]
