"""The terms of a calibrated step: how a :class:`~hvdkit.advise.calibrate.Calibration` prices one
configuration's communication (latency, CPU, wire), the one-worker step's copies, the transport's
all-to-all floor and an asynchronous PS's queueing at its servers (:meth:`Calibration.predict
<hvdkit.advise.calibrate.Calibration.predict>` adds them up). Pure arithmetic (no TensorFlow, no MPI);
``cal`` is the calibration, ``job`` the configuration (:class:`Job`).
"""
from __future__ import annotations

from dataclasses import dataclass

from hvdkit.advise.collective_fits import latency_steps, wire_factor
from hvdkit.advise.model import closed_network_cycle, server_serial_time
from hvdkit.advise.predict import Priced

__all__ = ["LIMITS", "Job", "communication", "with_copies", "transport", "server_cycle"]

#: the names of :meth:`hvdkit.advise.calibrate.Calibration.predict`'s terms in a prediction's ``limiting``
LIMITS = {"compute": "compute", "latency": "latency (per message)", "cpu": "CPU per byte (copies, reduction, polling)",
          "wire": "NIC bandwidth", "server": "servers (asynchronous requests)",
          "transport": "MPI's all-to-all transport"}


@dataclass
class Job:
    """One configuration :meth:`~hvdkit.advise.calibrate.Calibration.predict` prices, and the figures its
    terms share."""
    model: str
    row: Priced
    rate: str
    workers: int
    nbytes: float        # S, the gradient bytes
    base: float          # the one-worker step less its network, seconds at one full core
    comm: str            # the row's pattern; a hierarchical ring at one rank per host is a ring
    k: int               # a dedicated PS's servers, else 1
    ranks: int
    ln: object           # the place's hvdkit.advise.measured.Link
    share: float         # cpu_share of one busy thread of this job
    share_fit: float     # ... of the collective it reads
    n: float             # the bytes on that collective's bytes axis
    wf: float            # the wire fraction on that axis
    fit_method: str      # the collective it reads
    b: float             # the 2-host fit's seconds per byte
    parts: dict          # split_fit of the 2-host fit at n
    cal_workers: int     # the workers of the 2-host fit
    pattern_Bps: float | None   # the probe's rate of the row's pattern, every host at once
    ring: float          # link rate / pattern rate at more than 2 workers, else 1
    at: float | None     # seconds of the collective measured at this rank count, else None


def communication(cal, job: Job) -> tuple[float, float, float]:
    """(latency, CPU, wire) seconds of ``job``'s communication in one step, the first two at the CPU share
    of the collective it reads (:meth:`Calibration.predict <hvdkit.advise.calibrate.Calibration.predict>`)."""
    row, rate, workers, k, n, wf, parts = job.row, job.rate, job.workers, job.k, job.n, job.wf, job.parts
    comm, ln = job.comm, job.ln
    if job.at is not None:
        rate_Bps = ln.link_Bps if comm == "ps" else (job.pattern_Bps or ln.link_Bps)
        wire = min(job.at, wire_factor(comm, workers, k, row.serial_replies) * n * wf / rate_Bps)
        # its smallest size's time
        lat = min(job.at - wire, cal.collective_time(rate, job.fit_method, 0.0, job.ranks))
        cpu = job.at - wire - lat
    elif comm == "ps":
        asynchronous = row.staleness != 0
        w_eff = 1 if asynchronous else workers
        wire = parts["wire"] * wire_factor("ps", w_eff, k, row.serial_replies and not asynchronous) \
            / wire_factor("ps", 1, 1)
        # the sum runs at reduce_Bps on a full core: in the fit's CPU units (at share_fit), / share_fit
        cpu = parts["cpu"] + server_serial_time(w_eff - 1, job.nbytes / k, cal.reduce_Bps) / job.share_fit
        lat = parts["latency"]
    elif comm == "ring" and cal.points.get((rate, job.fit_method)):
        # a ring of W is 2 (W - 1) steps of 2 S / W bytes each way; the measured 2-host ring of x bytes
        # is 2 steps of x / 2: so (W - 1) x the 2-host time at x = 2 S / W (Patarasuk & Yuan 2009),
        # read off the measured sizes where the chunk is small (the quota's floor per step)
        x = 2 * n / workers
        per = cal.collective_time(rate, job.fit_method, x)
        w2 = min(per, wf * x / ln.link_Bps)
        lat_p = min(per - w2, max(0.0, per - job.b * x))
        lat, cpu, wire = (workers - 1) * lat_p, (workers - 1) * (per - w2 - lat_p), (workers - 1) * w2 * job.ring
    else:
        wire = parts["wire"] * wire_factor(comm, workers) / wire_factor(comm, job.cal_workers) * job.ring
        cpu = parts["cpu"] * wire_factor(comm, workers) / wire_factor(comm, job.cal_workers)
        lat = parts["latency"] * latency_steps(comm, workers) / latency_steps(comm, job.cal_workers)
    return lat, cpu, wire


