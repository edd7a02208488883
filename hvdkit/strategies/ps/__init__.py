"""hvdkit's parameter server on mpi4py.

protocol (wire format) < rules (update rules, pure NumPy) < shard (a shard's state and
mode logic, no MPI) < server (the MPI loop of a shard) and worker (a worker's client) <
group (the wiring of servers and clients on a communicator) < strategy (``--strategy ps-*``).
"""
