"""Published scaling results the advisor is checked against (data only; the check: :mod:`hvdkit.advise.check`).

Each row is one figure as its source prints it, with where it is printed, the quoted value(s) and the
hardware (accelerators, per host, intra-host link, network, transport, rate); ``published`` is the figure
the check compares: a scaling efficiency (throughput at N / (N x throughput at 1)) or a speed-up (one
system's throughput over another's on the same cluster). ``cluster`` is the ``--cluster`` form of that
hardware; ``strategy`` the advise row that stands for the system the source ran; ``overlap``: that system
sends gradients while the backward pass runs (Horovod's DistributedOptimizer, PyTorch DDP, BytePS), not
after it (tf_cnn_benchmarks' replicated and distributed_replicated modes); ``aggregate``: a PS host sums its
accelerators' gradients before pushing; ``images_per_s``: the one-accelerator throughput the source prints
next to the figure (None: :data:`hvdkit.advise.presets.KNOWN_MODELS`'s for ``gpu``); ``batch``: per accelerator;
``servers`` (where present): the parameter servers the source names where it ran fewer than its hosts;
``framework`` and ``precision`` (where a source ran several frameworks on one cluster): two rows of one source,
model and cluster at one precision whose frameworks differ are a comparison no term of the advisor prices (it
has no framework term), counted apart by the check.

:data:`SOURCES` declares, per source and before any term of the model was fitted to these rows, which
sources may calibrate the model (``"calibrate"``) and which are held out (``"held-out"``): a change to the
model is judged on the held-out sources only. ``unseen``: a held-out source declared, and its rows committed,
before any prediction of them was computed; the other held-out sources' errors had been looked at while terms
of the model were being chosen, so they judge it less strictly.
"""
from __future__ import annotations

__all__ = ["SOURCES", "ROWS", "NCCL_TCP"]

#: key -> title, where it is read, and its role (declared before fitting)
SOURCES: dict[str, dict] = {
    "horovod": {"title": "Sergeev & Del Balso 2018 (arXiv:1802.05799), Horovod's docs/benchmarks.rst and "
                          "its README's first 16-GPU table",
                "role": "calibrate"},
    "byteps": {"title": "BytePS README.md and docs/performance.md (Jiang et al., OSDI 2020)", "role": "calibrate"},
    "tf-benchmarks": {"title": "TensorFlow's Benchmarks page (tensorflow/docs_src/performance/benchmarks.md, "
                               "tests of May 2017, tf_cnn_benchmarks)", "role": "held-out"},
    "nvidia-dle": {"title": "NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/resnet50v1.5/README.md "
                            "(Training performance results, 20.06-tf1 container)", "role": "held-out"},
    "dlperf": {"title": "OneFlow DLPerf Benchmark Test Report v1.0 (Oneflow-Inc/DLPerf "
                        "reports/dlperf_benchmark_test_report_v1.md, Aug 2020)", "role": "held-out"},
    "dell": {"title": "Dell EMC Ready Solutions for AI: Deep Learning with NVIDIA, Reference Guide v1.0 "
                      "(sec. 2.6 Network; sec. 3, Figure 9 text)", "role": "held-out"},
    "eth-cscs": {"title": "ETH Zurich / CSCS distributed TensorFlow report (e-bug/distributed-tensorflow-benchmarks "
                          "report/source/benchmarks.tex, tests of August 2017, tf_cnn_benchmarks on TensorFlow 1.1)",
                 "role": "held-out", "unseen": True},
    "paddle-perf": {"title": "PaddlePaddle/Perf ResNet50V1.5/README.md (Paddle ResNet50V1.5 performance test, "
                             "sec. 5.2: NGC TensorFlow 1.15, NGC PyTorch and NGC MXNet on the same hosts)",
                    "role": "held-out", "unseen": True},
}

_HVD_HW = "128 hosts x 4 Pascal GPUs (PCIe), RoCE-capable 25 Gbit/s, NCCL over RDMA"
_TF_HW = "32 hosts x 4 Pascal GPUs (PCIe), 25 Gbit/s, TCP (gRPC)"
_AWS_HW = ("p2.8xlarge: 8 K80 GPUs per host (PCIe), 10 Gbit/s (the instance's rate as Apache SINGA's "
           "docs/benchmark-train.md states it), TCP (gRPC)")
