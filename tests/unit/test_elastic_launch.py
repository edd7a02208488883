"""``hvdkit-launch --elastic`` without running anything: the discovery output, the command, the
checks that refuse a launch in one line (status 2), and the rank-side refusals of hvdkit.train."""
from __future__ import annotations

import os
import shlex
import types
import subprocess
import sys

import pytest

from hvdkit.errors import UsageError
from hvdkit.launch import cli
from hvdkit.launch.elastic import discovered, elastic_command, write_discovery_script
from hvdkit.startup import name_mismatch


def test_discovery_reads_either_hostfile_syntax_and_an_empty_file(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the job's hosts\nh1 slots=2\nh2 slots=1\n")
    assert discovered(str(f)) == ["h1:2", "h2:1"]
    f.write_text("h1:4\nh3:1  # back\n")
    assert discovered(str(f)) == ["h1:4", "h3:1"]
    f.write_text("# every host removed\n")
    assert discovered(str(f)) == []
    with pytest.raises(UsageError, match="no such file|No such file"):
        discovered(str(tmp_path / "missing"))


def test_the_discovery_script_prints_the_file_as_it_is_when_called(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("h1 slots=1\nh2 slots=1\n")
    script = write_discovery_script(str(tmp_path / "out"), str(f), sys.executable)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    assert subprocess.run([script], capture_output=True, text=True, env=env, timeout=60).stdout == "h1:1\nh2:1\n"
    f.write_text("h1 slots=1\n")
    assert subprocess.run([script], capture_output=True, text=True, env=env, timeout=60).stdout == "h1:1\n"


def test_elastic_command():
    cmd = elastic_command("horovodrun", 3, 2, 4, "/o/discover_hosts.sh", "eth0", "/o/rank_command.sh", 10,
                          ["--verbose"], env=[("FOO", "a b")])
    assert cmd == ["env", "HOROVOD_GLOO_TIMEOUT_SECONDS=10", "FOO=a b", "horovodrun", "-np", "3", "--min-np", "2",
                   "--max-np", "4", "--host-discovery-script", "/o/discover_hosts.sh", "--network-interface", "eth0",
                   "--blacklist-cooldown-range", "10", "60", "--verbose", "/o/rank_command.sh"]
    with pytest.raises(UsageError, match="--min-np"):
        elastic_command("horovodrun", 2, 3, 4, "s", "eth0", "p", 10)


def test_the_rank_command_passes_every_argument_unchanged(tmp_path):
    """The file horovodrun runs instead of the training command: ``exec`` of it, quoting kept."""
    from hvdkit.launch.elastic import write_rank_command

    path = write_rank_command(str(tmp_path / "o"), [sys.executable, "-c", "import sys; print(sys.argv[1:])",
                                                    "--timeline", "t 1.json", "--verbose", "$HOME", "it's"])
    assert os.path.isabs(path) and os.access(path, os.X_OK)
    out = subprocess.run([path], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == str(["--timeline", "t 1.json", "--verbose", "$HOME", "it's"])


def _launch(argv, capsys) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_dry_run_adds_elastic_and_defaults_np_to_the_slots(tmp_path, capsys):
    f = tmp_path / "hosts"
    f.write_text("localhost slots=2\n")
    rc, out, err = _launch(["--elastic", "--hostfile", str(f), "--dry-run", "--", "--output-dir", str(tmp_path / "o")],
                           capsys)
    assert rc == 0, err
    comment, body, cmd = out.splitlines()
    assert "-np 2 --min-np 1 --max-np 2 " in cmd and "--network-interface lo " in cmd
    assert cmd.endswith(" " + str(tmp_path / "o" / "rank_command.sh"))
    assert comment == f"# {tmp_path / 'o' / 'rank_command.sh'} (written at launch; every rank runs it):"
    assert body.endswith("-m hvdkit.train --output-dir " + str(tmp_path / "o") + " --elastic")
    assert not (tmp_path / "o").exists()   # --dry-run writes nothing


def _horovodrun_parse(cmd: list[str], monkeypatch):
    """horovodrun 0.28.1's own parser (``horovod.runner.launch.parse_args``) on ``cmd`` without its
    ``env NAME=VALUE ...`` prefix; returns (namespace, the environment the prefix sets)."""
    from horovod.runner.launch import parse_args

    i = next(i for i, a in enumerate(cmd) if a.endswith("horovodrun"))
    env = dict(a.split("=", 1) for a in cmd[1:i])
    monkeypatch.setattr(sys, "argv", cmd[i:])
    return parse_args(), env


def test_training_flags_never_reach_horovodruns_parser_and_env_reaches_its_environment(tmp_path, capsys,
                                                                                      monkeypatch):
    """``--timeline`` after '--' was refused by horovodrun ("ambiguous option: --timeline could match
    --timeline-filename, --timeline-mark-cycles"); the
    training flags now live in the rank command file. ``--env FOO=bar`` is set for horovodrun (whose
    elastic mode passes its environment to every rank), ``--env NAME`` is there already."""
    f = tmp_path / "hosts"
    f.write_text("localhost slots=2\n")
    out_dir = tmp_path / "o"
    flags = ["--timeline", "t.json", "--timeline-steps", "0:5", "--checkpoint-every", "25", "--output-dir", str(out_dir)]
    monkeypatch.setenv("KEPT", "1")
    rc, out, err = _launch(["--elastic", "--hostfile", str(f), "--env", "FOO=bar", "--env", "KEPT", "--dry-run", "--",
                            *flags], capsys)
    assert rc == 0, err
    ns, env = _horovodrun_parse(shlex.split(out.splitlines()[-1]), monkeypatch)
    assert ns.command == [str(out_dir / "rank_command.sh")] and not ns.verbose
    assert ns.num_proc == 2 and ns.min_num_proc == 1 and ns.max_num_proc == 2
    # --timeline: Horovod's own timeline next to it, read by hvd.init in every rank
    assert env == {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30", "FOO": "bar",
                   "HOROVOD_TIMELINE": os.path.abspath("t.horovod.json")}

    ran = {}   # without --dry-run: the files written, then horovodrun run (supervised) with that command and environment
    monkeypatch.setattr(cli, "run_job", lambda cmd, env, **kw: ran.update(exe=cmd[0], cmd=list(cmd), env=env)
                        or types.SimpleNamespace(ended_by=0, status=0))
    monkeypatch.setattr(cli, "_horovodrun", lambda: sys.executable)   # any existing executable
    cli.main(["--elastic", "--hostfile", str(f), "--env", "FOO=bar", "--", *flags])
    assert os.path.basename(ran["cmd"][0]) == "env" and ran["cmd"][1:3] == ["HOROVOD_GLOO_TIMEOUT_SECONDS=30", "FOO=bar"] \
         and ran["env"]["KEPT"] == "1"
    assert ran["cmd"][-1] == str(out_dir / "rank_command.sh")
    body = (out_dir / "rank_command.sh").read_text().splitlines()[-1]
    assert shlex.split(body) == ["exec", sys.executable, "-m", "hvdkit.train", *flags, "--elastic"]


@pytest.mark.parametrize("argv,message", [
    (["--elastic", "--", "--output-dir", "o"], "--elastic needs --hostfile"),
    (["--elastic", "--hostfile", "H", "--", "--strategy", "ring", "--output-dir", "o"], "--strategy horovod only"),
    (["--elastic", "--hostfile", "H", "--", "--epochs", "2"], "needs --output-dir"),
    (["--elastic", "--hostfile", "H", "--max-restarts", "2", "--", "--output-dir", "o"], "choose one"),
    (["--elastic", "--hostfile", "H", "--", "--epochs", "0", "--output-dir", "o"], "--epochs"),
    (["--elastic", "--hostfile", "R", "--", "--output-dir", "o"], "cannot read the network interfaces of host h1"),
])
def test_bad_elastic_launches_are_refused_in_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "H").write_text("localhost slots=2\n")
    (tmp_path / "R").write_text("h1 slots=1\nh2 slots=1\n")
    argv = [str(tmp_path / a) if a in ("H", "R") else a for a in argv]
    rc, out, err = _launch(argv, capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("hvdkit-launch: error: ") and message in err, err


def test_a_host_name_on_loopback_is_named(monkeypatch):
    """Horovod's Gloo process sets connect by host name: a name that resolves to loopback is refused
    (the emulated hosts resolve theirs: tests/cluster/test_elastic.py)."""
    import socket

    from hvdkit import network
    monkeypatch.setattr(socket, "gethostname", lambda: "node7")
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")
    monkeypatch.setattr(network, "local_interfaces", lambda: [network.Interface("eth0", "10.0.0.7", 24),
                                                              network.Interface("lo", "127.0.0.1", 8)])
    why = name_mismatch("eth0")
    assert why.startswith("this host's name 'node7' resolves to 127.0.1.1 (loopback), not to its address on eth0 "
                          "(10.0.0.7)"), why
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "10.0.0.7")
    assert name_mismatch("eth0") is None and name_mismatch("lo") is None


@pytest.mark.parametrize("env,argv,message", [
    ({}, ["--strategy", "horovod", "--elastic", "--output-dir", "o"], "--elastic needs an elastic launch"),
    ({"HOROVOD_ELASTIC": "1"}, ["--strategy", "ring"], "runs --strategy horovod --elastic only"),
])
def test_ranks_refuse_elastic_mismatches(tmp_path, env, argv, message):
    from tests.conftest import ROOT
    r = subprocess.run([sys.executable, "-m", "hvdkit.train", *argv], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, **env, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("hvdkit: error:") == 1 and message in r.stderr, r.stderr


def test_the_ssh_wrapper_adds_keepalives_to_the_ssh_on_path(tmp_path):
    """horovodrun's ssh gets keep-alives (a host whose link is down ends its session: the driver
    waits for that, tests/cluster/test_elastic.py), with every argument passed on unchanged."""
    from hvdkit.launch.elastic import write_ssh_keepalive

    real = tmp_path / "bin"
    real.mkdir()
    (real / "ssh").write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    (real / "ssh").chmod(0o755)
    out = str(tmp_path / "o")
    d = write_ssh_keepalive(out, 5, f"{out}/ssh-keepalive:{real}")   # its own directory is skipped
    assert d == os.path.join(out, "ssh-keepalive")
    args = subprocess.run([os.path.join(d, "ssh"), "-o", "X=1", "h3", "cd /x && run 'a b'"], capture_output=True,
                          text=True, timeout=30).stdout.splitlines()
    assert args == ["-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=4",
                    "-o", "X=1", "h3", "cd /x && run 'a b'"]   # a silent host dropped 4-5 s after its last answer
    assert write_ssh_keepalive(out, 30, str(tmp_path / "empty")) is None


@pytest.mark.parametrize("timeout, probes", [(1, (1, 1)), (2, (1, 1)), (5, (1, 4)), (30, (1, 29))])
def test_ssh_drops_a_silent_host_by_the_gloo_timeout(timeout, probes):
    """ssh ends the session (count + 1) x interval after the last packet received: never later than
    the Gloo timeout (at least 1 s: 2 s), which the re-form after a link loss waits for."""
    from hvdkit.launch.elastic import keepalive_probes

    every, count = keepalive_probes(timeout)
    assert (every, count) == probes and (count + 1) * every <= max(timeout, 2)


def test_elastic_overwrite_deletes_the_checkpoint_only_when_the_launch_goes_ahead(tmp_path, capsys):
    """A launch refused after the flags were read (``--gloo-timeout 0``) keeps the checkpoint."""
    f = tmp_path / "hosts"
    f.write_text("localhost slots=2\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / "checkpoint.npz").write_bytes(b"kept")
    rc, _, err = _launch(["--elastic", "--hostfile", str(f), "--gloo-timeout", "0", "--",
                          "--output-dir", str(out), "--overwrite"], capsys)
    assert rc == 2 and "--gloo-timeout 0" in err, err
    assert (out / "checkpoint.npz").read_bytes() == b"kept"


def test_sigusr1_reaches_the_ranks_here_and_by_ssh_on_every_other_host(tmp_path, monkeypatch):
    """``signal_ranks``: this host's processes whose argv is the rank command's program, in this
    network namespace (an emulated host is one), get the signal directly; every other host of the
    hostfile by ``ssh HOST pkill -USR1 -x -f PATTERN``, the command line as an extended regex."""
    import signal
    import time

    from hvdkit.launch import elastic as E

    program = ["/venv/bin/python", "-m", "hvdkit.train", "--output-dir", "/runs/a.b (1)"]
    proc = tmp_path / "proc"
    for pid, argv, net in ((11, program, "net:[1]"), (12, program, "net:[2]"), (13, [*program, "--x"], "net:[1]"),
                           ("self", ["me"], "net:[1]")):
        d = proc / str(pid)
        (d / "ns").mkdir(parents=True)
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        os.symlink(net, d / "ns" / "net")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\nh2 slots=1\n")
    log = tmp_path / "ssh.log"
    ssh = tmp_path / "ssh"
    ssh.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {log}\n")
    ssh.chmod(0o755)
    killed, lines = [], []
    monkeypatch.setattr(E.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    assert E.signal_ranks(str(hostfile), program, signal.SIGUSR1, proc=str(proc), ssh=str(ssh),
                          log=lines.append) == ["localhost", "h2"]
    assert killed == [(11, signal.SIGUSR1)]   # not another namespace's, not another command line
    for _ in range(100):
        if log.exists() and log.read_text().strip():
            break
        time.sleep(0.05)
    args = log.read_text().splitlines()
    assert args[-2:] == ["h2", "pkill -USR1 -x -f '/venv/bin/python -m hvdkit\\.train --output-dir /runs/a\\.b \\(1\\)'"]
    assert lines == ["hvdkit-launch: SIGUSR1 sent to the job's ranks (this host, h2); they stop at a checkpoint "
                     "after the step that follows their next check for new hosts"]
