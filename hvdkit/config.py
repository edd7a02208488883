"""One typed Config for a training run: the flags, their defaults, and where values come from.

Precedence (highest first): command-line flag > ``--config FILE`` (JSON object) >
``HVDKIT_<NAME>`` environment variable (e.g. ``HVDKIT_BATCH_SIZE=64``) > default.
Unknown keys in the config file or unknown ``HVDKIT_*`` variables are refused, so a typo
never silently falls back to a default. The resolved Config is saved in results.json.

The flags are declared once, in :data:`FIELDS`; argparse, the env and file readers and
the dataclass all come from that table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

from hvdkit.cliparse import Parser
from hvdkit.errors import UsageError

__all__ = ["Config", "Option", "FIELDS", "at_least", "above", "option_values", "build_parser", "parse_config",
           "env_settings", "ENV_PREFIX", "warmup_steps", "warmup_lr"]

ENV_PREFIX = "HVDKIT_"
# Environment variables with this prefix that are not Config fields but are known.
_ENV_RESERVED = {"HVDKIT_PYTHON", "HVDKIT_VENV", "HVDKIT_RESTART"}   # HVDKIT_RESTART: hvdkit-launch --max-restarts
_ENV_RESERVED_PREFIX = "HVDKIT_CLUSTER_"   # set by hvdkit-cluster for the commands it runs


def at_least(low: float) -> Callable[[Any], str | None]:
    """A check for :class:`Option`: the value must be >= ``low``."""
    return lambda v: None if v >= low else f"must be >= {low:g}"


def above(low: float) -> Callable[[Any], str | None]:
    """A check for :class:`Option`: the value must be > ``low``."""
    return lambda v: None if v > low else f"must be > {low:g}"


@dataclass(frozen=True)
class Option:
    """One setting, declared once: its flag, type, default, validation, help and ``--help`` group.

    Attributes:
        name: the key (``batch_size``); the flag is ``--batch-size``, the environment
            variable ``HVDKIT_BATCH_SIZE``, the config-file key ``batch_size``.
        type: ``int``, ``float``, ``str`` or ``bool`` (a bool gets ``--x/--no-x``).
        default: the value when no source gives one (the only place it is written).
        help: one line for ``--help``.
        group: the ``--help`` section.
        choices: allowed values, or None.
        metavar: the placeholder in ``--help``.
        check: ``check(value) -> None | reason``, e.g. :func:`at_least` (0): a value with a
            reason is refused when the flags are parsed, as ``--NAME=VALUE REASON``.
        aliases: other flags of the same setting (``--out-dir`` of ``--output-dir``: the name the
            benchmarks and the launcher use for theirs), or ().

    The top-level settings are :data:`FIELDS`; a strategy declares its own in its class's
    ``options`` (see :mod:`hvdkit.strategies.base`); both go through :func:`parse_config`.
    """

    name: str
    type: type
    default: Any
    help: str
    group: str
    choices: tuple | None = None
    metavar: str | None = None
    check: Callable[[Any], str | None] | None = None
    aliases: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        """``--batch-size`` for ``batch_size``."""
        return "--" + self.name.replace("_", "-")

    def convert(self, raw: Any, source: str) -> Any:
        """``raw`` (text, or a value of ``type``) as a value of ``type``, not yet validated; a bool
        takes true/false, yes/no, on/off or 1/0 (what the environment and config files accept).

        Raises:
            UsageError: ``SOURCE: NAME=RAW is not a valid TYPE`` (or ``... is not a boolean``).
        """
        return _convert(self, raw, source)

    def validate(self, value: Any) -> Any:
        """``value`` if it passes ``choices`` and ``check``.

        Raises:
            UsageError: ``--NAME=VALUE must be ...`` (the value and the rule named).
        """
        if self.choices is not None and value not in self.choices:
            raise UsageError(f"{self.flag}={value!r}: choose {', '.join(map(str, self.choices))}")
        reason = self.check(value) if self.check is not None else None
        if reason:
            raise UsageError(f"{self.flag}={value} {reason}")
        return value


def option_values(options: Sequence[Option], extra: Mapping[str, Any]) -> SimpleNamespace:
    """The values of ``options`` from ``extra`` (``Config.extra``), each default from its declaration.

    Returns a namespace with one attribute per option, validated.

    Raises:
        UsageError: a value fails its option's check.
    """
    return SimpleNamespace(**{o.name: o.validate(extra.get(o.name, o.default)) for o in options})


FIELDS: tuple[Option, ...] = (
    # what to train
    Option("strategy", str, "horovod", "how replicas agree (the list below; README: the strategy table)",
           "what to train", metavar="NAME"),
    Option("model", str, "mlp", "linear | mlp | mlp-wide | cnn | resnet50 | MODULE:FUNCTION (a function "
           "(input_shape, num_classes) -> tf.keras.Model returning logits)", "what to train", metavar="NAME"),
    Option("keras", str, "auto", "the Keras that builds the model: 3 (the tf221 stack's default; `import keras`) "
           "| 2 (tf_keras on tf221, TensorFlow's own on tf215) | auto (the stack's newest; 2 where "
           "TF_USE_LEGACY_KERAS=1 is set)", "what to train", choices=("auto", "2", "3"), metavar="VERSION"),
    Option("dataset", str, "digits", "digits (scikit-learn's 1,797 bundled 8x8 images) | synthetic | "
           "npz:PATH (arrays x, y) | idx:DIR (MNIST IDX files)", "what to train", metavar="SPEC"),
    Option("image_size", int, 224, "synthetic images are IMAGE_SIZE x IMAGE_SIZE x 3", "what to train", check=above(0)),
    Option("synthetic_samples", int, 1024, "number of synthetic training samples", "what to train", check=above(0)),
    Option("num_classes", int, 0, "classes for synthetic data (0: 1000, as ImageNet)", "what to train", check=at_least(0)),
    Option("eval_fraction", float, 0.2, "held-out fraction for datasets without a test split", "what to train",
           check=lambda v: None if 0.0 < v < 1.0 else "must be between 0 and 1"),
    # optimisation
    Option("epochs", int, 10, "passes over the training set", "optimisation", check=above(0)),
    Option("batch_size", int, 32, "samples per rank per step (the global batch is BATCH_SIZE x workers)", "optimisation", check=above(0)),
    Option("optimizer", str, "momentum", "sgd | momentum | adam; a strategy may default to another (ps-async and "
           "ps-dcasgd: sgd, their papers' rule)", "optimisation", choices=("sgd", "momentum", "adam")),
    Option("lr", float, 0.02, "learning rate of one worker; synchronous data-parallel strategies multiply "
           "it by the number of workers unless --no-lr-scaling (asynchronous PS modes never do)", "optimisation", check=above(0)),
    Option("momentum", float, 0.9, "momentum for --optimizer momentum", "optimisation", check=at_least(0)),
    Option("lr_scaling", bool, True, "multiply the learning rate by the number of workers (Goyal et "
           "al. 2017, as Horovod's examples do)", "optimisation"),
    Option("warmup_epochs", float, 0.0, "with a scaled learning rate: raise it linearly, step by step, from --lr "
           "to --lr x workers over this many epochs (Goyal et al. 2017's gradual warmup; they use 5); 0: none; "
           "no effect where the rate is not scaled (asynchronous PS modes, --no-lr-scaling, one worker)",
           "optimisation", check=at_least(0), metavar="EPOCHS"),
    Option("seed", int, 0, "seed for weights, data order and synthetic data (same on every rank)", "optimisation"),
    Option("max_steps", int, 0, "stop after this many steps of each rank, over all epochs (0: no limit)",
           "optimisation", check=at_least(0)),
    Option("straggler", str, "", "make RANK compute FACTOR times slower (it sleeps (FACTOR-1) x its compute "
           "time each step), for experiments; hvdkit's own strategies, not tf-*", "optimisation",
           metavar="RANK:FACTOR"),
    # output
    Option("output_dir", str, "", "results directory (default runs/<timestamp>-<strategy>); also --out-dir, the "
           "benchmarks' name for theirs", "output", metavar="DIR", aliases=("--out-dir",)),
    Option("export_weights", str, "", "write the final weights to this .npz file (rank 0; weights are "
           "identical on every rank)", "output", metavar="PATH"),
    Option("resume", bool, False, "continue from the checkpoint in --output-dir", "output"),
    Option("overwrite", bool, False, "start afresh in an --output-dir that holds a checkpoint, which is deleted "
           "(without --resume or this, such a run is refused)", "output"),
    Option("checkpoint", bool, True, "write OUTPUT_DIR/checkpoint.npz after every epoch (rank 0, atomic)", "output"),
    Option("checkpoint_every", int, 0, "also checkpoint every STEPS steps inside an epoch, so a restart repeats at "
           "most STEPS steps (0: at epoch ends only; not model-parallel)", "output", check=at_least(0), metavar="STEPS"),
    Option("tensorboard", bool, True, "write TensorBoard scalars to OUTPUT_DIR/tensorboard", "output"),
    Option("progress_seconds", float, 10.0, "print a progress line inside an epoch at most this often", "output", check=above(0)),
    Option("timeline", str, "", "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of every rank's steps to "
           "this JSON file (rank 0, at the end; with --strategy horovod also Horovod's own timeline next to it: "
           "trace.json -> trace.horovod.json)", "output", metavar="PATH"),
    Option("timeline_steps", str, "", "trace only global steps A..B-1 (0-based; A: or :B leave one end open)",
           "output", metavar="A:B"),
    # system
    Option("threads", int, 0, "TensorFlow intra-op threads per rank (0: cores / ranks on this host, "
           "at least 1; inter-op is 1 when ranks >= cores)", "system", check=at_least(0)),
    Option("network_interface", str, "", "the network between hosts for the servers hvdkit starts (TensorFlow's): "
           "interface names or CIDR networks, comma-separated (default: the first network that joins every "
           "host and is checked to connect them; README: Addresses)", "system", metavar="NAME"),
    Option("startup_timeout", float, 120.0, "end the job with one line if start-up (strategy creation to "
           "the first step) takes longer (seconds; 0: no limit)", "system", check=at_least(0)),
    Option("stall_timeout", str, "auto", "end the job with one line naming the ranks that made no progress for "
           "this many seconds after their first step (a rank hung in a data step, a collective that never "
           "completes); auto: max(120 s, 20 x the rank's median step time so far); 0: off; under --elastic a "
           "rank stuck outside any collective leaves the job instead, which goes on without it", "system",
           metavar="SECONDS", check=lambda v: None if _stall_seconds(v) is not False else "must be auto, 0 (off) "
           "or a number of seconds > 0"),
    Option("fail_at", str, "", "on RANK at STEP raise an error (RANK:STEP), exit at once as if "
           "killed (RANK:STEP:exit), hang (RANK:STEP:hang; inside the compiled step before its allreduce: "
           "RANK:STEP:hang-step, --strategy horovod --elastic) or set this rank's first weight to NaN "
           "(RANK:STEP:nan), to exercise failure handling; RANK must take training steps (not a "
           "parameter server's or a tf-ps task's rank)", "testing",
           metavar="RANK:STEP[:HOW]"),
)

_BY_NAME = {f.name: f for f in FIELDS}


class _ConfigMethods:
    def __post_init__(self) -> None:
        for f in FIELDS:
            f.validate(getattr(self, f.name))
        _check(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every setting."""
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        return d

    def replace(self, **changes: Any) -> "Config":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def straggler_rank_factor(self) -> tuple[int, float] | None:
        """``--straggler RANK:FACTOR`` as (rank, factor), or None."""
        if not self.straggler:
            return None
        rank, factor = self.straggler.split(":")
        return int(rank), float(factor)

    @property
    def timeline_window(self) -> tuple[int, int | None]:
        """``--timeline-steps A:B`` as (A, B): steps A <= step < B are traced; B None: no end."""
        if not self.timeline_steps:
            return 0, None
        a, _, b = self.timeline_steps.partition(":")
        return int(a or 0), (int(b) if b else None)

    @property
    def stall_timeout_s(self) -> float | None:
        """``--stall-timeout`` in seconds: None for ``auto`` (:mod:`hvdkit.watchdog` applies its
        rule), 0.0 for off."""
        return _stall_seconds(self.stall_timeout)

    @property
    def fail_rank_step(self) -> tuple[int, int, str] | None:
        """``--fail-at RANK:STEP[:HOW]`` as (rank, step, how), how in raise/exit/hang/hang-step/nan; or None."""
        if not self.fail_at:
            return None
        parts = self.fail_at.split(":")
        return int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "raise"


