"""An emulated cluster on one machine: hosts as network namespaces with SSH and shaped links.

The command is ``hvdkit-cluster`` (:mod:`hvdkit.cluster.cli`); :mod:`~hvdkit.cluster.control`
brings a cluster up and down, :mod:`~hvdkit.cluster.net` builds the network (pyroute2),
:mod:`~hvdkit.cluster.ssh` the hosts' sshds, :mod:`~hvdkit.cluster.probe` measures the links,
:mod:`~hvdkit.cluster.spec` is the pure description (rates, topology, addresses).
"""
__all__ = ["main"]


def main(argv=None) -> int:
    """Entry point of ``hvdkit-cluster``; see :mod:`hvdkit.cluster.cli`."""
    from hvdkit.cluster.cli import main as _main
    return _main(argv)
