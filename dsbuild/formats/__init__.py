"""Every on-disk byte format: the capture contract reader, video remux/decode, and the shard formats.

Shard formats are found by name (``get_format("webdataset")``); the built-in ones register here.
"""

from dsbuild.formats import parquet, webdataset  # noqa: F401  (registers the built-in shard formats)
from dsbuild.formats.base import Entry, Segment, ShardFormat, ShardReader, format_names, get_format, register_format

__all__ = ["Entry", "Segment", "ShardFormat", "ShardReader", "format_names", "get_format", "register_format"]
