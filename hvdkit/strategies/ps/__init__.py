"""hvdkit's parameter server on mpi4py: wire format, update rules, server, worker, strategies."""
