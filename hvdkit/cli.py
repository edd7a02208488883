"""``hvdkit``: the umbrella command. ``hvdkit advise ...`` = :mod:`hvdkit.advise.cli`.

The other commands keep their own scripts (``hvdkit-train``, ``hvdkit-launch``,
``hvdkit-bench``, ``hvdkit-cluster``); a new subcommand is one row of :data:`COMMANDS`.
"""
from __future__ import annotations

import importlib
import sys

__all__ = ["main", "COMMANDS"]

#: subcommand -> (module with ``main(argv) -> int``, one-line help)
COMMANDS = {"advise": ("hvdkit.advise.cli", "predict each strategy's step time and scaling on a cluster")}

_USAGE = ("usage: hvdkit {" + ",".join(COMMANDS) + "} [args]\n"
          + "".join(f"  {k:<10} {v[1]}\n" for k, v in COMMANDS.items())
          + "hvdkit NAME --help lists NAME's flags; also: hvdkit-train, hvdkit-launch, hvdkit-bench, hvdkit-cluster.")


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``hvdkit NAME ARGS``; returns the subcommand's exit status (2: unknown name)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"hvdkit: error: unknown command {argv[0]!r}; choose {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    mod = importlib.import_module(COMMANDS[argv[0]][0])
    try:
        return int(mod.main(argv[1:]) or 0)
    except SystemExit as e:   # --help
        return e.code if isinstance(e.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
