"""Commands that only compute must not start MPI or load TensorFlow when imported: ``hvdkit advise``
and the strategy registry it asks (importing mpi4py.MPI runs MPI_Init, which took 0.69 s of the
advisor's 1.4 s start on the 2-core machine). Each check runs in a fresh interpreter."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

HEAVY = ("mpi4py", "tensorflow", "horovod")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", [
    "import hvdkit.advise.cli",
    "import hvdkit.cli, hvdkit.advise.cli as c\ntry:\n    c.main(['--help'])\nexcept SystemExit:\n    pass",
    "from hvdkit.strategies.variants import parse_variant\nparse_variant('ps-sync:num_servers=2').ranks(4)",
], ids=["import", "help", "registry"])
def test_advise_and_the_registry_import_neither_mpi4py_nor_tensorflow(code):
    assert _loaded_after(code) == []


@pytest.mark.parametrize("flags", [["--model", "vgg"], ["--strategy", "ps-sync"],
                                   ["--model", "linear", "--output-dir", "README.md"]],
                         ids=["model", "strategy-check", "output-dir"])
def test_bad_input_is_refused_before_tensorflow_is_imported(flags):
    """Set-up's first checks (names, the strategy's own check, the data, every output path: run_setup._inputs)
    end a run with status 2 before TensorFlow is imported (about 3 CPU s on every rank of every such job)."""
    code = (f"from hvdkit.train import main\ntry:\n    main({flags!r})\nexcept SystemExit as e:\n"
            f"    assert e.code == 2, e.code\nelse:\n    raise AssertionError('no error')")
    assert _loaded_after(code) == ["mpi4py"]
