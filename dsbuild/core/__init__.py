"""The bottom layer: errors, hashing, JSON, safe file I/O, typed records, stores and executors.

Nothing here knows about captures, shards or catalogs; everything above builds on it.
"""
