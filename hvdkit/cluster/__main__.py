"""``python -m hvdkit.cluster``: the same as ``hvdkit-cluster`` and ``hvdkit cluster``."""
import sys

from hvdkit.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
