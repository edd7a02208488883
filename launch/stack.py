"""Which hvdkit stack an interpreter gets: the choice launch/install.sh makes, as a pure function.

    python3.13 launch/stack.py                  # prints "tf221": the stack for this interpreter
    TF_STACK=tf221 python3.11 launch/stack.py   # prints "tf221" (3.11 is in tf221's range)
    python3.8 launch/stack.py                   # one line on stderr naming what to install, status 3

A stack is one file ``requirements/<name>.txt`` (its pins, which include ``requirements/common.txt``)
whose header line ``# PYTHON=3.9-3.11`` gives the Python versions (major.minor, both ends included)
it supports. The rule (:func:`choose`): ``TF_STACK`` names the stack if given, and the interpreter
must be in its range; otherwise the stacks are taken in name order (``tf215`` before ``tf221``:
oldest TensorFlow first) and the first whose range holds the interpreter wins, so Python 3.12 and 3.13
get tf221 and 3.9-3.11 get tf215. An interpreter outside every range gets one line naming what to install.

Run by whatever interpreter install.sh is trying (python3.6 and later: no newer syntax here);
it imports nothing but the standard library and reads nothing but ``requirements/*.txt``.
"""
from __future__ import print_function

import os
import re
import sys

__all__ = ["read_stacks", "choose", "main"]

REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements")
#: status of an interpreter (or TF_STACK) no stack supports, as launch/install.sh tests it
UNSUPPORTED = 3


def read_stacks(directory=REQUIREMENTS):
    """The stacks defined in ``directory``: ``{name: ((major, minor), (major, minor))}``, the lowest
    and highest Python version each supports, from its ``# PYTHON=LO-HI`` line.

    Raises:
        ValueError: a ``requirements/*.txt`` other than ``common.txt`` without such a line.
    """
    stacks = {}
    for fname in sorted(os.listdir(directory)):
        if not fname.endswith(".txt") or fname == "common.txt":
            continue
        with open(os.path.join(directory, fname)) as fh:
            m = re.search(r"^#\s*PYTHON=(\d+)\.(\d+)-(\d+)\.(\d+)\s*$", fh.read(), re.M)
        if not m:
            raise ValueError("{}: no '# PYTHON=LO-HI' line (e.g. '# PYTHON=3.11-3.13')".format(
                os.path.join(directory, fname)))
        lo_hi = [int(g) for g in m.groups()]
        stacks[fname[:-4]] = ((lo_hi[0], lo_hi[1]), (lo_hi[2], lo_hi[3]))
    return stacks


def _ranges(stacks):
    return ", ".join("{}: Python {}.{}-{}.{}".format(n, lo[0], lo[1], hi[0], hi[1])
                     for n, (lo, hi) in sorted(stacks.items()))


def choose(version, stacks, requested=""):
    """The stack for an interpreter of ``version``.

    Args:
        version: (major, minor) of the interpreter, e.g. (3, 12).
        stacks: :func:`read_stacks`'s answer.
        requested: ``TF_STACK`` ("" when unset).

    Returns:
        (name, None), or (None, one line saying why not and what to install) when ``requested``
        is unknown or does not support ``version``, or no stack supports ``version``.
    """
    version = tuple(version[:2])
    py = "Python {}.{}".format(*version)
    if requested:
        if requested not in stacks:
            return None, "TF_STACK={}: no such stack; choose one of {} ({})".format(
                requested, ", ".join(sorted(stacks)), _ranges(stacks))
        lo, hi = stacks[requested]
        if not lo <= version <= hi:
            return None, ("TF_STACK={} supports Python {}.{}-{}.{}, not {}; give PYTHON=python{}.{} (or another "
                          "version in that range), or leave TF_STACK unset".format(
                              requested, lo[0], lo[1], hi[0], hi[1], py, hi[0], hi[1]))
        return requested, None
    for name in sorted(stacks):
        lo, hi = stacks[name]
        if lo <= version <= hi:
            return name, None
    newest = max(hi for lo, hi in stacks.values())
    want = "python{}.{}".format(*newest)
    return None, ("{} is supported by no hvdkit stack ({}); install {} (Debian/Ubuntu: apt-get install {}-venv "
                  "{}-dev where the release has it, else the deadsnakes PPA on Ubuntu; anywhere: uv python install "
                  "{}.{}) and give PYTHON={}, or use the container (Dockerfile.gpu)".format(
                      py, _ranges(stacks), want, want, want, newest[0], newest[1], want))


def main(argv=None):
    """Print the stack for this interpreter (status 0), or the one line why not (stderr, status 3)."""
    name, why = choose(sys.version_info[:2], read_stacks(), os.environ.get("TF_STACK", ""))
    if name is None:
        print(why, file=sys.stderr)
        return UNSUPPORTED
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
