"""Known models (sizes and published per-accelerator throughput) and cluster shorthands for ``hvdkit advise``.

Pure data and parsers: nothing here builds a model. The four ImageNet models are not built
(they are big, and need no TensorFlow to be described): their float32 gradient tensors come
from their architectures, their throughput from published single-accelerator runs.

=========== =========== ======== ============== ============ =========================================
model        params      tensors  P100 img/s     V100 img/s   sources
=========== =========== ======== ============== ============ =========================================
resnet50     25,557,032  161      219            360          He et al. 2016 (53 convs without bias,
                                                               53 BN gamma+beta, fc); P100: TensorFlow
                                                               tf_cnn_benchmarks results (DGX-1, batch
                                                               64, synthetic); V100 fp32: assumed
resnet101    44,549,160  314      119 (derived)  200          He et al. 2016; P100 figure derived from
                                                               ResNet-50's by FLOPs (7.8 / 4.1 GFLOPs)
inception3   23,851,784  190      142            230          Szegedy et al. 2016 (Keras InceptionV3:
                                                               94 convs, BN beta only, fc); P100: as above
vgg16        138,357,544 32       154            230          Simonyan & Zisserman 2015 (13 convs + 3 fc,
                                                               each weight + bias, computed exactly below)
=========== =========== ======== ============== ============ =========================================

Figures marked "assumed" or "derived" are approximate; give ``--images-per-s`` or
``--compute-ms`` for your accelerator. All at batch 64 per accelerator.

Cluster shorthand (``--cluster``): ``HxG[:INTRA[,INTER[,LATENCY]]]``: H hosts of G accelerators;
INTRA one of :data:`INTRA` or a rate (``nvlink``, ``pcie``, ``shm``, ``300gbit``); INTER a rate
(``25gbit``) optionally followed by ``+rdma`` (lower latency); LATENCY one-way, ``30us``.
Rates are tc's *bits* per second (:func:`hvdkit.costs.parse_rate`).
"""
from __future__ import annotations

import json
import re
import statistics

from hvdkit import costs
from hvdkit.advise.model import Cluster
from hvdkit.advise.published import NCCL_TCP

__all__ = ["KNOWN_MODELS", "INTRA", "NCCL_TCP_FRACTION", "vgg16_tensors", "known_tensors", "parse_cluster", "cluster_from_json",
           "with_inter"]

F32 = 4


