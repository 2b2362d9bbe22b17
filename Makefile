# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := demo

.PHONY: demo test venv clean

$(BIN)/dsbuild: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/dsbuild

demo: venv
	rm -rf $(DEMO)
	$(BIN)/dsbuild samples $(DEMO)/captures --sessions 6 --seconds 20 --seed 7
	$(BIN)/dsbuild convert $(DEMO)/captures $(DEMO)/catalog-wds --format webdataset --shard-size 8MB
	$(BIN)/dsbuild convert $(DEMO)/captures $(DEMO)/catalog-parquet --format parquet --shard-size 8MB
	$(BIN)/dsbuild convert sample_data/captures $(DEMO)/catalog-committed --format webdataset

test: venv
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) $(DEMO)
