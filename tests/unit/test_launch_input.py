"""What a user types, through every launch path (issue 51): paths of any characters a file system
allows, one shell word wherever a shell sees them; flags that contradict each other refused in one
line. Single-process: the exact command lines."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from hvdkit.errors import UsageError
from hvdkit.launch.elastic import elastic_command
from hvdkit.launch.templates import render
from tests.conftest import ROOT, VENV_BIN

#: spaces, a quote, a variable, a command separator, a leading '-' in a component, unicode
NASTY = "/tmp/x y/it's $HOME;ok/-é"


def test_the_discovery_script_horovodrun_runs_in_a_shell_is_one_word():
    script = os.path.join(NASTY, "discover_hosts.sh")
    cmd = elastic_command("horovodrun", 2, 1, 2, script, "lo", os.path.join(NASTY, "rank_command.sh"), 30)
    given = cmd[cmd.index("--host-discovery-script") + 1]
    assert shlex.split(given) == [script], given   # horovod's safe_shell_exec.execute(script): shell=True
    assert cmd[-1] == os.path.join(NASTY, "rank_command.sh")   # horovodrun quotes its program itself


@pytest.mark.parametrize("name", ["slurm", "suite"])
def test_a_venv_path_reaches_the_batch_script_as_typed(name, tmp_path):
    text = render(name, {"venv": NASTY})
    line = next(ln for ln in text.splitlines() if ln.startswith("VENV="))
    r = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$VENV"'], capture_output=True, text=True, timeout=30,
                       env={"HOME": "/root", "PATH": os.environ["PATH"]})
    assert r.stdout == NASTY, (line, r.stdout, r.stderr)
    (tmp_path / "job.sbatch").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0


@pytest.mark.parametrize("job_name", ["my job", "a;b", "x'y", "$HOME"])
def test_a_job_name_slurm_cannot_take_is_refused_in_one_line(job_name):
    with pytest.raises(UsageError, match=r"--set job_name=.*: Slurm reads it in #SBATCH lines"):
        render("slurm", {"job_name": job_name})


def _launch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=ROOT, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""), **(env or {}))
    return subprocess.run([sys.executable, "-m", "hvdkit.launch", *args], capture_output=True, text=True,
                          timeout=60, env=e, cwd=ROOT, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("where", [["-H", "h1:1,h2:1"], ["--launcher", "horovodrun", "-H", "h1:1,h2:1"], []])
def test_paths_survive_the_printed_command(where):
    """The command ``--dry-run`` prints (what runs, and what a user pastes into a shell on another
    host) gives back the very paths typed, for mpirun across hosts, horovodrun and this host; a
    Slurm allocation takes the -H path (tests/unit/test_slurm.py)."""
    flags = ["--output-dir", NASTY, "--dataset", f"npz:{NASTY}/d.npz", "--timeline", f"{NASTY}/t.json"]
    r = _launch("-np", "2", "--mpi", "openmpi", "--mpi-args=--mca btl_tcp_if_include lo", *where, "--dry-run",
                "--", *flags)
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout.strip().splitlines()[-1])
    assert argv[-len(flags):] == flags, argv


@pytest.mark.parametrize("flags, line", [
    (["-np", "2", "--min-np", "1"], "--min-np is a flag of --elastic launches; add --elastic or drop it"),
    (["-np", "2", "--gloo-timeout", "5"], "--gloo-timeout is a flag of --elastic launches; add --elastic or drop it"),
    (["--elastic", "--cpu-ranks", "0"], "--elastic with --cpu-ranks: an elastic job's ranks all train"),
])
def test_flags_that_contradict_each_other_are_refused_in_one_line(flags, line, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    r = _launch(*flags, "--hostfile", str(hosts), "--dry-run", "--", "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert line in r.stderr, r.stderr


def test_checkpoint_every_with_no_checkpoint_is_refused():
    from hvdkit.config import parse_config

    with pytest.raises(UsageError, match=r"--checkpoint-every 5 with --no-checkpoint: .* choose one"):
        parse_config(["--no-checkpoint", "--checkpoint-every", "5"], env={})
