"""One owner per directory (hvdkit.dirlock): a live holder refuses a second run in one line naming
its pid and host; a lock left by a dead run is taken over, and a line says whose it was."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from hvdkit import dirlock
from hvdkit.errors import UsageError
from tests.conftest import ROOT

HOLD = ("import sys, time; from hvdkit import dirlock; dirlock.hold(sys.argv[1]); print('held', flush=True); "
        "time.sleep(60)")


def test_a_live_holder_refuses_a_second_run_naming_its_pid_and_host(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(dirlock.DirectoryInUse) as e:
            dirlock.hold(str(tmp_path), f"--out-dir {tmp_path}")
        line = str(e.value)
        assert isinstance(e.value, UsageError) and "\n" not in line
        assert line.startswith(f"--out-dir {tmp_path} is in use by pid {p.pid} on {socket.gethostname()} since "), line
        assert dirlock.holder(str(tmp_path))["pid"] == p.pid and not dirlock.held(str(tmp_path))
    finally:
        p.kill()
        p.wait()
    notes = []
    lock = dirlock.hold(str(tmp_path), "d", note=notes.append)   # its flock went with it: the file is taken over
    try:
        assert len(notes) == 1 and f"took over the stale lock of pid {p.pid} on {socket.gethostname()}" in notes[0]
        assert notes[0].endswith("which is no longer running") and dirlock.holder(str(tmp_path))["pid"] == os.getpid()
    finally:
        lock.release()


def test_a_stale_lock_is_taken_over_with_a_line_and_a_clean_release_leaves_no_file(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(tmp_path / dirlock.LOCK_NAME, "w") as fh:
        json.dump({"pid": dead.pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00",
                   "command": "hvdkit train --output-dir d"}, fh)
    notes = []
    lock = dirlock.hold(str(tmp_path), "--output-dir d", note=notes.append)
    assert notes == [f"hvdkit: note: --output-dir d: took over the stale lock of pid {dead.pid} on "
                     f"{socket.gethostname()} since 2026-01-01T00:00:00 (hvdkit train --output-dir d), which is no "
                     f"longer running"]
    again = dirlock.hold(str(tmp_path), note=notes.append)   # the same process: held once more, no line
    assert again is lock and len(notes) == 1 and dirlock.held(str(tmp_path))
    lock.release()
    assert dirlock.held(str(tmp_path))            # one hold still counts
    again.release()
    assert not dirlock.held(str(tmp_path)) and not os.path.exists(tmp_path / dirlock.LOCK_NAME)
    lock = dirlock.hold(str(tmp_path), note=notes.append)   # free and clean: no line
    lock.release()
    assert len(notes) == 1


def test_a_forked_child_does_not_release_its_parents_lock(tmp_path):
    lock = dirlock.hold(str(tmp_path))
    try:
        pid = os.fork()
        if pid == 0:   # pragma: no cover - the child
            lock.release()
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.05)
        assert os.path.exists(tmp_path / dirlock.LOCK_NAME) and dirlock.holder(str(tmp_path))["pid"] == os.getpid()
    finally:
        lock.release()
