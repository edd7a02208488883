"""Another MPI's launcher (mpi4py#280): MPICH's ``mpiexec`` running hvdkit.train with mpi4py on Open
MPI ends at once with one line naming both MPIs and status 2, and writes nothing; each rank's
versions are in results.json.

MPICH's launcher comes from Debian's packages, unpacked (``apt-get download`` + ``dpkg -x``) under
``~/.cache/hvdkit-test-mpich``, never installed over Open MPI; the test is skipped where they cannot
be downloaded."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import launch, load_results

pytestmark = pytest.mark.parallel

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "hvdkit-test-mpich")
#: Hydra's launcher; the libraries it needs that are not installed are unpacked beside it (Debian 12:
#: libslurm38), MPICH's own library (libmpich12) not: mpi4py must go on loading Open MPI
PACKAGE = "mpich"


def _run(argv, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


def _hydra() -> tuple[str, dict]:
    """(``mpiexec.hydra``'s path, the environment it needs), unpacked once into :data:`CACHE`."""
    mpiexec = os.path.join(CACHE, "usr", "bin", "mpiexec.hydra")
    libs = os.pathsep.join(os.path.join(CACHE, d) for d in ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"))
    env = {"LD_LIBRARY_PATH": libs}
    if not os.path.exists(mpiexec):
        if not (shutil.which("apt-get") and shutil.which("dpkg") and shutil.which("apt-cache")):
            pytest.skip("no apt-get/dpkg here to unpack Debian's mpich")
        deps = _run(["apt-cache", "depends", "--no-recommends", "--no-suggests", PACKAGE]).stdout
        wanted = {ln.split(":", 1)[1].strip() for ln in deps.splitlines()
                  if ln.strip().startswith(("Depends:", "|Depends:"))}
        names = [PACKAGE] + sorted(n for n in wanted if n.startswith("lib") and not n.startswith(("libmpich", "<"))
                                   and _run(["dpkg", "-s", n]).returncode != 0)
        with tempfile.TemporaryDirectory() as d:
            got = _run(["apt-get", "download", *names], cwd=d)
            debs = [f for f in os.listdir(d) if f.endswith(".deb")]
            if got.returncode != 0 or len(debs) < len(names):
                why = (got.stderr or got.stdout).strip()[-300:]
                pytest.skip(f"could not download Debian's {' '.join(names)}: {why}")
            part = CACHE + ".part"
            shutil.rmtree(part, ignore_errors=True)
            for deb in debs:
                assert _run(["dpkg", "-x", os.path.join(d, deb), part]).returncode == 0, deb
            shutil.rmtree(CACHE, ignore_errors=True)
            os.rename(part, CACHE)   # whole or not at all: a rerun never finds half a tree
    version = _run([mpiexec, "--version"], env=env) if os.path.exists(mpiexec) else None
    if version is None or "HYDRA" not in version.stdout:
        pytest.skip(f"the unpacked {mpiexec} does not run here")
    return mpiexec, env


def test_mpichs_mpiexec_with_mpi4py_on_open_mpi_ends_in_one_line(tmp_path):
    mpiexec, env = _hydra()
    out = tmp_path / "out"
    r = launch([mpiexec, "-n", "2", sys.executable, "-m", "hvdkit.train", "--model", "linear", "--epochs", "1",
                "--no-tensorboard", "--no-checkpoint", "--output-dir", str(out)], timeout=180, env=env)
    errors = [ln for ln in r.output.splitlines() if "hvdkit: error:" in ln]
    assert len(errors) == 1, r.output
    assert errors[0].startswith("hvdkit: error: MPICH's mpiexec (Hydra) started 2 processes (PMI_SIZE=2), but mpi4py "
                                "uses Open MPI (Open MPI v"), r.output
    assert "launch with Open MPI's mpirun" in errors[0], r.output
    assert r.returncode == 2, r.output
    assert not (out / "results.json").exists() and "Traceback" not in r.output, r.output


def test_every_ranks_versions_are_in_results_json(sgd_20_job):
    from hvdkit.mpicheck import installed

    ranks = load_results(sgd_20_job / "ring")["ranks"]
    assert [x["rank"] for x in ranks] == [0, 1]
    assert all(x["versions"] == installed() for x in ranks), ranks
    assert set(installed()) == {"hvdkit", "python", "tensorflow", "horovod", "mpi4py"}
