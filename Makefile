# A fresh clone needs only `make run` and `make test`; both set up the .venv first when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SHARED ?= ../shared
STAMP := $(VENV)/.installed

.PHONY: setup run lint test test-quick bench fuzz paper-quick paper defaults stm32n6 op-lists clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,images,plots,sweep]'
	touch $(STAMP)

run: setup
	$(PY) -m experiments.run_default --shared $(SHARED)

lint: setup
	$(PY) -m ruff check .

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) -m experiments.bench --shared $(SHARED)

fuzz: setup
	$(PY) -m pytest -q tests/test_fuzz.py --fuzz-examples 20000

paper-quick: setup
	$(PY) -m experiments.study --grid quick --shared $(SHARED)

paper: setup
	$(PY) -m experiments.study --grid full --shared $(SHARED) --readme
	$(PY) -m experiments.study --grid steprules --shared $(SHARED) --readme
	$(PY) -m experiments.study --grid design-steprules --shared $(SHARED)
	$(PY) -m experiments.study --grid v3 --shared $(SHARED)
	$(PY) -m experiments.study --grid v31 --shared $(SHARED) --readme

defaults: setup
	$(PY) -m experiments.defaults_table --shared $(SHARED) --readme

# The op lists of docs/numerics.md and docs/stm32n6.md, from npusim/registry.py.
op-lists: setup
	$(PY) -m experiments.op_lists

stm32n6: setup
	$(PY) -m experiments.stm32n6_table --shared $(SHARED) --readme --docs

clean:
	rm -rf $(VENV) build *.egg-info
