"""The cost model of ``hvdkit advise``: one training step per strategy, as an alpha-beta-gamma account.

Pure arithmetic (no TensorFlow, no MPI): a :class:`Workload` (gradient bytes, their tensors,
compute seconds per step), a :class:`Cluster` (H hosts x G accelerators, intra- and inter-host
bandwidth and latency, reduction speed) and :class:`Options` go in; :func:`hvdkit.advise.predict.predict`
returns one :class:`Prediction` per strategy. Units: bytes, seconds, bytes per second. Every accelerator is
one worker rank, N = W = H x G.

The terms of one synchronous step (each function below cites its source and implements the
formula docs/performance.md writes for its strategy):

* compute: forward + backward of one batch, ``compute_s``; the backward pass is
  ``backward_fraction`` of it (2/3 by default: a backward pass costs about twice the forward's
  FLOPs, e.g. Kaplan et al. 2020, sec. 2.1); on an emulated cluster whose R ranks share C
  cores, compute stretches by R / C when R > C (``Cluster.shared_cores``);
* communication: the collective or push/pull of the strategy, alpha (per message) + beta
  (bytes / bandwidth on the busiest link) + gamma (bytes / reduction speed);
* overlap: with ``overlap`` the gradients go out in fusion buckets while the backward pass still
  runs (:func:`overlapped_step`); a row that does so itself (``horovod``'s DistributedGradientTape:
  :func:`hvdkit.advise.predict.overlaps_backward`) is priced so without it; otherwise (one grouped
  allreduce or one push after the backward pass: ``horovod:grouped=true``, the ring, the PS) all
  communication is exposed;
* straggler and barrier: a synchronous step waits for the slowest of W workers
  (:func:`straggler_factor`); SSP with staleness s amortises the wait over s + 1 clocks;
  asynchronous PS waits for nobody, its throughput is bounded by the servers
  (:func:`async_throughput`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hvdkit import costs

__all__ = ["Workload", "Cluster", "Options", "Prediction", "burst_seconds", "ring_time", "ring_inter_Bps", "flat_ring_time",
           "hierarchical_time", "ps_sync_time", "colocated_time", "overlapped_step", "straggler_factor",
           "async_throughput", "cpu_share", "split_fit", "server_serial_time", "closed_network_cycle"]


@dataclass(frozen=True)
class Workload:
    """One model at one batch size on one accelerator.

    Attributes:
        name: label.
        tensor_bytes: bytes of each gradient tensor, in the model's forward (layer) order;
            S = their sum (float32: 4 bytes per parameter).
        compute_s: seconds of forward + backward of one batch on one accelerator, > 0.
        batch: samples per worker per step.
        backward_fraction: share of ``compute_s`` spent in the backward pass, in (0, 1].
    """
    name: str
    tensor_bytes: tuple[int, ...]
    compute_s: float
    batch: int = 32
    backward_fraction: float = 2 / 3

    def __post_init__(self):
        if not self.tensor_bytes or min(self.tensor_bytes) < 0:
            raise ValueError(f"workload {self.name!r}: tensor_bytes must be a non-empty list of sizes >= 0")
        if not self.compute_s > 0:
            raise ValueError(f"compute_s={self.compute_s} must be > 0")
        if self.batch < 1 or not 0 < self.backward_fraction <= 1:
            raise ValueError(f"batch={self.batch} must be >= 1 and backward_fraction={self.backward_fraction} in (0, 1]")

    @property
    def nbytes(self) -> int:
        """S: gradient bytes per worker per step."""
        return int(sum(self.tensor_bytes))


@dataclass(frozen=True)
class Cluster:
    """H hosts of G accelerators; one NIC per host shared by its accelerators.

    Attributes:
        hosts: H >= 1. gpus_per_host: G >= 1.
        intra_Bps, intra_latency_s: between accelerators of one host (NVLink, PCIe, shared memory).
        inter_Bps, inter_latency_s: each host's NIC to a non-blocking switch, per direction.
        reduce_Bps: gamma, bytes per second one rank sums (GPU: ~1e11; one CPU core: ~2e9).
        server_Bps: bytes per second a PS server host sums pushes and applies updates (CPU), default 5e9.
        shared_cores: None on a real cluster; on an emulated one (namespaces on one machine),
            the cores every rank shares: compute stretches by ranks / cores when ranks > cores.
        ring_inter_fraction: the share of ``inter_Bps`` an allreduce ring (NCCL's) gets between hosts,
            in (0, 1]: below 1 where its TCP socket transport joins hosts of several accelerators
            (:func:`ring_inter_Bps`; :data:`hvdkit.advise.presets.NCCL_TCP_FRACTION`); 1 over RDMA, with
            one rank per host, and for a rate probed with the transport itself.
    """
    hosts: int
    gpus_per_host: int
    intra_Bps: float
    inter_Bps: float
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 25e-6
    reduce_Bps: float = 1e11
    server_Bps: float = 5e9
    shared_cores: int | None = None
    name: str = ""
    ring_inter_fraction: float = 1.0

    def __post_init__(self):
        if self.hosts < 1 or self.gpus_per_host < 1:
            raise ValueError(f"cluster {self.hosts}x{self.gpus_per_host}: hosts and accelerators per host must be >= 1")
        for f in ("intra_Bps", "inter_Bps", "reduce_Bps", "server_Bps"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f}={getattr(self, f)} must be > 0")
        if self.intra_latency_s < 0 or self.inter_latency_s < 0:
            raise ValueError("latencies must be >= 0")
        if not 0 < self.ring_inter_fraction <= 1:
            raise ValueError(f"ring_inter_fraction={self.ring_inter_fraction} must be in (0, 1]")

    @property
    def workers(self) -> int:
        """N = H x G worker ranks."""
        return self.hosts * self.gpus_per_host


@dataclass(frozen=True)
class Options:
    """Assumptions shared by every strategy of a prediction (a variant's own options, such as
    ``num_servers`` or ``staleness``, are in the variant: :mod:`hvdkit.strategies.variants`).

    Attributes:
        fusion_bytes: fusion threshold (Horovod's HOROVOD_FUSION_THRESHOLD: 64 MiB, its default before
            0.21 and the published systems'; 128 MiB since) of the rows without a ``fusion_bytes`` option
            of their own (``ring:fusion_bytes=B`` sets the ring's).
        overlap: communicate fused buckets during the backward pass on every row whose allreduce is a
            graph op (Horovod's DistributedOptimizer, DistributedGradientTape); False: each row as it
            runs (:func:`hvdkit.advise.predict.overlaps_backward`).
        jitter_cv: coefficient of variation of one worker's step compute time (the straggler term).
        ps_local_aggregation: sum the G gradients of a host before pushing (BytePS); hvdkit's PS
            pushes every worker's gradient (False).
        fitted: ``((label, alpha_s, s_per_byte), ...)``: a measured Hockney fit ``t = a + b x bytes``
            of that variant's (its label) allreduce-equivalent on this cluster (e.g. from ``hvdkit-bench
            cluster-collectives``), used per bucket instead of the formula.
    """
    fusion_bytes: int = 64 * 1024 * 1024
    overlap: bool = False
    jitter_cv: float = 0.02
    ps_local_aggregation: bool = False
    fitted: tuple = ()

    def __post_init__(self):
        if self.fusion_bytes < 0 or self.jitter_cv < 0:
            raise ValueError(f"options {self}: fusion_bytes and jitter_cv must be >= 0")


@dataclass
class Prediction:
    """One strategy's predicted step (seconds; a "step" = one batch on every worker); ``strategy`` is
    the variant's label (``ps-sync:num_servers=2``) or an own row's name. ``efficiency`` is of the kind
    ``efficiency_kind`` names (docs/performance.md): ``"compute"`` = compute_s / step_s (the formula
    rows), ``"scaling"`` = the predicted one-worker step / step_s (rows calibrated on measurements)."""
    strategy: str
    step_s: float
    compute_s: float
    comm_s: float
    exposed_s: float
    efficiency: float
    samples_per_s: float
    link_bytes: float
    link: str
    limiting: str
    staleness: float = 0.0
    hvdkit: bool = True
    terms: dict = field(default_factory=dict)
    efficiency_kind: str = "compute"


# ---------------------------------------------------------------- the formulas


def ring_time(nbytes: float, ranks: int, link_Bps: float, latency_s: float = 0.0, reduce_Bps: float = math.inf) -> float:
    """Ring allreduce with the reduction: ``2 (N-1) alpha + 2 (N-1)/N S / B + (N-1)/N S / gamma``.

    Patarasuk & Yuan 2009 (JPDC 69(2)), :func:`hvdkit.costs.ring_allreduce_time`, plus the
    gamma term of Thakur, Rabenseifner & Gropp 2005: in the reduce-scatter each rank sums
    N-1 chunks of S/N bytes. One rank: 0.
    """
    if ranks == 1:
        return 0.0
    return costs.ring_allreduce_time(nbytes, ranks, link_Bps, latency_s) + (ranks - 1) / ranks * nbytes / reduce_Bps


def ring_inter_Bps(cl: Cluster) -> float:
    """Bytes per second an allreduce ring moves through each NIC, each direction: ``inter_Bps x
    ring_inter_fraction``.

    What a TCP transport delivers is not line rate. NCCL's socket transport moves a ring's bytes
    through a few sockets per peer, and its bandwidth is the slowest socket's times their number (its
    maintainer, NVIDIA/nccl-tests#83); between hosts of several GPUs the all-reduce bus bandwidth
    published in NCCL's issue threads is about half the NIC's rate, with one GPU per host near line rate
    (:data:`hvdkit.advise.published.NCCL_TCP`). Over RDMA the NIC moves the bytes (fraction 1).
    """
    return cl.inter_Bps * cl.ring_inter_fraction


def flat_ring_time(nbytes: float, cl: Cluster) -> float:
    """One ring over all H x G ranks (Horovod/NCCL's default; hvdkit's ``ring``).

    Every ring step moves S/N over every edge at once, so a step lasts as long as its slowest
    edge: with H > 1 the ring crosses each NIC once each way, so B = min(intra, inter) and
    alpha = the inter-host latency (Patarasuk & Yuan 2009; Sergeev & Del Balso 2018, sec. 3).
    """
    if cl.hosts == 1:
        return ring_time(nbytes, cl.workers, cl.intra_Bps, cl.intra_latency_s, cl.reduce_Bps)
    return ring_time(nbytes, cl.workers, min(cl.intra_Bps, ring_inter_Bps(cl)), cl.inter_latency_s, cl.reduce_Bps)


def hierarchical_time(nbytes: float, cl: Cluster) -> float:
    """Hierarchical allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE): intra-host reduce-scatter, an
    inter-host ring of S/G per accelerator, intra-host allgather.

    ``2 [(G-1) a_i + (G-1)/G S/B_i] + (G-1)/G S/gamma`` inside hosts, plus ``2 (H-1) a_e +
    2 (H-1)/H S / B_e`` across them: G rings of S/G bytes run at once through one NIC, so the
    NIC carries 2 (H-1)/H S each way (Sergeev & Del Balso 2018 (Horovod's hierarchical
    allreduce); the two-level analysis of Jiang et al., OSDI 2020, sec. 3).
    """
    g, h = cl.gpus_per_host, cl.hosts
    intra = 0.0 if g == 1 else 2 * ((g - 1) * cl.intra_latency_s + (g - 1) / g * nbytes / cl.intra_Bps) \
        + (g - 1) / g * nbytes / cl.reduce_Bps
    inter = 0.0 if h == 1 else (2 * (h - 1) * cl.inter_latency_s + 2 * (h - 1) / h * nbytes / ring_inter_Bps(cl)
                                + (h - 1) / h * nbytes / g / cl.reduce_Bps)
    return intra + inter


def _local(nbytes: float, cl: Cluster, aggregate: bool) -> tuple[float, float]:
    """(bytes each host pushes, seconds of the intra-host reduce + broadcast, BytePS) for a PS."""
    g = cl.gpus_per_host
    if not aggregate or g == 1:
        return g * nbytes, 0.0
    return nbytes, 2 * ((g - 1) * cl.intra_latency_s + (g - 1) / g * nbytes / cl.intra_Bps)


def ps_sync_time(nbytes: float, cl: Cluster, servers: int, aggregate: bool = False, pipelined: bool = False,
                 serial: bool = False) -> float:
    """Synchronous push + pull through K dedicated server hosts, plus the servers' sum and update.

    Per direction ``alpha + max(S_h, H S_h / K) / B_e`` (:func:`hvdkit.costs.ps_time`; Jiang et al.
    OSDI 2020, sec. 3.1: a worker link carries S_h, a server link H S_h / K), S_h = G S without
    local aggregation (every worker pushes), S with it; gamma: each server sums ``H S_h / K`` bytes and
    applies ``S / K`` at ``server_Bps``. ``pipelined`` (BytePS, sec. 4: tensors cut into small
    partitions that flow through the stages one after another; full-duplex links): the stages
    overlap, so the time is the slowest stage's: ``max(local, one direction, servers)``. ``serial``: the
    servers send the replies one worker at a time (hvdkit's ``ps_replies=serial``), so the pulls overlap
    the next pushes (:func:`hvdkit.costs.ps_time`).
    """
    sh, local = _local(nbytes, cl, aggregate)
    wire = costs.ps_time(sh, cl.hosts, servers, cl.inter_Bps, cl.inter_latency_s, serial=serial)
    server = (cl.hosts * sh + nbytes) / servers / cl.server_Bps
    if pipelined:
        return max(local, wire / 2, server)
    return local + wire + server


def colocated_time(nbytes: float, cl: Cluster, aggregate: bool = False, servers: int | None = None) -> float:
    """Colocated PS: every host serves S/H: ``2 alpha + 2 (H-1)/H S_h / B_e`` plus the sum and update.

    :func:`hvdkit.costs.colocated_ps_time` (BytePS's colocated mode, Jiang et al. OSDI 2020: the same
    bytes per NIC as a ring); gamma: a host sums H shards of S_h/H and applies S/H at ``server_Bps``.

    ``servers``: K < H of the worker hosts also serve a shard of S/K (TensorFlow's Benchmarks page ran
    fewer parameter servers than instances for some models). A serving host's NIC then takes the other
    H-1 hosts' S_h/K each in the push and sends them as much in the pull: ``2 alpha + 2 (H-1)/K S_h / B_e``
    (BytePS's analysis, Jiang et al. OSDI 2020, sec. 3.1: a server link carries the workers' shards),
    and it sums H shards of S_h/K and applies S/K. None or K >= H: every host serves (K = H).
    """
    sh, local = _local(nbytes, cl, aggregate)
    if cl.hosts == 1:
        return local + (0.0 if aggregate or cl.gpus_per_host == 1 else
                        ring_time(nbytes, cl.gpus_per_host, cl.intra_Bps, cl.intra_latency_s, cl.reduce_Bps))
    if servers is not None and servers < 1:
        raise ValueError(f"servers={servers} must be >= 1")
    k = cl.hosts if servers is None or servers >= cl.hosts else servers
    if k == cl.hosts:
        return (local + costs.colocated_ps_time(sh, cl.hosts, cl.inter_Bps, cl.inter_latency_s)
                + (sh + nbytes / cl.hosts) / cl.server_Bps)
    return (local + 2 * cl.inter_latency_s + 2 * (cl.hosts - 1) / k * sh / cl.inter_Bps
            + (cl.hosts * sh + nbytes) / k / cl.server_Bps)


def overlapped_step(forward_s: float, backward_s: float, tensor_bytes, fusion_bytes: int, comm) -> tuple[float, float, int]:
    """Tensor fusion overlapped with the backward pass: ``(step_s, comm_s, buckets)``.

    Horovod (Sergeev & Del Balso 2018, sec. 4 "Tensor Fusion"; the wait-free backpropagation of
    Zhang et al., Poseidon, ATC 2017): gradients become ready in reverse layer order during the
    backward pass (assumed: each tensor takes ``backward_s / n``); whenever the network is free,
    every ready tensor not yet sent goes out in one bucket of at most ``fusion_bytes`` (0: no cap);
    a bucket of b bytes takes ``comm(b)`` seconds and buckets go one after another. The step ends
    when the last bucket and the backward pass have both finished. This is what Horovod's
    DistributedGradientTape does in a compiled step (one allreduce op per gradient, fused by the
    background thread from what is ready); left out: the wait for its next cycle (HOROVOD_CYCLE_TIME,
    1 ms since Horovod 0.21) before a bucket goes, and, on CPU ranks, the cores the reduction takes
    from the backward pass.

    Args:
        forward_s, backward_s: seconds, >= 0.
        tensor_bytes: sizes in forward order (the backward pass produces them reversed).
        fusion_bytes: bucket cap in bytes, 0 = none.
        comm: callable bytes -> seconds of one allreduce.
    """
    sizes = list(tensor_bytes)[::-1]
    n = len(sizes)
    ready = [forward_s + backward_s * (i + 1) / n for i in range(n)]
    t_net, comm_s, i, buckets = 0.0, 0.0, 0, 0
    while i < n:
        start = max(t_net, ready[i])
        size = 0
        while i < n and ready[i] <= start + 1e-15 and (size == 0 or not fusion_bytes or size + sizes[i] <= fusion_bytes):
            size += sizes[i]
            i += 1
        dt = comm(size)
        t_net, comm_s, buckets = start + dt, comm_s + dt, buckets + 1
    return max(forward_s + backward_s, t_net), comm_s, buckets


def straggler_factor(workers: int, jitter_cv: float, staleness: int = 0) -> float:
    """Expected slowdown of a barrier over W workers whose step times have mean 1 and std ``cv``.

    ``1 + cv sqrt(2 ln W) / sqrt(s + 1)``: the expected maximum of W independent normal step
    times is at most ``mu + sigma sqrt(2 ln W)`` (the Gaussian maximal inequality, e.g. Boucheron,
    Lugosi & Massart 2013, sec. 2.5); a synchronous step (s = 0) waits for that maximum every
    step. With SSP (Ho et al., NIPS 2013) the fastest worker may run s clocks ahead, so the
    barrier bites once per s + 1 clocks on a sum of s + 1 step times, whose spread grows as
    sqrt(s + 1). One worker: 1.
    """
    if workers <= 1 or jitter_cv == 0:
        return 1.0
    return 1.0 + jitter_cv * math.sqrt(2 * math.log(workers)) / math.sqrt(staleness + 1)


def async_throughput(cycle_s: float, workers: int, server_steps_per_s: float) -> tuple[float, float]:
    """Asynchronous PS: ``(worker steps per second, mean staleness)``.

    Each worker repeats compute + push + pull on its own (``cycle_s``), so W workers offer
    W / cycle_s steps/s; the servers accept at most ``server_steps_per_s`` (their links or
    CPUs). Throughput = the smaller. The staleness of an update = the updates applied by others
    while its worker computed (Dean et al. 2012; Ho et al. 2013): throughput x cycle_s - 1,
    which is W - 1 when the servers keep up.
    """
    rate = min(workers / cycle_s, server_steps_per_s)
    return rate, max(0.0, rate * cycle_s - 1)


# ---------------------------------------------------------------- terms fixed by measurements (calibrated advice)


def burst_seconds(cpu_s: float, speed: float, quota: float, period_s: float, phases: int = 64) -> float:
    """Mean wall seconds a thread that slept needs for ``cpu_s`` seconds of CPU under a CFS quota.

    Linux CFS bandwidth control (Documentation/scheduler/sched-bwc.rst) lets a cgroup's threads run
    ``quota x period`` seconds of CPU in each period, then throttles them until the next period; the
    quota is not carried over. A thread that slept starts with the period's quota unspent, so a burst
    shorter than that quota runs at ``speed`` (the cores a running thread gets: 1, a core of its own)
    and a longer one is throttled down to ``quota``. The burst starts at a uniform phase of the period
    (the mean over ``phases`` phases). Which ranks sleep, and the measurements: docs/advise.md
    (:meth:`hvdkit.advise.calibrate.Calibration.sleeps`); the formula: docs/performance.md.

    Args:
        cpu_s: CPU seconds of the burst (finite, >= 0). speed: cores while running (> 0). quota: cores
            per period (> 0). period_s: the CFS period, seconds (> 0). phases: start phases averaged (>= 1).

    Raises:
        ValueError: ``cpu_s`` negative or not finite, ``speed``, ``quota`` or ``period_s`` not above 0,
            ``phases`` below 1.
    """
    if not (math.isfinite(cpu_s) and cpu_s >= 0 and speed > 0 and quota > 0 and period_s > 0 and phases >= 1):
        raise ValueError(f"burst_seconds: cpu_s={cpu_s} must be finite and >= 0, speed={speed}, quota={quota} "
                         f"and period_s={period_s} > 0, phases={phases} >= 1")
    per = quota * period_s          # CPU seconds each period allows
    if speed * period_s <= per:     # never throttled
        return cpu_s / speed
    total = 0.0
    for i in range(phases):
        end = period_s * (1 - (i + 0.5) / phases)       # what is left of the period the burst starts in
        first = min(per, speed * end)
        if cpu_s <= first:
            total += cpu_s / speed
            continue
        left = cpu_s - first
        full = max(0, math.ceil(left / per) - 1)        # whole periods at the quota, then the rest at speed
        total += end + full * period_s + (left - full * per) / speed
    return total / phases


def cpu_share(ranks_on_host: int, host_cores: float | None = None, ranks_on_machine: int | None = None,
              machine_cores: float | None = None) -> float:
    """Cores (a fraction of one) each busy thread of a host gets: ``min(1, Q / r, C / R)``.

    Every rank is runnable all the time: it computes, or its MPI progress engine and Horovod's
    background thread busy-poll while it waits (the polling term: ``mpi_yield_when_idle`` alone raises
    Horovod's busbw, ``horovod[yield]`` in benchmarks/reference/cluster_collectives.md). Linux CFS gives runnable tasks equal shares of the cores
    (Documentation/scheduler/sched-design-CFS.rst), and a cgroup's CFS quota caps its tasks at Q cores
    together (sched-bwc.rst). So r ranks on a host with quota Q get Q / r each, R ranks sharing a
    machine of C cores without quotas C / R each, and no thread more than one core. r and R count busy
    threads: a rank has one (its compute thread, which busy-polls in MPI while it waits; hvdkit's ring
    and every PS rank sleep instead under a quota: their compute is then a burst,
    :func:`burst_seconds`), a Horovod rank
    two (its background thread negotiates every cycle and busy-polls while its peers lag; the rows'
    ``busy_threads``): on shared cores Horovod's compute per step stretches more than hvdkit's
    one-thread ring's (the step split of benchmarks/reference/fair_hosts/*/training.md).

    Args:
        ranks_on_host: r >= 1, busy threads on the host. host_cores: Q, the host's CPU quota in cores (None: no quota).
        ranks_on_machine, machine_cores: R (busy threads) and C when hosts share one machine's cores without
            quotas (an emulated cluster without ``--cpus-per-host``); None: real hosts.

    Raises:
        ValueError: r < 1 or a quota / core count <= 0.
    """
    if ranks_on_host < 1:
        raise ValueError(f"ranks_on_host={ranks_on_host} must be >= 1")
    share = 1.0
    if host_cores is not None:
        if not host_cores > 0:
            raise ValueError(f"host_cores={host_cores} must be > 0")
        share = min(share, host_cores / ranks_on_host)
    if machine_cores is not None and ranks_on_machine:
        if not machine_cores > 0:
            raise ValueError(f"machine_cores={machine_cores} must be > 0")
        share = min(share, machine_cores / ranks_on_machine)
    return share


def split_fit(a_s: float, b_s_per_byte: float, nbytes: float, wire_factor: float, link_Bps: float) -> dict:
    """A measured collective ``t = a + b S`` split into ``latency`` (a), ``wire`` (the busiest link's
    bytes at the probed rate, ``wire_factor x S / B``) and ``cpu`` (the rest of ``b S``: copies,
    the reduction's cost per byte on a host, serialisation, polling), seconds each, all >= 0.

    The split is what lets a fit at one rank count predict another: the wire term scales with the
    algorithm's bytes on the busiest link (:mod:`hvdkit.costs`), the latency term with its message
    steps, the CPU term with the bytes a rank copies and sums, and only the latency and CPU terms
    slow down when the rank gets less of a core (:func:`cpu_share`). Hockney 1994 for the fit; the
    alpha-beta-gamma split of Thakur, Rabenseifner & Gropp 2005 (gamma = CPU per byte) for the parts.
    A fit slower per byte than the wire (b < wire_factor / B) has ``cpu`` 0 and the wire term the
    fit's own ``b S``.
    """
    wire = min(b_s_per_byte * nbytes, wire_factor * nbytes / link_Bps)
    return {"latency": max(0.0, a_s), "wire": max(0.0, wire), "cpu": max(0.0, b_s_per_byte * nbytes - wire)}


def server_serial_time(pushes: int, shard_bytes: float, reduce_Bps: float) -> float:
    """Seconds a parameter server's single receive thread spends summing the pushes of one step.

    A dedicated server of hvdkit's PS (``hvdkit.strategies.ps.server``: one loop handles the requests
    one at a time) takes the W pushes of its shard one after another and adds each into the sum: ``W x shard / gamma`` with gamma
    the bytes per second one core sums (numpy float32 add on one core: the default
    ``Cluster.reduce_Bps`` of CPU clusters).
    The one update per step (S / K) is in the one-worker step the calibration starts from.
    """
    if pushes < 0 or shard_bytes < 0 or not reduce_Bps > 0:
        raise ValueError(f"pushes={pushes}, shard_bytes={shard_bytes} must be >= 0 and reduce_Bps={reduce_Bps} > 0")
    return pushes * shard_bytes / reduce_Bps


def closed_network_cycle(workers: int, think_s: float, shared: Sequence[float] = (),
                         fcfs: Sequence[float] = ()) -> float:
    """Seconds of one worker's cycle in a closed queueing network: W workers, each spending ``think_s``
    on its own (a delay station: its compute, its own link), then one request through every station in
    turn; solved by mean value analysis (Reiser & Lavenberg, JACM 27(2), 1980), adding one worker at a
    time: by the arrival theorem a request finds each station's queue Q (and utilisation U) of W - 1
    workers. Formula on docs/performance.md ("Step").

    Args:
        workers: W, >= 1.
        think_s: Z, seconds, >= 0.
        shared: demands D (seconds per request) of processor-sharing stations: a link whose rate the
            requests' TCP flows share (a server's ingress for the pushes, its egress for the pulls).
            R = D (1 + Q), exact for any service distribution (BCMP: Baskett, Chandy, Muntz & Palacios,
            JACM 22(2), 1975).
        fcfs: demands D of first-come-first-served stations with a deterministic service (a server's
            one loop): R = D + D (Q - U) + U D / 2, the request in service costing its residual D / 2
            (E[S^2] / 2 E[S]; Kleinrock, Queueing Systems vol. 1, 1975).

    Returns:
        Z + R, R the sum of the stations' R: Z + sum(D) at one worker, growing with W. Exact for
        processor-sharing stations, whose cycle never falls below the bound W max(D); the FCFS
        residual is an approximation that can (at W = 8, Z = 3 D, one station: 7.0 D), so a caller
        keeps the larger of the cycle and that bound.

    Raises:
        ValueError: W < 1, or a time negative, infinite or NaN.
    """
    demands = (*shared, *fcfs)
    if workers < 1 or not 0 <= think_s < math.inf or not all(0 <= d < math.inf for d in demands):
        raise ValueError(f"workers={workers} must be >= 1, think_s={think_s} and the demands {demands} >= 0")
    q, u = [0.0] * len(demands), [0.0] * len(demands)
    r = list(demands)
    for n in range(1, workers + 1):
        r = [d * (1 + qi) for d, qi in zip(shared, q)] + [
            d + d * (q[i] - u[i]) + u[i] * d / 2 for i, d in enumerate(fcfs, start=len(shared))]
        x = n / (think_s + sum(r)) if think_s + sum(r) > 0 else 0.0
        q, u = [x * ri for ri in r], [x * d for d in demands]
    return think_s + sum(r)
