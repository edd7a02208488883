"""Two hosts of one name under Open MPI 5 (hvdkit.comm.shared_name): PRRTE takes hosts by name, so
MPI's shared-memory split fails or hangs on them; hvdkit refuses them first, in one line, status 2."""
import os
import re

import pytest

from hvdkit import comm as C
from hvdkit.errors import EXIT_USAGE
from hvdkit.mpicheck import merged_host

BOOT_A, BOOT_B = "0f1e2d3c-aaaa", "9a8b7c6d-bbbb"


def test_distinct_names_and_ranks_of_one_host_pass():
    assert C.shared_name([("h1", f"{BOOT_A}/1"), ("h2", f"{BOOT_B}/1")]) is None
    assert C.shared_name([("node", f"{BOOT_A}/7"), ("node", f"{BOOT_A}/7"), ("h2", f"{BOOT_B}/7")]) is None
    assert C.shared_name([]) is None


@pytest.mark.parametrize("rows, ranks", [
    ([("node", f"{BOOT_A}/1"), ("node", f"{BOOT_B}/1")], (0, 1)),                      # two machines (VM clones)
    ([("node", f"{BOOT_A}/11"), ("node", f"{BOOT_A}/11"), ("node", f"{BOOT_A}/12")], (0, 2)),  # emulated hosts
    ([("h1", f"{BOOT_A}/1"), ("node", f"{BOOT_A}/2"), ("node", f"{BOOT_B}/2")], (1, 2)),
])
def test_two_hosts_of_one_name_are_named_in_one_line(rows, ranks):
    line = C.shared_name(rows)
    assert line is not None and "\n" not in line
    assert f"ranks {ranks[0]} and {ranks[1]} " in line and "'node'" in line, line
    assert "Open MPI 5" in line and "hostname of its own" in line, line


def test_a_rank_without_an_identity_is_not_compared():
    assert C.shared_name([("node", ""), ("node", f"{BOOT_A}/1"), ("node", "")]) is None


@pytest.mark.parametrize("library, major", [
    ("Open MPI v5.0.7, package: Debian OpenMPI, ident: 5.0.7, repo rev: v5.0.7, Feb 14, 2025\x00", 5),
    ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\x00", 4),
    ("MPICH Version:      4.0.2\nMPICH Release date: Thu Apr  7 12:34:45 CDT 2022\n", None),
    ("Intel(R) MPI Library 2021.10 for Linux* OS\n", None),
])
def test_the_open_mpi_major_is_read_from_the_library_version(library, major):
    assert C.open_mpi_major(library) == major


@pytest.mark.skipif(not os.path.exists("/proc/self/ns/net"), reason="no /proc network namespace")
def test_this_host_has_an_identity_shared_by_its_processes():
    ident = C.host_identity()
    assert re.fullmatch(r"[0-9a-f-]{36}/\d+", ident), ident
    assert ident == C.host_identity()


class _Comm:
    def __init__(self, rank):
        self.rank = rank

    def Get_rank(self):
        return self.rank


@pytest.mark.parametrize("rank", [0, 1])
def test_the_refusal_is_one_line_from_rank_0_and_status_2_everywhere(rank, monkeypatch, capsys):
    rows = [("node", f"{BOOT_A}/1"), ("node", f"{BOOT_A}/2")]
    monkeypatch.setattr(C, "exchange", lambda comm, item, timeout: rows)
    with pytest.raises(SystemExit) as e:
        C._refuse_shared_names(_Comm(rank))
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.splitlines() == ([f"hvdkit: error: {C.shared_name(rows)}"] if rank == 0 else []), err


def test_one_host_is_not_refused(monkeypatch, capsys):
    monkeypatch.setattr(C, "exchange", lambda comm, item, timeout: [item, item])
    C._refuse_shared_names(_Comm(0))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("local_rank, local_size, refused", [("1", "1", True), ("3", "2", True), ("0", "1", False),
                                                             ("1", "2", False), (None, None, False)])
def test_a_local_rank_past_the_local_size_is_refused_before_mpi_init(local_rank, local_size, refused):
    """What Open MPI 5.0.7 gave the second process on h1 of h1:2,h2:1 (both named node): local rank 1 of 1."""
    env = {} if local_rank is None else {"OMPI_COMM_WORLD_LOCAL_RANK": local_rank,
                                         "OMPI_COMM_WORLD_LOCAL_SIZE": local_size}
    line = merged_host(env, "node")
    assert (line is not None) == refused, line
    if refused:
        assert f"local rank {local_rank} of {local_size} on the host named 'node'" in line and "\n" not in line
        assert "Open MPI 5 (PRRTE)" in line and "hostname of its own" in line, line
