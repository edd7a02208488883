"""One MPI, one installation (hvdkit.mpicheck): the launcher's world read from its variables, the
line for another MPI's launcher, the comparison of every rank's versions, and hvdkit launch's
refusal of a launcher of another MPI than mpi4py's (mpi4py#280)."""
import os
import stat

import numpy as np
import pytest

from hvdkit.errors import UsageError
from hvdkit.launch import cli, mpi as M
from hvdkit.mpicheck import check_installation, installation_mismatch, installed, launcher, world_mismatch

OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\x00"
MPICH_LIB = "MPICH Version:      4.0.2\nMPICH Release date: Thu Apr  7 12:34:45 CDT 2022\n"
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "8", "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "1"}
SRUN = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}


@pytest.mark.parametrize("env, name, family, rank, size", [
    (HYDRA, "MPICH's mpiexec (Hydra)", "mpich", 1, 2),
    ({**HYDRA, **SRUN}, "MPICH's mpiexec (Hydra)", "mpich", 1, 2),          # Hydra's proxies under srun
    ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2", "PMIX_RANK": "2", **SRUN},
     "Open MPI's mpirun", "openmpi", 2, 3),                                  # orted started by srun
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "5", **SRUN}, "Slurm's srun (PMI-2)", None, 3, 4),
    ({"PMIX_RANK": "3", **SRUN}, "Slurm's srun (PMIx)", None, 3, 4),
    (SRUN, "Slurm's srun", None, 3, 4),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "horovodrun's Gloo controller", None, 0, 2),
])
def test_each_launcher_is_read_from_its_variables(env, name, family, rank, size):
    got = launcher(env)
    assert (got.name, got.family, got.rank, got.size) == (name, family, rank, size)


