"""Places (hvdkit/bench/places.py): which place the flags name, the commands it builds, and its
one-line refusals; in one process, no MPI job. The network choice and the MPI flavour are
injected; the ssh check runs against a fake ``ssh`` on PATH. The emulated place is brought up
for real in tests/cluster/test_places_cluster.py."""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import stat
import time

import pytest

from hvdkit.bench import places as P
from hvdkit.errors import UsageError
from hvdkit.launch.hosts import Host
from hvdkit.launch.network import Choice

CHOICE = Choice("198.18.0.0/24", "198.18.0.0/24", "198.18.0.0/24", "line")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    P.add_place_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture
def fake_net(monkeypatch):
    """MPI's network chosen without asking the hosts; Open MPI as the flavour; no ssh check."""
    calls = []

    def choose(names, given, *, launcher, mpi, **kw):
        calls.append((tuple(names), launcher, mpi))
        return CHOICE

    monkeypatch.setattr(P, "choose", choose)
    monkeypatch.setattr(P, "detect_mpi", lambda *a, **k: ("openmpi", "/usr/bin/mpirun"))
    monkeypatch.setattr(P, "check_ssh", lambda names, timeout, environ=None: {n: 0 for n in names})
    for k in [k for k in os.environ if k.startswith("OMPI_MCA_")]:
        monkeypatch.delenv(k)
    return calls


# -- which place -------------------------------------------------------------------------------

def test_no_flag_is_this_host_even_inside_slurm_with_a_note():
    notes = []
    p = P.place_from_args(_args(), {"SLURM_JOB_ID": "7"}, log=notes.append)
    assert p.kind == "local" and len(p.hosts) == 1 and p.fits(64)
    assert notes and "--slurm" in notes[0]
    assert P.place_from_args(_args(), {}, log=notes.append).kind == "local" and len(notes) == 1


def test_hosts_flag():
    p = P.place_from_args(_args("--hosts", "a:4,b:2,a:1"), {})
    assert p.kind == "hosts" and [(h.name, h.slots) for h in p.hosts] == [("a", 5), ("b", 2)]
    assert p.slots == 7 and p.fits(7) and not p.fits(8)


def test_hostfile_text(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# two hosts\nn1 slots = 2\nn2:3   # MPICH form\n\nu@n3\n")
    p = P.place_from_args(_args("--hostfile", str(hf)), {})
    assert [(h.name, h.slots, h.user) for h in p.hosts] == [("n1", 2, ""), ("n2", 3, ""), ("n3", None, "u")]
    assert p.slots == 6
    assert p.describe()["hosts"] == [{"name": "n1", "slots": 2, "gpus": None}, {"name": "n2", "slots": 3, "gpus": None},
                                     {"name": "n3", "slots": 1, "gpus": None}]


def test_slurm_variables_compressed_forms():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-[01-03],login5", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    p = P.place_from_args(_args("--slurm"), env)
    assert p.kind == "slurm"
    assert [(h.name, h.slots) for h in p.hosts] == [("gpu-01", 2), ("gpu-02", 2), ("gpu-03", 2), ("login5", 1)]
    assert p.describe()["source"] == "Slurm job 42: SLURM_JOB_NODELIST=gpu-[01-03],login5 SLURM_TASKS_PER_NODE=2(x3),1"


@pytest.mark.parametrize("text,want", [("3", (3, 1, None)), ("3:2", (3, 2, None)), ("2@200mbit", (2, 1, 2 * 10**8)),
                                       (" 4:2@1gbit ", (4, 2, 10**9))])
def test_emulated_spec(text, want):
    e = P.parse_emulated(text)
    assert (e.hosts, e.slots, e.rate_bps) == want


def test_an_emulated_place_knows_its_slots_before_it_is_up(monkeypatch):
    from hvdkit.cluster import control
    monkeypatch.setattr(control, "unavailable", lambda: None)
    p = P.place_from_args(_args("--emulated", "3:2"), {})
    assert p.kind == "emulated" and p.slots == 6 and p.fits(6) and not p.fits(7)


# -- bad input: one line each -------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "0", "3:0", "x", "3:2:1", "-1", "3@", "3:2@fast"])
def test_emulated_refusals_quote_the_value(text):
    with pytest.raises(UsageError) as e:
        P.parse_emulated(text)
    msg = str(e.value)
    assert msg.startswith(f"--emulated {text!r}: ") and "\n" not in msg
    assert "H[:SLOTS][@RATE]" in msg or "rate" in msg


def test_emulated_where_no_cluster_can_run_says_why(monkeypatch):
    from hvdkit.cluster import control
    monkeypatch.setattr(control, "unavailable", lambda: "needs root (...)")
    with pytest.raises(UsageError, match=r"^--emulated 2: no emulated cluster here: needs root"):
        P.place_from_args(_args("--emulated", "2"), {})


@pytest.mark.parametrize("env,match", [
    ({}, r"^--slurm: not inside a Slurm allocation \(no SLURM_JOB_ID\)"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2", "SLURM_TASKS_PER_NODE": "1"},
     r"^SLURM_JOB_NODELIST='n\[1-2': cannot read it"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x3)"},
     r"^SLURM_TASKS_PER_NODE='2\(x3\)' gives 3 counts for the 2 nodes"),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "two"},
     r"^SLURM_TASKS_PER_NODE='two': cannot read it"),
])
def test_slurm_refusals_quote_the_variable(env, match):
    with pytest.raises(UsageError, match=match) as e:
        P.place_from_args(_args("--slurm"), env)
    assert "\n" not in str(e.value)


