"""``python -m hvdkit.bench``: the same as the ``hvdkit-bench`` console script."""
import sys

from hvdkit.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
