"""One parameter-server group, wired once: the shard servers and workers of a communicator.

:class:`PSGroup` builds this rank's part of a group (its shard's
:class:`~hvdkit.strategies.ps.shard.ShardServer` and
:class:`~hvdkit.strategies.ps.server.ServerLoop`, the server thread where one is needed,
its :class:`~hvdkit.strategies.ps.worker.PSClient`) and tears it down. The PS strategies
(:mod:`hvdkit.strategies.ps.strategy`) and the collectives benchmark both use it, so
both run the parameter server the same way.

A rank may be a worker, a server, both (colocated, BytePS-style) or neither:

* worker only: :attr:`PSGroup.client` pushes and pulls.
* server only (a dedicated server rank): :meth:`PSGroup.serve` runs the shard's loop in
  the calling thread until every worker has finished, polling (spin, yield, then sleep);
  or, with ``serve_in_thread=True``, a thread does so while the caller does other work.
* both: a server thread checks for requests every 50 us while the worker computes, and
  the worker serves its own shard itself while it waits for replies (no thread switch on
  the critical path). Needs ``MPI_THREAD_MULTIPLE``.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np

from hvdkit.comm import run_guarded
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import Layout
from hvdkit.strategies.ps.server import ServerLoop
from hvdkit.strategies.ps.shard import ShardServer
from hvdkit.strategies.ps.worker import PSClient

__all__ = ["PSGroup", "COLOCATED_POLL_S"]

#: seconds a colocated server thread sleeps between checks for requests (its worker serves
#: the shard itself while it waits for replies; see :meth:`ServerLoop.run`)
COLOCATED_POLL_S = 5e-5


class PSGroup:
    """This rank's part of a parameter-server group on ``comm``.

    Collective over ``comm``: every rank of ``comm`` constructs the group (it duplicates
    ``comm``, so PS traffic never mixes with other messages), with the same arguments
    except ``weights``, of which only a server's own shard is read.

    Args:
        comm: the communicator of the group; the ranks below are ranks in it.
        layout: the model layout; ``layout.num_shards`` must equal ``len(server_ranks)``.
        weights: layout.dtype[layout.size], the initial flat weights; shard k's server starts
            from (a copy of) ``weights[layout.shard_slice(k)]``.
        server_ranks: rank of shard k's server, k = 0 .. K-1.
        worker_ranks: rank of worker i, i = 0 .. W-1. A rank in both lists is colocated.
        mode: the servers' mode, one of :data:`~hvdkit.strategies.ps.shard.MODES`.
        optimizer: ``optimizer(size)`` returns a new server-side optimizer for a shard of
            ``size`` elements of layout.dtype (one per shard).
        timeout: seconds a server waits for a missing worker before naming it as dead or
            hung; a worker waits twice as long for a server, so that the server, which knows
            which worker is missing, reports first.
        staleness: s, for mode ``ssp``.
        dc_lambda, dc_adaptive: lambda_0 and the adaptive variant, for mode ``dcasgd``.
        serve_in_thread: a dedicated server rank serves in a background thread (started
            here) instead of in :meth:`serve`; for callers whose main thread has other work,
            such as the benchmark's barriers. Colocated ranks always serve in a thread.
        compression, pull: the workers' :class:`~hvdkit.strategies.ps.worker.PSClient` settings
            (``"fp16"``: push float16 gradients; ``pull="fp16"``: their replies in float16 too).
            The servers need none: the wire says what each message carries.
        replies: how a server sends the weight replies it releases together (:class:`ServerLoop`).

    Attributes:
        comm: the group's own communicator (a ``Dup`` of ``comm``; freed by :meth:`close`).
        shard: the shard this rank serves, or None.
        server: that shard's state (:class:`ShardServer`), or None.
        loop: that shard's MPI loop (:class:`ServerLoop`), or None.
        client: this rank's :class:`PSClient` if it is a worker, else None.
        colocated: this rank is both a worker and a server.

    Raises:
        ValueError: ``layout.num_shards != len(server_ranks)``, or an unknown ``mode``.
    """

    def __init__(self, comm, layout: Layout, weights: np.ndarray, server_ranks: Sequence[int],
                 worker_ranks: Sequence[int], mode: str, optimizer: Callable[[int], rules.Optimizer], *,
                 timeout: float, staleness: int = 0, dc_lambda: float = 0.0, dc_adaptive: bool = False,
                 serve_in_thread: bool = False, compression: str = "none", pull: str = "float32",
                 replies: str = "concurrent"):
        if layout.num_shards != len(server_ranks):
            raise ValueError(f"layout has {layout.num_shards} shards but {len(server_ranks)} server ranks were given")
        self.server_ranks, self.worker_ranks = list(server_ranks), list(worker_ranks)
        self.comm = comm.Dup()                                  # PS traffic never mixes with other messages
        rank = self.comm.Get_rank()
        self.shard = self.server_ranks.index(rank) if rank in self.server_ranks else None
        self.colocated = self.shard is not None and rank in self.worker_ranks
        self.server: ShardServer | None = None
        self.loop: ServerLoop | None = None
        self.client: PSClient | None = None
        self._thread: threading.Thread | None = None
        if self.shard is not None:
            sl = layout.shard_slice(self.shard)
            dc = rules.DCState(dc_lambda, dc_adaptive) if mode == "dcasgd" else None
            self.server = ShardServer(self.shard, layout, weights[sl], mode, optimizer(sl.stop - sl.start),
                                      len(self.worker_ranks), staleness=staleness, dc=dc)
            self.loop = ServerLoop(self.comm, self.server, self.worker_ranks, timeout, replies)
            if self.colocated or serve_in_thread:
                self._thread = threading.Thread(target=run_guarded, name=f"ps-shard-{self.shard}", daemon=True,
                                                args=(self.loop.run, COLOCATED_POLL_S if self.colocated else None))
                self._thread.start()
        if rank in self.worker_ranks:
            # The HELLO (variable-table check) goes out with the first request, not here: the
            # caller may still hold dedicated servers in a collective (a --resume broadcast).
            self.client = PSClient(self.comm, layout, self.server_ranks, self.worker_ranks.index(rank), 2 * timeout,
                                   local_server=self.loop if self.colocated else None, compression=compression,
                                   pull=pull)

    def serve(self) -> dict:
        """Serve this rank's shard in the calling thread until every worker has sent DONE.

        For a dedicated server rank (not colocated, no ``serve_in_thread``).

        Returns:
            The shard's final statistics (:meth:`ShardServer.stats`).

        Raises:
            RuntimeError: this rank serves no shard, or a thread already serves it.
            TimeoutError, ProtocolError: as :meth:`ServerLoop.run`.
        """
        if self.loop is None or self._thread is not None:
            raise RuntimeError("PSGroup.serve: this rank " + ("serves no shard" if self.loop is None else
                                                              "already serves its shard in a thread"))
        return self.loop.run()

    def pause(self) -> None:
        """Park this rank's server thread, if any, until :meth:`resume` (:meth:`ServerLoop.pause`).

        Only between synchronous rounds, when no worker waits on a shard, and only for a
        shard served in a thread (colocated or ``serve_in_thread``); :meth:`close` resumes it.
        """
        if self._thread is not None:
            self.loop.pause()

    def resume(self) -> None:
        """Wake this rank's server thread parked by :meth:`pause`."""
        if self.loop is not None:
            self.loop.resume()

    def close(self) -> None:
        """Tear down this rank's part: a worker tells every server it is done, a server thread
        is joined (it ends once every worker is done), and the group's communicator is freed.

        Call it on every rank once this rank has finished with the group (a dedicated
        server: after :meth:`serve` returns). Blocks until this rank's server thread, if any,
        has served every worker to the end.
        """
        self.resume()   # a parked server thread must serve the workers' DONE
        if self.client is not None:
            self.client.done()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
