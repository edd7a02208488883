"""``python -m hvdkit.launch`` (console script ``hvdkit-launch``): one launch command for
horovodrun, Open MPI's ``mpirun`` and MPICH's ``mpiexec`` (Hydra), plus job templates.

Examples (``--dry-run`` prints the command instead of running it)::

    hvdkit-launch -np 4                                   # python -m hvdkit.train on 4 local ranks
    hvdkit-launch -np 8 -H a:4,b:4 -- --model resnet50 --dataset synthetic
    hvdkit-launch -np 16 --hostfile hosts --launcher horovodrun -- --model cnn
    hvdkit-launch -np 5 --cpu-ranks 4 -- --strategy ps-sync     # 4 GPU workers, server rank 4 on CPU
    hvdkit-launch -np 2 --dry-run -- python my_script.py        # any program, not only hvdkit.train
    hvdkit-launch --render slurm --set nodes=4 --set gpus_per_node=8 > hvdkit.sbatch

What the built command contains (see :func:`build_command`):

* Open MPI: ``mpirun -np N [-H HOSTS | --hostfile FILE] --bind-to none --map-by slot
  [--allow-run-as-root] [--oversubscribe] -x VAR ... PROGRAM`` (as Horovod's docs run it).
  ``--allow-run-as-root`` only when this process is root; ``--oversubscribe`` only when N
  exceeds the slots: the physical cores of this host when no hosts are given, else the sum
  of ``host:slots`` / ``host slots=S`` (a host given without a count counts as one slot).
* MPICH and other Hydra launchers (Intel MPI, MVAPICH2): ``mpiexec -n N [-hosts HOSTS |
  -f FILE] -genvlist VAR,... PROGRAM``. Hydra neither refuses root nor oversubscription and
  binds nothing by default, so none of the Open MPI-only flags appear.
* horovodrun: ``horovodrun -np N [-H HOSTS | --hostfile FILE] PROGRAM``; horovodrun forwards
  the whole environment and adds ``--allow-run-as-root`` itself; ``--mpi-args=--oversubscribe``
  is added when N exceeds the slots of the given hosts and the MPI is Open MPI.

Forwarded environment (``-x`` / ``-genvlist``): PATH, LD_LIBRARY_PATH, PYTHONPATH and every
``NCCL_*``, ``HOROVOD_*`` and ``HVDKIT_*`` variable set here, plus ``--env NAME[=VALUE]``.

GPU placement: every rank of ``hvdkit.train`` uses the GPU of its local rank
(:func:`hvdkit.steps.configure_threads`). ``--cpu-ranks LIST`` runs the listed ranks (for
example parameter-server ranks) with ``CUDA_VISIBLE_DEVICES=""``: the program is wrapped in
``python -m hvdkit.launch --rank-exec --cpu-ranks LIST -- PROGRAM``, which reads its rank from
the launcher's environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, HOROVOD_RANK,
SLURM_PROCID) and then ``exec``s PROGRAM.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from hvdkit.errors import UsageError

__all__ = [
    "LaunchSpec", "build_command", "plan_command", "parse_mpi_version", "detect_mpi", "local_cores",
    "parse_hosts", "parse_hostfile", "total_slots", "forwarded_env_names", "parse_rank_list",
    "rank_from_env", "rank_exec_env", "render_template", "render", "template_values", "TEMPLATES",
    "main",
]

OPENMPI, MPICH = "openmpi", "mpich"
HOROVODRUN, MPI = "horovodrun", "mpi"
# Forwarded to every rank when set here: exact names, then prefixes.
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
FORWARD_PREFIXES = ("NCCL_", "HOROVOD_", "HVDKIT_")
# Where launchers put the global rank of a process, in the order they are looked up.
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK", "SLURM_PROCID")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------
# MPI flavour and slots
# --------------------------------------------------------------------------------------

def parse_mpi_version(text: str) -> str:
    """The MPI flavour named in the output of ``mpirun --version`` / ``mpiexec --version``.

    Returns ``"openmpi"`` (Open MPI, "OpenRTE") or ``"mpich"`` (MPICH's Hydra, and Hydra
    derivatives that take the same flags: Intel MPI, MVAPICH2).

    Raises:
        ValueError: the text names neither; the message quotes its first line.
    """
    if re.search(r"Open MPI|OpenRTE|open-mpi\.org", text, re.I):
        return OPENMPI
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", text, re.I):
        return MPICH
    first = text.strip().splitlines()[0] if text.strip() else "(no output)"
    raise ValueError(f"cannot tell the MPI from {first!r}; pass --mpi openmpi or --mpi mpich")


def detect_mpi(binary: str | None = None,
               run: Callable[[list[str]], str] | None = None) -> tuple[str, str]:
    """Find the MPI launcher and its flavour: ``(flavour, binary)``.

    Args:
        binary: the launcher to ask (``--mpi-exec``); None tries ``mpirun`` then ``mpiexec``
            on PATH (Debian's alternatives switch both together).
        run: ``run(argv) -> combined stdout+stderr`` (tests inject one); default runs it
            with a 20 s timeout.

    Returns:
        ``("openmpi", "mpirun")`` for Open MPI; ``("mpich", B)`` for Hydra, where B is
        ``binary`` if given, else ``mpiexec`` (if on PATH) or the binary that answered.

    Raises:
        UsageError: no launcher found, or its output names no known MPI.
    """
    def _run(argv: list[str]) -> str:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return p.stdout + p.stderr

    run = run or _run
    candidates = [binary] if binary else [b for b in ("mpirun", "mpiexec") if shutil.which(b)]
    if not candidates:
        raise UsageError("no mpirun or mpiexec on PATH; install Open MPI (bash launch/install.sh) or "
                         "MPICH, pass --mpi-exec PATH, or use --launcher horovodrun")
    b = candidates[0]
    try:
        flavour = parse_mpi_version(run([b, "--version"]))
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"could not run '{b} --version' ({e}); pass --mpi-exec PATH") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    if binary:
        return flavour, binary
    if flavour == OPENMPI:
        return flavour, "mpirun"
    return flavour, "mpiexec" if shutil.which("mpiexec") else b


def local_cores(cpuinfo: str | None = None) -> int:
    """Physical cores usable here, as Open MPI counts slots on a host without a hostfile.

    Unique (physical id, core id) pairs of ``/proc/cpuinfo`` (or ``cpuinfo`` text),
    capped by this process's CPU affinity; falls back to ``os.cpu_count()``. Returns >= 1.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    pairs, phys = set(), "0"
    for line in cpuinfo.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = val.strip()
        elif key == "core id":
            pairs.add((phys, val.strip()))
    n = len(pairs) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        n = min(n, len(os.sched_getaffinity(0)))
    return max(1, n)


def parse_hosts(spec: str) -> list[tuple[str, int | None]]:
    """``"a:4,b:4,c"`` -> ``[("a", 4), ("b", 4), ("c", None)]`` (None: no slot count given).

    Raises:
        UsageError: an empty host name or a slot count that is not a positive integer.
    """
    out: list[tuple[str, int | None]] = []
    for item in spec.split(","):
        host, sep, slots = item.strip().partition(":")
        if not host:
            raise UsageError(f"-H {spec!r}: empty host name; write HOST:SLOTS,HOST:SLOTS (e.g. a:4,b:4)")
        if not sep:
            out.append((host, None))
        elif slots.isdigit() and int(slots) > 0:
            out.append((host, int(slots)))
        else:
            raise UsageError(f"-H {spec!r}: slots {slots!r} of host {host!r} must be a positive integer")
    return out


def parse_hostfile(text: str, path: str = "hostfile") -> tuple[list[tuple[str, int | None]], str]:
    """Parse a hostfile: ``(entries, syntax)``.

    Accepts Open MPI / horovodrun lines ``host slots=S`` (syntax ``"openmpi"``), MPICH lines
    ``host:S`` (syntax ``"mpich"``) and bare ``host`` lines (valid in both; syntax ``"bare"``
    when every line is bare). ``#`` starts a comment.

    Raises:
        UsageError: an empty file, a line of neither form, or both forms mixed.
    """
    entries: list[tuple[str, int | None]] = []
    kinds = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#")[0].strip()
        if not line:
            continue
        m_ompi = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)(\s+max[-_]slots\s*=\s*\d+)?", line)
        m_mpich = re.fullmatch(r"([^\s:]+):(\d+)", line)
        if m_ompi and int(m_ompi.group(2)) > 0:
            entries.append((m_ompi.group(1), int(m_ompi.group(2))))
            kinds.add(OPENMPI)
        elif m_mpich and int(m_mpich.group(2)) > 0:
            entries.append((m_mpich.group(1), int(m_mpich.group(2))))
            kinds.add(MPICH)
        elif re.fullmatch(r"[^\s:=]+", line):
            entries.append((line, None))
        else:
            raise UsageError(f"{path}:{lineno}: {raw.strip()!r} is not 'HOST slots=N' (Open MPI, horovodrun) "
                             f"nor 'HOST:N' (MPICH)")
    if not entries:
        raise UsageError(f"{path}: no hosts in the hostfile; write one 'HOST slots=N' line per host")
    if len(kinds) > 1:
        raise UsageError(f"{path}: mixes 'HOST slots=N' and 'HOST:N' lines; use one form")
    return entries, (kinds.pop() if kinds else "bare")


