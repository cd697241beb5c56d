# Every target sets itself up: .venv is (re)built from requirements.txt when missing or stale.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export NO_GCE_CHECK := true
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: train test clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	# meshfit's own packages, editable: imports see the working tree.
	$(VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

train: $(VENV)/.installed
	$(PY) train.py --config=configs/default.py --workdir=runs/default

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) runs
