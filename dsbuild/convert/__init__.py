"""Building a dataset version: discover sessions, cut clips, write shards in parallel, commit."""

from dsbuild.convert.build import ConvertResult, convert
from dsbuild.convert.config import ConvertConfig

__all__ = ["ConvertConfig", "ConvertResult", "convert"]
