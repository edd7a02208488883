# hvdkit CPU image: TensorFlow (CPU) + Horovod (MPI, Gloo) + Open MPI + mpi4py + hvdkit, on Debian.
#
#   make image                                 # launch/image.sh: base, engine and settings found for you
#   docker build -t hvdkit:cpu .               # by hand, where debian:bookworm-slim can be pulled
#   docker run --rm -v "$PWD/runs:/opt/hvdkit/runs" hvdkit:cpu     # the README's job, results in ./runs
#   docker run --rm hvdkit:cpu hvdkit --help
#
# One recipe with Dockerfile.gpu: the same install steps (launch/install.sh and the stack files
# requirements/*.txt, exactly as on a host), the same SSH set-up, environment, working directory
# and default command. They differ in the base image (here a Debian base, BASE; there nvidia/cuda
# devel), TF_PACKAGE and HOROVOD_GPU_OPERATIONS, and in that this image is built in two stages:
# the compilers, CMake and -dev packages Horovod's build needs stay in the first stage, and the
# image holds the venv, hvdkit and the run-time packages only. tests/unit/test_dockerfile.py
# checks that the two files keep sharing these steps.
#
# The stack follows the base's python3, as on a host (launch/stack.py): Debian 12 (bookworm,
# Python 3.11) gets tf215; Debian 13 (trixie, Python 3.13) the newest stack that takes 3.13.
#
# Behind an HTTPS proxy with its own CA, pip needs that CA for the build only: give the bundle as
# the build secret `pipcert` (launch/image.sh does, from pip's `cert` setting). It is mounted for
# the one RUN that installs the stack and never stored in a layer.
ARG BASE=debian:bookworm-slim

# ---- build stage: install.sh's OS packages (compilers, CMake, -dev), the venv, Horovod -------------
# hadolint ignore=DL3006
FROM ${BASE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8
# install.sh installs the rest (Open MPI, compilers, CMake, python3.X-venv/-dev); it needs python3.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*

# The files launch/install.sh needs only (a change to the sources does not rebuild TensorFlow and
# Horovod), as in Dockerfile.gpu.
WORKDIR /opt/hvdkit
COPY setup.cfg pyproject.toml README.md ./
COPY requirements/ requirements/
COPY launch/install.sh launch/stack.py launch/cuda_home.sh launch/
COPY launch/patches/ launch/patches/
COPY hvdkit/__init__.py hvdkit/
ARG TF_PACKAGE=tensorflow-cpu
ARG HOROVOD_GPU_OPERATIONS=
# pip's and install.sh's caches (the TensorFlow download, the Horovod wheel) are a cache mount: the
# engine keeps it across builds (a change to the stack files reinstalls without a download or a
# compile), and it is never part of the image.
RUN --mount=type=secret,id=pipcert --mount=type=cache,target=/root/.cache \
    if [ -s /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi \
 && VENV=/opt/venv PYTHON=python3 bash launch/install.sh

# hvdkit itself (editable, as install.sh installs it; the second run installs and byte-compiles it
# and checks the Horovod build again, with no download), then a smoke check of the entry points.
COPY . .
RUN VENV=/opt/venv PYTHON=python3 bash launch/install.sh \
 && /opt/venv/bin/hvdkit-launch --help >/dev/null

# ---- the image: run-time packages, the venv and hvdkit --------------------------------------------
# (BASE is tagged: debian:bookworm-slim, or the debootstrapped localhost/debian-<release>:min)
# hadolint ignore=DL3006
FROM ${BASE}
ARG TF_PACKAGE=tensorflow-cpu
LABEL org.opencontainers.image.title="hvdkit" \
      org.opencontainers.image.description="hvdkit on Debian: ${TF_PACKAGE} and Horovod (MPI, Gloo) from the stack launch/install.sh picks for the base's python3" \
      org.opencontainers.image.licenses="Apache-2.0"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8

# Python (the venv's interpreter), Open MPI's programs and libraries, SSH (multi-node) and
# iproute2 (hvdkit cluster): no compiler, no CMake, no -dev package; no downloaded .deb files either
# (apt-get clean: a debootstrapped base has no docker-clean rule, as debian:*-slim has).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 openmpi-bin openssh-client openssh-server iproute2 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# SSH between containers (mpirun starts remote ranks over SSH; the Kubeflow MPI Operator
# mounts a key pair at /root/.ssh): no host-key prompts, keys from a mounted secret accepted.
RUN mkdir -p /run/sshd \
 && printf 'Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n' \
        > /etc/ssh/ssh_config.d/hvdkit.conf \
 && printf 'StrictModes no\nPermitRootLogin prohibit-password\n' > /etc/ssh/sshd_config.d/hvdkit.conf

WORKDIR /opt/hvdkit
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/hvdkit /opt/hvdkit

# Root in a container: Open MPI needs these to start (hvdkit-launch also adds
# --allow-run-as-root); no CMA single-copy between ranks (needs CAP_SYS_PTRACE in Docker).
ENV PATH=/opt/venv/bin:$PATH \
    OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    TF_CPP_MIN_LOG_LEVEL=2 \
    NP=4
EXPOSE 22

# The README's job: NP ranks (default 4) on this container; results in /opt/hvdkit/runs (mount it).
# Training flags: HVDKIT_<FLAG> variables (e.g. -e HVDKIT_MODEL=cnn) or a command of your own.
CMD ["bash", "-c", "exec horovodrun -np \"${NP}\" python -m hvdkit.train"]
