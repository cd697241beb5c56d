# Every target sets itself up: .venv is (re)built from requirements.txt when missing or stale.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export NO_GCE_CHECK := true
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: train test test-fast bench-setup requirements-check clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	# meshfit's own packages, editable: imports see the working tree.
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# The benchmarks' references (scikit-learn, PyTorch, ...) beside meshfit's pins.
$(VENV)/.bench-installed: $(VENV)/.installed requirements-bench.txt
	$(VENV)/bin/pip install --quiet -r requirements.txt -r requirements-bench.txt
	touch $@

train: $(VENV)/.installed
	$(PY) train.py --config=configs/default.py --workdir=runs/default

# The whole suite: what CI runs.
test: $(VENV)/.installed
	$(PY) -m pytest -q tests

# Unit tests only: no training run, no subprocess of train.py (tests marked
# slow are left out).
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m 'not slow' tests

bench-setup: $(VENV)/.bench-installed

# Both requirements files resolve together (pip's resolver, nothing installed).
requirements-check: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet --dry-run --ignore-installed \
	    -r requirements.txt -r requirements-bench.txt

clean:
	rm -rf $(VENV) runs
