"""Importers: recordings people already have (game videos with input logs, MCAP robot logs) written as
captures that follow the published capture contract (docs/capture-format.md), ready for `convert`.

One module per source. Every importer is deterministic (the same input gives byte-identical captures),
counts every line it drops and every value it guesses, and publishes its output folder whole or not at
all (``common.staged``). Layering: cli -> importers -> formats -> core.
"""
