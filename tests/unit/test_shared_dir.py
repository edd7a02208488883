"""The results directory every host must share (issue 51, gpt-neox#765), checked by a token file
read back over ssh (:func:`hvdkit.bench.places.check_shared`). A stand-in ``ssh`` on PATH runs the
remote command in a local shell for host ``good-h1`` (so the path's quoting meets a real shell) and
answers as a host without the directory for ``other-h2``. Pure unit: no host is reached."""
from __future__ import annotations

import os

import pytest

from hvdkit.bench.places import check_shared
from hvdkit.errors import UsageError

FAKE_SSH = """#!/bin/sh
for last; do :; done
case "$*" in
  *good-h1*) exec sh -c "$last" ;;
  *) echo "cat: $last: No such file or directory" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def ssh_env(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    (b / "ssh").write_text(FAKE_SSH)
    (b / "ssh").chmod(0o755)
    return {**os.environ, "PATH": f"{b}{os.pathsep}{os.environ['PATH']}"}


def test_a_host_that_reads_the_token_back_passes_and_nothing_is_left(tmp_path, ssh_env):
    d = tmp_path / "x y" / "it's $HOME;ok"
    check_shared(str(d), ["good-h1"], 10, ssh_env)
    assert not d.exists(), "the directory it made for the check is left"
    d.mkdir(parents=True)
    check_shared(str(d), ["good-h1"], 10, ssh_env)
    assert list(d.iterdir()) == []


def test_a_host_that_cannot_is_named_in_one_line(tmp_path, ssh_env):
    d = tmp_path / "res"
    with pytest.raises(UsageError) as e:
        check_shared(str(d), ["good-h1", "other-h2"], 10, ssh_env)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"--out-dir {d} is not shared with 1 of 2 hosts: other-h2 (cat: "), msg
    assert "No such file or directory" in msg and "good-h1" not in msg
    assert not d.exists()
