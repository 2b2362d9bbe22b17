"""The checks, one module per concept: structural (bytes and layout), content (decoded clips and arrays),
dataset (coverage, duplicates, balance) and splits (leakage, coverage). The registry is ``spec.CHECKS``."""
