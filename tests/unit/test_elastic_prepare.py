"""The elastic set-up is the trainer's own (:func:`hvdkit.trainer.prepare` with ``elastic=True``) and
runs no collective (Horovod's rule: nothing communicates before ``hvd.elastic.run`` has synchronised
the state). One process, world size 1, over a communicator that fails on any collective; Horovod
initialised at size 1 without a launcher. In a subprocess, so that Horovod and TensorFlow stay out of
the test process."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = textwrap.dedent('''
    import io, os, sys, contextlib
    import horovod.tensorflow as hvd
    hvd.init()                                   # size 1, before the elastic flag: no rendezvous
    os.environ["HOROVOD_ELASTIC"] = "1"          # what an elastic horovodrun sets (the strategy checks it)
    from hvdkit import results as R
    from hvdkit.comm import World
    from hvdkit.config import parse_config
    from hvdkit.strategies import extra_fields, summaries
    from hvdkit.trainer import change_world, prepare

    class NoCollectives:
        """A communicator of one rank that fails the test on any collective."""
        def Get_rank(self): return 0
        def Get_size(self): return 1
        def __getattr__(self, name): raise AssertionError(f"collective {name} during the elastic set-up")

    out = sys.argv[1]
    w = World(NoCollectives(), 0, 1, 0, 1, "h")
    flags = ["--strategy", "horovod", "--elastic", "--model", "linear", "--output-dir", out, "--lr", "0.5",
             "--checkpoint-every", "3", "--no-tensorboard"]
    cfg = parse_config(flags, extra_fields=extra_fields(), strategies=summaries())
    loop, prog = prepare(cfg, w, elastic=True)
    lr = lambda: float(loop.strategy.optimizer.learning_rate.numpy())
    assert loop.out_dir == out and loop.ckpt_path == os.path.join(out, "checkpoint.npz") and lr() == 0.5
    change_world(loop, World(NoCollectives(), 0, 1, 0, 1, "h"))    # local too; lr from lr_scale
    print("OK prepare", lr())

    # --resume: a checkpoint of this run is restored (locally), one of another strategy refused in one line
    meta = {"epoch": 2, "global_step": 7, "history": [{"epoch": 1}, {"epoch": 2}], "model": "linear",
            "dataset": "digits", "strategy": "horovod", "optimizer": cfg.optimizer, "world_size": 3}
    R.save_npz(loop.ckpt_path, loop.strategy.state(), meta)
    cfg = parse_config(flags + ["--resume"], extra_fields=extra_fields(), strategies=summaries())
    loop, prog = prepare(cfg, w, elastic=True)
    assert (prog.epoch, prog.global_step, len(prog.history)) == (2, 7, 2), prog
    print("OK resume")
    R.save_npz(loop.ckpt_path, loop.strategy.state(), {**meta, "strategy": "ring"})
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            prepare(cfg, w, elastic=True)
        except SystemExit as e:
            print("EXIT", e.code)
    print("STDERR", repr(err.getvalue()))
''')


def test_elastic_preparation_runs_no_collective_and_makes_the_resume_checks(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("HOROVOD_ELASTIC", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out")], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "OK prepare 0.5" in lines and "OK resume" in lines and "EXIT 2" in lines, r.stdout + r.stderr
    ckpt = tmp_path / "out" / "checkpoint.npz"
    assert (f"STDERR 'hvdkit: error: --resume: {ckpt} is a checkpoint of --strategy ring --model linear --dataset "
            "digits, not --strategy horovod --model linear --dataset digits; resume with the same settings\\n'") in lines, \
        r.stdout
