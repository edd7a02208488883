"""The benchmarks' jobs start in this process's environment less what made it an MPI process of its own:
an ``hvdkit bench`` started by a Python that had imported mpi4py (an Open MPI singleton) inherits the
singleton's variables, and an mpirun started under them exits 1 at once, printing nothing."""
import os
import sys

from hvdkit.bench import _common
from hvdkit.bench._common import job_env, launch

#: what an Open MPI 4.1 singleton (``from mpi4py import MPI``, no mpirun) sets in its C environment
SINGLETON = {
    "OMPI_APP_CTX_NUM_PROCS": "1", "OMPI_MCA_ess": "singleton", "OMPI_MCA_orte_ess_num_procs": "1",
    "OMPI_MCA_orte_launch": "1", "OMPI_MCA_orte_precondition_transports": "f8e16c61f5ff66f3-e68acf135d33013f",
    "OMPI_MCA_pmix": "^s1,s2,cray,isolated", "ORTE_SCHIZO_DETECTION": "ORTE",
    "PMIX_BFROP_BUFFER_TYPE": "PMIX_BFROP_BUFFER_NON_DESC", "PMIX_GDS_MODULE": "ds21,ds12,hash",
    "PMIX_DSTORE_21_BASE_PATH": "/tmp/ompi.vm.0/pid.1/pmix_dstor_ds21_1", "PMIX_HOSTNAME": "vm",
    "PMIX_NAMESPACE": "1041367041", "PMIX_RANK": "0", "PMIX_SECURITY_MODE": "native",
    "PMIX_SERVER_TMPDIR": "/tmp/ompi.vm.0/pid.1", "PMIX_SERVER_URI4": "1041367040.0;tcp4://127.0.0.1:58391",
    "PMIX_SYSTEM_TMPDIR": "/tmp", "PMIX_VERSION": "4.2.2rc2"}
#: what mpirun sets in a rank's environment besides (its identity and its daemon's address)
RANK = {"OMPI_MCA_ess": "^singleton", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_UNIVERSE_SIZE": "2", "OMPI_FIRST_RANKS": "0", "OMPI_NUM_APP_CTX": "1", "OMPI_ARGV": "",
        "OMPI_COMMAND": "python", "OMPI_FILE_LOCATION": "/tmp/ompi.vm.0/jf.1/1/0",
        "OMPI_MCA_ess_base_jobid": "1", "OMPI_MCA_ess_base_vpid": "0", "OMPI_MCA_orte_hnp_uri": "1.0;tcp://h:1"}
#: a user's own settings: tuning of Open MPI and PMIx, and the rest of the environment
USER = {"OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "eth0", "PMIX_MCA_gds": "hash",
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "HOME": "/root", "PATH": "/usr/bin", "HVDKIT_THREADS": "1"}


def test_a_singletons_and_a_ranks_variables_are_dropped_and_the_users_kept():
    e = job_env({**SINGLETON, **RANK, **USER})
    assert not set(SINGLETON) & set(e) and not set(RANK) & set(e), sorted(set(e) - set(USER))
    assert {k: e[k] for k in USER if k != "PATH"} == {k: v for k, v in USER.items() if k != "PATH"}
    assert e["PATH"] == os.path.dirname(sys.executable) + os.pathsep + "/usr/bin"
    assert e["TF_CPP_MIN_LOG_LEVEL"] == "2" and job_env({"TF_CPP_MIN_LOG_LEVEL": "0"})["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_a_job_without_home_gets_this_users_from_the_password_database():
    # Open MPI 5's mpirun exits 1 without HOME ("Failed initializing opal: -1"); a HOME given is kept
    import pwd

    assert job_env({"PATH": "/usr/bin"})["HOME"] == pwd.getpwuid(os.getuid()).pw_dir
    assert job_env({"HOME": "/elsewhere"})["HOME"] == "/elsewhere"


def test_a_job_does_not_see_them(tmp_path, monkeypatch):
    for k, v in {**SINGLETON, **USER}.items():
        if k != "PATH":
            monkeypatch.setenv(k, v)
    job = launch(["env"], 30, str(tmp_path / "job.log"))
    seen = dict(line.split("=", 1) for line in job.output.splitlines() if "=" in line)
    assert job.ok and seen["OMPI_MCA_btl"] == "self,vader,tcp" and seen["PMIX_MCA_gds"] == "hash"
    assert not set(SINGLETON) & set(seen), sorted(set(SINGLETON) & set(seen))
    assert _common._env() == job_env(os.environ)


def test_hvdkit_bench_under_a_singletons_variables_launches_its_job_without_them(monkeypatch):
    from hvdkit.bench import cli

    for k in [k for k in os.environ if k.startswith(("OMPI_", "PMIX_", "PMI_", "HOROVOD_"))]:
        monkeypatch.delenv(k)
    assert not cli._in_mpi_job()
    for k, v in {**SINGLETON, "OMPI_MCA_btl": "self,vader,tcp"}.items():
        monkeypatch.setenv(k, v)
    assert not cli._in_mpi_job()   # PMIX_RANK=0, but a singleton's: the benchmark is launched, not run here
    calls = []
    monkeypatch.setattr(cli.subprocess, "call", lambda cmd, **kw: calls.append((cmd, kw)) or 0)
    assert cli.main(["collectives", "-np", "2", "--", "--min-bytes", "1K"]) == 0
    ((cmd, kw),) = calls
    assert "hvdkit.bench.collectives" in cmd and kw["env"]["OMPI_MCA_btl"] == "self,vader,tcp"
    assert not set(SINGLETON) & set(kw["env"]), sorted(set(SINGLETON) & set(kw["env"]))
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.delenv("OMPI_MCA_ess")
    assert cli._in_mpi_job()   # a rank of mpirun's


def test_launch_and_train_leave_a_singletons_variables_and_a_ranks_alone():
    from hvdkit.lifecycle import launched, leave_singleton, singleton_child

    env = {**SINGLETON, **USER}
    assert singleton_child(env) and not launched(env)   # PMIX_RANK=0, but no launcher started it
    assert set(leave_singleton(env)) == set(SINGLETON) and env == USER
    rank = {**RANK, **USER}
    assert not singleton_child(rank) and launched(rank)
    assert leave_singleton(rank) == [] and rank == {**RANK, **USER}   # a rank's: mpirun says "recursive"
