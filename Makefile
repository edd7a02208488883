# hvdkit: the two commands of the README, and a few more.
#   make train   horovodrun -np 4 on the embedded digits data (installs what is missing first)
#   make test    the whole test suite (installs what is missing first); make test-quick: not the slow
#                cases, not the emulated cluster (about 6 minutes)
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
# three pytest workers (tests/conftest.py groups the tests; a test mostly waits, so 3 fit 2 cores); WORKERS= runs one process
WORKERS ?= -n 3 --dist loadgroup

.PHONY: setup train test test-quick clean

setup:
	bash launch/install.sh

train: setup
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/horovodrun -np $(NP) $(PY) -m hvdkit.train $(ARGS)

test: setup
	$(PY) -m pytest -ra $(WORKERS) tests

test-quick: setup
	$(PY) -m pytest -ra $(WORKERS) -m "not slow and not cluster" tests

clean:
	rm -rf runs results .pytest_cache
