# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := demo
EXTRAS := dev,docs,importers,torch,ray,s3,peers,jax

.PHONY: demo demo-run test lint readme venv bytecode clean chromium ffmpeg

# Nothing is compiled to bytecode at install: compiling all ~200 packages (466 MB of .pyc) cost about 45 s
# of CPU, and a whole test run imports a third of it. Python saves a module's bytecode the first time it is
# imported, so every Python process make starts may write it, whatever the environment says (CI images
# often set PYTHONDONTWRITEBYTECODE); `bytecode` compiles what dsbuild's commands import ahead of time.
unexport PYTHONDONTWRITEBYTECODE

# torch is pinned (extra "torch"): a plain `torch` pulls a multi-GB CUDA build. ale-py is optional:
# without it the demo falls back to synthetic captures and the Atari tests skip; so do the MuJoCo ones without
# dm-control, mujoco or a working offscreen renderer.
$(BIN)/dsbuild: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile 'torch==2.13.0'  # alone first, by pip: the machine's pip config picks its CPU wheel
	$(BIN)/pip install -q uv || echo "note: uv could not be installed; pip installs the rest (slower)"
	@# uv installs the ~200 packages below in parallel (26 s here, pip 81 s); pip where uv is absent. One
	@# resolve for everything (torch stays 2.13.0); where atari or mujoco cannot be installed, the rest is
	@# installed without them and each is tried on its own. The --no-deps line: litdata and
	@# mosaicml-streaming (their deps are in [peers]), what `from streaming import StreamingDataset` imports
	@# (docs/interop.md) and torchdata's StatefulDataLoader; their declared deps pull a CUDA torch,
	@# torchvision's pin an old one.
	@echo "installing dsbuild[$(EXTRAS),atari,mujoco] with $$([ -x $(BIN)/uv ] && echo uv || echo pip)"
	@install="$(BIN)/pip install -q --no-compile"; [ -x $(BIN)/uv ] && install="$(BIN)/uv pip install -q --python $(BIN)/python"; \
	$$install -e '.[$(EXTRAS),atari,mujoco]' || { $$install -e '.[$(EXTRAS)]' && \
	  { $$install -e '.[atari]' || echo "note: ale-py could not be installed; Atari captures are unavailable"; } && \
	  { $$install -e '.[mujoco]' || echo "note: dm-control/mujoco could not be installed; --source mujoco is unavailable"; }; } && \
	$$install --no-deps 'litdata==0.2.76' 'mosaicml-streaming==0.13.0' 'transformers==5.24.0' \
	  'tokenizers==0.23.3' 'safetensors==0.8.0' 'torchvision==0.16.2' 'torchdata==0.11.0'
	touch $@

venv: $(BIN)/dsbuild

demo: venv bytecode
	@$(MAKE) --no-print-directory demo-run
	@echo
	@echo "dsbuild is installed in .venv: 'source .venv/bin/activate' puts it on your PATH (or call .venv/bin/dsbuild)."

# The demo's steps with the dsbuild in $(BIN): tests/cli/test_demo.py runs them with BIN= the environment the
# tests run in, so the test never builds a second one.
# Atari: 4 players (one per policy and seed), split 2/1/1 by player; synthetic: 12 sessions of 3 players,
# split by session. Either way every title reaches every split and the shares are what is asked for; the
# clips are near-duplicates by nature (sample_data/demo-acceptance.toml says why).
DEMO_BENCH_SECONDS ?= 20
ATARI := $(shell $(BIN)/python -c "import ale_py" 2>/dev/null && echo yes)
DEMO_SPLIT_BY := $(if $(ATARI),player,session_id)

demo-run:
	rm -rf $(DEMO)
	@if [ -n "$(ATARI)" ]; then \
	  $(BIN)/dsbuild samples $(DEMO)/captures --source atari --games Breakout,Pong,MsPacman --sessions 4 \
	    --seconds 20 --policy random,sticky,scripted --seed 0; \
	else \
	  echo "ale-py is not installed: using synthetic captures (pip install 'dsbuild[atari]' for real gameplay)"; \
	  $(BIN)/dsbuild samples $(DEMO)/captures --sessions 12 --seconds 20 --seed 7; \
	fi
	$(BIN)/dsbuild convert $(DEMO)/captures $(DEMO)/catalog --clip-seconds 4 --shard-size 64MB
	$(BIN)/dsbuild convert $(DEMO)/captures $(DEMO)/catalog-parquet --format parquet --clip-seconds 4
	$(BIN)/dsbuild tag $(DEMO)/catalog demo-v1
	$(BIN)/dsbuild verify $(DEMO)/catalog@demo-v1
	$(BIN)/dsbuild split $(DEMO)/catalog --name main --by $(DEMO_SPLIT_BY) --ratios train=0.5,val=0.25,test=0.25 --stratify title
	$(BIN)/dsbuild query $(DEMO)/catalog "select title, count(*) as clips, round(sum(t_end - t_start) / 60, 2) as minutes from samples group by title order by title"
	$(BIN)/dsbuild validate $(DEMO)/catalog --level full --split-set main --acceptance sample_data/demo-acceptance.toml --html $(DEMO)/validate.html --junit $(DEMO)/validate.xml
	$(BIN)/dsbuild bench $(DEMO)/catalog --split main/train --resize 96x96 --batch-size 2 --duration $(DEMO_BENCH_SECONDS) --html $(DEMO)/bench.html
	$(BIN)/dsbuild log $(DEMO)/catalog

# The HTML report test renders pages in headless Chromium (Debian's package); without it that test skips.
chromium:
	@command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } || \
	  echo "note: could not install chromium; the HTML render test will skip"

# The recorder-capture tests write captures with the ffmpeg CLI (Debian's package); without it they skip.
ffmpeg:
	@command -v ffmpeg >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq ffmpeg >/dev/null 2>&1; } || \
	  echo "note: could not install ffmpeg; the recorder-capture tests will skip"

# The bytecode of dsbuild, the tests and every module dsbuild's commands import (all of dsbuild's modules,
# and the parts of torch that bench --model loads on demand), written once here: a venv used outside make
# where PYTHONDONTWRITEBYTECODE is set would otherwise compile them again in every process (torch's alone
# take seconds), and the tests' processes would race to compile them. Only what is missing or stale is written.
bytecode: venv
	@$(BIN)/python -m compileall -q dsbuild tests >/dev/null
	@$(BIN)/python -c "import importlib, pkgutil, dsbuild; \
	  [importlib.import_module(m.name) for m in pkgutil.walk_packages(dsbuild.__path__, 'dsbuild.')]; \
	  import torch._dynamo, torch.distributed.fsdp, torch.profiler, torch.utils.flop_counter"

# Lint and types: ruff (lint and format) over the code and tests, mypy over the package (pyproject.toml).
lint: venv
	$(BIN)/ruff check dsbuild tests benchmarks
	$(BIN)/ruff format --check dsbuild tests benchmarks
	$(BIN)/mypy

test: venv bytecode chromium ffmpeg lint
	$(BIN)/python -m pytest

# Runs every shell block of README.md and docs/*.md as written (tests/cli/test_readme.py).
readme: venv bytecode
	$(BIN)/python -m pytest tests/cli/test_readme.py -q

clean:
	rm -rf $(VENV) $(DEMO)
