"""``python -m hvdkit.bench.report DIR``: the same as ``hvdkit-bench report DIR``."""
import sys

from hvdkit.bench.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
