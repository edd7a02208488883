"""Two containers of the CPU image as two hosts: ``hvdkit launch -np 4 -H c1:2,c2:2`` run in one of them
trains across both, with identical weights on every rank.

Each container runs with the network of an emulated host (``--network ns:/run/netns/hvdc-hI``, the
namespace :mod:`hvdkit.cluster` made for this test, address 198.18.0.I), as a container on a real
host runs with ``--network host``; the emulated host's own sshd keeps port 22, so the container's
sshd listens on 2222 and the mounted ``/root/.ssh/config`` says ``Port 2222``: the lines of
docs/install.md#across-hosts, with a key made for the test and one results directory mounted in
both. Everything is removed at the end, on failure and on Ctrl-C (the containers are ``--rm`` and
their processes live in the cluster's namespaces, which :func:`hvdkit.cluster.control.session`
removes even when pytest is killed).

Marked ``cluster`` and ``image`` (so neither ``make test`` nor ``make test-quick`` runs it); it
builds the image first (``launch/image.sh``: seconds when its layers are cached). Under the lock:
    flock /tmp/hvdkit-heavy.lock .venv/bin/python -m pytest -m image tests/cluster/test_image_cluster.py
HVDKIT_IMAGE=trixie for the Debian 13 image."""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.cluster.conftest import needs_cluster
from tests.unit.test_image import IMAGE_SH, engine, images_asked_for

pytestmark = [pytest.mark.cluster, pytest.mark.image, pytest.mark.slow, needs_cluster]

PORT = 2222   # the containers' sshd, beside the (emulated) host's own on 22
SGD_20 = ["--model", "mlp", "--optimizer", "sgd", "--max-steps", "20", "--seed", "0", "--no-tensorboard",
          "--no-checkpoint"]


def _run(argv: list[str], timeout: float, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"{shlex.join(argv)}: status {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
    return p


def _ssh_dir(d: str) -> str:
    """What a user mounts at /root/.ssh: a key pair, the public key authorized, and the port."""
    os.makedirs(d, mode=0o700)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdkit-image-test", "-f", f"{d}/id_ed25519"], 30)
    shutil.copy(f"{d}/id_ed25519.pub", f"{d}/authorized_keys")
    with open(f"{d}/config", "w") as f:
        f.write(f"Host *\n    Port {PORT}\n")
    for name in ("authorized_keys", "config"):
        os.chmod(f"{d}/{name}", 0o600)
    return d


@pytest.mark.timeout(3600)
def test_two_containers_train_as_two_hosts(request):
    if not images_asked_for(request):
        pytest.skip("builds and runs container images: run it with -m image")
    from hvdkit.cluster import control
    from hvdkit.cluster.spec import ClusterSpec

    release = os.environ.get("HVDKIT_IMAGE", "bookworm")
    tag = f"hvdkit:cpu-{release}"
    _run(["bash", IMAGE_SH, release], 3000)
    eng, env = engine()

    work = tempfile.mkdtemp(prefix="hvdkit-image-cluster-", dir="/var/tmp")
    names = [f"hvdkit-test-c{i}-{os.getpid()}" for i in (1, 2)]

    def remove_containers():
        for name in names:
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([*eng, "rm", "-f", "-t", "0", name], capture_output=True, timeout=120, env=env)

    try:
        keys, shared = _ssh_dir(os.path.join(work, "ssh")), os.path.join(work, "runs")
        os.makedirs(shared)
        with control.session(ClusterSpec(hosts=2, slots=2, cpus_per_host=None), log=lambda *_: None) as state:
            try:
                out, doc = _train_across(eng, env, state["hosts"], names, tag, keys, shared)
            finally:
                remove_containers()   # before the namespaces go
    finally:
        remove_containers()
        shutil.rmtree(work, ignore_errors=True)
    left = _run([*eng, "ps", "-a", "--format", "{{.Names}}"], 60, env=env).stdout.split()
    assert not set(left) & set(names), left
    assert "weights identical on 4 ranks: yes" in out, out[-4000:]
    ranks = doc["ranks"]
    assert doc["world_size"] == 4 and doc["final"]["weights_identical_across_ranks"] is True, doc["final"]
    assert [(r["rank"], r["host"], r["local_rank"]) for r in ranks] == [
        (0, "c1", 0), (1, "c1", 1), (2, "c2", 0), (3, "c2", 1)], ranks
    assert len({r["weights_crc32"] for r in ranks}) == 1, ranks


def _train_across(eng, env, hosts, names, tag, keys, shared) -> tuple[str, dict]:
    """Start one container per emulated host (sshd on :data:`PORT`), then ``hvdkit launch -np 4 -H c1:2,c2:2``
    in the first; returns the launch's output and the run's results.json."""
    add_hosts = [a for i, h in enumerate(hosts, 1) for a in ("--add-host", f"c{i}:{h['address']}")]
    for i, (h, name) in enumerate(zip(hosts, names), 1):
        _run([*eng, "run", "-d", "--rm", "--name", name, "--hostname", f"c{i}",
              "--network", f"ns:/run/netns/{h['netns']}", *add_hosts,
              "-v", f"{keys}:/root/.ssh:ro", "-v", f"{shared}:/opt/hvdkit/runs", tag,
              "/usr/sbin/sshd", "-De", "-p", str(PORT)], 120, env=env)
    exec1 = [*eng, "exec", names[0]]
    for _ in range(60):   # c2's sshd listening (bounded: 60 tries, 0.5 s apart)
        p = _run([*exec1, "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", "c2", "hostname"], 30,
                 check=False, env=env)
        if p.stdout.strip() == "c2":
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"c1 cannot ssh to c2 after 30 s: {p.stdout + p.stderr}")
    p = _run([*exec1, "hvdkit", "launch", "-np", "4", "-H", "c1:2,c2:2", "--", *SGD_20,
              "--output-dir", "/opt/hvdkit/runs/across"], 900, check=False, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    with open(os.path.join(shared, "across", "results.json")) as f:
        return out, json.load(f)
