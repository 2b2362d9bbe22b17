"""atheris harness: the shard, manifest, JSON and events parsers accept only what they should."""

import json
import sys

import atheris

with atheris.instrument_imports():
    from dsbuild.core.errors import FormatError
    from dsbuild.core.jsonio import loads_bounded
    from dsbuild.formats.sample import decompress_events
    from dsbuild.formats.webdataset import parse_members
    from dsbuild.lineage.manifest import Manifest


def one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 3)
    body = fdp.ConsumeBytes(len(data))
    try:
        if which == 0:
            parse_members(body)
        elif which == 1:
            Manifest.from_bytes(body, "fuzz")
        elif which == 2:
            loads_bounded(body, max_bytes=1 << 20, what="fuzz")
        else:
            decompress_events(body, limit=1 << 20)
    except FormatError:
        pass
    except json.JSONDecodeError:
        raise


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
