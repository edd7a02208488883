"""``python -m hvdkit.advise``: the same as ``hvdkit advise``."""
import sys

from hvdkit.advise.cli import main

if __name__ == "__main__":
    sys.exit(main())
