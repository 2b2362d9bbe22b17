"""The checks, one module per concept: structural (bytes and layout), clips (decoded clips and arrays, with
their pure measurements in ``content``), dataset (coverage, duplicates, balance) and splits (leakage,
coverage). ``validators.registry`` lists them."""
