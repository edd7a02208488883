"""Measured collectives in place of the formulas: Hockney fits ``t = a + b x bytes`` from
``hvdkit-bench cluster-collectives`` (``--calibrate`` of ``hvdkit advise``).

On a cluster where the formulas' assumptions fail (more ranks than cores, a TCP stack or an MPI
algorithm that does not reach the link rate) the time of each strategy's allreduce-equivalent,
measured alone at a few sizes, predicts its share of a training step better than alpha and beta
from a probe (Hockney 1994: ``t(m) = alpha + m / B`` fitted by least squares).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hvdkit import costs
from hvdkit.advise.model import (Prediction, burst_seconds, closed_network_cycle, cpu_share, server_serial_time,
                                 split_fit)
from hvdkit.advise.predict import Priced, priced
from hvdkit.errors import UsageError

__all__ = ["fit_collectives", "fit_for", "fitted_options", "collective_method", "wire_factor", "latency_steps",
           "Calibration", "calibrate", "held_out"]


def collective_method(row, hosts: int) -> tuple[str | None, int]:
    """(the ``cluster_collectives`` method measuring ``row``'s step communication alone, its ranks)
    for one rank per host (the only calibrated case), from the row's facts (:class:`~hvdkit.advise.predict.Priced`).

    The collectives benchmark names its methods: a ring by the strategy that runs it (``horovod``,
    ``ring``; Horovod's hierarchical allreduce is its flat ring at one rank per host), ``ps`` / ``ps2``
    for K = 1 / 2 dedicated servers (H + K ranks), ``ps-colocated``; ``-fp16`` after a method when
    the row sends float16 (``compression=fp16``; ``ps-fp16-push`` when only the push is). Other rows
    (BytePS, K > 2): (None, ranks), the formulas stand.
    """
    label = row.label.partition(":")[0]
    if row.comm == "hierarchical":
        method = "horovod"
    elif row.comm == "ring":
        method = label
    elif row.comm == "colocated":
        method = "ps-colocated"
    elif row.comm == "ps" and row.servers in (1, 2):
        return (_fp16("ps" if row.servers == 1 else "ps2", row.wire_fraction), hosts + row.servers)
    else:
        return None, hosts
    return _fp16(method, row.wire_fraction), hosts


def _fp16(method: str, wire_fraction: float) -> str:
    """``method`` with the ``-fp16`` suffix of the collectives benchmark's compressed rows."""
    if wire_fraction == 1.0:
        return method
    return method + ("-fp16" if wire_fraction == 0.5 else "-fp16-push")


def fit_collectives(doc: dict, link_Bps: float | None = None, min_bytes: int = 1 << 20) -> dict:
    """``{(method, ranks): (a_s, b_s_per_byte)}`` from a ``cluster_collectives --json`` document.

    Rows with one rank per host, the default variant, ``bytes >= min_bytes``, at the link rate
    closest to ``link_Bps`` (bytes/s; None: 1 Gbit/s); a least-squares line per (method, ranks)
    with at least two sizes; a and b are clipped at 0.

    Raises:
        ValueError: the document has no ``rows`` (names what is missing).
    """
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not rows:
        raise ValueError("a cluster_collectives --json document with rows is needed")
    rates = sorted({r["rate"] for r in rows if r.get("rate")})
    want = link_Bps or 1e9 / 8
    rate = min(rates, key=lambda t: abs(costs.parse_rate(t) / 8 - want)) if rates else None
    pts: dict = {}
    for r in rows:
        if r.get("slots") == 1 and r.get("rate") == rate and r.get("variant", "main") == "main" \
                and r["bytes"] >= min_bytes and "[" not in r["method"]:
            pts.setdefault((r["method"], r["ranks"]), []).append((r["bytes"], r["time_us"] / 1e6))
    out = {}
    for key, xy in pts.items():
        x, y = np.array(xy).T
        if len(set(x)) >= 2:
            b, a = np.polyfit(x, y, 1)
            out[key] = (max(0.0, float(a)), max(0.0, float(b)))
    return out


def _bytes_factor(method: str, ranks: int) -> float:
    """Busiest-link bytes per S of one allreduce-equivalent (the formulas' beta factor)."""
    k = {"ps": 1, "ps2": 2}.get(method.split("-fp16")[0], 0)
    if k:
        return 2 * max(1.0, (ranks - k) / k)
    return 2 * (ranks - 1) / ranks


def fit_for(fits: dict, method: str, ranks: int) -> tuple[float, float] | None:
    """The fit of ``method`` at ``ranks``; for an unmeasured rank count, the largest measured
    one's ``a`` and its ``b`` scaled by the formulas' bytes ratio; None when the method is absent."""
    if (method, ranks) in fits:
        return fits[(method, ranks)]
    have = sorted(r for m, r in fits if m == method)
    if not have:
        return None
    a, b = fits[(method, have[-1])]
    return a, b * _bytes_factor(method, ranks) / _bytes_factor(method, have[-1])


def fitted_options(fits: dict, rows, hosts: int) -> tuple:
    """``Options.fitted`` for one rank per host: ``((label, a, b), ...)`` for each of ``rows``
    (:class:`~hvdkit.advise.predict.Priced`) with a measured method (:func:`collective_method`)."""
    out = []
    for row in rows:
        method, ranks = collective_method(row, hosts)
        fit = fit_for(fits, method, ranks) if method and ranks > 1 else None
        if fit:
            out.append((row.label, *fit))
    return tuple(out)


# ---------------------------------------------------------------- calibration on micro-measurements


def wire_factor(comm: str, workers: int, servers: int | None = None, serial: bool = False) -> float:
    """Bytes on the busiest link per gradient byte S of one step, from the row's traffic formula in
    :mod:`hvdkit.costs` (at S = 1 byte, B = 1 byte/s, no latency; docs/performance.md): a ring (flat, or
    hierarchical at one rank per host), a colocated PS, K dedicated servers (push + pull through the
    server's link; ``serial``: the replies one worker at a time, pulls overlapping the next pushes). One
    worker on a ring: 0."""
    if comm == "ps":
        return costs.ps_time(1.0, workers, servers or 1, 1.0, serial=serial)
    if comm == "colocated":
        return costs.colocated_ps_time(1.0, workers, 1.0)
    return costs.ring_allreduce_time(1.0, workers, 1.0)


def latency_steps(comm: str, workers: int) -> int:
    """Messages one after another in one step: a ring's 2 (W-1) (reduce-scatter + allgather), a PS's 2
    (push, pull): the factor of the latency term (Patarasuk & Yuan 2009; :func:`hvdkit.costs.ps_time`)."""
    return 2 * (workers - 1) if comm in ("ring", "hierarchical") else 2


#: the names of :meth:`Calibration.predict`'s terms in a prediction's ``limiting``
LIMITS = {"compute": "compute", "latency": "latency (per message)", "cpu": "CPU per byte (copies, reduction, polling)",
          "wire": "NIC bandwidth", "server": "servers (asynchronous requests)",
          "transport": "MPI's all-to-all transport"}

#: the collectives method whose traffic is a colocated PS's with no PS (every rank to every rank at once),
#: measured at 3 hosts or more: the transport's all-to-all rate (:attr:`Calibration.a2a_frac`)
A2A_METHOD = "mpi-a2a"
#: the CFS period of an emulated host's CPU quota, seconds (hvdkit.cluster.cpu.PERIOD_US)
CFS_PERIOD_S = 0.01


def a2a_fraction(row: dict, place_ring_Bps: float | None) -> float | None:
    """The all-to-all rate an ``mpi-a2a`` collectives row reached as a share of the ring pattern's probed
    rate: busbw ``2 (N-1)/N x bytes / time`` (the bytes each rank sends, as a ring's; BytePS's colocated
    mode, Jiang et al. OSDI 2020) over the row's own probe (``ring_bps``, a cluster-collectives run) or
    else ``place_ring_Bps`` (bytes/s: the place's ring pattern, else its link); None without either."""
    ranks, t = int(row["ranks"]), float(row["time_us"]) / 1e6
    ring = float(row["ring_bps"]) / 8 if row.get("ring_bps") else place_ring_Bps
    if ranks < 2 or t <= 0 or not ring:
        return None
    return 2 * (ranks - 1) / ranks * row["bytes"] / t / ring


@dataclass
class Calibration:
    """What the micro-measurements fixed: collectives at ``hosts`` hosts and one worker's step.

    Attributes:
        fits: ``{(rate, method): (a_s, b_s_per_byte)}``, Hockney fits of each collectives method at
            ``hosts`` hosts, one rank per host (:func:`fit_collectives`' rule).
        base: ``{(rate, model, variant): seconds}``: the one-worker step less its network (the
            dedicated PS: less the fitted push + pull), at one full core (times its CPU share).
        links: ``{rate: Link}`` (:class:`hvdkit.advise.measured.Link`).
        used: the measurements read: ``("cell", model, variant, workers, rate)`` and
            ``("collectives", rate, method, ranks)`` (what :func:`held_out` checks).
        hosts: the collectives' host count. reduce_Bps: gamma of :func:`~hvdkit.advise.model.server_serial_time`.
        fit_quota: ``{(rate, method): cores}`` where the collectives ran under a CPU quota of their own
            (a cluster-collectives run; None: no quota); absent: the place's.
        notes: one line per micro-measurement the calibration could not use as it is (why, and what it took instead).
        points: ``{(rate, method): ((bytes, seconds), ...)}``, every size the collectives measured at
            ``hosts`` hosts, the small ones too (:meth:`collective_time` interpolates them).
        overhead: ``{(rate, model, variant): seconds at one full core}``: what a one-worker step of a
            row without network at one worker (a ring, a colocated PS) spends beyond its compute
            (the harness's own split, ``Cell.base_ms``): the strategy's per-step copies. Added to a
            ring's communication at more workers (hvdkit's ring packs the gradient tensors into one
            buffer and back, Horovod's grouped allreduce copies them through its fusion buffer, and
            both average: the collectives benchmark sums one contiguous buffer, so none of that is in
            its time); a floor of a colocated PS's (its benchmark runs the PS itself, the servers' apply
            of the update included) (:meth:`predict`).
        a2a_frac: ``{rate: fraction}``: the transport's all-to-all rate as a share of the ring pattern's
            probed rate (:func:`a2a_fraction`, median of the ``mpi-a2a`` rows at 3 hosts or more, the
            default launch, the largest size measured if >= the fits' ``min_bytes``: a rate, not a
            latency): the floor of a colocated PS's push + pull on more than 2 hosts (:meth:`predict`).
            A pattern the 2-host collectives cannot show (one peer each); measured with no PS and no
            training, like the probe's patterns.
        scale_points: ``{(rate, method, ranks): ((bytes, seconds), ...)}``: the collectives measured at more
            hosts than ``hosts`` (``calibrate(..., at_scale=True)``; one rank per host): a configuration
            whose collective ran at its own rank count reads it there (:meth:`predict`) instead of
            extrapolating the 2-host one. Empty: the 2-host calibration alone.
        scale_fits: ``{(rate, method, ranks): (a_s, b_s_per_byte)}``: their Hockney fits at >= ``min_bytes``
            (the slope beyond the largest size). scale_quota: ``{(rate, method, ranks): cores}``, where they
            ran under a CPU quota of their own (as ``fit_quota``).
    """
    fits: dict
    base: dict
    links: dict
    used: set
    hosts: int = 2
    reduce_Bps: float = 2e9
    fit_quota: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    points: dict = field(default_factory=dict)
    overhead: dict = field(default_factory=dict)
    a2a_frac: dict = field(default_factory=dict)
    scale_points: dict = field(default_factory=dict)
    scale_fits: dict = field(default_factory=dict)
    scale_quota: dict = field(default_factory=dict)

    def share(self, rate: str, ranks_on_host: int, ranks: int, threads: int = 1, method: str | None = None,
              scaled: bool = False) -> float:
        """:func:`~hvdkit.advise.model.cpu_share` of one busy thread of a job of ``ranks`` ranks of
        ``threads`` busy threads each (the row's ``busy_threads``) at ``rate``'s place (``method``: of
        that collectives fit, under its own quota where it recorded one; ``scaled``: of that method's
        collective measured at ``ranks``, :attr:`scale_points`)."""
        ln = self.links[rate]
        quotas, key = (self.scale_quota, (rate, method, ranks)) if scaled else (self.fit_quota, (rate, method))
        quota = quotas.get(key, ln.cpus_per_host) if method else ln.cpus_per_host
        return cpu_share(ranks_on_host * threads, quota, ranks * threads if quota is None else None,
                         ln.cores if quota is None else None)

    def sleeps(self, rate: str, row: Priced, workers: int, ranks_on_host: int = 1) -> bool:
        """True where ``row``'s ranks sleep while they communicate, so that their compute is a burst
        (:meth:`burst`): more than one worker, one rank per host, a place whose hosts have a quota below
        one core (with a core of its own hvdkit's ring spins: ``--ring-wait auto``) and the machine's
        cores, and a row that does not spin (:attr:`~hvdkit.advise.predict.Priced.spins`: Horovod's
        background thread, ``ring_wait=spin``). Its base stays the one-worker step at the quota: there a
        ring's or a colocated PS's rank never waits. A dedicated PS's worker waits there too, but
        reading its base back through the burst and the fitted push + pull made the reference check
        worse (benchmarks/reference/advise_check.md; not kept)."""
        ln = self.links[rate]
        return bool(ln.cpus_per_host and ln.cpus_per_host < 1 and ln.cores and ranks_on_host == 1 and workers > 1
                    and not row.spins)

    def burst(self, rate: str, cpu_s: float, workers: int) -> float:
        """Wall seconds of ``cpu_s`` (CPU seconds) of compute of a rank that :meth:`sleeps`: a burst
        (:func:`~hvdkit.advise.model.burst_seconds`) at the speed the machine's cores give ``workers`` >= 1
        ranks computing at once (the workers of a synchronous step compute together; a dedicated PS's
        servers wait then), under the hosts' quota and :data:`CFS_PERIOD_S`."""
        ln = self.links[rate]
        return burst_seconds(cpu_s, min(1.0, ln.cores / workers), ln.cpus_per_host, CFS_PERIOD_S)

    def base_key(self, rate: str, model: str, label: str) -> tuple | None:
        """The key of :meth:`base_of`'s base: ``(rate, model, label)``, else the model's horovod (else
        ring) one at ``rate``, else None."""
        return next((key for key in ((rate, model, label), (rate, model, "horovod"), (rate, model, "ring"))
                     if key in self.base), None)

    def base_of(self, rate: str, model: str, label: str) -> float | None:
        """The one-worker base of ``label`` (seconds at one full core): its own, else the model's
        horovod (else ring) base at ``rate``, else None."""
        key = self.base_key(rate, model, label)
        return self.base[key] if key else None

    def scale_read(self, row, rate: str, workers: int, ranks_on_host: int = 1) -> tuple[str, float] | None:
        """``(method, bytes scale)`` of the collective measured at scale (:attr:`scale_points`) that ``row``
        (:class:`~hvdkit.advise.predict.Priced`) reads with ``workers`` workers at ``rate``: its own method at
        its rank count (W; a dedicated PS W + K), else the float32 method on ``wire_fraction`` of the bytes
        (an ``-fp16`` row); None where it reads the 2-host calibration: one worker, more than one rank per
        host (the collectives ran one per host), an asynchronous row (its queueing network reads the 2-host
        fit), ``ps_replies=serial`` (the benchmark's servers reply concurrently), or nothing measured."""
        method, ranks = collective_method(row, workers)
        if method is None or workers <= 1 or ranks_on_host != 1 or row.staleness != 0 or row.serial_replies:
            return None
        for m, scale in ((method, 1.0), (method.split("-fp16")[0], row.wire_fraction)):
            if (rate, m, ranks) in self.scale_points:
                return m, scale
        return None

    def collective_time(self, rate: str, method: str, nbytes: float, ranks: int | None = None) -> float | None:
        """Seconds of ``method``'s collective of ``nbytes`` at ``hosts`` hosts, from its measured sizes:
        linear between the two measured sizes around ``nbytes``, the smallest size's time below them,
        and the Hockney fit's slope beyond the largest; None when the method has no points.

        Why not the fit alone: under a CPU quota a message step costs at least about one CFS period
        (benchmarks/reference/fair_hosts/*/collectives_np2.md: the small sizes), a floor a straight line
        fitted at >= 1 MiB does not have, and a ring on W hosts moves chunks of 2 S / W, down in that
        floor for a small model (docs/advise.md). ``ranks``: the same from the collectives measured at that
        rank count (:attr:`scale_points`); None: at ``hosts`` hosts.
        """
        key = (rate, method) if ranks is None else (rate, method, ranks)
        pts = (self.points if ranks is None else self.scale_points).get(key)
        if not pts:
            return None
        xs, ys = zip(*sorted(pts))
        if nbytes <= xs[0]:
            return ys[0]
        if nbytes >= xs[-1]:
            fit = (self.fits if ranks is None else self.scale_fits).get(key)
            return ys[-1] + (fit[1] if fit else 0.0) * (nbytes - xs[-1])
        return float(np.interp(nbytes, xs, ys))

    def _fit(self, rate: str, method: str, wire_fraction: float) -> tuple[tuple[float, float], float, str] | None:
        """(the fit for ``method``, the gradient bytes scale it applies to, the method fitted): the method's own fit, else
        (``ps2``) the one-server fit, else (``-fp16``) the float32 method's on ``wire_fraction`` of the bytes."""
        for m, scale in ((method, 1.0), (method.replace("ps2", "ps"), 1.0),
                         (method.split("-fp16")[0], wire_fraction), (method.split("-fp16")[0].replace("ps2", "ps"),
                                                                     wire_fraction)):
            if (rate, m) in self.fits:
                return self.fits[(rate, m)], scale, m
        return None

    def predict(self, model: str, variant: str, workers: int, rate: str, nbytes: float, batch: int = 32,
                ranks_on_host: int = 1) -> Prediction | None:
        """The step of ``variant`` with ``workers`` workers of ``model`` (S = ``nbytes``) at ``rate``, or
        None where the calibration lacks the model's one-worker step or the method's collective.

        ``step = base / share + (latency + cpu) x share_fit / share + wire`` (sync), where base is the
        one-worker step less its network; a configuration whose own collective was measured at its rank
        count (:attr:`scale_points`; one rank per host, a synchronous row, not ``ps_replies=serial``) reads
        it there, split into wire (its bytes at the pattern's rate), latency (its smallest size's time) and
        CPU (the rest); else the collective's fit at 2 hosts is split by
        :func:`~hvdkit.advise.model.split_fit` and scaled: latency by :func:`latency_steps`, wire by
        :func:`wire_factor` (a ring or colocated PS on more than 2 hosts at the probe's ring-pattern rate,
        every host sending and receiving at once, where cluster.json has it; a colocated PS at its
        all-to-all pattern's rate where the probe measured that), the CPU term of a ring and a colocated
        PS by the wire factor (the bytes each rank copies and sums; a ring's plus the one-worker step's
        copies, :attr:`overhead`, which are a floor of a colocated PS's), of a dedicated PS kept (the worker's
        own serialisation) plus
        :func:`~hvdkit.advise.model.server_serial_time` of the W - 1 other pushes; a colocated PS on
        more than 2 hosts at least its bytes at :attr:`a2a_frac` of the ring pattern's rate where the
        calibration has it (the excess: the ``transport`` term); ``share``:
        :func:`~hvdkit.advise.model.cpu_share` of the job (the fit's: 2 ranks). Asynchronous rows
        (ps-async, ps-ssp, ps-dcasgd): W workers cycle between their own work (the one-worker step at
        this job's CPU share, less its time at the servers) and the K servers, a closed queueing network
        (:func:`~hvdkit.advise.model.closed_network_cycle`): a request's shard S / K in through a server's
        link and its weights out through it (two processor-sharing stations, each one way of the fit's
        wire term), then the server's one loop (first come, first served: the transport's copies, the
        fit's CPU term, and the sum of one push, at the CPU share of one busy rank on its host; the
        waiting workers sleep: :func:`hvdkit.comm.poll`).
        """
        if rate not in self.links:
            return None
        try:
            row = priced(variant, workers)
        except UsageError:   # a row advise has no formula for (model parallel, tf-ps)
            return None
        method, _ = collective_method(row, workers)
        base = self.base_of(rate, model, row.label)
        if method is None or base is None:
            return None
        got = self._fit(rate, method, row.wire_fraction)
        if got is None:
            return None
        (a, b), scale, fit_method = got
        comm = "ring" if row.comm == "hierarchical" else row.comm
        k = row.servers or 1
        ln = self.links[rate]
        ranks = workers + (k if comm == "ps" else 0)
        t = busy_threads(row, workers)
        share = self.share(rate, ranks_on_host, ranks, t)
        share_fit = self.share(rate, 1, self.hosts, row.busy_threads, fit_method)
        n = nbytes * scale
        wf = row.wire_fraction / scale   # the fit's bytes axis: float32 bytes for an -fp16 method's own fit
        cal_workers = self.hosts - 1 if comm == "ps" else self.hosts
        parts = split_fit(a, b, n, wire_factor(comm, cal_workers, 1) * wf, ln.link_Bps)
        asynchronous = row.staleness != 0
        # every host sends and receives at once: the probe's rate of the row's pattern where it measured
        # one (a colocated PS: every worker to every shard, the all-to-all pattern; else the ring's)
        pattern_Bps = ln.a2a_Bps if comm == "colocated" and ln.a2a_Bps else ln.ring_Bps
        ring = ln.link_Bps / pattern_Bps if pattern_Bps and workers > 2 else 1.0
        # the row's own collective measured at this configuration's rank count: nothing to extrapolate
        # from 2 hosts, its transport included (scale_read)
        at = None
        got_scale = self.scale_read(row, rate, workers, ranks_on_host)
        if got_scale:
            sm, sscale = got_scale
            n, wf, fit_method = nbytes * sscale, row.wire_fraction / sscale, sm
            at = self.collective_time(rate, sm, n, ranks)
        if at is not None:
            share_fit = self.share(rate, 1, ranks, row.busy_threads, fit_method, scaled=True)
            rate_Bps = ln.link_Bps if comm == "ps" else (pattern_Bps or ln.link_Bps)
            wire = min(at, wire_factor(comm, workers, k, row.serial_replies) * n * wf / rate_Bps)
            lat = min(at - wire, self.collective_time(rate, fit_method, 0.0, ranks))   # its smallest size's time
            cpu = at - wire - lat
        elif comm == "ps":
            w_eff = 1 if asynchronous else workers
            wire = parts["wire"] * wire_factor("ps", w_eff, k, row.serial_replies and not asynchronous) \
                / wire_factor("ps", 1, 1)
            # the sum runs at reduce_Bps on a full core: in the fit's CPU units (at share_fit), / share_fit
            cpu = parts["cpu"] + server_serial_time(w_eff - 1, nbytes / k, self.reduce_Bps) / share_fit
            lat = parts["latency"]
        elif comm == "ring" and self.points.get((rate, fit_method)):
            # a ring of W is 2 (W - 1) steps of 2 S / W bytes each way; the measured 2-host ring of x bytes
            # is 2 steps of x / 2: so (W - 1) x the 2-host time at x = 2 S / W (Patarasuk & Yuan 2009),
            # read off the measured sizes where the chunk is small (the quota's floor per step)
            x = 2 * n / workers
            per = self.collective_time(rate, fit_method, x)
            w2 = min(per, wf * x / ln.link_Bps)
            lat_p = min(per - w2, max(0.0, per - b * x))
            lat, cpu, wire = (workers - 1) * lat_p, (workers - 1) * (per - w2 - lat_p), (workers - 1) * w2 * ring
        else:
            wire = parts["wire"] * wire_factor(comm, workers) / wire_factor(comm, cal_workers) * ring
            cpu = parts["cpu"] * wire_factor(comm, workers) / wire_factor(comm, cal_workers)
            lat = parts["latency"] * latency_steps(comm, workers) / latency_steps(comm, cal_workers)
        compute = base / share
        if self.sleeps(rate, row, workers, ranks_on_host):
            # a rank that sleeps while it communicates starts its compute with its period's quota unspent:
            # a burst at the speed the machine's cores give the workers computing at once (burst_seconds)
            compute = self.burst(rate, base, workers)
        # the one-worker step's own copies (rows without network at one worker; Calibration.overhead)
        # (a row with no one-worker cell of its own, e.g. advise's horovod-hier: those of the step whose base it took)
        floor = self.overhead.get(self.base_key(rate, model, row.label), 0.0) / share if comm != "ps" else 0.0
        if comm == "ring":
            # the collective measured alone sums one contiguous buffer; a training step's ring packs the
            # gradient tensors into one and back (hvdkit's ring) or copies them through the fusion buffer
            # (Horovod's grouped allreduce), and averages: the one-worker step's copies, added (not a
            # floor: a ring's collective measured alone already pays its own copies once)
            cpu += floor * share / share_fit
        else:   # a colocated PS: its benchmark runs the PS itself (the servers' apply too): a floor
            cpu = max(cpu, (floor - wire) * share / share_fit - lat)
        soft = (lat + cpu) * share_fit / share
        step = compute + soft + wire
        terms = {"compute": compute, "latency": lat * share_fit / share, "cpu": cpu * share_fit / share, "wire": wire}
        frac = self.a2a_frac.get(rate)
        if comm == "colocated" and workers > 2 and frac and at is None:
            # every rank sends to and receives from every other at once: at most the transport's
            # measured all-to-all rate (mpi-a2a in benchmarks/reference/fair_hosts/*/collectives_np*.md:
            # Open MPI's TCP transport, below the rate plain sockets carry in the same pattern)
            floor = wire_factor("colocated", workers) * n * wf / (frac * (ln.ring_Bps or ln.link_Bps))
            terms["transport"] = max(0.0, floor - soft - wire)
            step += terms["transport"]
        if asynchronous and comm == "ps":
            # W workers cycle between their own work and the K servers: a closed queueing network
            # (closed_network_cycle). A request's shard S / K goes in through a server's link and its
            # weights come out through it: two links the workers' TCP flows share (processor sharing),
            # each one way's time of the fit's wire term; then the server's one loop (first come,
            # first served): the transport's copies (the fit's CPU term) and the sum, at the CPU share
            # of one busy rank on its host (the waiting workers sleep: hvdkit.comm.poll). The rest of
            # the one-worker step (`step`, at this job's CPU share) is each worker's own. With pushes
            # and pulls overlapping and only the loop queueing, ps-async came out under the reference
            # check's cells (benchmarks/reference/advise_check.md)
            alone = self.share(rate, 1, 1)
            link = parts["wire"] / 2 / k
            loop = (parts["cpu"] * share_fit / alone + server_serial_time(1, nbytes, self.reduce_Bps) / alone) / k
            think = max(0.0, step - 2 * link - loop)
            cycle = closed_network_cycle(workers, think, shared=(link, link), fcfs=(loop,))   # = step at one worker
            # and at least the bound: W requests through the busiest station per cycle (the loop's residual
            # approximation can fall below it where the loop is the bottleneck)
            cycle = max(cycle, workers * max(link, loop))
            terms["server"] = max(0.0, cycle - step)
            step = max(step, cycle)
        one = self.predict(model, variant, 1, rate, nbytes, batch) if workers > 1 else None
        worst = max(terms, key=terms.get)
        return Prediction(strategy=row.label, step_s=step, compute_s=compute, comm_s=step - compute,
                          exposed_s=step - compute, efficiency=(one.step_s if one else step) / step,
                          samples_per_s=workers * batch / step, link_bytes=wire_factor(comm, workers, k) * nbytes,
                          link="server NIC" if comm == "ps" else "NIC", limiting=LIMITS[worst], hvdkit=row.hvdkit,
                          terms=terms, efficiency_kind="scaling")


def busy_threads(row, workers: int) -> int:
    """The busy threads of one of ``row``'s ranks at ``workers`` workers: its ``busy_threads``, but 1 at one
    worker, where no peer is waited for: under a quota Horovod's compute per step doubles from one worker
    to two and hvdkit's one-thread ring's does not (the step split of
    benchmarks/reference/fair_hosts/*/training.md)."""
    return row.busy_threads if workers > 1 else 1


def _polyfit(xy) -> tuple[float, float] | None:
    x, y = np.array(xy).T
    if len(set(x)) < 2:
        return None
    b, a = np.polyfit(x, y, 1)
    return max(0.0, float(a)), max(0.0, float(b))


def calibrate(meas, hosts: int = 2, min_bytes: int = 1 << 20, at_scale: bool = False) -> Calibration:
    """A :class:`Calibration` from ``meas`` (:class:`hvdkit.advise.measured.Measured`) using ONLY the
    collectives at ``hosts`` hosts (one rank per host, the default launch, sizes >= ``min_bytes``) and
    the one-worker training cells: nothing of a configuration with more workers. ``at_scale``: also the
    collectives at more hosts (:attr:`Calibration.scale_points`), each read by the configurations of its
    rank count: micro-measurements at every scale, as nccl-tests are run at the scale of a job; still no
    training step with more than one worker.

    The one-worker base of a variant: its one-worker step at that rate, less (dedicated PS) the
    fitted push + pull of one worker; scaled to one full core by the cell's CPU share. A variant with
    no one-worker cell takes the model's horovod (else ring) base; a rate without one takes another
    rate's (compute does not depend on the link).
    """
    fits, used, pts, every = {}, set(), {}, {}
    for r in meas.collectives:
        if r.get("hosts") == hosts and r.get("slots", 1) == 1 and r.get("variant", "main") == "main" \
                and "[" not in r["method"] and r.get("rate") in meas.links:
            every.setdefault((r["rate"], r["method"]), []).append((r["bytes"], r["time_us"] / 1e6))
            if r["bytes"] >= min_bytes:
                pts.setdefault((r["rate"], r["method"], r["ranks"]), []).append((r["bytes"], r["time_us"] / 1e6))
    quota, squota = {}, {}
    for r in meas.collectives:
        if "cpus_per_host" in r and r.get("hosts") == hosts:
            quota[(r.get("rate"), r["method"])] = r["cpus_per_host"]
        elif "cpus_per_host" in r:
            squota[(r.get("rate"), r["method"], r["ranks"])] = r["cpus_per_host"]
    scale: dict = {}
    for r in meas.collectives if at_scale else ():
        if (r.get("hosts") or 0) > hosts and r.get("slots", 1) == 1 and r.get("variant", "main") == "main" \
                and "[" not in r["method"] and r.get("rate") in meas.links:
            scale.setdefault((r["rate"], r["method"], r["ranks"]), []).append((r["bytes"], r["time_us"] / 1e6))
    for (rate, method, ranks), xy in pts.items():
        fit = _polyfit(xy)
        if fit:
            fits[(rate, method)] = fit
            used.add(("collectives", rate, method, ranks))
    cal = Calibration(fits, {}, dict(meas.links), used, hosts,
                      fit_quota={k: v for k, v in quota.items() if k in fits},
                      points={k: tuple(sorted(v)) for k, v in every.items() if k in fits})
    for key, xy in sorted(scale.items()):
        big = [(x, y) for x, y in xy if x >= min_bytes]
        fit = _polyfit(big) if len(big) >= 2 else None
        if fit and key[1] != A2A_METHOD:
            cal.scale_points[key], cal.scale_fits[key] = tuple(sorted(xy)), fit
            if key in squota:
                cal.scale_quota[key] = squota[key]
            used.add(("collectives", *key))
    a2a: dict = {}
    for r in meas.collectives:   # the transport's all-to-all: mpi-a2a at >= 3 hosts, largest size per run
        if r["method"] == A2A_METHOD and (r.get("hosts") or 0) >= 3 and r.get("slots", 1) == 1 \
                and r.get("variant", "main") == "main" and r.get("rate") in meas.links and r["bytes"] >= min_bytes:
            a2a.setdefault((r["rate"], r["hosts"]), []).append(r)
    fracs: dict = {}
    for (rate, h), rs in sorted(a2a.items()):
        top = max(r["bytes"] for r in rs)
        ln = meas.links[rate]
        got = [f for f in (a2a_fraction(r, ln.ring_Bps or ln.link_Bps) for r in rs if r["bytes"] == top) if f]
        if got:
            fracs.setdefault(rate, []).extend(got)
            used.add(("transport", rate, A2A_METHOD, h))
    cal.a2a_frac = {rate: float(np.median(v)) for rate, v in fracs.items()}
    raw: dict = {}
    for c in meas.cells:
        if c.workers != 1 or c.rate not in meas.links:
            continue
        try:
            row = priced(c.variant, 1)
        except UsageError:   # a row advise has no formula for (model parallel, tf-ps)
            continue
        net = 0.0
        share = cal.share(c.rate, max(1, -(-c.ranks // (c.hosts or c.ranks))), c.ranks, busy_threads(row, 1))
        if row.comm == "ps":   # less the push + pull, as predict() prices them for one worker at this share
            got = cal._fit(c.rate, collective_method(row, 1)[0] or "ps", row.wire_fraction)
            if got is None:
                continue
            (a, b), scale, m = got
            parts = split_fit(a, b, c.gradient_bytes * scale, wire_factor("ps", 1, 1) * row.wire_fraction / scale,
                              meas.links[c.rate].link_Bps)
            net = (parts["latency"] + parts["cpu"]) * cal.share(c.rate, 1, hosts, row.busy_threads, m) / share \
                + parts["wire"]
        base = (c.step_ms / 1e3 - net) * share
        if row.comm != "ps" and c.base_ms is not None and 0 < c.base_ms <= c.step_ms:
            # no network at one worker: the step is compute + the strategy's own copies (the harness's split)
            base = c.base_ms / 1e3 * share
            cal.overhead[(c.rate, c.model, c.variant)] = (c.step_ms - c.base_ms) / 1e3 * share
        if base > 0:
            raw[(c.rate, c.model, c.variant)] = base
            used.add(("cell", c.model, c.variant, 1, c.rate))
        else:
            cal.notes.append(f"{c.rate} {c.model} {c.variant}: the one-worker step ({c.step_ms:.1f} ms) is shorter than "
                             f"the fitted push + pull of its bytes ({net * 1e3:.1f} ms): the collectives benchmark "
                             "and the training step disagree; its base is the model's horovod (else ring) base")
    for c in meas.cells:   # every (rate, model, variant) measured: its own base, else a stand-in
        key = (c.rate, c.model, c.variant)
        if key in raw:
            cal.base[key] = raw[key]
            continue
        other = [v for (r, m, lab), v in sorted(raw.items()) if m == c.model and lab == c.variant]
        stand = [raw.get((c.rate, c.model, s)) for s in ("horovod", "ring")]
        pick = other[0] if other else next((x for x in stand if x), None)
        if pick:
            cal.base[key] = pick
    return cal


def held_out(cal: Calibration, predicted) -> bool:
    """True when no predicted configuration was used for calibration: none of ``predicted``
    (:class:`~hvdkit.advise.measured.Cell`) is a calibration cell, no calibration cell has as many
    workers as the smallest prediction, and the collectives fitted ran on fewer hosts than it needs.
    The transport's all-to-all (``("transport", ...)`` in ``used``: ``mpi-a2a`` at 3 hosts or more)
    is no configuration of a strategy: no PS, no model, no training step, like the probe's patterns;
    nor is a collective measured at scale (``calibrate(..., at_scale=True)``): one collective, no training
    step (the summary lists its host counts: ``collectives_hosts``)."""
    keys = {c.key for c in predicted}
    if not keys:
        return False
    fewest = min(c.workers for c in predicted)
    if cal.hosts >= fewest:
        return False
    for u in cal.used:
        if u[0] == "cell" and ((u[1], u[2], u[3], u[4]) in keys or u[3] >= fewest):
            return False
        if u[0] == "collectives" and cal.hosts >= fewest:
            return False
    return True
