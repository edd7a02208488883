"""Resume at another shard count (the PS state re-cut, bit-exact) and output paths checked at set-up."""
import os

import numpy as np
import pytest

from hvdkit.config import Config
from hvdkit.errors import UsageError
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import Layout
from hvdkit.strategies.ps.shard import ShardServer, resplit_states
from hvdkit.trainer import CHECKPOINT, prepare_outputs


def _layout(k, dtype="float32"):
    # 3 variables, 17 + 6 + 5 = 28 elements: shard bounds cut inside variables for most K
    return Layout(("a:0", "b:0", "c:0"), ((17,), (2, 3), (5,)), (dtype,) * 3, k)


def _servers(layout, kind, flat, slots, versions):
    out = []
    for k in range(layout.num_shards):
        sl = layout.shard_slice(k)
        opt = rules.Optimizer(kind, 0.1, sl.stop - sl.start, dtype=layout.dtype.type)
        for name, full in slots.items():
            opt.slots[name][...] = full[sl]
        opt.iterations = versions[k]
        out.append(ShardServer(k, layout, flat[sl], "sync", opt, 2, version=versions[k]))
    return out


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k_old,k_new", [(2, 1), (1, 2), (2, 3), (3, 2), (4, 4), (1, 5), (5, 1), (3, 40)])
def test_resplit_is_bit_exact(kind, dtype, k_old, k_new):
    """A state written with K_old shards, loaded into K_new servers: every weight and slot value equal, bit for bit."""
    rng = np.random.default_rng(k_old * 10 + k_new)
    old = _layout(k_old, dtype)
    flat = rng.standard_normal(old.size).astype(dtype)
    names = list(rules.Optimizer(kind, 0.1, 0).slots)
    slots = {n: rng.standard_normal(old.size).astype(dtype) for n in names}
    states = [(s.state_vector(), s.version, s.optimizer.iterations)
              for s in _servers(old, kind, flat, slots, [7] * k_old)]
    new = _layout(k_new, dtype)
    cut = resplit_states(states, new)
    assert len(cut) == k_new
    servers = _servers(new, kind, np.zeros(new.size, dtype), {n: np.zeros(new.size, dtype) for n in names},
                       [0] * k_new)
    for s, (vec, version, iters) in zip(servers, cut):
        assert vec.dtype == np.dtype(dtype)
        s.load_state_vector(vec, version, iters)
        assert (s.version, s.optimizer.iterations) == (7, 7)
    got = np.concatenate([s.weights for s in servers])
    assert got.tobytes() == flat.tobytes()
    for n in names:
        assert np.concatenate([s.optimizer.slots[n] for s in servers]).tobytes() == slots[n].tobytes()


def test_resplit_takes_the_largest_counters_of_the_old_shards_it_covers():
    """Asynchronous checkpoints read shards moments apart: a new shard takes the most advanced counters."""
    old = _layout(2)
    vecs = [np.zeros(2 * (old.shard_slice(k).stop - old.shard_slice(k).start), np.float32) for k in range(2)]
    cut = resplit_states([(vecs[0], 5, 5), (vecs[1], 6, 4)], _layout(3))
    # old bounds [0, 14, 28]; new [0, 9, 18, 28]: shard 1 overlaps both old shards
    assert [(v, i) for _, v, i in cut] == [(5, 5), (6, 5), (6, 4)]


def test_resplit_refuses_a_state_of_another_size():
    old = _layout(2)
    flat = np.zeros(old.size, np.float32)
    states = [(s.state_vector(), 0, 0) for s in _servers(old, "momentum", flat, {"m": flat}, [0, 0])]
    with pytest.raises(ValueError, match="not whole copies"):
        resplit_states(states, Layout(("a:0",), ((29,),), ("float32",), 1))
    with pytest.raises(ValueError, match="no parameter-server shard"):
        resplit_states([], old)


# -- output paths ---------------------------------------------------------------------------------

def _cfg(tmp_path, **kw):
    kw.setdefault("output_dir", str(tmp_path / "out"))
    return Config(**kw)


def test_prepare_outputs_creates_every_directory(tmp_path):
    cfg = _cfg(tmp_path, export_weights=str(tmp_path / "new" / "sub" / "w.npz"))
    assert prepare_outputs(cfg) == str(tmp_path / "out")
    assert (tmp_path / "out" / "tensorboard").is_dir() and (tmp_path / "new" / "sub").is_dir()
    assert not (tmp_path / "new" / "sub" / "w.npz").exists()
    assert sorted(os.listdir(tmp_path / "out")) == [".hvdkit.lock", "tensorboard"], \
        "the write test leaves nothing behind (the lock: the run holds the directory, hvdkit.dirlock)"


@pytest.mark.parametrize("make,kw,message", [
    (lambda t: (t / "out").write_text("x"), {}, "--output-dir {t}/out: {t}/out is a file, not a directory"),
    (lambda t: (t / "f").write_text("x"), {"output_dir": "{t}/f/out"}, "--output-dir {t}/f/out: {t}/f is a file"),
    (lambda t: (t / "f").write_text("x"), {"export_weights": "{t}/f/w.npz"},
     "--export-weights {t}/f/w.npz: {t}/f is a file, not a directory"),
    (lambda t: (t / "w.npz").mkdir(), {"export_weights": "{t}/w.npz"}, "--export-weights {t}/w.npz is a directory"),
    (lambda t: (t / "out" / CHECKPOINT).mkdir(parents=True), {},
     f"--output-dir {{t}}/out: {{t}}/out/{CHECKPOINT} is a directory"),
    (lambda t: (t / "out" / "results.json").mkdir(parents=True), {"checkpoint": False},
     "--output-dir {t}/out: {t}/out/results.json is a directory"),
    (lambda t: ((t / "out").mkdir(), (t / "out" / "tensorboard").write_text("x")), {},
     "--output-dir {t}/out: {t}/out/tensorboard is a file"),
    (lambda t: (t / "out").mkdir(), {"resume": True}, f"--resume: no checkpoint at {{t}}/out/{CHECKPOINT}"),
])
def test_prepare_outputs_refuses_with_one_line(tmp_path, make, kw, message):
    make(tmp_path)
    kw = {k: v.format(t=tmp_path) if isinstance(v, str) else v for k, v in kw.items()}
    with pytest.raises(UsageError) as e:
        prepare_outputs(_cfg(tmp_path, **kw))
    assert message.format(t=tmp_path) in str(e.value)
    assert "\n" not in str(e.value)


def test_prepare_outputs_resume_creates_nothing(tmp_path):
    with pytest.raises(UsageError, match="no checkpoint"):
        prepare_outputs(_cfg(tmp_path, output_dir=str(tmp_path / "typo"), resume=True))
    assert not (tmp_path / "typo").exists()
