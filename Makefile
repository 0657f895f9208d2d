# A fresh clone needs only `make run` and `make test`; both set up the .venv first when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SHARED ?= ../shared
STAMP := $(VENV)/.installed

.PHONY: setup run lint test test-quick bench fuzz paper defaults stm32n6 op-lists clean

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

# A representative slice for development (CI runs the full `make test`): every op family against
# TFLM at a third of the examples, the int16 paths, the registry and the layout rules, the STM32N6
# view, one ZO training run and the in-process fuzz campaigns at 150 cases. Measured with the
# kernels compiled, 2 cores at load average 4 (other jobs): 114 s of tests, 59 s of CPU.
QUICK_TESTS := tests/test_registry.py tests/test_layout.py tests/test_import_side_effects.py \
	tests/test_ops_tflm.py tests/test_ops_elementwise.py tests/test_ops_int16.py tests/test_ops_movement.py \
	tests/test_npu.py tests/test_neural_art.py tests/test_zo.py::test_training_learns_and_same_seed_same_result tests/test_fuzz.py
test-quick: setup
	NPUSIM_TEST_SCALE=0.3 $(PY) -m pytest -q -x $(QUICK_TESTS) --fuzz-examples 150 \
		--deselect tests/test_fuzz.py::test_fuzz_cli_run

bench: setup
	$(PY) -m experiments.bench --shared $(SHARED)

fuzz: setup
	$(PY) -m pytest -q tests/test_fuzz.py --fuzz-examples 20000

# The pre-registered study of the cost-aware q rule (docs/study.md, v5; its cells were chosen by
# experiments.study.v5_bounds, whose cached bounds it reads); resumes where it stopped. The earlier studies'
# grids (v4, full, steprules, v3, v31, init, quick) run by name with experiments.study.
paper: setup
	$(PY) -m experiments.study.v5_bounds --shared $(SHARED)
	$(PY) -m experiments.study --grid v5 --shared $(SHARED) --workers 2 --readme

defaults: setup
	$(PY) -m experiments.tables.defaults --shared $(SHARED) --docs

# The op lists of docs/numerics.md and docs/stm32n6.md, from npusim/registry.py.
op-lists: setup
	$(PY) -m experiments.tables.op_lists

stm32n6: setup
	$(PY) -m experiments.tables.stm32n6 --shared $(SHARED) --readme --docs

clean:
	rm -rf $(VENV) build *.egg-info
