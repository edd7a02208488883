"""Alpha-beta cost model of one allreduce-equivalent: what a network *should* give, to put next to a measurement.

The model (Hockney 1994; the form used by Thakur, Rabenseifner & Gropp 2005 and by
Patarasuk & Yuan 2009): sending m bytes over one link takes ``alpha + m / B``. Assumptions:

* each rank has its own full-duplex link of B bytes/s to a non-blocking switch (one rank
  per host; ranks sharing a host share its link, which this model does not cover);
* a link carries B bytes/s in each direction at once, and several concurrent messages
  on one link share its B;
* messages a rank sends to different peers in one phase go out concurrently, so a phase
  costs one ``alpha`` plus the bytes on its busiest link / B;
* the reduction itself is free (gamma = 0): the figures are lower bounds for a network
  whose CPUs keep up.

Every time is for *one* allreduce-equivalent of S bytes per rank: at the end every
worker holds the sum (or, for a parameter server, the updated weights). Units: bytes,
bytes per second, seconds. Rates on command lines are written as tc writes them, in
*bits* per second (:func:`parse_rate`); divide by 8 for bytes per second.

busbw (nccl-tests' definition) turns a time into the bytes per second each rank's link
moved in an optimal allreduce: ``busbw = S / t * 2 (N-1) / N``. A bandwidth-optimal
allreduce on this model reaches ``busbw == B`` as S grows (:func:`busbw`).

docs/performance.md carries these formulas with their derivations (the alpha-beta model, ring
allreduce, parameter server, colocated parameter server, busbw); this module is their one
implementation, and docstrings elsewhere cite the page instead of restating them.
"""
from __future__ import annotations

import re

__all__ = ["RATE_UNITS", "parse_rate", "ring_allreduce_time", "ps_time", "colocated_ps_time", "busbw"]