_HVD16_HW = ("4 servers x 4 Pascal GPUs (PCIe; 2 GPUs per CPU, dual PCIe root: horovod#979), RoCE-capable "
             "25 Gbit/s (horovod#20); tf_cnn_benchmarks, batch 64, HOROVOD_GPU_ALLREDUCE=NCCL (horovod#320)")
_TCP16 = ", NCCL over TCP (NCCL_IB_DISABLE=1, horovod#320)"
_RDMA16 = ", NCCL over RoCE (NCCL 2.0.5's RoCE support, horovod#20)"
_DLPERF_HW = "4 hosts x 8 V100-SXM2-16GB (NVLink), InfiniBand 100 Gb/s (4X EDR), NCCL over RDMA"


def _eff(n: int, one: float, at_n: float) -> float:
    return round(at_n / (n * one), 6)


ROWS: list[dict] = [
    # ---- horovod (calibrate): the paper's Figure 1 and the docs' 512-GPU benchmark
    *({"source": "horovod", "where": "docs/benchmarks.rst (512-GPU benchmark)",
       "quoted": f"{q}% scaling efficiency", "model": m, "kind": "efficiency", "published": q / 100,
       "strategy": "horovod", "overlap": True, "aggregate": False, "cluster": "128x4:pcie,25gbit+rdma",
       "gpu": "p100", "images_per_s": None, "batch": 64, "hardware": _HVD_HW, "transport": "rdma"}
      for m, q in (("inception3", 90), ("resnet101", 90), ("vgg16", 68))),
    *({"source": "horovod", "where": "arXiv:1802.05799, Figure 1 and sec. 1",
       "quoted": "about 50% scaling efficiency at 128 GPUs (standard distributed TensorFlow)", "model": m,
       "kind": "efficiency", "published": 0.50, "strategy": "ps-sync:ps_colocated=true", "overlap": False,
       "aggregate": False, "cluster": "32x4:pcie,25gbit", "gpu": "p100", "images_per_s": None, "batch": 64,
       "hardware": _TF_HW, "transport": "tcp"}
      for m in ("inception3", "resnet101")),
    # ---- horovod (calibrate): the README's first 16-GPU table, NCCL over TCP beside NCCL over RoCE
    *({"source": "horovod", "where": "README.md's 16-GPU table (the one horovod/horovod#44 replaced)",
       "quoted": f"baseline single-GPU {one}; {how} (allreduce on GPU with NCCL) {v} ({x}x) on 16 GPUs",
       "model": m, "kind": "efficiency", "published": _eff(16, one, v), "strategy": "horovod", "overlap": True,
       "aggregate": False, "cluster": f"4x4:pcie,25gbit{'+rdma' if how == 'RDMA Horovod' else ''}", "gpu": "p100",
       "images_per_s": one, "batch": 64, "hardware": _HVD16_HW + (_RDMA16 if how == "RDMA Horovod" else _TCP16),
       "transport": "rdma" if how == "RDMA Horovod" else "tcp"}
      for m, one, vals in (("inception3", 134.4, (("TCP Horovod", 1990.7, 14.8), ("RDMA Horovod", 2022.6, 15.0))),
                           ("resnet101", 119.4, (("TCP Horovod", 1685.1, 14.1), ("RDMA Horovod", 1746.2, 14.6))),
                           ("vgg16", 130.9, (("TCP Horovod", 1308.7, 10.0), ("RDMA Horovod", 1787.4, 13.7))))
      for how, v, x in vals),
    # ---- byteps (calibrate): speed-ups of BytePS over Horovod on the same cluster
    *({"source": "byteps", "where": where, "quoted": f"BytePS outperforms Horovod (NCCL) by {q}% for {name}",
       "model": m, "kind": "speedup", "published": round(1 + q / 100, 4), "strategy": "byteps", "versus": "horovod",
       "overlap": True, "aggregate": True, "cluster": cl, "gpu": "v100", "images_per_s": None, "batch": 64,
       "hardware": hw, "transport": tr}
      for m, name, q, cl, where, hw, tr in (
          ("resnet50", "Resnet50", 44, "8x8:nvlink,20gbit", "README.md, Performance",
           "8 hosts x 8 V100 (NVLink), 20 Gbit/s TCP/IP", "tcp"),
          ("vgg16", "VGG16", 100, "8x8:nvlink,20gbit", "README.md, Performance",
           "8 hosts x 8 V100 (NVLink), 20 Gbit/s TCP/IP", "tcp"),
          ("resnet50", "Resnet50", 7, "8x8:pcie,100gbit+rdma", "docs/performance.md, PCIe + RDMA",
           "8 hosts x 8 V100 (PCIe switches), 100 Gbit/s RoCEv2", "rdma"),
          ("vgg16", "VGG16", 17, "8x8:pcie,100gbit+rdma", "docs/performance.md, PCIe + RDMA",
           "8 hosts x 8 V100 (PCIe switches), 100 Gbit/s RoCEv2", "rdma"))),
    # ---- tf-benchmarks (held out): DGX-1 (VGG16: replicated with NCCL), synthetic data, batch 64
    *({"source": "tf-benchmarks", "where": "Details for NVIDIA DGX-1 (P100), Training synthetic data (batch 64)",
       "quoted": f"VGG16: 1 GPU 154, {n} GPUs {v} images/s", "model": "vgg16", "kind": "efficiency",
       "published": _eff(n, 154, v), "strategy": "horovod", "overlap": False, "aggregate": False,
       "cluster": f"1x{n}:nvlink", "gpu": "p100", "images_per_s": 154.0, "batch": 64,
       "hardware": "1 DGX-1, 8 P100 (NVLink), variable_update replicated with NCCL", "transport": "none"}
      for n, v in ((2, 295), (4, 584), (8, 1081))),
    # ---- tf-benchmarks (held out): Amazon EC2 distributed, distributed_replicated, PS on every instance
    *({"source": "tf-benchmarks", "where": f"Details for Amazon EC2 Distributed (K80), Training synthetic data{tbl}",
       "quoted": f"{name}: 1 GPU {one}, {n} GPUs {v} images/s", "model": m, "kind": "efficiency",
       "published": _eff(n, one, v), "strategy": "ps-sync:ps_colocated=true", "overlap": False, "aggregate": True,
       "cluster": f"{n // 8}x8:pcie,10gbit", "gpu": None, "images_per_s": one, "batch": b,
       "hardware": _AWS_HW + "; distributed_replicated, parameter servers on the worker instances"
                   + (f" ({n // 8} instances / {k} parameter servers, as the page states)" if k else ""),
       "transport": "tcp", "servers": k}
      for m, name, b, tbl, one, vals in (
          ("inception3", "InceptionV3", 64, "", 29.7, ((8, 229), (16, 459), (32, 902), (64, 1783))),
          ("resnet50", "ResNet-50", 64, "", 52.4, ((8, 378), (16, 751), (32, 1388), (64, 2744))),
          ("inception3", "InceptionV3", 32, " (Other Results, batch 32)", 29.2,
           ((8, 219), (16, 427), (32, 820), (64, 1608))),
          ("resnet50", "ResNet-50", 32, " (Other Results, batch 32)", 48.4,
           ((8, 333), (16, 667), (32, 1180), (64, 2315))))
      for n, v in vals
      # "Equal numbers of parameter servers and worker servers were used with the following exceptions:
      # InceptionV3: 8 instances / 6 parameter servers; ResNet-50: (batch size 32) 8 instances / 4 [...]"
      for k in [(6 if m == "inception3" else 4 if b == 32 else None) if n == 64 else None]),
    # ---- nvidia-dle (held out): TF1 ResNet-50 v1.5 with Horovod inside one DGX
    *({"source": "nvidia-dle", "where": f"Training performance: {box}", "quoted": f"weak scaling {ws}x at {n} GPUs "
       f"({prec}; 1 GPU {one} img/s)", "model": "resnet50", "kind": "efficiency", "published": round(ws / n, 6),
       "strategy": "horovod", "overlap": True, "aggregate": False, "cluster": f"1x{n}:nvlink", "gpu": None,
       "images_per_s": float(one), "batch": b, "hardware": f"{box}, NVLink, Horovod", "transport": "none"}
      for box, n, prec, one, ws, b in (
          ("NVIDIA DGX-1 (8x V100 16G)", 8, "FP32 + XLA", 412, 7.69, 128),
          ("NVIDIA DGX-1 (8x V100 16G)", 8, "mixed precision + XLA", 1270, 7.48, 256),
          ("NVIDIA DGX-2 (16x V100 32G)", 16, "FP32 + XLA", 432, 15.05, 128),
          ("NVIDIA DGX-2 (16x V100 32G)", 16, "mixed precision + XLA", 1300, 13.27, 256),
          ("NVIDIA DGX A100 (8x A100 40GB)", 8, "TF32 + XLA", 909, 7.70, 256),
          ("NVIDIA DGX A100 (8x A100 40GB)", 8, "mixed precision + XLA", 2375, 7.32, 256))),
    # ---- dlperf (held out): ResNet-50 v1.5, FP32, 1 to 4 hosts of 8 V100
    *({"source": "dlperf", "where": "Benchmark Test Results, ResNet50 V1.5 batch size = 128, FP32 & Without XLA",
       "quoted": f"{fw}: 1 device {one}, {n} devices {v} img/s", "model": "resnet50", "kind": "efficiency",
       "published": _eff(n, one, v), "strategy": "horovod", "overlap": True, "aggregate": False,
       "cluster": f"{max(1, n // 8)}x8:nvlink,100gbit+rdma", "gpu": None, "images_per_s": one, "batch": b,
       "hardware": f"{_DLPERF_HW}; {how}", "transport": "rdma" if n > 8 else "none", "framework": fw,
       "precision": "FP32"}
      for fw, how, one, b, vals in (
          ("TensorFlow 1.x", "NVIDIA DeepLearningExamples' script, DALI + Horovod", 362.44, 128,
           ((8, 2721.98), (16, 5099.42), (32, 9514.64))),
          ("MXNet", "NVIDIA DeepLearningExamples' script, DALI + Horovod, batch 96", 389.71, 96,
           ((8, 2947.72), (16, 5684.68), (32, 10419.21))),
          ("PyTorch", "pytorch/examples imagenet, DistributedDataParallel (NCCL)", 354.40, 128,
           ((8, 2719.07), (16, 5307.21), (32, 10632.33))))
      for n, v in vals),
    # ---- dell (held out): 8 hosts x 4 V100-PCIe, FP32 speed-ups at 32 GPUs over one GPU
    *({"source": "dell", "where": "sec. 3.1, Figure 9 (text); sec. 2.6 Network",
       "quoted": f"{fw} {sp}x speedup in FP32 mode at 32 GPUs", "model": "resnet50", "kind": "efficiency",
       "published": round(sp / 32, 6), "strategy": "horovod", "overlap": True, "aggregate": False,
       "cluster": "8x4:pcie,100gbit+rdma", "gpu": "v100", "images_per_s": None, "batch": 64,
       "hardware": "8 PowerEdge C4140 x 4 V100-PCIe, 100 Gb/s EDR InfiniBand; the framework's own synchronous "
                   "data parallelism (its collective is not named in the text read)", "transport": "rdma",
       "framework": fw, "precision": "FP32"}
      for fw, sp in (("MXNet", 29.4), ("TensorFlow", 22.0), ("Caffe2", 26.5))),
    # ---- eth-cscs (held out): InceptionV3 on 1 to 16 p2.8xlarge, distributed_replicated, synthetic data; each
    # GPU count's best number of parameter servers (the table's "Num PSs"), run on the worker instances
    *({"source": "eth-cscs", "where": "sec. Results, Distributed training on Amazon p2.8xlarge, Table \"Parameters "
                                      "achieving peak performance on p2.8xlarge systems\" (Real Data FALSE)",
       "quoted": f"InceptionV3: 1 GPU 30.55, {n} GPUs {v} images/s ({k} PSs)", "model": "inception3",
       "kind": "efficiency", "published": _eff(n, 30.55, v), "strategy": "ps-sync:ps_colocated=true", "overlap": False,
       "aggregate": True, "cluster": f"{max(1, n // 8)}x{min(n, 8)}:pcie,10gbit", "gpu": None, "images_per_s": 30.55,
       "batch": 64,
       "hardware": _AWS_HW + f"; distributed_replicated, {k} parameter server(s) on the worker instances (the "
                             "workers of a host aggregate before pushing, as the report states)",
       "transport": "tcp", "servers": k if k < max(1, n // 8) else None}
      for k, n, v in ((1, 2, 58.38), (1, 4, 116.34), (1, 8, 230.75), (1, 16, 448.57), (3, 32, 863.72),
                      (8, 64, 1731.31), (16, 128, 3333.20))),
    # ---- paddle-perf (held out): ResNet-50 v1.5 in NVIDIA's DeepLearningExamples (DALI on, XLA on for TF), 1 and 8
    # GPUs in one host, 32 in four; the systems whose collective the report or the system's example names
    # (Horovod in NGC TensorFlow and MXNet, DistributedDataParallel in NGC PyTorch), each at one batch for all counts;
    # Paddle's own rows are left out: the report does not say how its collective sends the gradients
    *({"source": "paddle-perf", "where": f"sec. 5.2 (comparison with other frameworks), {prec} table",
       "quoted": f"{fw}: GPU=1 {one}, GPU={n} {v} images/sec (batch {b})", "model": "resnet50", "kind": "efficiency",
       "published": _eff(n, one, v), "strategy": "horovod", "overlap": True, "aggregate": False,
       "cluster": f"{n // 8}x8:nvlink,100gbit+rdma", "gpu": None, "images_per_s": one, "batch": b,
       "hardware": ("1 host of 8 V100-SXM2-32GB (NVLink), Xeon Gold 6148" if n == 8 else
                    "4 hosts of 8 V100-SXM2-32GB (NVLink), Xeon Gold 6271C, InfiniBand 100 Gb/sec (the 1-GPU figure "
                    "from the single-host machine)") + f"; {how}, {prec}", "transport": "rdma" if n > 8 else "none",
       "framework": fw, "precision": prec}
      for prec, fw, how, one, b, vals in (
          ("FP32", "NGC TensorFlow 1.15", "DeepLearningExamples, Horovod", 408.70, 128, ((8, 3132.27), (32, 11622.9))),
          ("FP32", "NGC PyTorch", "DeepLearningExamples, DistributedDataParallel", 358.30, 128,
           ((8, 2768.51), (32, 10393.2))),
          ("FP32", "NGC MXNet", "DeepLearningExamples, Horovod", 360.73, 96, ((8, 2955.30),)),
          ("AMP", "NGC TensorFlow 1.15", "DeepLearningExamples, Horovod", 1100.88, 128, ((8, 8434.95), (32, 27528.0))),
          ("AMP", "NGC PyTorch", "DeepLearningExamples, DistributedDataParallel", 752.39, 128,
           ((8, 5587.61), (32, 17940.7))),
          ("AMP", "NGC MXNet", "DeepLearningExamples, Horovod", 1277.3, 128, ((8, 9449.3),)))
      for n, v in vals),
]

#: What NCCL's TCP socket transport moved between hosts of several GPUs, against the NIC's line rate:
#: all-reduce bus bandwidth (one ring's bytes per second through each NIC, each direction) over the NIC's
#: rate, as the issue threads print them. The one-GPU-per-host runs of the first thread came within 4%
#: of line rate (30.6-31.4 of 32 Gbit/s); hosts of several GPUs got about half: NCCL's bandwidth is
#: "the minimum speed of the sockets multiplied by the number of sockets" (its maintainer, nccl-tests#83).
#: :data:`hvdkit.advise.presets.NCCL_TCP_FRACTION` is their median.
NCCL_TCP: list[dict] = [
    {"source": "NVIDIA/nccl issue #209, cswinter's comment, GCP Results table",
     "quoted": "bus bandwidth 14.5, 14.8, 14.9 Gbit/s, 2 nodes x 8 GPUs",
     "hardware": "GCP 32GbE instances, 8 GPUs each, NCCL 2.4.7 over TCP", "line_gbit": 32.0, "busbw_gbit": 14.8},
    {"source": "NVIDIA/nccl issue #209, cswinter's comment, GCP Results table",
     "quoted": "bus bandwidth 22.2, 22.4, 22.9 Gbit/s, 4 nodes x 8 GPUs",
     "hardware": "GCP 32GbE instances, 8 GPUs each, NCCL 2.4.7 over TCP", "line_gbit": 32.0, "busbw_gbit": 22.4},
    {"source": "NVIDIA/nccl issue #450, description",
     "quoted": "the best performance (bus-bw) is between 4~6GB/s",
     "hardware": "4 machines x 8 V100-32G, 100Gbps TCP network", "line_gbit": 100.0, "busbw_gbit": 40.0},
    {"source": "NVIDIA/nccl-tests issue #83, description",
     "quoted": "it maxed out at 1.7GBps (expected ~21 Gbps bidirectional, 25Gbps unidirectional)",
     "hardware": "Azure VM scale set, 2 hosts x 4 GPUs (-np 8), TCP/IP 25 Gbit/s", "line_gbit": 25.0,
     "busbw_gbit": 13.6},
]
