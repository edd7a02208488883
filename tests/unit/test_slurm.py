"""Slurm allocations (hvdkit.launch.slurm): compressed host lists, task counts, bad forms, and
hvdkit-launch's command inside an allocation (no -H: the multi-host command, as with -H)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from hvdkit.errors import UsageError
from hvdkit.launch import render
from hvdkit.launch.slurm import allocation, describe, expand_nodelist, expand_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("text,names", [
    ("node1", ["node1"]),
    ("gpu-[01-03,07]", ["gpu-01", "gpu-02", "gpu-03", "gpu-07"]),
    ("node[1-2],login5", ["node1", "node2", "login5"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),                  # padding of the first number
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a[1-2]-ib,b[3],c.example.org", ["a1-ib", "a2-ib", "b3", "c.example.org"]),
])
def test_expand_nodelist(text, names):
    assert expand_nodelist(text) == names


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[1-]", "a,,b", "n[1,]", ""])
def test_expand_nodelist_refuses(text):
    with pytest.raises(ValueError):
        expand_nodelist(text)


def test_expand_tasks():
    assert expand_tasks("4(x3),2") == [4, 4, 4, 2]
    assert expand_tasks("2") == [2]
    assert expand_tasks("1,2(x2)") == [1, 2, 2]
    for bad in ("4(3)", "x", "0", "2(x0)", "4(x3),", "-1"):
        with pytest.raises(ValueError):
            expand_tasks(bad)


JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-[01-03,07]", "SLURM_TASKS_PER_NODE": "4(x3),2"}


def test_allocation():
    assert allocation({}) is None
    assert allocation({"SLURM_JOB_NODELIST": "n1"}) is None           # not inside a job
    hosts = allocation(JOB)
    assert [(h.name, h.slots) for h in hosts] == [("gpu-01", 4), ("gpu-02", 4), ("gpu-03", 4), ("gpu-07", 2)]
    assert [(h.name, h.slots) for h in allocation({"SLURM_JOBID": "1", "SLURM_NODELIST": "n[1-2]",
                                                   "SLURM_NTASKS_PER_NODE": "3"})] == [("n1", 3), ("n2", 3)]
    assert describe(JOB) == "Slurm job 42: SLURM_JOB_NODELIST=gpu-[01-03,07] SLURM_TASKS_PER_NODE=4(x3),2"


@pytest.mark.parametrize("env,match", [
    ({"SLURM_JOB_NODELIST": "gpu-[01-03"}, r"^SLURM_JOB_NODELIST='gpu-\[01-03': cannot read it \(unbalanced"),
    ({"SLURM_TASKS_PER_NODE": "4(x2)"}, r"^SLURM_TASKS_PER_NODE='4\(x2\)' gives 2 counts for the 4 nodes of "
                                        r"SLURM_JOB_NODELIST='gpu-\[01-03,07\]'"),
    ({"SLURM_TASKS_PER_NODE": "4(3)"}, r"^SLURM_TASKS_PER_NODE='4\(3\)': cannot read it"),
    ({"SLURM_TASKS_PER_NODE": "", "SLURM_NTASKS_PER_NODE": "four"},
     r"^SLURM_NTASKS_PER_NODE='four': cannot read it \(not a positive integer\)"),
    ({"SLURM_TASKS_PER_NODE": ""}, r"neither SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE is set"),
    ({"SLURM_JOB_NODELIST": ""}, r"^inside Slurm job 42 \(SLURM_JOB_ID\) but SLURM_JOB_NODELIST is not set"),
    ({"SLURM_JOB_NODELIST": "n_[1-4]"}, r"^SLURM_JOB_NODELIST='n_\[1-4\]': host name 'n_1': hvdkit takes letters"),
])
def test_allocation_refusals(env, match):
    with pytest.raises(UsageError, match=match):
        allocation({**JOB, **env})


def _launch(env, *argv):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(env, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "hvdkit.launch", "--dry-run", "--mpi", "openmpi",
                        "--mpi-exec", "mpirun", *argv], capture_output=True, text=True, env=e, timeout=60, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def test_inside_an_allocation_the_command_is_multi_host():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    rc, out, err = _launch(env, "-np", "4", "--", "prog")
    argv = shlex.split(out)
    assert rc == 0, err
    assert argv[argv.index("-H") + 1] == "node1:2,node2:2" and "--oversubscribe" not in argv
    assert "oob_tcp_keepalive_time" in argv and "coll_tuned_allreduce_algorithm" in argv   # -H's settings
    assert err.splitlines()[0] == "hvdkit-launch: Slurm job 7: SLURM_JOB_NODELIST=node[1-2] " \
                                  "SLURM_TASKS_PER_NODE=2(x2): -np 4 -H node1:2,node2:2"
    assert "--dry-run without MPI's network" in err   # the allocation's hosts are asked for their networks too
    rc, out, _ = _launch(env, "--launcher", "horovodrun", "--", "prog")   # -np: the allocation's tasks
    assert rc == 0 and " -np 4 -H node1:2,node2:2 " in out and "oob_tcp_keepalive_time" in out
    # -H / --hostfile win over the allocation
    rc, out, err = _launch(env, "-np", "1", "-H", "other:1", "--", "prog")
    assert rc == 0 and "-H other:1" in out and "Slurm" not in err


def test_a_variable_it_cannot_read_is_one_line_status_2():
    rc, out, err = _launch({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2", "SLURM_TASKS_PER_NODE": "2"},
                           "-np", "2", "--", "prog")
    assert (rc, out) == (2, "")
    assert err == ("hvdkit-launch: error: SLURM_JOB_NODELIST='node[1-2': cannot read it (unbalanced brackets in "
                   "'node[1-2'); or give -H HOST:SLOTS,... / --hostfile FILE\n")


def test_sbatch_template_lets_hvdkit_launch_read_the_allocation():
    text = render("slurm", {"nodes": "2"})
    mpirun_branch = text[text.index('elif [[ "$LAUNCH" == mpirun ]]'):]
    assert "python -m hvdkit.launch" in mpirun_branch
    launch_line = next(ln for ln in mpirun_branch.splitlines() if "python -m hvdkit.launch" in ln)
    assert "--hostfile" not in launch_line and "scontrol show hostnames" not in mpirun_branch   # hvdkit reads it
