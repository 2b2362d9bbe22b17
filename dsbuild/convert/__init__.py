"""Building a dataset version: discover sessions, cut clips, write shards in parallel, commit."""

from dsbuild.convert.build import ConvertResult, Progress, convert
from dsbuild.convert.config import ConvertConfig, parse_size

__all__ = ["ConvertConfig", "ConvertResult", "Progress", "convert", "parse_size"]
