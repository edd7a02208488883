# hvdkit: the two commands of the README, and a few more.
#   make train   horovodrun -np 4 on the embedded digits data (installs what is missing first)
#   make test    the whole test suite (installs what is missing first); make test-quick: not the slow
#                cases, not the emulated cluster, on two pytest workers
#   the stack follows the interpreter (launch/install.sh, launch/stack.py): make train PYTHON=python3.13
#   (tf221; 3.12 too), TF_STACK=tf221 on 3.11; a VENV of its own per stack (make setup VENV=DIR PYTHON=...)
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 4
# make test runs in two parts: every case but the emulated cluster's on pytest workers (WORKERS, default
# two: a test spends much of its time waiting on its ranks, a stall timeout, a restart), then the
# emulated-cluster cases in one process, alone on the machine (one cluster exists at a time, and
# their timing-bound cases failed beside the other workers' jobs when both parts ran together); the
# quick tier (not slow, no cluster) on two workers. WORKERS= (empty) runs the first part in one process.
# Cases marked gpu_build (a GPU image's build) or image (the container image's) are deselected by both.
WORKERS ?= -n 2 --dist loadgroup
QUICK_WORKERS ?= -n 2 --dist loadgroup
DESELECT := not gpu_build and not image

.PHONY: setup train test test-quick clean image

setup:
	bash launch/install.sh

train: setup
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/horovodrun -np $(NP) $(PY) -m hvdkit.train $(ARGS)

test: setup
	$(PY) -m pytest -ra --durations=25 $(WORKERS) -m "not cluster and $(DESELECT)" tests; a=$$?; \
	$(PY) -m pytest -ra --durations=15 -m "cluster and $(DESELECT)" tests; b=$$?; \
	echo "make test: not cluster: status $$a; cluster: status $$b"; [ $$a -eq 0 ] && [ $$b -eq 0 ]

test-quick: setup
	$(PY) -m pytest -ra $(QUICK_WORKERS) -m "not slow and not cluster and $(DESELECT)" tests

# make image: the CPU image on Debian 12 (hvdkit:cpu-bookworm); DEBIAN=trixie for Debian 13, DEBIAN=gpu for
# Dockerfile.gpu. docker where its engine runs, else podman; the base from debootstrap where none can be
# pulled (launch/image.sh, docs/install.md#the-container-images)
DEBIAN ?= bookworm
image:
	bash launch/image.sh $(DEBIAN)

clean:
	rm -rf runs results .pytest_cache