def test_bad_hosts_and_hostfiles(tmp_path):
    with pytest.raises(UsageError, match=r"must be a positive integer"):
        P.place_from_args(_args("--hosts", "a:x"), {})
    with pytest.raises(UsageError, match=r"^--hostfile .*nope: cannot read it"):
        P.place_from_args(_args("--hostfile", str(tmp_path / "nope")), {})
    (tmp_path / "h").write_text("a slots=2 gpus=4\n")
    with pytest.raises(UsageError, match=r"h:1: 'a slots=2 gpus=4'"):
        P.place_from_args(_args("--hostfile", str(tmp_path / "h")), {})
    with pytest.raises(UsageError, match=r"^--ssh-timeout 0.0: must be"):
        P.place_from_args(_args("--hosts", "a:1", "--ssh-timeout", "0"), {})


def test_the_flags_are_mutually_exclusive():
    p = argparse.ArgumentParser()
    P.add_place_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--hosts", "a:1", "--emulated", "2"])


def test_out_dir_under_tmp_is_refused_across_hosts(tmp_path):
    hosts = P.place_from_args(_args("--hosts", "a:1,b:1"), {})
    with pytest.raises(UsageError, match=r"^--out-dir /tmp/x: /tmp is private to each host \(the 2 hosts"):
        hosts.out_dir_ok("/tmp/x")
    assert hosts.out_dir_ok("/var/tmp/x") == "/var/tmp/x"
    assert P.place_from_args(_args(), {}).out_dir_ok("/tmp/x") == "/tmp/x"   # this host alone: fine


# -- --resume on the place the results were measured on ------------------------------------------

