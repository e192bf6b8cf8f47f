# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create .venv with python3.12 when it is missing.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo venv clean gpu-test

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
test: $(STAMP)
	$(PY) -m pytest tests -q

demo: $(STAMP)
	$(PY) examples/demo.py

# On the lent H200 (no install there): PYTHONPATH=. python3 -m pytest -m gpu tests
gpu-test:
	PYTHONPATH=. python3 -m pytest -m gpu tests -q

clean:
	rm -rf $(VENV) .pytest_cache
