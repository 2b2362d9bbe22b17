"""dsbuild: raw game captures -> versioned, validated, deterministic training datasets."""

__version__ = "0.2.0"