#: The resolved settings of one run: one attribute per :data:`FIELDS` entry (same name, type
#: and default; see there for meaning and units), plus ``extra``, the options that strategies
#: declare (name -> value). Frozen; every value is validated on construction.
Config = dataclasses.make_dataclass(
    "Config",
    [(f.name, f.type, field(default=f.default)) for f in FIELDS]
    + [("extra", Mapping[str, Any], field(default_factory=dict))],
    bases=(_ConfigMethods,), frozen=True)
Config.__module__ = __name__
Config.__doc__ = "The resolved settings of one run; see :data:`FIELDS` for meaning, units and defaults."


def _stall_seconds(text: str) -> float | None | bool:
    """``--stall-timeout`` text as seconds (None: auto; 0.0: off), or False if it is neither."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        v = float(text)
    except ValueError:
        return False
    return v if v >= 0 and v == v and v != float("inf") else False


def warmup_steps(epochs: float, samples: int, workers: int, batch: int) -> int:
    """Steps of a linear warmup over ``epochs`` epochs (``--warmup-epochs``): ``epochs`` x one
    worker's steps per epoch, ceil(ceil(samples / workers) / batch), rounded up; 0 for 0 epochs."""
    if epochs <= 0:
        return 0
    per_epoch = -(-(-(-samples // workers)) // batch)
    return max(1, math.ceil(epochs * per_epoch))


def warmup_lr(step: int, base: float, peak: float, steps: int) -> float:
    """The learning rate of update ``step`` (0 for the first) under the gradual warmup of Goyal et
    al. 2017 ("Accurate, Large Minibatch SGD", section 2.2): linear from ``base`` (one worker's
    rate) to ``peak`` (the scaled one) over ``steps`` updates, then ``peak``:
    base + (peak - base) * min(step, steps) / steps. ``steps`` 0: ``peak`` throughout."""
    if steps <= 0:
        return peak
    return base + (peak - base) * min(step, steps) / steps


def _check(c) -> None:
    """The checks that involve a pattern or more than one field."""
    if c.fail_at:
        parts = c.fail_at.split(":")
        if not (len(parts) in (2, 3) and all(p.strip().isdigit() for p in parts[:2])
                and (len(parts) == 2 or parts[2] in ("raise", "exit", "hang", "hang-step", "nan"))):
            raise UsageError(f"--fail-at={c.fail_at!r} must be RANK:STEP or RANK:STEP:raise|exit|hang|hang-step|nan, "
                             "e.g. 1:2")
    if c.straggler:
        parts = c.straggler.split(":")
        try:
            ok = len(parts) == 2 and int(parts[0]) >= 0 and float(parts[1]) >= 1.0
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"--straggler={c.straggler!r} must be RANK:FACTOR with FACTOR >= 1, e.g. 1:3")
    if c.timeline_steps:
        a, sep, b = c.timeline_steps.partition(":")
        ok = bool(sep) and (a or "0").strip().isdigit() and (not b or b.strip().isdigit())
        if not ok or (b and int(b) <= int(a or 0)):
            raise UsageError(f"--timeline-steps={c.timeline_steps!r} must be A:B with 0 <= A < B (steps A..B-1), "
                             "A: or :B, e.g. 10:60")
    if c.warmup_epochs and c.extra.get("elastic"):
        raise UsageError("--warmup-epochs with --elastic: the number of workers, and so the scaled learning rate, "
                         "changes while an elastic job runs; drop one of them")
    if c.resume and not c.output_dir:
        raise UsageError("--resume needs --output-dir DIR (the directory holding checkpoint.npz)")
    if c.resume and c.overwrite:
        raise UsageError("--resume continues the checkpoint in --output-dir, --overwrite deletes it: choose one")
    if c.checkpoint_every and not c.checkpoint:
        raise UsageError(f"--checkpoint-every {c.checkpoint_every} with --no-checkpoint: one asks for checkpoints, the "
                         "other for none; choose one")


def _convert(f: Option, raw: Any, source: str) -> Any:
    if f.type is bool:
        if isinstance(raw, bool):
            return raw
        s = str(raw).strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off", ""):
            return False
        raise UsageError(f"{source}: {f.name}={raw!r} is not a boolean (use true/false)")
    try:
        return f.type(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{source}: {f.name}={raw!r} is not a valid {f.type.__name__}") from None


def build_parser(prog: str = "python -m hvdkit.train", extra_fields: Sequence[Option] = (),
                 strategies: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The argparse parser for :data:`FIELDS` and ``extra_fields`` (every default is None:
    precedence is applied later). ``strategies`` (name -> one-line summary) become the
    list of ``--strategy`` names in the epilog (an unknown name is refused by
    :func:`hvdkit.strategies.get_strategy`, with that list)."""
    p = Parser(
        prog=prog,
        description="Train a shared model on a shared dataset under one distributed strategy,\n"
                    "with the same timing, logging and results.json for every strategy.",
        epilog="Settings come from (highest first): flags > --config FILE (JSON) > HVDKIT_<NAME>\n"
               "environment variables (e.g. HVDKIT_BATCH_SIZE=64) > defaults. Flags of one strategy\n"
               "(e.g. --micro-batches) are ignored by the others.\n"
               "Exit status: 0 done, 2 bad input (one line from rank 0), 1 a rank failed (MPI_Abort), 74 an output\n"
               "cannot be written (no space, I/O error; not retried by --max-restarts), 75 stopped on SIGUSR1 at\n"
               "a checkpoint (Slurm's --signal): continue with --resume.\n"
               "Examples:\n"
               "  horovodrun -np 4 python -m hvdkit.train\n"
               "  mpirun -np 2 python -m hvdkit.train --model cnn --epochs 3 --export-weights w.npz\n"
               "  horovodrun -np 8 -H a:4,b:4 python -m hvdkit.train --model resnet50 --dataset synthetic"
               + ("\nStrategies (--strategy NAME):\n" + "\n".join(f"  {n:<19} {d}" for n, d in strategies.items())
                  if strategies else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="JSON object of settings (keys as below, with underscores)")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in _fields(extra_fields).values():
        g = groups.get(f.group) or groups.setdefault(f.group, p.add_argument_group(f.group))
        flag = "--" + f.name.replace("_", "-")
        default_txt = f" (default: {f.default})" if f.default not in ("", 0, None) or f.type is int else ""
        if f.type is bool:
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=f"{f.help} (default: {'on' if f.default else 'off'})")
        else:
            g.add_argument(flag, *f.aliases, dest=f.name, type=str, default=None, choices=f.choices,
                           metavar=f.metavar or f.name.upper(), help=f.help + default_txt)
    return p


def env_settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``HVDKIT_<NAME>`` variables of ``env`` (default ``os.environ``) that
    :func:`parse_config` reads as settings, name -> raw value, sorted by name: every ``HVDKIT_*``
    but the launcher's and the cluster emulator's own (``HVDKIT_PYTHON``, ``HVDKIT_VENV``,
    ``HVDKIT_RESTART``, ``HVDKIT_CLUSTER_*``). Unknown names are included (parse_config refuses them)."""
    env = os.environ if env is None else env
    return {k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIX) and k not in _ENV_RESERVED
            and not k.startswith(_ENV_RESERVED_PREFIX)}


def _fields(extra_fields: Sequence[Option]) -> dict[str, Option]:
    """Every option by name: :data:`FIELDS`, then ``extra_fields``.

    Raises:
        ValueError: two different declarations of one name (a programming error).
    """
    out = {f.name: f for f in FIELDS}
    for f in extra_fields:
        if out.setdefault(f.name, f) is not f:
            raise ValueError(f"option {f.name!r} is declared twice, differently; declare it once and share it")
    return out


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 extra_fields: Sequence[Option] = (), strategies: Mapping[str, str] | None = None,
                 prog: str = "python -m hvdkit.train",
                 strategy_defaults: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Resolve a :class:`Config` from flags, an optional JSON file, the environment and defaults.

    Args:
        argv: command-line arguments (without the program name); None means ``sys.argv[1:]``.
        env: environment mapping; None means ``os.environ``.
        extra_fields: strategy-specific options, stored in ``Config.extra`` (every one,
            with its default when no source sets it); validated here, like :data:`FIELDS`.
        strategies: the registered strategies (name -> summary), see :func:`build_parser`.
        prog: the command as typed (``hvdkit train``), shown by ``--help`` and in errors.
        strategy_defaults: strategy name -> {setting: default} that replace the declared defaults
            under that ``--strategy`` (:func:`hvdkit.strategies.strategy_defaults`: the rows'
            ``defaults``), for every setting no flag, file or environment variable gives.

    Raises:
        UsageError: an unknown flag, key in the file or environment variable, a value of the
            wrong type, or a value out of range.
        SystemExit: from argparse, for ``--help``.
    """
    env = os.environ if env is None else env
    fields = _fields(extra_fields)
    args = vars(build_parser(prog, extra_fields=extra_fields, strategies=strategies).parse_args(argv))
    values: dict[str, Any] = {}
    given: set[str] = set()   # set by an environment variable, the file or a flag
    # lowest precedence first: defaults (the strategy's own, below) < env < file < flags
    for f in fields.values():
        values[f.name] = f.default
    for key, raw in env_settings(env).items():
        name = key[len(ENV_PREFIX):].lower()
        if name not in fields:
            raise UsageError(f"unknown environment variable {key}; known: "
                             + ", ".join(ENV_PREFIX + n.upper() for n in fields))
        values[name] = _convert(fields[name], raw, f"environment {key}")
        given.add(name)
    if args.get("config"):
        path = args["config"]
        try:
            with open(path) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise UsageError(f"--config {path}: no such file") from None
        except json.JSONDecodeError as e:
            raise UsageError(f"--config {path}: not valid JSON ({e})") from None
        except UnicodeDecodeError:
            raise UsageError(f"--config {path}: not a text file (expected a JSON object of settings)") from None
        except OSError as e:  # a directory, no permission, an I/O error
            raise UsageError(f"--config {path}: cannot read it ({e.strerror or e})") from None
        if not isinstance(data, dict):
            raise UsageError(f"--config {path}: expected a JSON object of settings")
        for name, raw in data.items():
            if name not in fields:
                raise UsageError(f"--config {path}: unknown key {name!r}; known: {', '.join(fields)}")
            values[name] = _convert(fields[name], raw, f"--config {path}")
            given.add(name)
    for name, raw in args.items():
        if name != "config" and raw is not None:
            values[name] = _convert(fields[name], raw, "--" + name.replace("_", "-"))
            given.add(name)
    for name, value in (strategy_defaults or {}).get(values["strategy"], {}).items():
        if name not in given:
            values[name] = value
    for name, value in values.items():
        fields[name].validate(value)
    base = {k: v for k, v in values.items() if k in _BY_NAME}
    extra = {k: v for k, v in values.items() if k not in _BY_NAME}
    return Config(**base, extra=extra)
