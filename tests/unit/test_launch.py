"""hvdkit.launch: the exact command lines it builds, MPI detection, --rank-exec, templates."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from hvdkit import launch as L
from hvdkit.launch import templates as T
from hvdkit.launch import command as C
from hvdkit.launch.command import multi_host_mpi_args
from hvdkit.launch import fabrics as F
from hvdkit.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROG = ("python", "-m", "hvdkit.train")
ENV = ("HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG", "PATH")
OMPI_HOSTFILE = "node1 slots=2\nnode2 slots=2\n"     # 4 slots
MPICH_HOSTFILE = "node1:2\nnode2:2\n"                # 4 slots


def _plan(mpi, root, np_, where, launcher="mpi", **kw):
    """Command for the test matrix: 'local' (this host, 4 cores) or 'hostfile' (2 hosts x 2 slots)."""
    hostfile = "hosts.txt" if where == "hostfile" else ""
    text = (MPICH_HOSTFILE if mpi == "mpich" else OMPI_HOSTFILE) if hostfile else None
    spec = L.LaunchSpec(np=np_, program=PROG, launcher=launcher, hostfile=hostfile, env_forward=ENV, **kw)
    return _hf(shlex.join(L.plan_command(spec, mpi=mpi, is_root=root, cores=4, hostfile_text=text)))


def _hf(cmd: str) -> str:
    """The command with the clean hostfile hvdkit writes (a path named after its content) as HOSTFILE."""
    return re.sub(r"\S*/hvdkit-hosts-[0-9a-f]{16}", "HOSTFILE", cmd)


# {Open MPI, MPICH} x {root, not root} x {ranks <= slots, ranks > slots} x {one host, hostfile}:
# 4 slots in both places; 4 ranks fit, 6 ranks exceed them.
OMPI_TAIL = "-x HOROVOD_FUSION_THRESHOLD -x NCCL_DEBUG -x PATH python -m hvdkit.train"
MPICH_TAIL = "-genvlist HOROVOD_FUSION_THRESHOLD,NCCL_DEBUG,PATH python -m hvdkit.train"
MATRIX = {
    ("openmpi", True, 4, "local"): f"mpirun -np 4 --bind-to none --map-by slot --allow-run-as-root {OMPI_TAIL}",
    ("openmpi", True, 6, "local"):
        f"mpirun -np 6 --bind-to none --map-by slot --allow-run-as-root --oversubscribe {OMPI_TAIL}",
    ("openmpi", False, 4, "local"): f"mpirun -np 4 --bind-to none --map-by slot {OMPI_TAIL}",
    ("openmpi", False, 6, "local"): f"mpirun -np 6 --bind-to none --map-by slot --oversubscribe {OMPI_TAIL}",
    ("openmpi", True, 4, "hostfile"):
        f"mpirun -np 4 --hostfile HOSTFILE --bind-to none --map-by slot --allow-run-as-root {OMPI_TAIL}",
    ("openmpi", True, 6, "hostfile"):
        f"mpirun -np 6 --hostfile HOSTFILE --bind-to none --map-by slot --allow-run-as-root --oversubscribe "
        f"{OMPI_TAIL}",
    ("openmpi", False, 4, "hostfile"): f"mpirun -np 4 --hostfile HOSTFILE --bind-to none --map-by slot {OMPI_TAIL}",
    ("openmpi", False, 6, "hostfile"):
        f"mpirun -np 6 --hostfile HOSTFILE --bind-to none --map-by slot --oversubscribe {OMPI_TAIL}",
    ("mpich", True, 4, "local"): f"mpiexec -n 4 {MPICH_TAIL}",
    ("mpich", True, 6, "local"): f"mpiexec -n 6 {MPICH_TAIL}",
    ("mpich", False, 4, "local"): f"mpiexec -n 4 {MPICH_TAIL}",
    ("mpich", False, 6, "local"): f"mpiexec -n 6 {MPICH_TAIL}",
    ("mpich", True, 4, "hostfile"): f"mpiexec -n 4 -f HOSTFILE {MPICH_TAIL}",
    ("mpich", True, 6, "hostfile"): f"mpiexec -n 6 -f HOSTFILE {MPICH_TAIL}",
    ("mpich", False, 4, "hostfile"): f"mpiexec -n 4 -f HOSTFILE {MPICH_TAIL}",
    ("mpich", False, 6, "hostfile"): f"mpiexec -n 6 -f HOSTFILE {MPICH_TAIL}",
}
OPENMPI_ONLY = {"-np", "-x", "-H", "--hostfile", "--bind-to", "--map-by", "--allow-run-as-root",
                "--oversubscribe", "--mca", "-mca"}


@pytest.mark.parametrize("case", sorted(MATRIX), ids=lambda c: "-".join(map(str, c)))
def test_command_matrix(case):
    mpi, root, np_, where = case
    assert _plan(mpi, root, np_, where) == MATRIX[case]


@pytest.mark.parametrize("root", [True, False])
@pytest.mark.parametrize("np_", [1, 4, 64])
def test_mpich_never_gets_openmpi_only_flags(root, np_):
    for where in ("local", "hostfile"):
        argv = shlex.split(_plan("mpich", root, np_, where, env_set=(("A", "1"),)))
        assert not OPENMPI_ONLY & set(argv), argv
        assert argv[-3:] == list(PROG) and "-genv" in argv


def test_hosts_flag():
    spec = L.LaunchSpec(np=8, program=PROG, hosts="a:4,b:4")
    assert L.plan_command(spec, mpi="openmpi", is_root=False, cores=2) == [
        "mpirun", "-np", "8", "-H", "a:4,b:4", "--bind-to", "none", "--map-by", "slot", *PROG]
    assert L.plan_command(spec, mpi="mpich", is_root=True, cores=2) == [
        "mpiexec", "-n", "8", "-hosts", "a:4,b:4", *PROG]
    # 9 ranks on 8 slots; a host without a count counts as one slot
    over = L.LaunchSpec(np=9, program=PROG, hosts="a:4,b:4")
    assert "--oversubscribe" in L.plan_command(over, mpi="openmpi", is_root=False, cores=64)
    assert "--oversubscribe" not in L.plan_command(L.LaunchSpec(np=2, program=PROG, hosts="a,b"),
                                                   mpi="openmpi", is_root=False, cores=1)


def test_env_set_extra_args_and_binary():
    spec = L.LaunchSpec(np=2, program=PROG, env_forward=("PATH",), env_set=(("NCCL_DEBUG", "INFO"),),
                        mpi_args=("--mca", "btl", "^openib"), binary="/opt/ompi/bin/mpirun")
    assert L.plan_command(spec, mpi="openmpi", is_root=False, cores=2) == (
        "/opt/ompi/bin/mpirun -np 2 --bind-to none --map-by slot -x PATH -x NCCL_DEBUG=INFO "
        "--mca btl ^openib python -m hvdkit.train").split()
    spec = L.LaunchSpec(np=2, program=PROG, env_forward=("PATH",), env_set=(("NCCL_DEBUG", "INFO"),))
    assert shlex.join(L.plan_command(spec, mpi="mpich", is_root=False, cores=2)) == (
        "mpiexec -n 2 -genvlist PATH -genv NCCL_DEBUG INFO python -m hvdkit.train")


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
@pytest.mark.parametrize("root", [True, False])
def test_horovodrun(mpi, root):
    def hv(np_, **kw):
        spec = L.LaunchSpec(np=np_, program=PROG, launcher="horovodrun", env_forward=ENV, **kw)
        return shlex.join(L.plan_command(spec, mpi=mpi, is_root=root, cores=2,
                                         hostfile_text=OMPI_HOSTFILE if kw.get("hostfile") else None))

    # horovodrun forwards the environment and handles root itself; alone it runs on localhost:np
    assert hv(8) == "horovodrun -np 8 python -m hvdkit.train"
    assert hv(4, hosts="a:2,b:2") == "horovodrun -np 4 -H a:2,b:2 python -m hvdkit.train"
    assert hv(4, hostfile="hosts.txt") == "horovodrun -np 4 -H node1:2,node2:2 python -m hvdkit.train"
    over = "--mpi-args=--oversubscribe " if mpi == "openmpi" else ""
    assert hv(6, hosts="a:2,b:2") == f"horovodrun -np 6 -H a:2,b:2 {over}python -m hvdkit.train"
    assert hv(2, env_set=(("NCCL_DEBUG", "INFO"),)) == "env NCCL_DEBUG=INFO horovodrun -np 2 python -m hvdkit.train"
    with pytest.raises(UsageError, match="horovodrun needs one for every host"):
        hv(2, hosts="a,b")


def test_horovodrun_mpi_args_merge():
    spec = L.LaunchSpec(np=3, program=PROG, launcher="horovodrun", hosts="a:1", mpi_args=("--mca", "btl", "tcp,self"))
    assert L.plan_command(spec, mpi="openmpi", is_root=True, cores=2) == [
        "horovodrun", "-np", "3", "-H", "a:1", "--mpi-args=--oversubscribe --mca btl tcp,self", *PROG]


def test_cpu_ranks_wraps_the_program():
    spec = L.LaunchSpec(np=4, program=PROG, cpu_ranks="0", python="/venv/bin/python")
    assert L.plan_command(spec, mpi="mpich", is_root=False, cores=4) == [
        "mpiexec", "-n", "4", "/venv/bin/python", "-m", "hvdkit.launch", "--rank-exec", "--cpu-ranks", "0", "--", *PROG]
    with pytest.raises(UsageError, match="rank 4 does not exist with -np 4"):
        L.LaunchSpec(np=4, program=PROG, cpu_ranks="1,4")


@pytest.mark.parametrize("text,mpi,match", [
    ("# only a comment\n", "openmpi", "no hosts"),
    ("a slots=two\n", "openmpi", r"hosts.txt:1: 'a slots=two': slots='two' must be a positive integer"),
])
def test_hostfile_errors(text, mpi, match):
    spec = L.LaunchSpec(np=2, program=PROG, hostfile="hosts.txt")
    with pytest.raises(UsageError, match=match):
        L.plan_command(spec, mpi=mpi, is_root=False, cores=2, hostfile_text=text)


@pytest.mark.parametrize("text,mpi,written", [
    (MPICH_HOSTFILE, "openmpi", "node1 slots=2\nnode2 slots=2\n"),    # MPICH's form, given to Open MPI
    (OMPI_HOSTFILE, "mpich", "node1:2\nnode2:2\n"),                  # Open MPI's form, given to MPICH
    ("a slots=2\nb:2\n", "openmpi", "a slots=2\nb slots=2\n"),       # both forms in one file
])
def test_hostfile_converted_to_the_launchers_form(text, mpi, written, tmp_path):
    spec = L.LaunchSpec(np=2, program=PROG, hostfile="hosts.txt")
    cmd = L.plan_command(spec, mpi=mpi, is_root=False, cores=2, hostfile_text=text, hostfile_dir=str(tmp_path))
    path = cmd[cmd.index("--hostfile" if mpi == "openmpi" else "-f") + 1]
    assert os.path.dirname(path) == str(tmp_path)
    with open(path) as f:
        assert f.read().split("\n", 1)[1] == written


def test_hostfile_read_from_disk(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# two nodes\nn1 slots=4  # GPUs\nn2 slots=4 max_slots=4\n")
    assert [(h.name, h.slots, h.max_slots) for h in L.parse_hostfile(f.read_text())] == [
        ("n1", 4, None), ("n2", 4, 4)]
    cmd = L.plan_command(L.LaunchSpec(np=9, program=PROG, hostfile=str(f)), mpi="openmpi", is_root=False, cores=1,
                         hostfile_dir=str(tmp_path))
    assert "--oversubscribe" in cmd and cmd[3] == "--hostfile"
    assert open(cmd[4]).read().endswith("n1 slots=4\nn2 slots=4 max_slots=4\n")
    with pytest.raises(UsageError, match="cannot read it"):
        L.plan_command(L.LaunchSpec(np=2, program=PROG, hostfile=str(tmp_path / "nope")),
                       mpi="openmpi", is_root=False, cores=1)
    with pytest.raises(UsageError, match=r"h:1: host 'a' has no slot count; horovodrun needs one"):
        L.plan_command(L.LaunchSpec(np=2, program=PROG, hostfile="h", launcher="horovodrun"),
                       mpi="openmpi", is_root=False, cores=1, hostfile_text="a\nb\n")


@pytest.mark.parametrize("spec,match", [
    ("a:0", "positive integer"), ("a:x", "positive integer"), (",a:1", "empty host name")])
def test_parse_hosts_errors(spec, match):
    with pytest.raises(UsageError, match=match):
        L.parse_hosts(spec)


def test_spec_errors():
    with pytest.raises(UsageError, match="must be >= 1"):
        L.LaunchSpec(np=0, program=PROG)
    with pytest.raises(UsageError, match="not both"):
        L.LaunchSpec(np=1, program=PROG, hosts="a:1", hostfile="h")
    with pytest.raises(UsageError, match="choose openmpi or mpich"):
        L.build_command(L.LaunchSpec(np=1, program=PROG), mpi="lam", is_root=False, slots=1)


OMPI_VERSION = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
MPICH_VERSION = ("HYDRA build details:\n    Version:                                 4.1.2\n"
                 "    Release Date:                            Wed Jun  7 15:22:45 CDT 2023\n")
IMPI_VERSION = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n"


def test_parse_mpi_version():
    assert L.parse_mpi_version(OMPI_VERSION) == "openmpi"
    assert L.parse_mpi_version(MPICH_VERSION) == "mpich"
    assert L.parse_mpi_version(IMPI_VERSION) == "mpich"  # Hydra flags
    with pytest.raises(ValueError, match="pass --mpi openmpi or --mpi mpich"):
        L.parse_mpi_version("LAM 7.1.4\n")


def test_open_mpi_major_tells_open_mpi_5_from_4_and_asks_each_launcher_once():
    from hvdkit.launch.mpi import launcher_open_mpi_major, open_mpi_major

    assert open_mpi_major(OMPI_VERSION) == 4
    assert open_mpi_major("mpirun (Open MPI) 5.0.7\n\nReport bugs to https://www.open-mpi.org/community/help/\n") == 5
    assert open_mpi_major("Open MPI v5.0.7, package: Debian OpenMPI, ident: 5.0.7") == 5   # MPI.Get_library_version
    assert open_mpi_major(MPICH_VERSION) is None and open_mpi_major("") is None
    asked = []
    fake = f"/nonexistent/mpirun-{os.getpid()}"
    for _ in range(2):
        assert launcher_open_mpi_major(fake, run=lambda argv: asked.append(argv) or "mpirun (Open MPI) 5.0.7\n") == 5
    assert asked == [[fake, "--version"]]
    assert launcher_open_mpi_major(fake + "-missing") is None   # no such launcher: not Open MPI 5


def test_detect_mpi_with_injected_output():
    assert L.detect_mpi("/opt/mpich/bin/mpiexec", run=lambda argv: MPICH_VERSION) == ("mpich", "/opt/mpich/bin/mpiexec")
    assert L.detect_mpi("/x/mpirun", run=lambda argv: OMPI_VERSION) == ("openmpi", "/x/mpirun")
    with pytest.raises(UsageError, match="cannot tell the MPI"):
        L.detect_mpi("mpirun", run=lambda argv: "something else")


def test_detect_mpi_here():
    """This machine has Open MPI 4.1 (the verified stack)."""
    if not (shutil.which("mpirun") or shutil.which("mpiexec")):
        pytest.skip("no mpirun/mpiexec on PATH")
    flavour, binary = L.detect_mpi()
    assert flavour in ("openmpi", "mpich") and binary


def test_local_cores_counts_physical_cores():
    ht = "".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i % 2}\n\n" for i in range(4))
    assert L.local_cores(ht) == min(2, len(os.sched_getaffinity(0)))
    assert L.local_cores("") >= 1


def test_forwarded_env_names():
    env = {"PATH": "/bin", "HOME": "/root", "NCCL_DEBUG": "INFO", "HOROVOD_CYCLE_TIME": "1",
           "HVDKIT_MODEL": "cnn", "PYTHONPATH": "/x", "TF_CONFIG": "{}", "CUDA_VISIBLE_DEVICES": "0"}
    assert L.forwarded_env_names(env, extra=("OMP_NUM_THREADS",)) == (
        "HOROVOD_CYCLE_TIME", "HVDKIT_MODEL", "NCCL_DEBUG", "OMP_NUM_THREADS", "PATH", "PYTHONPATH")


def test_rank_list_and_env():
    assert L.parse_rank_list("0,2,4-6") == {0, 2, 4, 5, 6}
    for bad in ("", "a", "3-1", "1,,2"):
        with pytest.raises(UsageError, match="--cpu-ranks"):
            L.parse_rank_list(bad)
    assert L.rank_from_env({"PMI_RANK": "3", "SLURM_PROCID": "7"}) == 3
    assert L.rank_from_env({"OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "5"}) == 1
    with pytest.raises(UsageError, match="cannot tell this process's rank"):
        L.rank_from_env({})
    assert L.rank_exec_env({"PMIX_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,1"}, "0")["CUDA_VISIBLE_DEVICES"] == ""
    assert L.rank_exec_env({"PMIX_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, "0")["CUDA_VISIBLE_DEVICES"] == "0,1"


def _run(args, env=None, timeout=60):
    e = dict(os.environ, PYTHONPATH=ROOT)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "hvdkit.launch", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


@pytest.mark.parametrize("rank,expect", [("0", "''"), ("1", "'0'")])
def test_rank_exec_runs_the_program(rank, expect):
    show = "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    p = _run(["--rank-exec", "--cpu-ranks", "0", "--", sys.executable, "-c", show],
             env={"OMPI_COMM_WORLD_RANK": rank, "CUDA_VISIBLE_DEVICES": "0"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == expect


def test_main_dry_run(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    assert L.main(["-np", "1", "--mpi", "openmpi", "--env", "FOO=1", "--dry-run", "--", "--epochs", "1"]) == 0
    argv = shlex.split(capsys.readouterr().out)
    head = ["mpirun", "-np", "1", "--bind-to", "none", "--map-by", "slot"]
    head += ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert argv[:len(head)] == head
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)
    assert "--oversubscribe" not in argv  # 1 rank never exceeds the cores
    assert argv[argv.index("NCCL_DEBUG") - 1] == "-x" and argv[argv.index("FOO=1") - 1] == "-x"
    assert argv[-5:] == [sys.executable, "-m", "hvdkit.train", "--epochs", "1"]
    assert L.main(["-np", "2", "--mpi", "mpich", "--dry-run", "python", "my.py", "-v"]) == 0
    argv = shlex.split(capsys.readouterr().out)
    assert argv[:3] == ["mpiexec", "-n", "2"] and argv[-3:] == ["python", "my.py", "-v"]


def test_multi_host_open_mpi_gets_the_ring_allreduce(capsys, monkeypatch):
    """-H / --hostfile with Open MPI: the ring allreduce MCA flags (mpirun, and horovodrun's
    --mpi-args); not on one host, not for MPICH, not when the user set any coll_tuned parameter."""
    ring = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"]
    keep = ["--mca", "oob_tcp_keepalive_time", "5", "--mca", "oob_tcp_keepalive_intvl", "3",
            "--mca", "oob_tcp_keepalive_probes", "3"]    # a lost host noticed within ~14 s
    links = ["--mca", "btl_tcp_links", "2"]   # each direction of a pair on a connection of its own
    monkeypatch.delenv("OMPI_MCA_coll_tuned_allreduce_algorithm", raising=False)
    assert multi_host_mpi_args(("-v",), {}) == ("-v", *ring, *keep, *links)
    assert multi_host_mpi_args(("--mca", "coll_tuned_allreduce_algorithm", "6"), {}) == \
        ("--mca", "coll_tuned_allreduce_algorithm", "6", *keep, *links)
    assert multi_host_mpi_args((), {"OMPI_MCA_coll_tuned_use_dynamic_rules": "0"}) == (*keep, *links)
    assert multi_host_mpi_args(("--mca", "oob_tcp_keepalive_time", "60"), {"OMPI_MCA_coll_tuned_x": "1",
                                                                           "OMPI_MCA_btl_tcp_links": "1"}) == \
        ("--mca", "oob_tcp_keepalive_time", "60")
    assert multi_host_mpi_args(("--mca", "btl_tcp_links", "4"), {}) == ("--mca", "btl_tcp_links", "4", *ring, *keep)

    def run(*args):
        assert L.main([*args, "--dry-run", "--", "--epochs", "1"]) == 0
        return shlex.split(capsys.readouterr().out)

    argv = run("-np", "2", "-H", "a:1,b:1", "--mpi", "openmpi")
    i = argv.index("--mca")
    assert argv[i:i + 18] == ring + keep + links and argv[i + 18] == sys.executable
    monkeypatch.setattr("hvdkit.launch.network.fabric_devices", lambda: ["/dev/hfi1_0"])   # no cm rule (fabrics.py)
    assert "--mca" not in run("-np", "2", "--mpi", "openmpi")
    assert "--mca" not in " ".join(run("-np", "2", "-H", "a:1,b:1", "--mpi", "mpich"))
    argv = run("-np", "2", "-H", "a:1,b:1", "--mpi", "openmpi", "--mpi-args=--mca coll_tuned_use_dynamic_rules 0")
    assert argv.count("--mca") == 5 and "coll_tuned_allreduce_algorithm" not in argv
    argv = run("-np", "2", "-H", "a:1,b:1", "--mpi", "openmpi", "--launcher", "horovodrun")
    assert "--mpi-args=" + shlex.join(ring + keep + links) in argv
    with monkeypatch.context() as m:   # a Slurm allocation without -H: the same multi-host settings
        for k, v in {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}.items():
            m.setenv(k, v)
        argv = run("--mpi", "openmpi")
        i = argv.index("--mca")
        assert argv[i:i + 18] == ring + keep + links and "n1:1,n2:1" in argv, argv
    monkeypatch.setenv("OMPI_MCA_coll_tuned_allreduce_algorithm", "6")
    argv = run("-np", "2", "-H", "a:1,b:1", "--mpi", "openmpi")
    assert "coll_tuned_allreduce_algorithm" not in argv and argv.count("--mca") == 4


@pytest.mark.parametrize("args,match", [
    (["--dry-run"], "-np N is required"),
    (["-np", "2", "--cpu-ranks", "5", "--mpi", "openmpi", "--dry-run"], "rank 5 does not exist"),
    (["-np", "2", "--hostfile", "/nonexistent/hosts", "--mpi", "openmpi", "--dry-run"], "cannot read it"),
    (["-np", "2", "--env", "HVDKIT_SURELY_UNSET_VAR", "--mpi", "openmpi", "--dry-run"], "not set in this environment"),
    (["-np", "2", "-H", "a:1", "--hostfile", "h"], "not allowed with argument"),
    (["--render", "k8s", "--set", "replicas=3"], "has no 'replicas'"),
])
def test_main_errors_exit_2(args, match, capsys):
    assert L.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvdkit-launch: error: ") and match in err, err


def test_help_has_groups():
    p = _run(["--help"])
    assert p.returncode == 0
    for group in ("ranks and hosts:", "launcher:", "environment:", "GPU placement:", "templates:"):
        assert group in p.stdout


# ------------------------------------------------------------------ templates and wrappers

def test_render_k8s_mpijob_parses():
    doc = yaml.safe_load(L.render("k8s", {"workers": "3", "gpus_per_worker": "8", "image": "reg.io/hvdkit:gpu",
                                          "name": "hvdkit-r50", "train_args": "--model cnn --epochs 2"}))
    assert doc["apiVersion"] == "kubeflow.org/v2beta1" and doc["kind"] == "MPIJob"
    spec = doc["spec"]
    assert doc["metadata"]["name"] == "hvdkit-r50" and spec["slotsPerWorker"] == 8
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    worker = spec["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    wc = worker["template"]["spec"]["containers"][0]
    assert wc["resources"]["limits"]["nvidia.com/gpu"] == 8 and wc["image"] == launcher["image"] == "reg.io/hvdkit:gpu"
    cmd = launcher["command"] + launcher["args"]
    assert cmd[:2] == ["bash", "-c"]
    assert shlex.split(cmd[2]) == ["exec", "hvdkit-launch", "-np", "24", "--hostfile", "/etc/mpi/hostfile",
                                   "--env", "NCCL_DEBUG=WARN", "--", "--model", "cnn", "--epochs", "2"]


def test_render_slurm_passes_bash_n(tmp_path):
    text = L.render("slurm", {"nodes": "4", "gpus_per_node": "8", "train_args": "--model resnet50 --dataset synthetic"})
    assert "{{" not in text
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gres=gpu:8"):
        assert line in text.splitlines()
    assert "srun --mpi=pmix" in text and "python -m hvdkit.launch -np" in text
    f = tmp_path / "job.sbatch"
    f.write_text(text)
    p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def test_render_cli_and_defaults(tmp_path):
    p = _run(["--render", "k8s"])
    assert p.returncode == 0, p.stderr
    assert yaml.safe_load(p.stdout)["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == int(
        L.TEMPLATES["k8s"][1]["workers"])
    # every placeholder of every template has a value
    for name in L.TEMPLATES:
        assert set(T._PLACEHOLDER.findall(L.template_text(name))) <= set(L.template_values(name)), name


@pytest.mark.parametrize("name,over,match", [
    ("k8s", {"workers": "0"}, "positive integer"),
    ("k8s", {"name": "Bad_Name"}, "Kubernetes name"),
    ("slurm", {"nodes": "two"}, "positive integer"),
    ("pbs", {}, "choose slurm, suite or k8s"),
])
def test_template_value_errors(name, over, match):
    with pytest.raises(UsageError, match=match):
        L.template_values(name, over)


def test_render_template_missing_value():
    with pytest.raises(UsageError, match="without a value: b"):
        L.render_template("{{a}} {{ b }}", {"a": "1"})
    assert L.render_template("x={{ a }}", {"a": "1"}) == "x=1"


@pytest.mark.parametrize("script", ["launch/hvdkit-run.sh", "launch/hvdkit-horovodrun.sh",
                                    "hvdkit/launch/jobs/hvdkit.sbatch"])
def test_scripts_pass_bash_n(script):
    p = subprocess.run(["bash", "-n", os.path.join(ROOT, script)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def test_wrapper_script_dry_run():
    e = dict(os.environ, HVDKIT_PYTHON=sys.executable)
    p = subprocess.run(["bash", os.path.join(ROOT, "launch/hvdkit-horovodrun.sh"), "-np", "2", "--dry-run", "--",
                        "--epochs", "1"], capture_output=True, text=True, timeout=60, env=e, cwd="/")
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout)
    assert os.path.basename(argv[0]) == "horovodrun" and argv[1:3] == ["-np", "2"]
    assert argv[-5:] == [sys.executable, "-m", "hvdkit.train", "--epochs", "1"]


# ------------------------------------------------------------------ the local builder of tests and benchmarks

def test_local_command_is_the_launchers_command(monkeypatch):
    prog = ["py", "-m", "x"]
    fwd = ["-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL"]
    now = ["--mca", "odls_base_sigkill_timeout", "0"]   # a failed job ends at once (restart_mpi_args' rule)
    monkeypatch.delenv("OMPI_MCA_pml", raising=False)
    monkeypatch.delenv("OMPI_MCA_mtl", raising=False)
    monkeypatch.setattr(C, "fabric_devices", lambda: [])   # a host without a fabric: cm left out (fabrics.py)
    monkeypatch.setattr(F, "param_files", lambda environ: [])   # no Open MPI parameter file (Debian's: test_fabrics)
    skip_cm = ["--mca", "pml", "^cm"]
    assert L.local_command(4, prog, binary="mpirun", is_root=True) == [
        "mpirun", "-np", "4", "--bind-to", "none", "--map-by", "slot", "--allow-run-as-root", "--oversubscribe",
        *fwd, *now, *skip_cm, *prog]
    assert L.local_command(1, prog, binary="mpirun", is_root=False, oversubscribe=False,
                           mpi_args=["--mca", "btl", "self"]) == [
        "mpirun", "-np", "1", "--bind-to", "none", "--map-by", "slot", *fwd, "--mca", "btl", "self", *now, *skip_cm,
        *prog]
    monkeypatch.setattr(C, "fabric_devices", lambda: ["/sys/class/infiniband/mlx5_0"])   # cm's MTLs may serve it
    assert L.local_command(1, prog, binary="mpirun", is_root=False, oversubscribe=False)[-6:] == [*now, *prog]
    traced = [*prog, "--timeline", "t.json"]   # rank 0 writes its spans on SIGTERM: Open MPI's 1 s kept
    assert L.local_command(2, traced, binary="mpirun", is_root=False)[-len(traced) - 2:] == ["-x", "TF_CPP_MIN_LOG_LEVEL",
                                                                                            *traced]
    assert L.local_command(2, prog, binary="mpiexec", mpi="mpich", forward=("PATH",), is_root=True) == [
        "mpiexec", "-n", "2", "-genvlist", "PATH", *prog]


def test_local_command_finds_mpirun_or_says_so(monkeypatch):
    if shutil.which("mpirun"):
        cmd = L.local_command(2, ["p"])
        assert cmd[0] == shutil.which("mpirun")
        assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(FileNotFoundError, match="mpirun not found on PATH"):
        L.local_command(2, ["p"])
    with pytest.raises(UsageError, match="must be >= 1"):
        L.local_command(0, ["p"], binary="mpirun")


def test_benchmark_outputs_are_checked_before_any_job_runs(tmp_path):
    """A mistyped --json/--csv/--table/--out-dir fails at once, naming it (no job is launched)."""
    from hvdkit.bench._common import check_outputs

    (tmp_path / "f").write_text("a file")
    check_outputs("b", str(tmp_path / "runs"), [str(tmp_path / "new" / "t.json"), None, ""])
    assert (tmp_path / "runs").is_dir() and (tmp_path / "new").is_dir()
    for out_dir, files, message in ((tmp_path / "f", [], f"--out-dir {tmp_path}/f: {tmp_path}/f is a file"),
                                    (tmp_path / "ok", [str(tmp_path / "f" / "t.json")], f"{tmp_path}/f is a file"),
                                    (tmp_path / "ok", [str(tmp_path)], "is a directory; name a file")):
        with pytest.raises(SystemExit, match=message):
            check_outputs("b", str(out_dir), files)
    r = subprocess.run([sys.executable, "-m", "hvdkit.bench.training", "--quick", "--out-dir", str(tmp_path / "t"),
                        "--table", str(tmp_path / "f" / "x.txt")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == \
        f"hvdkit-bench training: error: {tmp_path}/f/x.txt: {tmp_path}/f is a file, not a directory", r.stderr


def test_network_interface_goes_to_mpi_and_to_the_ranks():
    """--network-interface: MPI's TCP transport and hvdkit.train (HVDKIT_NETWORK_INTERFACE) use one network."""
    got = {m: _plan(m, False, 4, "hostfile", network_interface="eth1") for m in ("openmpi", "mpich")}
    assert ("--mca btl_tcp_if_include eth1 --mca oob_tcp_if_include eth1 -x HOROVOD_FUSION_THRESHOLD -x NCCL_DEBUG "
            "-x PATH -x HVDKIT_NETWORK_INTERFACE=eth1 python") in got["openmpi"], got["openmpi"]
    assert "-iface eth1 -genvlist HOROVOD_FUSION_THRESHOLD,NCCL_DEBUG,PATH -genv HVDKIT_NETWORK_INTERFACE eth1 " \
        "python" in got["mpich"], got["mpich"]
    hvd = _plan("openmpi", False, 4, "hostfile", launcher="horovodrun", network_interface="eth1")
    assert hvd.startswith("env HVDKIT_NETWORK_INTERFACE=eth1 horovodrun -np 4 --network-interface eth1 "), hvd
    assert "if_include" not in _plan("openmpi", False, 4, "hostfile")
