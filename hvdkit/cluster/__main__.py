"""``python -m hvdkit.cluster``: the same as ``hvdkit-cluster``."""
import sys

from hvdkit.cluster import main

sys.exit(main())
