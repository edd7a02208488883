# hvdkit: the two commands of the README, and a few more.
#   make train   horovodrun -np 4 on the embedded digits data (installs what is missing first)
#   make test    the whole test suite (installs what is missing first); make test-quick: not the slow
#                cases, not the emulated cluster, on two pytest workers
#   the stack follows the interpreter (launch/install.sh, launch/stack.py): make train PYTHON=python3.12
#   (tf218), TF_STACK=tf218 on 3.10/3.11; a VENV of its own per stack (make setup VENV=DIR PYTHON=...)
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
# make test runs in one process. On pytest workers (WORKERS="-n 2 --dist loadgroup"; tests/conftest.py
# groups the tests) a full run took 17:32 on two and 17:34 on three (the emulated-cluster group is one
# worker's serial path, slowed by the others) and timing-bound cluster cases failed under that load;
# the quick tier, which has no cluster group, runs on two
WORKERS ?=
QUICK_WORKERS ?= -n 2 --dist loadgroup

.PHONY: setup train test test-quick clean

setup:
	bash launch/install.sh

train: setup
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/horovodrun -np $(NP) $(PY) -m hvdkit.train $(ARGS)

test: setup
	$(PY) -m pytest -ra --durations=25 $(WORKERS) -m "not gpu_build" tests

test-quick: setup
	$(PY) -m pytest -ra $(QUICK_WORKERS) -m "not slow and not cluster and not gpu_build" tests

clean:
	rm -rf runs results .pytest_cache
