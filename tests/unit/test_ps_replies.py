"""How a dedicated server sends the weights it releases together (``--ps-replies``): the
:class:`~hvdkit.strategies.ps.server.ServerLoop` over a recording stand-in for the communicator,
so the order and the number of sends on their way are seen exactly (no MPI job)."""
import numpy as np
import pytest

from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import TAG_REP_DATA, Header, Layout
from hvdkit.strategies.ps.server import ServerLoop
from hvdkit.strategies.ps.shard import Reply, ShardServer

WORKERS = 3


class Send:
    """A send request the test completes by hand (``done``)."""

    def __init__(self):
        self.done = False

    def Test(self):  # noqa: N802 - mpi4py's name
        return self.done

    def Wait(self):  # noqa: N802
        self.done = True


class Comm:
    """Records every Isend: (destination rank, tag, the header or payload, its request)."""

    def __init__(self):
        self.sent = []

    def Isend(self, buf, dest, tag):  # noqa: N802
        req = Send()
        self.sent.append((dest, tag, np.array(buf, copy=True), req))
        return req

    def data(self):
        return [(dest, buf, req) for dest, tag, buf, req in self.sent if tag == TAG_REP_DATA]


def loop(replies, mode="sync"):
    lay = Layout(("w",), ((8,),), ("float32",), 1)
    shard = ShardServer(0, lay, np.zeros(8, np.float32), mode, rules.Optimizer("sgd", 1.0, 8), WORKERS)
    comm = Comm()
    # worker i is rank 10 + i: a destination is never its worker id by accident
    return ServerLoop(comm, shard, [10 + i for i in range(WORKERS)], timeout=60.0, replies=replies), comm


def test_concurrent_replies_start_at_once():
    lp, comm = loop("concurrent")
    lp._send_weights([Reply(2, 0.0), Reply(0, 0.0), Reply(1, 0.0)])
    assert [d for d, _, _ in comm.data()] == [12, 10, 11]


def test_serial_replies_go_one_at_a_time_in_worker_order():
    lp, comm = loop("serial")
    lp._send_weights([Reply(2, 0.0), Reply(0, 0.0), Reply(1, 0.0)])
    assert [d for d, _, _ in comm.data()] == [10]          # worker 0 first, alone
    lp._pump()
    assert len(comm.data()) == 1                            # still on its way: nothing more starts
    assert not lp._next_due()
    comm.data()[0][2].done = True
    assert lp._next_due()
    lp._pump()
    assert [d for d, _, _ in comm.data()] == [10, 11]
    comm.data()[1][2].done = True
    lp._pump()
    assert [d for d, _, _ in comm.data()] == [10, 11, 12]
    assert not lp.outbox and not lp._next_due()
    # the three got the same weights, each after its own header
    headers = [Header.unpack(buf) for dest, tag, buf, _ in comm.sent if tag != TAG_REP_DATA]
    assert [h.worker for h in headers] == [0, 1, 2] and {h.version for h in headers} == {0}


def test_a_queued_reply_carries_the_weights_current_when_it_starts():
    lp, comm = loop("serial", mode="async")
    lp._send_weights([Reply(0, 0.0)])
    lp._send_weights([Reply(1, 0.0)])                       # queued behind worker 0's
    lp.server.weights[:] = 5.0                              # an update lands meanwhile
    lp.server.version += 1
    comm.data()[0][2].done = True
    lp._pump()
    (_, first, _), (_, second, _) = comm.data()
    assert first.tolist() == [0.0] * 8 and second.tolist() == [5.0] * 8


def test_an_unknown_reply_schedule_is_refused():
    with pytest.raises(ValueError, match="replies='fifo'"):
        loop("fifo")


@pytest.mark.parametrize("replies", ["concurrent", "serial"])
def test_a_replaced_snapshot_is_reused_once_its_sends_are_done(replies):
    lp, comm = loop(replies, mode="async")
    bufs = []
    for version in range(4):
        lp.server.version = version
        lp._send_weights([Reply(0, 0.0)])
        for _, _, _, req in comm.sent:
            req.done = True
        lp._reap()
        bufs.append(lp.snapshot[0])
    assert bufs[2] is bufs[0] and bufs[3] is bufs[1]   # two buffers in turn, not one per version


def test_advise_refuses_serial_replies_on_a_colocated_ps():
    from hvdkit.advise.predict import priced
    from hvdkit.errors import UsageError

    with pytest.raises(UsageError, match=r"variant 'ps-sync:ps_colocated=true,ps_replies=serial': ps_replies=serial "
                                         r"\(--ps-replies serial\) is for dedicated servers"):
        priced("ps-sync:ps_colocated=true,ps_replies=serial")   # the row's own rule (PSStrategy.check_options)
