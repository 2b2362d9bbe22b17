"""Building a dataset version: discover sessions, cut clips, write shards in parallel, commit."""

from dsbuild.convert.build import ConvertResult, Progress, convert
from dsbuild.convert.config import ConvertConfig, parse_size
from dsbuild.convert.plan import ConvertPlan, SessionPlan, plan_convert

__all__ = [
    "ConvertConfig",
    "ConvertPlan",
    "ConvertResult",
    "Progress",
    "SessionPlan",
    "convert",
    "parse_size",
    "plan_convert",
]
