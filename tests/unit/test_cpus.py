"""hvdkit.cpus (a rank's cores: affinity, cgroup quotas, ranks sharing them) and hvdkit.comm.poll's
schedule, which the ring's ``wait`` uses: pure, on fake cgroup trees, no MPI."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hvdkit import comm as C
from hvdkit.cpus import cgroup_cpu_limit, cores_per_rank


def _tree(tmp_path, name: str, cgroup: str, files: dict[str, str]):
    """A process's ``/proc/self/cgroup`` text and a cgroup file system, under ``tmp_path/name``:
    (the cgroup list's path, the file system's root)."""
    d = tmp_path / name
    d.mkdir()
    (d / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        path = d / "fs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(d / "cgroup"), str(d / "fs")


def test_v1_quota_of_the_cgroup_or_an_ancestor_the_smallest(tmp_path):
    # the emulated hosts' layout: cgroup v1's cpu controller, hvdc-h1 at half a core
    args = _tree(tmp_path, "v1", "2:cpuacct:/\n1:cpu:/hvdc-h1/job\n0::/\n", {
        "cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000",
        "cpu/hvdc-h1/cpu.cfs_quota_us": "50000", "cpu/hvdc-h1/cpu.cfs_period_us": "100000",
        "cpu/hvdc-h1/job/cpu.cfs_quota_us": "150000", "cpu/hvdc-h1/job/cpu.cfs_period_us": "100000"})
    assert cgroup_cpu_limit(*args) == pytest.approx(0.5)


def test_v2_cpu_max_and_none_where_unlimited_or_unreadable(tmp_path):
    slurm = _tree(tmp_path, "v2", "0::/slurm/job_7\n", {"slurm/job_7/cpu.max": "200000 100000",
                                                        "slurm/cpu.max": "max 100000"})
    assert cgroup_cpu_limit(*slurm) == pytest.approx(2.0)
    assert cgroup_cpu_limit(*_tree(tmp_path, "max", "0::/a\n", {"a/cpu.max": "max 100000"})) is None
    assert cgroup_cpu_limit(*_tree(tmp_path, "bad", "1:cpu:/x\n", {"cpu/x/cpu.cfs_quota_us": "garbage"})) is None
    assert cgroup_cpu_limit(str(tmp_path / "missing"), str(tmp_path)) is None


def test_cores_per_rank():
    assert cores_per_rank(2, cores=8, limit=None) == 4.0
    assert cores_per_rank(4, cores=2, limit=None) == 0.5        # the test suite: 4 ranks on 2 cores
    assert cores_per_rank(1, cores=2, limit=0.5) == 0.5          # an emulated host at half a core
    assert cores_per_rank(0, cores=2, limit=None) == 2.0         # no rank counted: one
    assert cores_per_rank(1) > 0                                 # this host, read for real


@pytest.mark.timeout(30)   # a poll that never ends would hang here: a failure, not a wait
def test_poll_without_a_yield_phase_goes_from_spinning_to_sleeping(monkeypatch):
    """yield_s <= SPIN_S: no sleep(0) at all (a thread alone on its core would spin on in it); the
    default yields between SPIN_S and YIELD_S; the sleeps after it are at most 200 us. On a fake
    clock: every test() costs 10 us, every sleep its length."""
    clock = {"t": 0.0}
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        clock["t"] += s

    monkeypatch.setattr(C, "time", SimpleNamespace(perf_counter=lambda: clock["t"], monotonic=lambda: clock["t"],
                                                   sleep=sleep))

    def done_at(seconds):
        def test():
            clock["t"] += 1e-5
            return clock["t"] >= seconds
        return test

    C.poll(done_at(0.003), None, "x", yield_s=C.SPIN_S)
    assert sleeps and 0 not in sleeps and max(sleeps) <= 2e-4, sleeps
    sleeps.clear()
    clock["t"] = 0.0
    C.poll(done_at(0.003), None, "x")
    assert 0 in sleeps and max(sleeps) <= 2e-4
    clock["t"] = 0.0
    with pytest.raises(TimeoutError, match="^late$"):
        C.poll(done_at(1.0), 0.01, "late", yield_s=C.SPIN_S)


def test_a_containers_own_group_mounted_as_the_hierarchys_top(tmp_path):
    # podman/docker on cgroup v1, no cgroup namespace: /proc/self/cgroup names the full path, while
    # /sys/fs/cgroup/cpu holds only the container's group (mountinfo's root field)
    cg, fs = _tree(tmp_path, "ctr", "4:cpu,cpuacct:/libpod_parent/libpod-ab12/hvdc-h1\n0::/\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "150000", "cpu,cpuacct/cpu.cfs_period_us": "100000",   # the container's --cpus
        "cpu,cpuacct/hvdc-h1/cpu.cfs_quota_us": "5000", "cpu,cpuacct/hvdc-h1/cpu.cfs_period_us": "10000"})
    info = tmp_path / "mountinfo"
    info.write_text(f"40 31 0:33 /libpod_parent/libpod-ab12 {fs}/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n")
    assert cgroup_cpu_limit(cg, fs, str(info)) == pytest.approx(0.5)
    assert cgroup_cpu_limit(cg, fs, str(tmp_path / "none")) == pytest.approx(1.5)   # as a whole hierarchy: the group unseen
    (tmp_path / "ctr" / "cgroup").write_text("4:cpu,cpuacct:/libpod_parent/libpod-ab12\n")
    assert cgroup_cpu_limit(cg, fs, str(info)) == pytest.approx(1.5)   # the container's own quota
