"""Machine-readable reports: JSON (everything) and JUnit XML (one testcase per check, for CI dashboards).

JUnit mapping: fail -> <failure>, skip -> <skipped>, warn -> a passing testcase whose <system-out> starts
with "WARNING" (JUnit has no warning state; CI viewers show system-out beside the test).
"""

from __future__ import annotations

import json
import re

from dsbuild.core.jsonio import pretty_json
from dsbuild.validators.base import STAGES
from dsbuild.validators.model import CheckResult, Report

_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def format_value(v: object, *, digits: int = 6, sep: str = ", ", dash: str = "-") -> str:
    """A measured value or threshold for people: floats to ``digits`` significant digits, dicts as k = v."""
    if v is None:
        return dash
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, dict):
        return sep.join(f"{k} = {format_value(x, digits=digits, sep=sep, dash=dash)}" for k, x in v.items()) or dash
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def xml_safe(text: object) -> str:
    """Text XML 1.0 can hold: control characters and lone surrogates (from hostile names) become U+FFFD."""
    return _NOT_XML.sub("\ufffd", str(text))


def to_json(report: Report) -> str:
    """The whole report: every check with its offenders, distribution and table (``dsbuild.validate/2``)."""
    return pretty_json(report.to_json()).decode()


def _lines(c: CheckResult) -> str:
    out = [c.message, f"measured: {c.measured}", f"threshold: {json.dumps(c.threshold, sort_keys=True)}"]
    if c.offenders:
        out.append(f"offenders ({len(c.offenders)} of {c.offender_count}):")
        out += [f"  {o.kind} {o.item}: {o.detail}" for o in c.offenders]
    return xml_safe("\n".join(out))


def to_junit(report: Report) -> str:
    import xml.etree.ElementTree as ET  # (only for JUnit: not at a validation's start-up)

    counts = report.counts()
    root = ET.Element(
        "testsuites",
        name="dsbuild validate",
        tests=str(len(report.checks)),
        failures=str(counts["fail"]),
        skipped=str(counts["skip"]),
        errors="0",
        time=f"{report.summary.seconds.get('total', 0):.3f}",
    )
    for stage in STAGES:
        checks = [c for c in report.checks if c.stage == stage]
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"dsbuild.validate.{stage}",
            tests=str(len(checks)),
            failures=str(sum(c.status == "fail" for c in checks)),
            errors="0",
            skipped=str(sum(c.status == "skip" for c in checks)),
            time="0",
        )
        props = ET.SubElement(suite, "properties")
        for k, v in (
            ("version_id", report.version_id),
            ("level", report.level),
            ("verdict", report.verdict),
            ("spec", report.spec_source),
            ("split", report.split or ""),
        ):
            ET.SubElement(props, "property", name=k, value=xml_safe(v))
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=f"dsbuild.validate.{stage}", name=c.name, time="0")
            if c.status == "fail":
                ET.SubElement(case, "failure", message=xml_safe(c.message), type=c.name).text = _lines(c)
            elif c.status == "skip":
                ET.SubElement(case, "skipped", message=xml_safe(c.message))
            elif c.status == "warn":
                ET.SubElement(case, "system-out").text = "WARNING " + _lines(c)
            else:
                ET.SubElement(case, "system-out").text = _lines(c)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
