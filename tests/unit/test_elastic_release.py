"""hvdkit.elastic's release of a rank's Gloo connections on a lost peer (no MPI job, no Horovod)."""
from __future__ import annotations

import socket

from hvdkit import elastic


def _pair(lst):
    a = socket.create_connection(lst.getsockname())
    b, _ = lst.accept()
    return a, b


def test_released_connections_end_at_once_for_the_peer(monkeypatch):
    """A connection of this rank's is released: its peer, waiting to receive, gets end-of-file at once
    (not at its timeout). Kept: the connections held before Horovod started and the rendezvous server's."""
    before = set(elastic._connected_tcp().values())   # mpi4py's own (imported with hvdkit), as run() records
    gloo_lst, rdv_lst = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    mine, peer = _pair(gloo_lst)          # this rank's connection to a peer (the peer's end held here too)
    old, old_peer = _pair(gloo_lst)       # one made before Horovod started
    rdv, rdv_srv = _pair(rdv_lst)         # to the rendezvous server
    socks = (mine, peer, old, old_peer, rdv, rdv_srv, gloo_lst, rdv_lst)
    try:
        links = elastic._connected_tcp()
        assert {s.fileno() for s in (mine, peer, old, rdv)} <= set(links) and gloo_lst.fileno() not in links
        # the peer's end counts as held before Horovod: it stands for the other rank's process
        monkeypatch.setattr(elastic, "_BEFORE_HOROVOD",
                            before | {links[old.fileno()], links[old_peer.fileno()], links[peer.fileno()]})
        monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
        monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(rdv_lst.getsockname()[1]))
        assert elastic._release_peers() == 2   # mine, and the rendezvous server's accepted end (a client port)
        peer.settimeout(5)
        assert peer.recv(1) == b""   # the other end: end of file now
        old.sendall(b"x")
        old_peer.settimeout(5)
        assert old_peer.recv(1) == b"x"   # kept
        rdv.sendall(b"y")   # the client end to the rendezvous server is kept (its server's end was released)
        assert mine.fileno() >= 0   # released, not closed: Horovod's reset closes its own
    finally:
        for s in socks:
            s.close()