def with_copies(cal, job: Job, lat: float, cpu: float, wire: float) -> float:
    """``cpu`` with the one-worker step's own copies (:attr:`~hvdkit.advise.calibrate.Calibration.overhead`): added to a ring's, a floor of
    the others'."""
    # the one-worker step's own copies (rows without network at one worker; Calibration.overhead)
    # (a row with no one-worker cell of its own, e.g. advise's horovod-hier: those of the step whose base it took)
    floor = cal.overhead.get(cal.base_key(job.rate, job.model, job.row.label), 0.0) / job.share \
        if job.comm != "ps" else 0.0
    if job.comm == "ring":
        # the collective measured alone sums one contiguous buffer; a training step's ring packs the
        # gradient tensors into one and back (hvdkit's ring) or copies them through the fusion buffer
        # (Horovod's grouped allreduce), and averages: the one-worker step's copies, added (not a
        # floor: a ring's collective measured alone already pays its own copies once)
        return cpu + floor * job.share / job.share_fit
    # a colocated PS: its benchmark runs the PS itself (the servers' apply too): a floor
    return max(cpu, (floor - wire) * job.share / job.share_fit - lat)


def transport(cal, job: Job, soft: float, wire: float) -> float | None:
    """The ``transport`` term of a colocated PS on more than 2 hosts (its bytes at :attr:`~hvdkit.advise.calibrate.Calibration.a2a_frac` of the
    ring pattern's rate, beyond ``soft + wire``); None for other rows, or without a measured fraction."""
    frac = cal.a2a_frac.get(job.rate)
    if not (job.comm == "colocated" and job.workers > 2 and frac and job.at is None):
        return None
    # every rank sends to and receives from every other at once: at most the transport's
    # measured all-to-all rate (mpi-a2a in benchmarks/reference/fair_hosts/*/collectives_np*.md:
    # Open MPI's TCP transport, below the rate plain sockets carry in the same pattern)
    floor = wire_factor("colocated", job.workers) * job.n * job.wf / (frac * (job.ln.ring_Bps or job.ln.link_Bps))
    return max(0.0, floor - soft - wire)


def server_cycle(cal, job: Job, step: float) -> float:
    """Seconds per cycle of an asynchronous PS's workers whose own step is ``step``: a closed queueing
    network through the servers' links and loop, at least its bound."""
    # W workers cycle between their own work and the K servers: a closed queueing network
    # (closed_network_cycle). A request's shard S / K goes in through a server's link and its
    # weights come out through it: two links the workers' TCP flows share (processor sharing),
    # each one way's time of the fit's wire term; then the server's one loop (first come,
    # first served): the transport's copies (the fit's CPU term) and the sum, at the CPU share
    # of one busy rank on its host (the waiting workers sleep: hvdkit.comm.poll). The rest of
    # the one-worker step (`step`, at this job's CPU share) is each worker's own. With pushes
    # and pulls overlapping and only the loop queueing, ps-async came out under the reference
    # check's cells (benchmarks/reference/advise_check.md)
    alone = cal.share(job.rate, 1, 1)
    link = job.parts["wire"] / 2 / job.k
    loop = (job.parts["cpu"] * job.share_fit / alone
            + server_serial_time(1, job.nbytes, cal.reduce_Bps) / alone) / job.k
    think = max(0.0, step - 2 * link - loop)
    cycle = closed_network_cycle(job.workers, think, shared=(link, link), fcfs=(loop,))   # = step at one worker
    # and at least the bound: W requests through the busiest station per cycle (the loop's residual
    # approximation can fall below it where the loop is the bottleneck)
    return max(cycle, job.workers * max(link, loop))