def test_resume_compares_the_recorded_place_with_this_runs(tmp_path, monkeypatch):
    hf = tmp_path / "hosts"
    hf.write_text("h1 slots=2\nh2 slots=2\n")
    on_hosts = P.place_from_args(_args("--hostfile", str(hf)), {}).describe()
    P.check_resume_place(on_hosts, P.place_from_args(_args("--hosts", "h1:2,h2:2"), {}), "D")   # the same hosts
    P.check_resume_place(None, P.place_from_args(_args(), {}), "D")                             # nothing recorded
    here = P.place_from_args(_args(), {})
    P.check_resume_place(here.describe(), here, "D")
    with pytest.raises(UsageError) as e:
        P.check_resume_place(on_hosts, here, "D")
    assert str(e.value) == (f"--resume D: its rows were measured on hosts h1:2,h2:2 (--hostfile {hf}), not on this "
                            f"run's place (local: {here.hosts[0].name}:{here.hosts[0].slots}); give --hostfile {hf} to "
                            "continue them, or give a new --out-dir")
    with pytest.raises(UsageError, match=r"measured on hosts h1:2,h2:2 .* not on this run's place \(--hosts h1:2,h2:4"):
        P.check_resume_place(on_hosts, P.place_from_args(_args("--hosts", "h1:2,h2:4"), {}), "D")
    with pytest.raises(UsageError, match=r"measured on this host then \(elsewhere:8\).*run it on elsewhere with no "):
        P.check_resume_place({"kind": "local", "source": "local", "hosts": [{"name": "elsewhere", "slots": 8}]}, here,
                             "D")
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)"}
    slurm = P.place_from_args(_args("--slurm"), env).describe()
    P.check_resume_place(slurm, P.place_from_args(_args("--slurm"), {**env, "SLURM_JOB_ID": "43",
                                                                      "SLURM_JOB_NODELIST": "m[7-8]"}), "D")
    with pytest.raises(UsageError, match=r"give --slurm inside an allocation of 2 nodes with the same slots"):
        P.check_resume_place(slurm, here, "D")
    from hvdkit.cluster import control
    monkeypatch.setattr(control, "unavailable", lambda: None)
    emulated = {"kind": "emulated", "source": "--emulated 3:2", "hosts": [{"name": "h1", "slots": 2}]}
    P.check_resume_place(emulated, P.place_from_args(_args("--emulated", "3:2"), {}), "D")
    with pytest.raises(UsageError, match=r"on an emulated cluster \(--emulated 3:2\), .*give --emulated 3:2 to"):
        P.check_resume_place(emulated, P.place_from_args(_args("--emulated", "3"), {}), "D")


