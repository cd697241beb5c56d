# Every target sets itself up: .venv is (re)built from requirements.txt when missing or stale.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export NO_GCE_CHECK := true
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: train test test-fast bench-setup requirements-check slurm-setup clean

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

# The whole suite: what CI runs. Two workers, a test file each at a time
# (module fixtures are per file): much of the suite waits on subprocesses,
# an emulator's retries and a SLURM cluster, and the other worker trains.
test: $(VENV)/.installed
	$(PY) -m pytest -q -rs -n 2 --dist loadfile tests

# Unit tests only: no training run, no subprocess of train.py (tests marked
# slow are left out).
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m 'not slow' tests

bench-setup: $(VENV)/.bench-installed

# Both requirements files resolve together (pip's resolver, nothing installed).
requirements-check: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet --dry-run --ignore-installed \
	    -r requirements.txt -r requirements-bench.txt

# What tests/test_slurm.py runs a one-node SLURM cluster with: Debian's
# slurmctld, slurmd, slurm-client and munge (as root; nothing to do when they
# are installed). The cluster itself is the tests' own (tests/slurm/).
SLURM_PROGRAMS := munged slurmctld slurmd sbatch scontrol sinfo
slurm-setup:
	@for p in $(SLURM_PROGRAMS); do command -v $$p >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install \
	    -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
	    >/dev/null; \
	fi

clean:
	rm -rf $(VENV) runs