def test_no_launcher_outside_one_and_a_batch_script_is_not_srun():
    assert launcher({}) is None and launcher({"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}) is None
    assert world_mismatch({"SLURM_NTASKS": "4"}, 1, OPEN_MPI) is None


def test_another_mpis_launcher_is_named_with_both_mpis_and_the_fix():
    assert world_mismatch(HYDRA, 1, OPEN_MPI) == (
        "MPICH's mpiexec (Hydra) started 2 processes (PMI_SIZE=2), but mpi4py uses Open MPI (Open MPI v4.1.4), "
        "which cannot join them: each process is rank 0 of a world of 1 and would train alone; launch with Open "
        "MPI's mpirun (hvdkit launch -np 2 finds it), or use an mpi4py built for MPICH")
    line = world_mismatch({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}, 1, MPICH_LIB)
    assert line.startswith("Open MPI's mpirun started 4 processes") and "mpi4py uses MPICH (MPICH Version:" in line
    assert "launch with MPICH's mpiexec" in line
    assert "srun --mpi=pmix" in world_mismatch(SRUN, 1, OPEN_MPI)
    assert "drop --gloo" in world_mismatch({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, 1, OPEN_MPI)


def test_the_launchers_world_is_no_mismatch():
    assert world_mismatch(HYDRA, 2, MPICH_LIB) is None
    assert world_mismatch({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, 2, OPEN_MPI) is None
    assert world_mismatch({"PMIX_RANK": "0"}, 1, OPEN_MPI) is None   # a PMIx launcher that says no size
    assert world_mismatch({}, 1, OPEN_MPI) is None


V = {"hvdkit": "0.1.0", "python": "3.11.7", "tensorflow": "2.15.1", "horovod": "0.28.1", "mpi4py": "4.1.2"}


def test_the_first_rank_with_other_versions_is_named_with_both():
    assert installation_mismatch([("h1", V), ("h2", dict(V))]) is None
    other = {**V, "tensorflow": "2.16.1", "horovod": None}
    assert installation_mismatch([("h1", V), ("h1", V), ("h2", other), ("h3", other)]) == (
        "rank 2 on h2 runs another installation than rank 0 on h1: tensorflow 2.16.1 (rank 0: 2.15.1), "
        "horovod not installed (rank 0: 0.28.1) (and 1 more rank); install the same versions on every host "
        "(one environment, or one image)")


class _TwoRanks:
    """A communicator of 2 ranks whose other rank runs ``theirs`` on host h2 (the Allgather of raw bytes)."""

    def __init__(self, theirs):
        self.theirs = theirs

    def Get_size(self):
        return 2

    def Allgather(self, mine, every):
        from hvdkit.mpicheck import _encode

        assert isinstance(mine, np.ndarray) and mine.dtype == np.uint8   # bytes, no pickle
        every[0], every[1] = mine, _encode("h2", self.theirs)


def test_check_installation_gathers_raw_bytes():
    assert check_installation(_TwoRanks(installed()), "h1") is None
    line = check_installation(_TwoRanks({**installed(), "python": "3.12.1"}), "h1")
    assert line.startswith("rank 1 on h2 runs another installation than rank 0 on h1: python 3.12.1 (rank 0: ")


def _fake_launchers(tmp_path, **outputs):
    for name, text in outputs.items():
        p = tmp_path / name
        p.write_text(f"#!/bin/sh\nprintf '%s\\n' '{text}'\n")   # a builtin: PATH holds only the fakes
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path)


HYDRA_VERSION = "HYDRA build details:\n    Version:                                 4.0.2"
ORTE_VERSION = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/"


def test_launch_refuses_another_mpis_launcher_in_one_line(tmp_path, monkeypatch, capsys):
    """mpi4py on Open MPI, only MPICH's mpiexec on PATH: no command is built."""
    monkeypatch.setenv("PATH", _fake_launchers(tmp_path, mpiexec=HYDRA_VERSION))
    monkeypatch.setattr(cli, "mpi4py_library", lambda python: OPEN_MPI)
    assert cli.main(["-np", "2", "--", "--epochs", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("hvdkit-launch: error: mpi4py uses Open MPI (Open MPI v4.1.4), but mpiexec is MPICH's "
                          "(Hydra 4.0.2)"), err
    monkeypatch.setattr(cli, "mpi4py_library", lambda python: MPICH_LIB)
    assert cli.main(["-np", "2", "--dry-run"]) == 0 and capsys.readouterr().out.startswith("mpiexec -n 2 ")


def test_launch_picks_the_launcher_of_mpi4pys_mpi(tmp_path, monkeypatch):
    """Both MPIs installed, the alternatives pointing at MPICH: Open MPI's own name is found."""
    monkeypatch.setenv("PATH", _fake_launchers(tmp_path, mpirun=HYDRA_VERSION, mpiexec=HYDRA_VERSION,
                                               **{"mpirun.openmpi": ORTE_VERSION}))
    assert M.detect_mpi(want="openmpi", library=OPEN_MPI) == ("openmpi", "mpirun.openmpi")
    with pytest.raises(UsageError, match=r"^mpi4py uses MPICH \(MPICH Version: 4.0.2\), but /x/mpirun is Open MPI's"):
        M.detect_mpi("/x/mpirun", run=lambda argv: ORTE_VERSION, want="mpich", library=MPICH_LIB)


def test_mpi4py_library_is_asked_without_starting_mpi():
    argv = []
    assert M.mpi4py_library("py", run=lambda a: argv.extend(a) or OPEN_MPI) == OPEN_MPI
    assert argv[0] == "py" and "mpi4py.rc.initialize = mpi4py.rc.finalize = False" in argv[2]
    assert M.mpi4py_library(os.devnull) is None   # not a Python: not asked


@pytest.mark.parametrize("rank", ["0", "1"])
def test_another_mpis_launcher_is_refused_before_mpi_init(rank):
    """Each process of MPICH's mpiexec ends with status 2 before MPI_Init; the launcher's rank 0 alone prints."""
    import subprocess
    import sys

    code = ("from hvdkit.mpicheck import start_mpi\ntry:\n    start_mpi(dict(HYDRA, PMI_RANK=R))\n"
            "finally:\n    from mpi4py import MPI\n    print('initialized', MPI.Is_initialized())")
    r = subprocess.run([sys.executable, "-c", f"HYDRA = {HYDRA!r}\nR = {rank!r}\n{code}"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "MPI4PY_MPIABI": "openmpi"})
    assert r.returncode == 2 and r.stdout.strip() == "initialized False", r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hvdkit: error:")]
    assert len(lines) == (rank == "0") and r.stderr.count("\n") == len(lines), r.stderr
    assert all(ln.startswith("hvdkit: error: MPICH's mpiexec (Hydra) started 2 processes (PMI_SIZE=2), but mpi4py "
                             "uses Open MPI (Open MPI v") for ln in lines), r.stderr