def test_resuming_a_hostfile_run_without_the_flag_is_refused_before_any_job(tmp_path, monkeypatch, capsys):
    """The place comes from the command line only: without this check, the resumed jobs ran on this
    host, their rows joined the hostfile's in one table, and training.json's place said local."""
    from hvdkit.bench import jobs, suite, training
    from hvdkit.results import write_json

    hf, out = tmp_path / "hosts", tmp_path / "run"
    hf.write_text("h1 slots=2\n")
    out.mkdir()
    write_json(str(out / "training.json"), {"benchmark": "training", "meta": {}, "rows": [], "skipped": [],
                                            "place": P.place_from_args(_args("--hostfile", str(hf)), {}).describe()})
    monkeypatch.setattr(jobs, "run_job", lambda *a, **k: pytest.fail("a job ran on another place"))
    monkeypatch.setattr(suite, "launch", lambda *a, **k: pytest.fail("a step ran on another place"))
    assert training.main(["--resume", str(out), "--workers", "1"]) == 2
    assert suite.main(["--resume", str(out), "--skip", "report"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(f"its rows were measured on hosts h1:2 (--hostfile {hf}), not on this run's place "
                                 f"(local: " in x and f"give --hostfile {hf} to continue them" in x for x in err), err


# -- commands -----------------------------------------------------------------------------------

def test_local_command_is_todays_bench_path():
    from hvdkit.bench._common import mpirun_cmd
    p = P.place_from_args(_args(), {})
    with p:
        cmd = p.command(3, ["python", "-m", "hvdkit.train"], env_set=[("A", "1")])
    want = mpirun_cmd(3, "hvdkit.train")
    assert cmd[:cmd.index("-x")] == want[:want.index("-x")]   # mpirun -np 3 --bind-to none ... --oversubscribe
    assert "-H" not in cmd and "A=1" in cmd and cmd[-3:] == ["python", "-m", "hvdkit.train"]


def test_hosts_command_is_hvdkit_launchs_multi_host_command(fake_net):
    p = P.place_from_args(_args("--hosts", "h1:2,h2:2"), {})
    with p:
        assert fake_net == [(("h1", "h2"), "mpi", "openmpi")]   # chosen on entering, before any job
        cmd = p.command(3, ["python", "-m", "hvdkit.train"], env_set=[("K", "v")])
        p.command(4, ["python", "x.py"])
    assert len(fake_net) == 1   # once per place
    assert cmd[:5] == ["/usr/bin/mpirun", "-np", "3", "-H", "h1:2,h2:2"]
    s = " ".join(cmd)
    assert "--map-by slot" in s
    assert "--mca btl_tcp_if_include 198.18.0.0/24 --mca oob_tcp_if_include 198.18.0.0/24" in s
    assert "-x HVDKIT_NETWORK_INTERFACE=198.18.0.0/24" in s and "-x K=v" in s
    assert "--mca oob_tcp_keepalive_time 5" in s and "--mca coll_tuned_allreduce_algorithm 4" in s
    assert "--oversubscribe" not in s and cmd[-3:] == ["python", "-m", "hvdkit.train"]
    assert p.fits(4) and not p.fits(5)


def test_hosts_command_leaves_cm_out_as_hvdkit_launch(fake_net, monkeypatch):
    """Open MPI's cm PML (hvdkit/launch/fabrics.py): left out where the check read every host and none
    has a fabric device; kept where one has, and for horovodrun."""
    monkeypatch.setattr("hvdkit.launch.fabrics.param_files", lambda environ: [])
    for devices, want in ((((), ()), True), ((("/dev/hfi1_0",), ()), False)):
        monkeypatch.setattr(P, "choose", lambda *a, devices=devices, **k: dataclasses.replace(CHOICE, fabrics=devices))
        with P.place_from_args(_args("--hosts", "h1:1,h2:1"), {}) as p:
            cmd = p.command(2, ["x"])
            assert (cmd[-4:-1] == ["--mca", "pml", "^cm"]) == want, cmd
            assert "^cm" not in " ".join(p.command(2, ["x"], launcher="horovodrun"))


def test_horovodrun_is_chosen_for_separately(fake_net):
    with P.place_from_args(_args("--hosts", "h1:1,h2:1"), {}) as p:
        cmd = p.command(2, ["python", "t.py"], launcher="horovodrun")
    assert fake_net[-1] == (("h1", "h2"), "horovodrun", "openmpi")
    i = cmd.index("horovodrun")
    assert cmd[:i] == ["env", "HVDKIT_NETWORK_INTERFACE=198.18.0.0/24"]
    assert cmd[i:i + 7] == ["horovodrun", "-np", "2", "--network-interface", "198.18.0.0/24", "-H", "h1:1,h2:1"]
    assert "--mpi-args=--mca coll_tuned_use_dynamic_rules 1" in " ".join(cmd)


def test_a_user_network_choice_is_kept(fake_net):
    with P.place_from_args(_args("--hosts", "h1:1,h2:1"), {}) as p:
        cmd = p.command(2, ["x"], mpi_args=["--mca", "btl_tcp_if_include", "ib0"])
    s = " ".join(cmd)
    assert "198.18.0.0/24" not in s and "HVDKIT_NETWORK_INTERFACE" not in s
    assert s.count("btl_tcp_if_include") == 1 and "--mca btl_tcp_if_include ib0" in s


def test_hostfile_users_go_to_a_clean_hostfile_for_open_mpi(fake_net, tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("me@n1 slots=2\nn2 slots=2\n")
    with P.place_from_args(_args("--hostfile", str(hf)), {}) as p:
        cmd = p.command(4, ["x"])
    clean = cmd[cmd.index("--hostfile") + 1]
    assert clean != str(hf) and open(clean).read().splitlines()[1:] == ["me@n1 slots=2", "n2 slots=2"]
    with P.place_from_args(_args("--hostfile", str(hf)), {}) as p:
        with pytest.raises(UsageError, match=r"horovodrun takes no user@"):
            p.command(4, ["x"], launcher="horovodrun")


def test_slurm_command_has_the_allocation_as_hosts(fake_net):
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "4"}
    with P.place_from_args(_args("--slurm"), env) as p:
        cmd = p.command(8, ["x"])
    assert cmd[3:5] == ["-H", "n1:4,n2:4"]


def test_bad_ranks_and_launcher(fake_net):
    with P.place_from_args(_args("--hosts", "h1:1"), {}) as p:
        with pytest.raises(UsageError, match=r"launcher 'srun': choose mpirun or horovodrun"):
            p.command(1, ["x"], launcher="srun")
        with pytest.raises(UsageError, match=r"-np 0"):
            p.command(0, ["x"])


# -- reachability ---------------------------------------------------------------------------------

@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """An ``ssh`` on PATH: 198.18.7.1 answers with 2 GPUs, .2 refuses, .3 and .4 never answer."""
    d = tmp_path / "bin"
    d.mkdir()
    ssh = d / "ssh"
    ssh.write_text('#!/bin/sh\nfor a; do host=$last; last=$a; done\n'   # the host is the argument before CMD
                   'case "$host" in\n'
                   '  198.18.7.1) echo "Welcome"; echo 2 ;;\n'
                   '  198.18.7.2) echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255 ;;\n'
                   '  *) sleep 30 ;;\nesac\n')
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


def test_ssh_check_counts_gpus(fake_ssh):
    assert P.check_ssh(["198.18.7.1"], 5) == {"198.18.7.1": 2}


def test_hosts_that_do_not_answer_are_named_in_one_line_and_asked_at_once(fake_ssh):
    t0 = time.monotonic()
    with pytest.raises(UsageError) as e:
        P.check_ssh(["198.18.7.1", "198.18.7.2", "198.18.7.3", "198.18.7.4"], 1.0)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert msg.startswith("3 of 4 hosts did not answer ssh within 1 s (--ssh-timeout): 198.18.7.2 (ssh: connect to "
                          "host 198.18.7.2 port 22: Connection refused), 198.18.7.3 (no answer within 1 s), "
                          "198.18.7.4 (no answer within 1 s); check that 'ssh 198.18.7.2 true' works"), msg
    assert "\n" not in msg
    assert took < 2.5, took   # one timeout for all the hosts, not one each (sequential asking: >= 2 s)


def test_entering_a_place_checks_ssh_before_the_network(fake_ssh, monkeypatch):
    monkeypatch.setattr(P, "choose", lambda *a, **k: pytest.fail("the network was asked before the ssh check"))
    p = P.place_from_args(_args("--hosts", "198.18.7.1:2,198.18.7.2:2", "--ssh-timeout", "3"), {})
    with pytest.raises(UsageError, match=r"^1 of 2 hosts did not answer ssh within 3 s"):
        with p:
            pass


def test_describe_gpus_from_the_check(fake_ssh, monkeypatch):
    monkeypatch.setattr(P, "choose", lambda *a, **k: None)
    monkeypatch.setattr(P, "detect_mpi", lambda *a, **k: ("openmpi", "mpirun"))
    with P.place_from_args(_args("--hosts", "198.18.7.1:2"), {}) as p:
        d = p.describe()
    assert d == {"kind": "hosts", "source": "--hosts 198.18.7.1:2", "links": [],
                 "hosts": [{"name": "198.18.7.1", "slots": 2, "gpus": 2}]}


def test_a_gpu_host_with_other_slots_gets_a_note(fake_ssh, monkeypatch):
    monkeypatch.setattr(P, "choose", lambda *a, **k: None)
    monkeypatch.setattr(P, "detect_mpi", lambda *a, **k: ("openmpi", "mpirun"))
    notes = []
    p = P.place_from_args(_args("--hosts", "198.18.7.1:1"), {})
    p._log = notes.append
    with p:
        pass
    assert notes == ["hvdkit-bench: note: host 198.18.7.1 has 2 GPUs and 1 slot(s) (-H '198.18.7.1:1'); "
                     "give 198.18.7.1:2 for one rank per GPU"]


def test_a_local_place_describes_this_host():
    d = P.place_from_args(_args(), {}).describe()
    assert d["kind"] == "local" and len(d["hosts"]) == 1 and d["hosts"][0]["gpus"] == 0 and d["links"] == []


def test_a_place_of_this_hosts_names_is_not_asked_over_ssh(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")   # no ssh at all: it must not be needed
    assert P.check_ssh(["localhost", "127.0.0.1"], 1) == {"localhost": 0, "127.0.0.1": 0}


def test_host_objects_are_the_launchers():
    assert isinstance(P.place_from_args(_args("--hosts", "a:1"), {}).hosts[0], Host)


# -- the suite's sbatch template -----------------------------------------------------------------

def test_the_suite_sbatch_template_renders_and_runs_the_suite_on_the_allocation(tmp_path):
    import subprocess
    import hvdkit.launch as L
    from hvdkit.launch.cli import main

    text = L.render("suite", {"nodes": "3", "gpus_per_node": "8", "suite_args": "--quick"})
    assert "{{" not in text
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=8", "#SBATCH --gres=gpu:8",
                 "#SBATCH --job-name=hvdkit-suite"):
        assert line in text.splitlines()
    assert 'exec python -m hvdkit.bench suite --slurm --out-dir "$OUT_DIR" --quick' in text.splitlines()
    f = tmp_path / "suite.sbatch"
    f.write_text(text)
    p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert main(["--render", "suite", "--set", "nodes=2"]) == 0
    assert main(["--render", "suite", "--set", "train_args=x"]) == 2   # a key of another template


# -- hvdkit-bench collectives at a place ---------------------------------------------------------

def test_collectives_run_across_the_hosts_given(fake_net, monkeypatch):
    from hvdkit.bench import cli
    ran = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, **kw: ran.append(cmd) or 0)
    assert cli.main(["collectives", "-np", "4", "--hosts", "h1:2,h2:2", "--", "--methods", "mpi,ring"]) == 0
    cmd = ran[0]
    assert cmd[1:5] == ["-np", "4", "-H", "h1:2,h2:2"] and "btl_tcp_if_include" in cmd
    assert cmd[-4:] == ["-m", "hvdkit.bench.collectives", "--methods", "mpi,ring"]
    assert cli.main(["collectives", "--methods", "mpi"]) == 0 and "-H" not in ran[1]   # this host, -np 2
    assert ran[1][1:3] == ["-np", "2"] and ran[1][-2:] == ["--methods", "mpi"]


@pytest.mark.parametrize("argv,match", [
    (["-np", "5", "--hosts", "h1:2,h2:2"], r"^hvdkit-bench collectives: error: -np 5: the hosts have 4 slots"),
    (["-np", "x"], r"^hvdkit-bench collectives: error: argument -np/-n/--np: invalid int value: 'x'"),   # as launch
    (["--hosts", "h1:1,h2:1", "--", "--json", "/tmp/c.json"], r"error: --json /tmp: /tmp is private to each host"),
    (["--emulated", "2:0"], r"error: --emulated '2:0': write H\[:SLOTS\]\[@RATE\]"),
])
def test_collectives_bad_place_is_one_line_status_2(fake_net, monkeypatch, capsys, argv, match):
    from hvdkit.bench import cli
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, **kw: pytest.fail("a job ran"))
    assert cli.main(["collectives", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(match, err) and len(err.splitlines()) == 1, err


def test_a_probed_place_gives_the_collectives_its_link():
    from hvdkit.bench.cli import link_args as _link_args
    p = P.Place("hosts", [Host("h1", 1), Host("h2", 1)])
    assert _link_args(["--methods", "mpi"], p) == []   # no probe: no link
    p._links = [{"src": "h1", "dst": "h2", "rate_bps": 9e8, "rtt_ms": 0.2},
                {"src": "h2", "dst": "h1", "rate_bps": 9.4e8, "rtt_ms": 0.4}]
    assert _link_args([], p) == ["--link-bandwidth", "920000000bit", "--link-latency", "0.00015"]
    assert _link_args(["--link-bandwidth=1gbit"], p) == [] and _link_args(["--cluster-json", "c"], p) == []
