"""Helpers shared by the benchmark drivers: launching MPI jobs, statistics, tables.

The drivers (:mod:`hvdkit.bench.training`, :mod:`hvdkit.bench.suite`) run WITHOUT
``mpirun``; they start one MPI job per measurement through :func:`launch`,
which puts the job in its own process group and kills the whole group (mpirun and every
rank) when the hard timeout expires, so a hang costs one row, never the run.

The driver's death ends its jobs, as ``hvdkit-launch``'s ends its own (:mod:`hvdkit.launch.supervise`):
under :func:`ending_signals` SIGINT, SIGTERM and SIGHUP raise :class:`DriverSignal` in the driver, and
:func:`launch` ends the running job's session (SIGTERM, SIGKILL 5 s later) before it propagates; a
driver killed outright (SIGKILL) ends it too, through the parent-death signal of the job's MPI
launcher (:func:`hvdkit.lifecycle.preexec_die_with_parent`) and the job's reaper
(:func:`hvdkit.launch.reaper.start`). mpirun ends the ranks on other hosts (their ``orted``
exits with it, and every rank of ``hvdkit.train`` dies with its ``orted``).

Tables follow nccl-tests: ``#`` metadata lines, then a ``#`` header row and a ``#`` units
row, then one whitespace-separated data row per measurement (no value contains a space;
a missing value is ``-``), ``#`` summary lines, and a last line ``OK`` or ``FAILED``
matching the exit status. :func:`parse_table` reads one back. JSON and CSV files are
written by :func:`hvdkit.results.write_json` / :func:`hvdkit.results.write_csv` (atomic).
"""
from __future__ import annotations

import json
import math
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from hvdkit.errors import UsageError
from hvdkit.launch import local_command, reaper
from hvdkit.launch.supervise import ENDING
from hvdkit.lifecycle import outside_mpi, preexec_die_with_parent
from hvdkit.results import make_writable_dir

__all__ = ["Job", "DriverSignal", "ending_signals", "mpirun_cmd", "cluster_mpirun_cmd", "launch", "job_env", "outside_mpi",
           "load_results", "quartiles", "paired_ratio_ci", "format_table", "parse_table", "host_meta", "boot_id",
           "meta_lines", "emit", "fmt", "log", "check_outputs"]


def log(*parts: object) -> None:
    """Progress line on stderr (stdout holds only the table)."""
    print(*parts, file=sys.stderr, flush=True)


@dataclass
class Job:
    """Outcome of one launched job.

    Attributes:
        cmd: the command line that was run.
        returncode: its exit status; None when the hard timeout killed it.
        seconds: wall seconds from start to exit (or kill).
        output: stdout and stderr, interleaved as the job wrote them.
    """

    cmd: list[str]
    returncode: int | None
    seconds: float
    output: str

    @property
    def ok(self) -> bool:
        """True when the job exited with status 0 before its timeout."""
        return self.returncode == 0

    def results(self, out_dir: str) -> dict[str, Any] | None:
        """The job's ``results.json`` when it ended OK and the file reads, else None; an unreadable
        file turns the job into a failure (``returncode`` -1) that :meth:`why` explains."""
        if not self.ok:
            return None
        try:
            return load_results(out_dir)
        except (OSError, ValueError) as e:
            self.returncode, self.output = -1, f"results.json unreadable: {e}"
            return None

    def why(self) -> str:
        """One line saying how the job ended, for a FAILED row."""
        if self.returncode is None:
            return f"timed out after {self.seconds:.0f}s"
        tail = [ln for ln in self.output.strip().splitlines() if ln.strip()][-3:]
        return f"exit {self.returncode}: " + " | ".join(t.strip()[:160] for t in tail)


