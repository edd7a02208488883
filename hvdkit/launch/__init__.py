"""``python -m hvdkit.launch`` (console script ``hvdkit-launch``): one launch command for
horovodrun, Open MPI's ``mpirun`` and MPICH's ``mpiexec`` (Hydra), plus job templates.

Examples (``--dry-run`` prints the command instead of running it)::

    hvdkit-launch -np 4                                   # python -m hvdkit.train on 4 local ranks
    hvdkit-launch -np 8 -H a:4,b:4 -- --model resnet50 --dataset synthetic
    hvdkit-launch -np 16 --hostfile hosts --launcher horovodrun -- --model cnn
    hvdkit-launch -np 5 --cpu-ranks 4 -- --strategy ps-sync     # 4 GPU workers, server rank 4 on CPU
    hvdkit-launch -np 2 --dry-run -- python my_script.py        # any program, not only hvdkit.train
    hvdkit-launch --render slurm --set nodes=4 --set gpus_per_node=8 > hvdkit.sbatch
    hvdkit-launch --render suite --set nodes=4 > hvdkit-suite.sbatch   # hvdkit-bench suite --slurm

What the built command contains (see :func:`~hvdkit.launch.command.build_command`):

* Open MPI: ``mpirun -np N [-H HOSTS | --hostfile FILE] --bind-to none --map-by slot
  [--allow-run-as-root] [--oversubscribe] -x VAR ... PROGRAM`` (as Horovod's docs run it).
  ``--allow-run-as-root`` only when this process is root; ``--oversubscribe`` only when N
  exceeds the slots: the physical cores of this host when no hosts are given, else the sum
  of ``host:slots`` / ``host slots=S`` (a host given without a count counts as one slot).
* MPICH and other Hydra launchers (Intel MPI, MVAPICH2): ``mpiexec -n N [-hosts HOSTS |
  -f FILE] -genvlist VAR,... PROGRAM``. Hydra neither refuses root nor oversubscription and
  binds nothing by default, so none of the Open MPI-only flags appear.
* horovodrun: ``horovodrun -np N [-H HOSTS | --hostfile FILE] PROGRAM``; horovodrun forwards
  the whole environment and adds ``--allow-run-as-root`` itself; ``--mpi-args=--oversubscribe``
  is added when N exceeds the slots of the given hosts and the MPI is Open MPI.

Across hosts (``-H``/``--hostfile`` naming other hosts) the network between them is read on
every host and checked by connecting before launch, then given to the launcher
(:mod:`~hvdkit.launch.network`): Open MPI ``--mca btl_tcp_if_include NET --mca
oob_tcp_if_include NET``, MPICH ``-iface NAME``, horovodrun ``--network-interface NAME``, and
``HVDKIT_NETWORK_INTERFACE`` on every rank; one line on stderr names the choice.

Forwarded environment (``-x`` / ``-genvlist``): PATH, LD_LIBRARY_PATH, PYTHONPATH and every
``NCCL_*``, ``HOROVOD_*`` and ``HVDKIT_*`` variable set here, plus ``--env NAME[=VALUE]``.

GPU placement: every rank of ``hvdkit.train`` uses the GPU of its local rank
(:func:`hvdkit.steps.configure_threads`). ``--cpu-ranks LIST`` runs the listed ranks (for
example parameter-server ranks) with ``CUDA_VISIBLE_DEVICES=""``: the program is wrapped in
``python -m hvdkit.launch --rank-exec --cpu-ranks LIST -- PROGRAM``, which reads its rank from
the launcher's environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, HOROVOD_RANK,
SLURM_PROCID) and then ``exec``s PROGRAM.

Modules, one job each: :mod:`~hvdkit.launch.mpi` (MPI flavour, local cores),
:mod:`~hvdkit.launch.hosts` (``-H`` and hostfiles in every form Open MPI and horovodrun take, slots,
the form each launcher gets), :mod:`~hvdkit.launch.slurm` (the hosts of a Slurm allocation, used
when neither ``-H`` nor ``--hostfile`` is given), :mod:`~hvdkit.launch.command`
(:class:`LaunchSpec`, :func:`build_command`, :func:`plan_command`, :func:`local_command`,
the forwarded environment), :mod:`~hvdkit.launch.rankexec` (``--rank-exec``),
:mod:`~hvdkit.launch.network` (MPI's network across hosts, chosen and checked before launch),
:mod:`~hvdkit.launch.templates` (the Slurm templates, one training job and the benchmark suite, and
the Kubernetes one, shipped in ``jobs/``),
:mod:`~hvdkit.launch.cli` (flags and :func:`main`).
"""
from hvdkit.launch.cli import main
from hvdkit.launch.command import (FORWARD_NAMES, FORWARD_PREFIXES, LOCAL_FORWARD, LaunchSpec, build_command,
                                   forwarded_env_names, local_command, plan_command)
from hvdkit.launch.hosts import parse_hostfile, parse_hosts, total_slots
from hvdkit.launch.mpi import HOROVODRUN, MPI, MPICH, OPENMPI, detect_mpi, local_cores, parse_mpi_version
from hvdkit.launch.rankexec import RANK_VARS, parse_rank_list, rank_exec_env, rank_from_env
from hvdkit.launch.templates import TEMPLATES, render, render_template, template_text, template_values

__all__ = [
    "LaunchSpec", "build_command", "plan_command", "local_command", "parse_mpi_version", "detect_mpi",
    "local_cores", "parse_hosts", "parse_hostfile", "total_slots", "forwarded_env_names", "parse_rank_list",
    "rank_from_env", "rank_exec_env", "render_template", "render", "template_text", "template_values",
    "TEMPLATES", "main", "OPENMPI", "MPICH", "HOROVODRUN", "MPI", "FORWARD_NAMES", "FORWARD_PREFIXES",
    "LOCAL_FORWARD", "RANK_VARS",
]
