"""Measured collectives in place of the formulas: Hockney fits ``t = a + b x bytes`` from
``hvdkit-bench cluster-collectives`` (``--calibrate`` of ``hvdkit advise``).

On a cluster where the formulas' assumptions fail (more ranks than cores, a TCP stack or an MPI
algorithm that does not reach the link rate) the time of each strategy's allreduce-equivalent,
measured alone at a few sizes, predicts its share of a training step better than alpha and beta
from a probe (Hockney 1994: ``t(m) = alpha + m / B`` fitted by least squares).

The fits and the traffic factors that scale them: :mod:`hvdkit.advise.collective_fits`; here, which
method measures which row (:func:`collective_method`), what a calibration fixed (:class:`Calibration`)
and the step it prices (:meth:`Calibration.predict`, its terms in :mod:`hvdkit.advise.terms`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hvdkit.advise.collective_fits import (A2A_METHOD, a2a_fractions, fit_collectives, fit_for, float32_method,
                                           hockney_fit, latency_steps, method_with, one_server_method, quotas,
                                           sizes_at, sizes_beyond, wire_factor)
from hvdkit.advise.model import Prediction, burst_seconds, cpu_share, split_fit
from hvdkit.advise.predict import COMPUTE_ROWS, Priced, priced
from hvdkit.advise.terms import LIMITS, Job, communication, server_cycle, transport, with_copies
from hvdkit.errors import UsageError

__all__ = ["fit_collectives", "fit_for", "fitted_options", "collective_method", "wire_factor", "latency_steps",
           "Calibration", "calibrate", "held_out"]


def collective_method(row, hosts: int) -> tuple[str | None, int]:
    """(the ``cluster_collectives`` method measuring ``row``'s step communication alone, its ranks)
    for one rank per host (the only calibrated case), from the row's facts (:class:`~hvdkit.advise.predict.Priced`).

    The collectives benchmark spells a method as the strategy variant it measures
    (:mod:`hvdkit.collectives.names`): a ring by the strategy that runs it (``horovod``, ``ring``;
    Horovod's hierarchical allreduce is its flat ring at one rank per host), ``ps-sync`` /
    ``ps-sync:num_servers=2`` for K = 1 / 2 dedicated servers (H + K ranks), ``ps-sync:ps_colocated=true``;
    ``compression=fp16`` when the row sends float16 (and ``ps_pull=float32`` when only the push is).
    Other rows (BytePS, K > 2): (None, ranks), the formulas stand.
    """
    if row.comm in ("hierarchical", "ring"):
        method = "horovod" if row.comm == "hierarchical" else row.label.partition(":")[0]
    elif row.comm == "colocated":
        method = "ps-sync:ps_colocated=true"
    elif row.comm == "ps" and row.servers in (1, 2):
        method = "ps-sync" if row.servers == 1 else "ps-sync:num_servers=2"
        hosts += row.servers
    else:
        return None, hosts
    if row.wire_fraction != 1.0:
        method = method_with(method, compression="fp16", ps_pull=None if row.wire_fraction == 0.5 else "float32")
    return method, hosts


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


#: the CFS period of an emulated host's CPU quota, seconds (hvdkit.cluster.cpu.PERIOD_US)
CFS_PERIOD_S = 0.01


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
        """The key of :meth:`base_of`'s base: ``(rate, model, label)``, else the model's horovod one at
        ``rate`` (:data:`~hvdkit.advise.predict.COMPUTE_ROWS`, either form), else its ring one, else None."""
        return next((key for key in ((rate, model, v) for v in (label, *COMPUTE_ROWS, "ring")) if key in self.base),
                    None)

    def base_of(self, rate: str, model: str, label: str) -> float | None:
        """The one-worker base of ``label`` (seconds at one full core): its own, else the model's
        horovod (else ring) base at ``rate``, else None."""
        key = self.base_key(rate, model, label)
        return self.base[key] if key else None

    def scale_read(self, row, rate: str, workers: int, ranks_on_host: int = 1) -> tuple[str, float] | None:
        """``(method, bytes scale)`` of the collective measured at scale (:attr:`scale_points`) that ``row``
        (:class:`~hvdkit.advise.predict.Priced`) reads with ``workers`` workers at ``rate``: its own method at
        its rank count (W; a dedicated PS W + K), else the float32 method on ``wire_fraction`` of the bytes
        (a ``compression=fp16`` row); None where it reads the 2-host calibration: one worker, more than one rank per
        host (the collectives ran one per host), an asynchronous row (its queueing network reads the 2-host
        fit), ``ps_replies=serial`` (the benchmark's servers reply concurrently), or nothing measured."""
        method, ranks = collective_method(row, workers)
        if method is None or workers <= 1 or ranks_on_host != 1 or row.staleness != 0 or row.serial_replies:
            return None
        for m, scale in ((method, 1.0), (float32_method(method), row.wire_fraction)):
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
        (two servers) the one-server fit, else (``compression=fp16``) the float32 method's on ``wire_fraction``
        of the bytes."""
        f32 = float32_method(method)
        for m, scale in ((method, 1.0), (one_server_method(method), 1.0), (f32, wire_fraction),
                         (one_server_method(f32), wire_fraction)):
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
        job = self._job(model, variant, workers, rate, nbytes, ranks_on_host)
        if job is None:
            return None
        lat, cpu, wire = communication(self, job)
        compute = job.base / job.share
        if self.sleeps(rate, job.row, workers, ranks_on_host):
            # a rank that sleeps while it communicates starts its compute with its period's quota unspent:
            # a burst at the speed the machine's cores give the workers computing at once (burst_seconds)
            compute = self.burst(rate, job.base, workers)
        cpu = with_copies(self, job, lat, cpu, wire)
        soft = (lat + cpu) * job.share_fit / job.share
        step = compute + soft + wire
        terms = {"compute": compute, "latency": lat * job.share_fit / job.share,
                 "cpu": cpu * job.share_fit / job.share, "wire": wire}
        excess = transport(self, job, soft, wire)
        if excess is not None:
            terms["transport"] = excess
            step += terms["transport"]
        if job.row.staleness != 0 and job.comm == "ps":
            cycle = server_cycle(self, job, step)
            terms["server"] = max(0.0, cycle - step)
            step = max(step, cycle)
        one = self.predict(model, variant, 1, rate, nbytes, batch) if workers > 1 else None
        worst = max(terms, key=terms.get)
        return Prediction(strategy=job.row.label, step_s=step, compute_s=compute, comm_s=step - compute,
                          exposed_s=step - compute, efficiency=(one.step_s if one else step) / step,
                          samples_per_s=workers * batch / step,
                          link_bytes=wire_factor(job.comm, workers, job.k) * nbytes,
                          link="server NIC" if job.comm == "ps" else "NIC", limiting=LIMITS[worst],
                          hvdkit=job.row.hvdkit, terms=terms, efficiency_kind="scaling")

    def _job(self, model: str, variant: str, workers: int, rate: str, nbytes: float,
             ranks_on_host: int) -> Job | None:
        """The configuration :meth:`predict` prices: its row, its base, the collective it reads (measured at
        its rank count, else the 2-host fit split by :func:`~hvdkit.advise.model.split_fit`) and its CPU
        shares; None where the calibration lacks the model's one-worker step or the method's collective."""
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
        wf = row.wire_fraction / scale   # the fit's bytes axis: float32 bytes for a compressed method's own fit
        cal_workers = self.hosts - 1 if comm == "ps" else self.hosts
        parts = split_fit(a, b, n, wire_factor(comm, cal_workers, 1) * wf, ln.link_Bps)
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
        return Job(model=model, row=row, rate=rate, workers=workers, nbytes=nbytes, base=base, comm=comm, k=k,
                    ranks=ranks, ln=ln, share=share, share_fit=share_fit, n=n, wf=wf, fit_method=fit_method, b=b,
                    parts=parts, cal_workers=cal_workers, pattern_Bps=pattern_Bps, ring=ring, at=at)

def busy_threads(row, workers: int) -> int:
    """The busy threads of one of ``row``'s ranks at ``workers`` workers: its ``busy_threads``, but 1 at one
    worker, where no peer is waited for: under a quota Horovod's compute per step doubles from one worker
    to two and hvdkit's one-thread ring's does not (the step split of
    benchmarks/reference/fair_hosts/*/training.md)."""
    return row.busy_threads if workers > 1 else 1


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
    every, big = sizes_at(meas.collectives, meas.links, hosts, min_bytes)
    quota, squota = quotas(meas.collectives, hosts)
    fits, used = {}, set()
    for (rate, method, ranks), xy in big.items():
        fit = hockney_fit(xy)
        if fit:
            fits[(rate, method)] = fit
            used.add(("collectives", rate, method, ranks))
    cal = Calibration(fits, {}, dict(meas.links), used, hosts,
                      fit_quota={k: v for k, v in quota.items() if k in fits},
                      points={k: tuple(sorted(v)) for k, v in every.items() if k in fits})
    if at_scale:
        _read_at_scale(cal, sizes_beyond(meas.collectives, meas.links, hosts), squota, min_bytes)
    # the transport's all-to-all: mpi-a2a at >= 3 hosts, largest size per run
    cal.a2a_frac, read = a2a_fractions(meas.collectives, meas.links, min_bytes)
    used.update(("transport", rate, A2A_METHOD, h) for rate, h in read)
    _read_bases(cal, meas, _one_worker_bases(cal, meas))
    return cal


def _read_at_scale(cal: Calibration, scale: dict, squota: dict, min_bytes: int) -> None:
    """Into ``cal``: the collectives measured at more hosts (``scale``,
    :func:`~hvdkit.advise.collective_fits.sizes_beyond`) with a Hockney fit at >= ``min_bytes`` (:attr:`Calibration.scale_points`), and their quotas."""
    for key, xy in sorted(scale.items()):
        big = [(x, y) for x, y in xy if x >= min_bytes]
        fit = hockney_fit(big) if len(big) >= 2 else None
        if fit and key[1] != A2A_METHOD:
            cal.scale_points[key], cal.scale_fits[key] = tuple(sorted(xy)), fit
            if key in squota:
                cal.scale_quota[key] = squota[key]
            cal.used.add(("collectives", *key))


def _one_worker_bases(cal: Calibration, meas) -> dict:
    """``{(rate, model, variant): seconds at one full core}``: each one-worker cell's step less its network
    (a dedicated PS: the fitted push + pull), or the harness's compute where it split one out (the rest into
    :attr:`Calibration.overhead`); a cell with no positive base gets a note instead."""
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
            got = cal._fit(c.rate, collective_method(row, 1)[0] or "ps-sync", row.wire_fraction)
            if got is None:
                continue
            (a, b), scale, m = got
            parts = split_fit(a, b, c.gradient_bytes * scale, wire_factor("ps", 1, 1) * row.wire_fraction / scale,
                              meas.links[c.rate].link_Bps)
            net = (parts["latency"] + parts["cpu"]) * cal.share(c.rate, 1, cal.hosts, row.busy_threads, m) / share \
                + parts["wire"]
        base = (c.step_ms / 1e3 - net) * share
        if row.comm != "ps" and c.base_ms is not None and 0 < c.base_ms <= c.step_ms:
            # no network at one worker: the step is compute + the strategy's own copies (the harness's split)
            base = c.base_ms / 1e3 * share
            cal.overhead[(c.rate, c.model, c.variant)] = (c.step_ms - c.base_ms) / 1e3 * share
        if base > 0:
            raw[(c.rate, c.model, c.variant)] = base
            cal.used.add(("cell", c.model, c.variant, 1, c.rate))
        else:
            cal.notes.append(f"{c.rate} {c.model} {c.variant}: the one-worker step ({c.step_ms:.1f} ms) is shorter "
                             f"than the fitted push + pull of its bytes ({net * 1e3:.1f} ms): the collectives "
                             "benchmark and the training step disagree; its base is the model's horovod (else ring) "
                             "base")
    return raw


def _read_bases(cal: Calibration, meas, raw: dict) -> None:
    """Into ``cal.base``: every (rate, model, variant) measured, its own base in ``raw``, else a stand-in (the
    variant's base at another rate, else the model's horovod, else ring, base at this rate)."""
    for c in meas.cells:
        key = (c.rate, c.model, c.variant)
        if key in raw:
            cal.base[key] = raw[key]
            continue
        other = [v for (r, m, lab), v in sorted(raw.items()) if m == c.model and lab == c.variant]
        stand = [raw.get((c.rate, c.model, s)) for s in (*COMPUTE_ROWS, "ring")]
        pick = other[0] if other else next((x for x in stand if x), None)
        if pick:
            cal.base[key] = pick


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