def total_slots(entries: Sequence[tuple[str, int | None]]) -> int:
    """Sum of the slot counts; a host without a count counts as one slot (conservative:
    at worst ``--oversubscribe`` is added where it was not needed)."""
    return sum(1 if s is None else s for _, s in entries)


def forwarded_env_names(environ: Mapping[str, str], extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Names of the variables to forward to every rank, sorted: PATH, LD_LIBRARY_PATH,
    PYTHONPATH, every NCCL_*, HOROVOD_*, HVDKIT_* that is set in ``environ``, and ``extra``."""
    names = {k for k in environ if k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES)}
    return tuple(sorted(names | set(extra)))


# --------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchSpec:
    """What to launch, independent of the MPI flavour.

    Attributes:
        np: number of ranks (processes), >= 1.
        program: the command every rank runs, e.g. ``("python", "-m", "hvdkit.train")``.
        launcher: ``"mpi"`` (the installed MPI's own launcher) or ``"horovodrun"``.
        hosts: ``-H`` value, ``"a:4,b:4"``; "" for this host only.
        hostfile: path of a hostfile ("" for none); exclusive with ``hosts``.
        env_forward: names of variables to forward from this environment (Open MPI ``-x``,
            MPICH ``-genvlist``), see :func:`forwarded_env_names`.
        env_set: ``(NAME, VALUE)`` pairs to set on every rank.
        mpi_args: extra launcher arguments, placed just before the program.
        cpu_ranks: ranks to run without GPUs (``"0"``, ``"0,1"``, ``"0-3"``), "" for none.
        python: interpreter for the ``--rank-exec`` wrapper that ``cpu_ranks`` adds.
        binary: the launcher executable ("" for mpirun / mpiexec / horovodrun by flavour).
    """

    np: int
    program: tuple[str, ...]
    launcher: str = MPI
    hosts: str = ""
    hostfile: str = ""
    env_forward: tuple[str, ...] = ()
    env_set: tuple[tuple[str, str], ...] = ()
    mpi_args: tuple[str, ...] = ()
    cpu_ranks: str = ""
    python: str = "python"
    binary: str = ""

    def __post_init__(self) -> None:
        if self.np < 1:
            raise UsageError(f"-np {self.np}: the number of ranks must be >= 1")
        if not self.program:
            raise UsageError("no program to launch; give one after '--' (default: python -m hvdkit.train)")
        if self.launcher not in (MPI, HOROVODRUN):
            raise UsageError(f"--launcher {self.launcher!r}: choose mpi or horovodrun")
        if self.hosts and self.hostfile:
            raise UsageError("give -H HOSTS or --hostfile FILE, not both")
        if self.cpu_ranks:
            bad = sorted(r for r in parse_rank_list(self.cpu_ranks) if r >= self.np)
            if bad:
                raise UsageError(f"--cpu-ranks {self.cpu_ranks!r}: rank {bad[0]} does not exist with "
                                 f"-np {self.np} (ranks are 0..{self.np - 1})")


def _program(spec: LaunchSpec) -> list[str]:
    if not spec.cpu_ranks:
        return list(spec.program)
    return [spec.python, "-m", "hvdkit.launch", "--rank-exec", "--cpu-ranks", spec.cpu_ranks, "--",
            *spec.program]


def build_command(spec: LaunchSpec, *, mpi: str, is_root: bool, slots: int) -> list[str]:
    """The argv that launches ``spec`` (pure: no environment, file or PATH is consulted).

    Args:
        spec: what to launch.
        mpi: ``"openmpi"`` or ``"mpich"`` (for horovodrun: the MPI underneath it).
        is_root: whether the launcher runs as root (Open MPI then needs
            ``--allow-run-as-root``).
        slots: the slots available to ``spec`` (see :func:`plan_command`); Open MPI gets
            ``--oversubscribe`` only when ``spec.np > slots``.

    Returns:
        the argv list (``[0]`` is the executable).

    Raises:
        UsageError: an unknown flavour, or horovodrun hosts without slot counts.
    """
    if mpi not in (OPENMPI, MPICH):
        raise UsageError(f"--mpi {mpi!r}: choose openmpi or mpich")
    oversubscribed = spec.np > slots
    np_ = str(spec.np)
    if spec.launcher == HOROVODRUN:
        cmd = ["env", *(f"{k}={v}" for k, v in spec.env_set)] if spec.env_set else []
        cmd += [spec.binary or "horovodrun", "-np", np_]
        if spec.hosts:
            if any(s is None for _, s in parse_hosts(spec.hosts)):
                raise UsageError(f"-H {spec.hosts!r}: horovodrun needs a slot count for every host "
                                 f"(HOST:SLOTS, e.g. a:4,b:4)")
            cmd += ["-H", spec.hosts]
        elif spec.hostfile:
            cmd += ["--hostfile", spec.hostfile]
        mpi_args = (["--oversubscribe"] if oversubscribed and mpi == OPENMPI else []) + list(spec.mpi_args)
        if mpi_args:
            cmd.append("--mpi-args=" + shlex.join(mpi_args))
        return cmd + _program(spec)
    if mpi == OPENMPI:
        cmd = [spec.binary or "mpirun", "-np", np_]
        if spec.hosts:
            cmd += ["-H", spec.hosts]
        elif spec.hostfile:
            cmd += ["--hostfile", spec.hostfile]
        cmd += ["--bind-to", "none", "--map-by", "slot"]
        if is_root:
            cmd.append("--allow-run-as-root")
        if oversubscribed:
            cmd.append("--oversubscribe")
        for name in spec.env_forward:
            cmd += ["-x", name]
        for k, v in spec.env_set:
            cmd += ["-x", f"{k}={v}"]
        return cmd + list(spec.mpi_args) + _program(spec)
    # MPICH / Hydra
    cmd = [spec.binary or "mpiexec", "-n", np_]
    if spec.hosts:
        cmd += ["-hosts", spec.hosts]
    elif spec.hostfile:
        cmd += ["-f", spec.hostfile]
    if spec.env_forward:
        cmd += ["-genvlist", ",".join(spec.env_forward)]
    for k, v in spec.env_set:
        cmd += ["-genv", k, v]
    return cmd + list(spec.mpi_args) + _program(spec)


def plan_command(spec: LaunchSpec, *, mpi: str, is_root: bool, cores: int,
                 hostfile_text: str | None = None) -> list[str]:
    """Count the slots of ``spec`` and build its command (see :func:`build_command`).

    Slots: ``cores`` when no hosts are given (horovodrun then runs on ``localhost:np``, so
    it never oversubscribes); the slot sum of ``-H``; the slot sum of the hostfile, whose
    text is ``hostfile_text`` (read from ``spec.hostfile`` when None).

    Raises:
        UsageError: the hostfile is missing, malformed, or in the other flavour's syntax
            (MPICH reads ``HOST:N``; Open MPI and horovodrun read ``HOST slots=N``).
    """
    if spec.hosts:
        slots = total_slots(parse_hosts(spec.hosts))
    elif spec.hostfile:
        if hostfile_text is None:
            try:
                with open(spec.hostfile) as fh:
                    hostfile_text = fh.read()
            except OSError as e:
                raise UsageError(f"--hostfile {spec.hostfile}: cannot read it ({e.strerror})") from None
        entries, syntax = parse_hostfile(hostfile_text, spec.hostfile)
        reader = HOROVODRUN if spec.launcher == HOROVODRUN else mpi
        if syntax == MPICH and reader != MPICH:
            h, s = entries[0]
            raise UsageError(f"--hostfile {spec.hostfile}: {reader} reads 'HOST slots=N' lines, not "
                             f"'HOST:N'; write '{h} slots={s}'")
        if syntax == OPENMPI and reader == MPICH:
            h, s = entries[0]
            raise UsageError(f"--hostfile {spec.hostfile}: MPICH's mpiexec reads 'HOST:N' lines, not "
                             f"'HOST slots=N'; write '{h}:{s}'")
        if reader == HOROVODRUN and syntax == "bare":
            raise UsageError(f"--hostfile {spec.hostfile}: horovodrun needs 'HOST slots=N' on every line")
        slots = total_slots(entries)
    else:
        slots = spec.np if spec.launcher == HOROVODRUN else cores
    return build_command(spec, mpi=mpi, is_root=is_root, slots=slots)


# --------------------------------------------------------------------------------------
# inside the job: --rank-exec
# --------------------------------------------------------------------------------------

def parse_rank_list(text: str) -> frozenset[int]:
    """``"0,2,4-6"`` -> ``{0, 2, 4, 5, 6}``.

    Raises:
        UsageError: an item that is not ``R`` or ``A-B`` with 0 <= A <= B.
    """
    ranks: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise UsageError(f"--cpu-ranks {text!r}: {item!r} is not a rank R or a range A-B (e.g. 0,2-3)")
        lo = int(m.group(1))
        ranks.update(range(lo, int(m.group(2) or lo) + 1))
    return frozenset(ranks)


def rank_from_env(environ: Mapping[str, str]) -> int:
    """This process's global rank, from the first of :data:`RANK_VARS` that is set.

    Raises:
        UsageError: none is set (``--rank-exec`` runs only inside a launched job).
    """
    for var in RANK_VARS:
        if environ.get(var, "").strip().isdigit():
            return int(environ[var])
    raise UsageError("--rank-exec: cannot tell this process's rank (none of " + ", ".join(RANK_VARS)
                     + " is set); it runs inside mpirun, mpiexec, srun or horovodrun")


def rank_exec_env(environ: Mapping[str, str], cpu_ranks: str) -> dict[str, str]:
    """The environment for the program of this rank: ``environ`` plus
    ``CUDA_VISIBLE_DEVICES=""`` when this rank is in ``cpu_ranks`` (TensorFlow then sees
    no GPU and places everything on the CPU)."""
    env = dict(environ)
    if cpu_ranks and rank_from_env(environ) in parse_rank_list(cpu_ranks):
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# --------------------------------------------------------------------------------------
# templates
# --------------------------------------------------------------------------------------

_INT_KEYS = {"nodes", "gpus_per_node", "cpus_per_task", "workers", "gpus_per_worker", "np"}
TEMPLATES: dict[str, tuple[str, dict[str, str]]] = {
    # name: (path relative to the repository root, default values)
    "slurm": ("launch/slurm/hvdkit.sbatch", {
        "job_name": "hvdkit", "nodes": "2", "gpus_per_node": "4", "cpus_per_task": "8",
        "time": "01:00:00", "venv": ".venv",
        "train_args": "--model resnet50 --dataset synthetic --epochs 1"}),
    "k8s": ("launch/k8s/mpijob.yaml", {
        "name": "hvdkit", "image": "hvdkit:gpu", "workers": "2", "gpus_per_worker": "4",
        "train_args": "--model resnet50 --dataset synthetic --epochs 1"}),
}
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


def template_values(name: str, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Defaults of template ``name`` updated with ``overrides``, plus derived values
    (k8s: ``np`` = workers x gpus_per_worker unless given).

    Raises:
        UsageError: an unknown template or key, or a count that is not a positive integer.
    """
    if name not in TEMPLATES:
        raise UsageError(f"--render {name!r}: choose {' or '.join(TEMPLATES)}")
    values = dict(TEMPLATES[name][1])
    known = set(values) | ({"np"} if name == "k8s" else set())
    for k, v in (overrides or {}).items():
        if k not in known:
            raise UsageError(f"--set {k}={v}: template {name} has no {k!r}; known: {', '.join(sorted(known))}")
        values[k] = str(v)
    if name == "k8s":
        values.setdefault("np", str(int(values["workers"]) * int(values["gpus_per_worker"]))
                          if values["workers"].isdigit() and values["gpus_per_worker"].isdigit() else "")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", values["name"]):
            raise UsageError(f"--set name={values['name']}: a Kubernetes name is lower-case letters, digits "
                             f"and '-' (e.g. hvdkit-resnet)")
    for k in _INT_KEYS & set(values):
        if not values[k].isdigit() or int(values[k]) < 1:
            raise UsageError(f"--set {k}={values[k]}: must be a positive integer")
    return values


def render_template(text: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{ key }}`` in ``text`` with ``values[key]``.

    Raises:
        UsageError: a placeholder without a value (the message names it).
    """
    missing = sorted({k for k in _PLACEHOLDER.findall(text) if k not in values})
    if missing:
        raise UsageError(f"template placeholders without a value: {', '.join(missing)}; pass --set KEY=VALUE")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def render(name: str, overrides: Mapping[str, str] | None = None, template: str | None = None) -> str:
    """Template ``name`` ("slurm" or "k8s") rendered with its defaults and ``overrides``.

    ``template`` is a path to use instead of the repository's ``launch/`` file.

    Raises:
        UsageError: unknown template or key, bad value, or the template file is missing.
    """
    values = template_values(name, overrides)
    path = template or os.path.join(_ROOT, TEMPLATES[name][0])
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        raise UsageError(f"template {path} not found; the templates live in launch/ of an hvdkit "
                         f"checkout (or pass --template PATH)") from None
    return render_template(text, values)


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="hvdkit-launch",
        usage="hvdkit-launch [options] [-- PROGRAM ARGS... | -- TRAIN_FLAGS...]",
        description="Build and run the launch command of an hvdkit job for horovodrun, Open MPI "
                    "(mpirun) or MPICH (mpiexec, Hydra); the MPI is detected from '<launcher> --version'. "
                    "PROGRAM defaults to 'python -m hvdkit.train'; if what follows '--' starts with a "
                    "flag, it is passed to hvdkit.train.",
        epilog="Examples:\n"
               "  hvdkit-launch -np 4 --dry-run\n"
               "  hvdkit-launch -np 8 -H a:4,b:4 -- --model resnet50 --dataset synthetic\n"
               "  hvdkit-launch -np 16 --hostfile hosts --launcher horovodrun\n"
               "  hvdkit-launch -np 5 --cpu-ranks 4 -- --strategy ps-sync   # PS server (last rank) on CPU\n"
               "  hvdkit-launch --render k8s --set workers=4 --set image=registry/hvdkit:gpu > job.yaml\n"
               "Open MPI gets --bind-to none --map-by slot, -x for forwarded variables, "
               "--allow-run-as-root only as root and --oversubscribe only when ranks exceed slots; "
               "MPICH gets -genvlist and none of those Open MPI-only flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("ranks and hosts")
    g.add_argument("-np", "-n", dest="np", type=int, metavar="N",
                   help="number of ranks (processes); required unless --render or --rank-exec")
    hosts = g.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default="", metavar="HOST:SLOTS,...",
                       help="hosts and their slots (usually GPUs), e.g. a:4,b:4; default: this host, "
                            "slots = its physical cores")
    hosts.add_argument("--hostfile", default="", metavar="FILE",
                       help="hostfile: 'HOST slots=N' lines (Open MPI, horovodrun) or 'HOST:N' (MPICH)")
    g = p.add_argument_group("launcher")
    g.add_argument("--launcher", choices=(MPI, HOROVODRUN), default=MPI,
                   help="mpi: the installed MPI's own launcher (mpirun or mpiexec); horovodrun: "
                        "Horovod's (default: mpi)")
    g.add_argument("--mpi", choices=("auto", OPENMPI, MPICH), default="auto",
                   help="which MPI is installed (default: auto, from '<launcher> --version')")
    g.add_argument("--mpi-exec", default="", metavar="PATH",
                   help="the MPI launcher to run (default: mpirun for Open MPI, mpiexec for MPICH)")
    g.add_argument("--mpi-args", default="", metavar="'ARGS'",
                   help="extra arguments for the launcher, one quoted string "
                        "(e.g. --mpi-args=\"--mca btl tcp,self\")")
    g.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    g = p.add_argument_group("environment")
    g.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="also forward NAME (or set NAME=VALUE) on every rank; repeatable. Always "
                        "forwarded when set: " + ", ".join(FORWARD_NAMES) + ", "
                        + ", ".join(pre + "*" for pre in FORWARD_PREFIXES))
    g = p.add_argument_group("GPU placement")
    g.add_argument("--cpu-ranks", default="", metavar="LIST",
                   help="ranks that run without GPUs (CUDA_VISIBLE_DEVICES=''), e.g. parameter-server "
                        "ranks: 0 or 0,1 or 0-3. The other ranks use the GPU of their local rank")
    g.add_argument("--rank-exec", action="store_true",
                   help="(inside a job) apply --cpu-ranks to this process and exec PROGRAM; "
                        "--cpu-ranks adds this wrapper itself")
    g = p.add_argument_group("templates")
    g.add_argument("--render", choices=tuple(TEMPLATES), metavar="{slurm,k8s}",
                   help="print a job template filled in: slurm (sbatch script) or k8s (Kubeflow MPIJob)")
    g.add_argument("--set", dest="set_values", action="append", default=[], metavar="KEY=VALUE",
                   help="a template value; slurm: " + ", ".join(TEMPLATES["slurm"][1]) + "; k8s: "
                        + ", ".join(TEMPLATES["k8s"][1]) + ", np")
    g.add_argument("--template", metavar="PATH", help="render this file instead of the one in launch/")
    p.add_argument("program", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def _split_program(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    if "--" in argv:
        i = list(argv).index("--")
        return list(argv[:i]), list(argv[i + 1:])
    return list(argv), None


def _env_args(items: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], list[tuple[str, str]]]:
    names, pairs = [], []
    for item in items:
        k, eq, v = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise UsageError(f"--env {item!r}: {k!r} is not a variable name")
        if eq:
            pairs.append((k, v))
        elif k in environ:
            names.append(k)
        else:
            raise UsageError(f"--env {k}: not set in this environment; export it or give --env {k}=VALUE")
    return names, pairs


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hvdkit-launch``; returns the exit status (2 on bad input).

    Without ``--dry-run`` the launcher replaces this process (``os.execvpe``), so its exit
    status and signals are the job's.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    own, after = _split_program(argv)
    try:
        ns = _parser().parse_args(own)
        program = after if after is not None else list(ns.program)
        if ns.render:
            overrides = {}
            for item in ns.set_values:
                k, eq, v = item.partition("=")
                if not eq:
                    raise UsageError(f"--set {item!r}: write KEY=VALUE")
                overrides[k] = v
            sys.stdout.write(render(ns.render, overrides, ns.template))
            return 0
        if ns.rank_exec:
            if not program:
                raise UsageError("--rank-exec needs a program after '--'")
            env = rank_exec_env(os.environ, ns.cpu_ranks)
            return _exec(program, env, ns.dry_run)
        if ns.np is None:
            raise UsageError("-np N is required: the number of ranks to launch")
        default = [sys.executable, "-m", "hvdkit.train"]
        if not program:
            program = default
        elif program[0].startswith("-"):
            program = default + program  # only flags: they are hvdkit.train's
        names, pairs = _env_args(ns.env, os.environ)
        spec = LaunchSpec(
            np=ns.np, program=tuple(program), launcher=ns.launcher, hosts=ns.hosts, hostfile=ns.hostfile,
            env_forward=forwarded_env_names(os.environ, names), env_set=tuple(pairs),
            mpi_args=tuple(shlex.split(ns.mpi_args)), cpu_ranks=ns.cpu_ranks, python=sys.executable,
            binary=ns.mpi_exec if ns.launcher == MPI else _horovodrun())
        mpi = ns.mpi
        needs_mpi = ns.launcher == MPI or bool(ns.hosts or ns.hostfile)
        if ns.launcher == MPI and mpi == "auto":
            mpi, binary = detect_mpi(ns.mpi_exec or None)
            spec = replace(spec, binary=binary)
        elif mpi == "auto":  # horovodrun: the flavour matters only for --oversubscribe across hosts
            mpi = detect_mpi()[0] if needs_mpi else OPENMPI
        cmd = plan_command(spec, mpi=mpi, is_root=os.geteuid() == 0, cores=local_cores())
        return _exec(cmd, dict(os.environ), ns.dry_run)
    except UsageError as e:
        print(f"hvdkit-launch: error: {e}", file=sys.stderr)
        return 2


def _horovodrun() -> str:
    if shutil.which("horovodrun"):
        return "horovodrun"
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.path.exists(beside) else "horovodrun"


def _exec(cmd: list[str], env: dict[str, str], dry_run: bool) -> int:
    if dry_run:
        print(shlex.join(cmd), flush=True)
        return 0
    exe = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0], path=env.get("PATH"))
    if not exe or not os.path.exists(exe):
        raise UsageError(f"{cmd[0]!r} not found on PATH; install it (bash launch/install.sh), activate the "
                         f"venv, or choose another --launcher / --mpi-exec")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(exe, cmd, env)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
