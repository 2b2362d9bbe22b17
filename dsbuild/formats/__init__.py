"""On-disk formats: the capture contract reader, video remux/decode, and the shard writers/readers."""
