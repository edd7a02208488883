"""``python -m hvdkit.launch``: the same as the ``hvdkit-launch`` console script."""
import sys

from hvdkit.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
