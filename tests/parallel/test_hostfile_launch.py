"""The real launchers take what hvdkit-launch makes of a hostfile as people write it: comment
lines, a blank line, trailing comments, ``slots = 1`` with spaces, ``user@``, and a host listed
once per slot, mixed with a ``slots=`` line for the same host (as given, Open MPI refuses the
mix and horovodrun tracebacks on the comments). One tiny job per launcher on this host."""
from __future__ import annotations

import getpass
import os
import re

import pytest

from tests.conftest import VENV_BIN, launch

PROGRAM = ("import socket; from mpi4py import MPI; c = MPI.COMM_WORLD; "
           "print(f'rank {c.Get_rank()} of {c.Get_size()} on {socket.gethostname()}', flush=True)")


@pytest.mark.parametrize("launcher", ["mpi", "horovodrun"])
def test_a_messy_hostfile_launches(launcher, tmp_path):
    f = tmp_path / "hosts"
    f.write_text(f"# this host, two slots: one line each\n\n{getpass.getuser()}@localhost   # the first\n"
                 f"{getpass.getuser()}@localhost slots = 1\n")
    r = launch([os.path.join(VENV_BIN, "hvdkit-launch"), "-np", "2", "--hostfile", str(f), "--launcher", launcher,
                "--", os.path.join(VENV_BIN, "python"), "-c", PROGRAM], timeout=180)
    assert r.returncode == 0, r.output[-3000:]
    ranks = sorted(re.findall(r"rank (\d+) of (\d+) on ", r.stdout))   # horovodrun prefixes [1,R]<stdout>:
    assert ranks == [("0", "2"), ("1", "2")], r.output[-3000:]
    assert "Traceback" not in r.output
