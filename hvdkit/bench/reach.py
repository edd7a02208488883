"""Reaching a place's hosts before any job: every host answers ``ssh`` (and says how many GPUs it has),
and every host sees a results directory at the same path. All hosts are asked at once over ``ssh``
(``BatchMode``, no password prompt), so N hosts cost one timeout; this host's own names are not asked.
Used by :class:`hvdkit.bench.places.Place` on entering; the one-line refusals are quoted in
:mod:`hvdkit.bench.places`.
"""
from __future__ import annotations

import contextlib
import math
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import time
from typing import Mapping, Sequence

from hvdkit.errors import UsageError
from hvdkit.launch.network import is_local

__all__ = ["check_ssh", "check_shared", "local_gpus", "GPU_COUNT"]

#: what the ssh check runs on each host: its GPU count (0 without nvidia-smi)
GPU_COUNT = "nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true"


def _ssh_all(names: Sequence[str], command: str, timeout: float, environ: Mapping[str, str] | None = None
             ) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Run the shell ``command`` on every host of ``names`` at once over ``ssh`` (``BatchMode``, no
    password prompt), all answers awaited within one ``timeout`` (seconds) in total.

    Returns:
        (host -> its standard output, for the hosts whose ssh exited 0; [(host, why)] for the others:
        the last line of ssh's or the command's error, or "no answer within T s").

    Raises:
        UsageError: ssh itself cannot be run.
    """
    environ = dict(os.environ if environ is None else environ)
    procs: dict[str, subprocess.Popen] = {}
    try:
        for n in dict.fromkeys(names):
            procs[n] = subprocess.Popen(["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={math.ceil(timeout)}",
                                         n, command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=environ, start_new_session=True)
    except OSError as e:
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.communicate()
        raise UsageError(f"cannot run ssh to reach the hosts ({e.strerror}); install OpenSSH's client") from None
    answers: dict[str, str] = {}
    bad: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    for n, p in procs.items():
        try:
            so, se = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.communicate()
            bad.append((n, f"no answer within {timeout:g} s"))
            continue
        if p.returncode != 0:
            why = next((ln.strip() for ln in reversed(se.splitlines()) if ln.strip()), f"ssh exit {p.returncode}")
            bad.append((n, why.rstrip(".")))
        else:
            answers[n] = so
    return answers, bad


def check_ssh(names: Sequence[str], timeout: float, environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Ask every host at once to run :data:`GPU_COUNT` over ``ssh`` (``BatchMode``, no password
    prompt); all answers are awaited within one ``timeout`` (seconds) in total.

    Args:
        names: ``[user@]host`` names; this host's own names are not asked over ssh.
        timeout: seconds; environ: the environment of ``ssh`` (its PATH finds it).

    Returns:
        host name -> its GPU count (0 where there is no ``nvidia-smi``).

    Raises:
        UsageError: one line naming every host that did not answer and why (ssh's last line,
            or "no answer within T s").
    """
    out = {n: local_gpus() for n in dict.fromkeys(names) if is_local(n)}
    answers, bad = _ssh_all([n for n in names if n not in out], GPU_COUNT, timeout, environ)
    for n, so in answers.items():
        counts = [ln.strip() for ln in so.splitlines() if ln.strip().isdigit()]
        out[n] = int(counts[-1]) if counts else 0
    if bad:
        listed = ", ".join(f"{n} ({why})" for n, why in bad)
        raise UsageError(f"{len(bad)} of {len(answers) + len(bad)} hosts did not answer ssh within {timeout:g} s "
                         f"(--ssh-timeout): "
                         f"{listed}; check that 'ssh {bad[0][0]} true' works without a password prompt, or raise "
                         f"--ssh-timeout")
    return out


def check_shared(path: str, names: Sequence[str], timeout: float, environ: Mapping[str, str] | None = None,
                 flag: str = "--out-dir") -> None:
    """Check that every host sees directory ``path`` as this process does: write a token file
    (``.hvdkit-shared-RANDOM``) into it (made if missing), have every host but this one ``cat`` it
    over ``ssh`` (``BatchMode``, all at once, one ``timeout`` in total), compare, remove the token.

    Raises:
        UsageError: one line naming every host that could not read the token back, and why (the
            last line of its ``cat``/ssh error, another content, no answer); the directory is removed
            again when this call made it and it is empty.
    """
    full = os.path.abspath(path)
    made = not os.path.isdir(full)
    try:
        os.makedirs(full, exist_ok=True)
        token_path = os.path.join(full, f".hvdkit-shared-{secrets.token_hex(6)}")
        token = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(16)}"
        with open(token_path, "w") as f:
            f.write(token + "\n")
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write there ({e.strerror}); give a directory you can write") from None
    try:
        remote = list(dict.fromkeys(n for n in names if not is_local(n)))
        answers, bad = _ssh_all(remote, "cat -- " + shlex.quote(token_path), timeout, environ)
        bad += [(n, "it holds another file of that name: another directory at the same path")
                for n, so in answers.items() if so.strip() != token]
    finally:
        with contextlib.suppress(OSError):
            os.remove(token_path)
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(full)   # only if empty; the driver makes it again
    if bad:
        listed = ", ".join(f"{n} ({why})" for n, why in bad)
        raise UsageError(f"{flag} {path} is not shared with {len(bad)} of {len(remote)} hosts: {listed}; every host "
                         f"must see the directory its jobs write at the same path: give one on a file system they "
                         f"all mount")


def local_gpus() -> int:
    """This host's GPU count from ``nvidia-smi -L`` (0 without it, or when it fails within 10 s)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        r = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for ln in r.stdout.splitlines() if ln.startswith("GPU"))