#: tc's units of *bits* per second (SI prefixes): ``200mbit`` = 2e8 bit/s
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def parse_rate(text: str) -> float:
    """A link rate as tc writes it -> bits per second: ``"1gbit"`` -> 1e9, ``"200mbit"`` -> 2e8.

    A number (``1``, ``2.5``, ``.5``) and one of the units of :data:`RATE_UNITS`
    (case-insensitive, SI prefixes, bits not bytes). Divide by 8 for bytes per second.

    Raises:
        ValueError: no unit, an unknown unit, or a rate of 0; the message names the text.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]+)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in RATE_UNITS:
        raise ValueError(f"rate {text!r}: write a number and a unit of bits per second, e.g. 200mbit or 1gbit "
                         f"(units: {', '.join(RATE_UNITS)})")
    bits = float(m.group(1)) * RATE_UNITS[unit]
    if bits <= 0:
        raise ValueError(f"rate {text!r}: must be above 0")
    return bits


def _check(nbytes: float, link_Bps: float, latency_s: float, **counts: int) -> None:
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes} must be >= 0")
    if not link_Bps > 0:
        raise ValueError(f"link_Bps={link_Bps} must be > 0")
    if latency_s < 0:
        raise ValueError(f"latency_s={latency_s} must be >= 0")
    for name, n in counts.items():
        if n < 1:
            raise ValueError(f"{name}={n} must be >= 1")


def ring_allreduce_time(nbytes: float, ranks: int, link_Bps: float, latency_s: float = 0.0) -> float:
    """Seconds for a ring allreduce of ``nbytes`` per rank over ``ranks`` ranks.

    ``2 (N-1) alpha + 2 (N-1)/N S / B`` (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
    algorithms for clusters of workstations", JPDC 69(2)): a reduce-scatter and an
    allgather of N-1 steps each; in every step each rank sends S/N bytes to its successor
    and receives S/N from its predecessor, so every link carries S/N per step each way.
    The bandwidth term is the lower bound for any allreduce on this model, so it is also
    the prediction for MPI's and Horovod's allreduce rows. One rank: 0.

    Args:
        nbytes: S, bytes per rank (the whole buffer), >= 0.
        ranks: N, >= 1.
        link_Bps: B, each link's bandwidth, bytes per second, > 0.
        latency_s: alpha, seconds per message, >= 0.

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    _check(nbytes, link_Bps, latency_s, ranks=ranks)
    n = ranks
    return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * nbytes / link_Bps


def ps_time(nbytes: float, workers: int, servers: int, link_Bps: float, latency_s: float = 0.0,
            serial: bool = False) -> float:
    """Seconds for one synchronous push + pull through ``servers`` dedicated server ranks.

    ``2 alpha + 2 max(S, W S / K) / B``: the parameters are split into K equal shards, one per
    server; in the push each of the W workers sends S/K to every server (S leave each
    worker's link) and each server receives S/K from every worker (W S / K arrive on each
    server's link); the pull is the same in reverse. Each phase takes as long as its busiest
    link: ``max(S, W S / K) / B``. With K < W the servers' links are the bottleneck (K = 1:
    W S each way); K >= W makes the workers' own links the limit. This is the
    inter-machine analysis of BytePS (Jiang et al., "A Unified Architecture for Accelerating
    Distributed DNN Training in Heterogeneous GPU/CPU Clusters", OSDI 2020): with as much
    server bandwidth as worker bandwidth (K = W) each worker moves S per direction.

    ``serial`` (``--ps-replies serial``): each server sends its W replies one after another in worker
    order, so worker i has its weights after i x S / (K B) and its next push arrives while later pulls
    still leave (a full-duplex link carries both): a step's bytes take ``max(2 S, (W + K) S / K) / B``
    on the busiest link, the W pulls one after another and then the last worker's push of S (its own
    link), instead of the two phases one after the other. Pipelining the two directions this way is
    the overlap of transfers TicTac orders for (Hashemi et al., MLSys 2019).

    Args:
        nbytes: S, bytes per worker (the whole buffer), >= 0.
        workers: W, worker ranks (each on its own link), >= 1.
        servers: K, dedicated server ranks (each on its own link), >= 1.
        link_Bps: B, bytes per second, > 0.
        latency_s: alpha, seconds, >= 0 (one per phase: the push, then the pull).
        serial: the replies one at a time (above).

    Raises:
        ValueError: an argument out of range.
    """
    _check(nbytes, link_Bps, latency_s, workers=workers, servers=servers)
    if serial:
        return 2 * latency_s + max(2 * nbytes, (workers + servers) * nbytes / servers) / link_Bps
    per_phase = max(nbytes, workers * nbytes / servers)
    return 2 * latency_s + 2 * per_phase / link_Bps


def colocated_ps_time(nbytes: float, ranks: int, link_Bps: float, latency_s: float = 0.0) -> float:
    """Seconds for one push + pull where every one of N ranks is both a worker and a shard server.

    ``2 alpha + 2 (N-1)/N S / B`` (BytePS's colocated mode, Jiang et al. OSDI 2020; the same
    bytes per link as a ring): each rank's shard is S/N; in the push a rank sends S/N to each
    of the N-1 others (its own shard stays local), (N-1)/N S out, and receives S/N from each
    of them, (N-1)/N S in; the pull is the same in reverse. One rank: 0.

    Args:
        nbytes: S, bytes per rank, >= 0.
        ranks: N, >= 1.
        link_Bps: B, bytes per second, > 0.
        latency_s: alpha, seconds, >= 0 (one per phase).

    Raises:
        ValueError: an argument out of range.
    """
    _check(nbytes, link_Bps, latency_s, ranks=ranks)
    if ranks == 1:
        return 0.0
    return 2 * latency_s + 2 * (ranks - 1) / ranks * nbytes / link_Bps


def busbw(nbytes: float, ranks: int, seconds: float) -> float:
    """Bus bandwidth of an allreduce, bytes per second: ``S / t * 2 (N-1) / N`` (nccl-tests' definition).

    Comparable with a link's B whatever N is: a bandwidth-optimal allreduce on this model
    has ``busbw(S, N, ring_allreduce_time(S, N, B)) == B``. One rank: 0.

    Raises:
        ValueError: ``seconds <= 0`` or ``ranks < 1``.
    """
    if ranks < 1 or not seconds > 0:
        raise ValueError(f"busbw needs ranks >= 1 and seconds > 0 (got ranks={ranks}, seconds={seconds})")
    return nbytes / seconds * 2 * (ranks - 1) / ranks
