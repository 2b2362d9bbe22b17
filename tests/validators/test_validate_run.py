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