def vgg16_tensors() -> tuple[int, ...]:
    """VGG-16's 32 gradient tensors (bytes, forward order): 13 3x3 convs and 3 fc layers, weight then bias.

    Sum: 138,357,544 float32 parameters (Simonyan & Zisserman 2015, configuration D, 1000 classes).
    """
    chans = [3, 64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    out: list[int] = []
    for cin, cout in zip(chans[:-1], chans[1:]):
        out += [9 * cin * cout * F32, cout * F32]
    for fin, fout in ((7 * 7 * 512, 4096), (4096, 4096), (4096, 1000)):
        out += [fin * fout * F32, fout * F32]
    return tuple(out)


#: name -> params, tensors, {accelerator: images/s at batch 64}, note
KNOWN_MODELS: dict[str, dict] = {
    "resnet50": {"params": 25_557_032, "tensors": 161, "images_per_s": {"p100": 219.0, "v100": 360.0}},
    "resnet101": {"params": 44_549_160, "tensors": 314, "images_per_s": {"p100": 119.0, "v100": 200.0}},
    "inception3": {"params": 23_851_784, "tensors": 190, "images_per_s": {"p100": 142.0, "v100": 230.0}},
    "vgg16": {"params": 138_357_544, "tensors": 32, "images_per_s": {"p100": 154.0, "v100": 230.0}},
}

#: intra-host link presets: bytes/s (bus bandwidth of an NCCL ring inside one host), one-way latency
INTRA: dict[str, tuple[float, float]] = {
    "nvlink": (130e9, 5e-6),    # V100 DGX-1 class, nccl-tests allreduce busbw ~130 GB/s
    "pcie": (10e9, 10e-6),      # PCIe 3.0 x16 through switches, ~10 GB/s
    "shm": (5e9, 2e-6),         # CPU ranks sharing memory
}
TCP_LATENCY = 30e-6
RDMA_LATENCY = 5e-6
#: share of the NIC's line rate NCCL's ring gets over TCP between hosts of several GPUs: the median of the
#: bus bandwidths NCCL's issue threads publish (:data:`hvdkit.advise.published.NCCL_TCP`)
NCCL_TCP_FRACTION = statistics.median(r["busbw_gbit"] / r["line_gbit"] for r in NCCL_TCP)


def known_tensors(name: str) -> tuple[int, ...]:
    """Gradient tensor bytes of a :data:`KNOWN_MODELS` entry: VGG-16 exact, the others split evenly."""
    if name == "vgg16":
        return vgg16_tensors()
    m = KNOWN_MODELS[name]
    n, total = m["tensors"], m["params"] * F32
    return tuple(total // n + (1 if i < total % n else 0) for i in range(n))


#: ``HxG[:INTRA[,INTER[,LATENCY]]]``: groups H, G, INTRA, INTER, LATENCY
_FORM = re.compile(r"\s*(\d+)x(\d+)(?::([^,]*)(?:,([^,]*)(?:,([^,]*))?)?)?\s*")


def with_inter(text: str, inter: str) -> str | None:
    """``text`` (the form of :func:`parse_cluster`) with INTER ``inter`` where it names no INTER (INTRA
    ``shm`` where it names none either: one rank per host, CPU processes), or None where it names one
    or is not of that form (a cluster.json: its probed rate)."""
    m = _FORM.fullmatch(text)
    if not m or (m.group(4) or "").strip():
        return None
    lat = f",{m.group(5).strip()}" if (m.group(5) or "").strip() else ""
    return f"{m.group(1)}x{m.group(2)}:{(m.group(3) or '').strip() or 'shm'},{inter}{lat}"


def parse_cluster(text: str, accelerator: str = "gpu") -> Cluster:
    """``"16x8:nvlink,25gbit"`` -> :class:`Cluster` (module docstring for the form).

    Defaults: INTRA ``nvlink`` for GPUs with G > 1 (``shm`` for ``accelerator="cpu"``), INTER
    ``25gbit``, latency 30 us over TCP, 5 us with ``+rdma``. CPU accelerators reduce at 2e9 B/s. GPU hosts
    of G > 1 joined over TCP (no ``+rdma``) give an allreduce ring :data:`NCCL_TCP_FRACTION` of INTER
    (:func:`hvdkit.advise.model.ring_inter_Bps`).

    Raises:
        ValueError: any other form (the message names the text).
    """
    m = _FORM.fullmatch(text)
    if not m:
        raise ValueError(f"--cluster {text!r}: write HOSTSxPER_HOST[:INTRA[,INTER[,LATENCY]]], "
                         "e.g. 16x8:nvlink,25gbit or 4x1:shm,1gbit,100us")
    h, g = int(m.group(1)), int(m.group(2))
    intra = (m.group(3) or ("shm" if accelerator == "cpu" else "nvlink")).strip().lower()
    try:
        intra_Bps, intra_lat = INTRA[intra] if intra in INTRA else (costs.parse_rate(intra) / 8, INTRA["pcie"][1])
    except ValueError:
        raise ValueError(f"--cluster {text!r}: INTRA {intra!r} (within a host): give {', '.join(INTRA)} or a rate "
                         f"such as 100gbit (units: {', '.join(costs.RATE_UNITS)})") from None
    inter = (m.group(4) or "25gbit").strip().lower()
    rdma = inter.endswith("+rdma")
    try:
        inter_Bps = costs.parse_rate(inter.removesuffix("+rdma")) / 8
    except ValueError:
        raise ValueError(f"--cluster {text!r}: INTER {inter!r} (between hosts): give a rate such as 1gbit or "
                         f"25gbit+rdma (units: {', '.join(costs.RATE_UNITS)})") from None
    lat = RDMA_LATENCY if rdma else TCP_LATENCY
    if m.group(5):
        lm = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)\s*", m.group(5))
        if not lm:
            raise ValueError(f"--cluster {text!r}: latency {m.group(5)!r}: write e.g. 30us or 1ms")
        lat = float(lm.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[lm.group(2)]
    try:
        return Cluster(hosts=h, gpus_per_host=g, intra_Bps=intra_Bps, intra_latency_s=intra_lat,
                       inter_Bps=inter_Bps, inter_latency_s=lat,
                       reduce_Bps=2e9 if accelerator == "cpu" else 1e11, name=text.strip(),
                       ring_inter_fraction=NCCL_TCP_FRACTION if not rdma and g > 1 and accelerator != "cpu" else 1.0)
    except ValueError as e:
        raise ValueError(f"--cluster {text!r}: {e}") from None


def cluster_from_json(path: str, hosts: int | None = None, shared_cores: int | None = None) -> Cluster:
    """A :class:`Cluster` from the ``cluster.json`` of ``hvdkit-cluster`` after ``probe``.

    Reads ``link_Bps`` (bytes/s, the median probed TCP rate) and ``rtt_s`` (alpha = rtt_s / 2), and
    ``spec.hosts``/``spec.slots`` (H, G) unless ``hosts`` overrides H. The ranks are CPU processes:
    shared memory inside a host, reduction at 2e9 B/s. ``shared_cores``: the emulated hosts' ranks
    share this machine's cores (:attr:`Cluster.shared_cores`).

    Raises:
        ValueError: unreadable, or without the probe's numbers (run ``hvdkit-cluster probe``).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        bps, rtt = float(doc["link_Bps"]), float(doc["rtt_s"])
        spec = doc.get("spec") or doc.get("meta", {}).get("cluster") or {}
        h = hosts or int(spec.get("hosts", 2))
        g = int(spec.get("slots", 1))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--cluster {path}: need the JSON of `hvdkit-cluster probe` with numbers link_Bps and "
                         f"rtt_s ({type(e).__name__}: {e})") from None
    return Cluster(hosts=h, gpus_per_host=g, intra_Bps=INTRA["shm"][0], intra_latency_s=INTRA["shm"][1],
                   inter_Bps=bps, inter_latency_s=rtt / 2, reduce_Bps=2e9, server_Bps=2e9,
                   shared_cores=shared_cores, name=path)