class DriverSignal(KeyboardInterrupt):
    """The driver received an ending signal (SIGINT, SIGTERM, SIGHUP: :data:`hvdkit.launch.supervise.ENDING`)
    under :func:`ending_signals`. A KeyboardInterrupt, so that no ``except Exception`` holds it up on its
    way out of :func:`launch` (which ends the running job first).

    Attributes:
        signum: the signal's number; the driver's exit status is 128 + ``signum``.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def status(self) -> int:
        return 128 + self.signum


@contextmanager
def ending_signals() -> Iterator[None]:
    """While inside, the first SIGINT, SIGTERM or SIGHUP raises :class:`DriverSignal` in the main
    thread (later ones are ignored: the job is being ended); the old handlers come back at the end.
    Call it from the main thread."""
    got: list[int] = []

    def on_signal(signum, _frame):
        if not got:
            got.append(signum)
            raise DriverSignal(signum)

    old = {s: signal.signal(s, on_signal) for s in sorted(ENDING)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cluster_mpirun_cmd(np_: int, program: Sequence[str], hosts: str, *, mpi_args: Sequence[str] = (),
                       env_set: Sequence[tuple[str, str]] = (),
                       forward: Sequence[str] = ("PATH", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")) -> list[str]:
    """``mpirun -np N -H HOSTS ...`` across hosts, built as ``hvdkit-launch`` builds it: MPI's network
    chosen and checked by connecting first (:func:`hvdkit.launch.network.choose`, which logs its one
    line; ssh reaches the hosts through PATH, e.g. the emulated cluster's environment), unless
    ``mpi_args`` names one (``btl_tcp_if_*``); Open MPI's ``cm`` PML left out where no host has a
    fabric device (:mod:`hvdkit.launch.fabrics`).

    Args:
        np_: ranks; program: what every rank runs; hosts: ``-H`` value, ``h1:1,h2:1``;
        mpi_args: extra mpirun arguments; env_set: ``(NAME, VALUE)`` set on every rank;
        forward: variables forwarded from here (``-x``).

    Raises:
        UsageError: the network cannot be chosen (one line, see :mod:`hvdkit.launch.network`).
    """
    from hvdkit.launch.command import LaunchSpec, build_command
    from hvdkit.launch.network import choose, host_names, user_chose

    choice = None if user_chose(mpi_args, os.environ) else \
        choose(host_names(hosts, ""), "", launcher="mpi", mpi="openmpi", log=log)
    from hvdkit.launch.fabrics import skip_cm_args
    from hvdkit.launch.network import job_fabrics

    devices = job_fabrics(host_names(hosts, ""), choice)
    spec = LaunchSpec(np=np_, program=tuple(program), hosts=hosts, env_forward=tuple(forward), env_set=tuple(env_set),
                      mpi_args=skip_cm_args(mpi_args, {**os.environ, **dict(env_set)}, devices), binary="mpirun",
                      network_interface=choice.interface if choice else "",
                      oob_interface=choice.oob_interface if choice else None)
    return build_command(spec, mpi="openmpi", is_root=os.geteuid() == 0, slots=np_)


def mpirun_cmd(np_: int, module: str, args: Sequence[str] = (), mpirun_args: Sequence[str] = ()) -> list[str]:
    """``mpirun -np N ... python -m MODULE ARGS`` on this host (:func:`hvdkit.launch.local_command`).

    Ranks may outnumber cores (``--oversubscribe``) and are not pinned to a core
    (``--bind-to none``: hvdkit sizes TensorFlow's thread pools itself); ``--allow-run-as-root``
    as root. ``PATH``, ``PYTHONPATH`` and ``TF_CPP_MIN_LOG_LEVEL`` are forwarded to every rank;
    ``mpirun_args`` go just before the program.

    Raises:
        FileNotFoundError: no ``mpirun`` on PATH (install Open MPI, or activate the venv).
    """
    return local_command(np_, [sys.executable, "-m", module, *args], mpi_args=mpirun_args)


def job_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a job started from a process whose environment is ``environ``: :func:`outside_mpi`
    of it, ``TF_CPP_MIN_LOG_LEVEL=2`` unless set, ``HOME`` (this user's, from the password database) unless
    set, and this interpreter's bin/ first on PATH. Pure but for that look-up.

    Open MPI 5's ``mpirun`` refuses to start without ``HOME`` ("Unable to get the user home directory",
    "Failed initializing opal: -1"), where Open MPI 4's starts: a driver run with a bare environment
    (``env -i``, a service, a test harness) would see every job fail at once."""
    e = outside_mpi(environ)
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "HOME" not in e:
        e["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    return e


def _env() -> dict[str, str]:
    """The jobs' environment: this one (:func:`job_env`)."""
    return job_env(os.environ)


def _end_group(p: subprocess.Popen) -> None:
    """SIGTERM the process group of ``p`` (mpirun and every rank), SIGKILL it 5 s later if still there."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue


def launch(cmd: Sequence[str], timeout: float, log_path: str | None = None) -> Job:
    """Run ``cmd`` in its own process group with a hard ``timeout`` (seconds).

    On timeout the whole group (mpirun and every rank) gets SIGTERM, then SIGKILL 5 s
    later; so does an interrupt of the caller (KeyboardInterrupt, :class:`DriverSignal`, re-raised).
    If the caller dies (SIGKILL too), the MPI launcher gets SIGTERM (its parent-death signal) and
    the job's reaper ends every process of its session (:mod:`hvdkit.launch.reaper`). The combined output is
    also written to ``log_path`` when given. The job runs in
    this process's working directory and environment (:func:`job_env`: plus ``TF_CPP_MIN_LOG_LEVEL=2``
    unless set, this interpreter's bin/ first on PATH, less an MPI singleton's or rank's own variables),
    so its ranks import the same hvdkit and relative paths mean the same to the job as to the driver.

    Returns:
        A :class:`Job`; ``returncode`` is None when the timeout killed it.
    """
    t0 = time.monotonic()
    guard = reaper.start(name="hvdkit bench")
    try:
        p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                             start_new_session=True, preexec_fn=preexec_die_with_parent())
    except BaseException:
        if guard:
            guard.finish()
        raise
    if guard:
        guard.watch(p.pid)   # a session leader: its pid is the session's id
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        _end_group(p)
        out, _ = p.communicate()
        rc = None
    except BaseException:   # Ctrl-C / SIGTERM of the driver: the job's own session would outlive it
        _end_group(p)
        raise
    finally:
        if guard:   # ends what the job left running (nothing, after a clean end)
            guard.finish()
    job = Job(list(cmd), rc, time.monotonic() - t0, out or "")
    if log_path:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        with open(log_path, "w") as fh:
            fh.write("$ " + " ".join(job.cmd) + "\n" + job.output
                     + f"\n# exit {job.returncode}  {job.seconds:.1f}s\n")
    return job


def load_results(out_dir: str) -> dict[str, Any]:
    """The ``results.json`` an ``hvdkit.train`` job wrote to ``out_dir``.

    Raises:
        FileNotFoundError: the job wrote none (it failed before finishing).
    """
    with open(os.path.join(out_dir, "results.json")) as fh:
        return json.load(fh)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(p25, median, p75) of ``values``: the median and the interquartile range's ends.

    Percentiles by NumPy's default (linear interpolation between order statistics).

    Raises:
        ValueError: ``values`` is empty.
    """
    v = np.asarray(values, np.float64)
    if v.size == 0:
        raise ValueError("quartiles of no values")
    p25, p50, p75 = np.percentile(v, [25, 50, 75])
    return float(p25), float(p50), float(p75)


def paired_ratio_ci(num: Sequence[float], den: Sequence[float], level: float = 0.95, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """``(ratio, lo, hi)``: median(num) / median(den) and a ``level`` confidence interval from paired rounds.

    ``num[i]`` and ``den[i]`` were measured in the same round i, one right after the other,
    so a burst of load on a shared machine hits both. The interval is a percentile
    bootstrap over rounds (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993,
    ch. 13): draw ``resamples`` sets of n round indices with replacement, compute the ratio
    of medians of each set (resampling whole rounds keeps the pairs together), and take
    the (1 - level)/2 and (1 + level)/2 quantiles. The generator is seeded: the same input
    gives the same interval. With very few rounds the percentile interval can miss the
    point estimate; it is then widened to include it, so ``lo <= ratio <= hi`` always.

    Args:
        num, den: float[n] each, n >= 1, positive times of the same n rounds.
        level: the confidence level, in (0, 1).
        resamples: bootstrap draws.
        seed: the generator's seed.

    Raises:
        ValueError: empty or unequal lengths, or ``level`` not in (0, 1).
    """
    a, b = np.asarray(num, np.float64), np.asarray(den, np.float64)
    if a.size == 0 or a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_ratio_ci needs two equal non-empty 1-d sequences, got shapes {a.shape} and {b.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level={level} must be in (0, 1)")
    ratio = float(np.median(a) / np.median(b))
    idx = np.random.default_rng(seed).integers(0, a.size, size=(resamples, a.size))
    boot = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return ratio, float(min(lo, ratio)), float(max(hi, ratio))


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: numbers with ``digits`` decimals, None/nan as ``-``, no spaces."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value).replace(" ", "_") or "-"


def boot_id() -> str | None:
    """This machine's boot as Linux names it (``/proc/sys/kernel/random/boot_id``, a UUID drawn at
    each boot), None where it cannot be read. Two documents with the same boot id were measured on the
    same machine without a reboot between them: the same CPUs at the same speed, which the figures of
    one held-out validation need (:func:`hvdkit.bench.heldout.summary`'s ``one_boot``); emulated hosts
    share it (one kernel)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def host_meta() -> dict[str, Any]:
    """Where and when: host, cores, load averages (1, 5, 15 min), date, Python, and :func:`boot_id`."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        load = None
    return {"host": socket.gethostname(), "cores": os.cpu_count(), "loadavg": load,
            "date": datetime.now().isoformat(timespec="seconds"), "python": sys.version.split()[0],
            "boot_id": boot_id()}


def format_table(title: str, meta_lines: Sequence[str], columns: Sequence[tuple[str, str, str]],
                 rows: Sequence[Mapping[str, str]], footer: Sequence[str], ok: bool) -> str:
    """Render an nccl-tests-style table.

    Args:
        title: first line, e.g. ``"hvdkit-bench training"``.
        meta_lines: ``key: value`` lines (printed after ``# ``).
        columns: (key, header, unit) per column; a unit of ``""`` prints as nothing.
        rows: already formatted cells (:func:`fmt`), keyed by column key.
        footer: summary lines (printed after ``# ``).
        ok: whether every measurement succeeded; the last line is ``OK`` or ``FAILED``.

    Returns:
        The table text, ending in a newline.
    """
    widths = [max(len(h), len(u), *(len(r.get(k, "-")) for r in rows)) for k, h, u in columns]
    out = [f"# {title}", *(f"# {m}" for m in meta_lines), "#"]
    out.append("# " + " ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)))
    out.append("# " + " ".join((u or "").rjust(w) for (_, _, u), w in zip(columns, widths)))
    for r in rows:
        out.append("  " + " ".join(r.get(k, "-").rjust(w) for (k, _, _), w in zip(columns, widths)))
    out.append("#")
    out += [f"# {f}" for f in footer]
    out.append("OK" if ok else "FAILED")
    return "\n".join(out) + "\n"


def meta_lines(meta: Mapping[str, Any], versions: Mapping[str, Any], out_root: str, extra: Sequence[str] = ()) -> list[str]:
    """The ``#`` metadata lines every driver prints: date, host, load, versions, parameters, out_dir."""
    return [f"date: {meta['date']}  host: {meta['host']}  cores: {meta['cores']}  load: {meta['loadavg']}",
            "versions: " + "  ".join(f"{k} {versions.get(k)}" for k in ("python", "tensorflow", "horovod", "mpi4py",
                                                                          "numpy", "hvdkit")),
            *extra,
            "parameters: " + "  ".join(f"{k}={','.join(map(str, x)) if isinstance(x, list) else x}"
                                       for k, x in meta["parameters"].items()),
            f"out_dir: {out_root}"]


def check_outputs(prog: str, out_dir: str, files: Sequence[str | None]) -> None:
    """Create the job directory and check every output file's place before any job runs, so a
    mistyped ``--json``/``--csv``/``--table`` fails at once instead of after the benchmark.

    Args:
        prog: the benchmark's name, for the message.
        out_dir: the directory of the job outputs (created, must be writable).
        files: output file paths (None or "" are skipped): each must not be a directory and
            its directory is created and must be writable.

    Raises:
        SystemExit: ``PROG: error: ...`` naming the flag value and the cause.
    """
    try:
        make_writable_dir(out_dir, f"--out-dir {out_dir}")
        for f in files:
            if not f:
                continue
            if os.path.isdir(f):
                raise UsageError(f"{f} is a directory; name a file, e.g. {os.path.join(f, 'out.json')}")
            make_writable_dir(os.path.dirname(f) or ".", f)
    except UsageError as e:
        raise SystemExit(f"{prog}: error: {e}") from None


def emit(text: str, table_path: str | None) -> None:
    """Print a finished table to stdout and, with ``--table FILE``, write it there too."""
    sys.stdout.write(text)
    sys.stdout.flush()
    if table_path:
        with open(table_path, "w") as fh:
            fh.write(text)


def parse_table(text: str) -> dict[str, Any]:
    """Read back a table written by :func:`format_table` (or hvdkit.bench.collectives).

    Returns:
        ``{"meta": {key: value}, "columns": [...], "units": [...], "rows": [{col: str}],
        "footer": [...], "status": "OK" | "FAILED" | None}``. The header and units rows are
        the two ``#`` lines just before the first data row.

    Raises:
        ValueError: no data rows, or a row whose cell count differs from the header's.
    """
    lines = [ln.rstrip("\n") for ln in text.splitlines()]
    first = next((i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#")
                  and ln.strip() not in ("OK", "FAILED")), None)
    if first is None or first < 2:
        raise ValueError("no table found: expected '#' header and units rows followed by data rows")
    columns = lines[first - 2].lstrip("#").split()
    units_line = lines[first - 1].lstrip("#")
    meta = {}
    for ln in lines[:first - 2]:
        key, sep, val = ln.lstrip("# ").partition(":")
        if sep and key and " " not in key.strip():
            meta[key.strip()] = val.strip()
    rows, footer, status = [], [], None
    for ln in lines[first:]:
        s = ln.strip()
        if not s:
            continue
        if s in ("OK", "FAILED"):
            status = s
        elif ln.startswith("#"):
            if ln.strip("# "):
                footer.append(ln.lstrip("# "))
        else:
            cells = s.split()
            if len(cells) != len(columns):
                raise ValueError(f"row {s!r} has {len(cells)} cells; the header has {len(columns)}: {columns}")
            rows.append(dict(zip(columns, cells)))
    if not rows:
        raise ValueError("the table has a header but no data rows")
    return {"meta": meta, "columns": columns, "units": units_line.split(), "rows": rows, "footer": footer,
            "status": status}
