"""Strategy variants: one spelling, ``NAME[:option=value,...]``, for every benchmark, the advisor and the docs.

A variant is a row of the strategy table (:data:`hvdkit.strategies.STRATEGIES`) with values for
some of its options, in the row's own option names and types (the ``Option.name`` of
``hvdkit.train``'s flags: ``num_servers`` for ``--num-servers``)::

    horovod                     Horovod at its defaults
    horovod:compression=fp16    ... with fp16 gradients on the wire
    ps-sync:num_servers=2       synchronous PS, 2 dedicated server ranks
    ps-sync:ps_colocated=true   synchronous PS, a shard server on every worker rank
    ps-ssp:staleness=4          SSP with bound s = 4

Values are converted and validated by the row's :class:`~hvdkit.config.Option` (its type, its
choices, its check), exactly as the training flags are; a bool takes true/false (yes/no, on/off,
1/0). The canonical spelling (:attr:`Variant.label`) names only the options that differ from
their defaults, keys sorted: ``ps-sync:num_servers=1`` is ``ps-sync``.

In a comma-separated LIST of variants a token with ``=`` and no ``:`` continues the previous
variant: ``ps-ssp:staleness=4,num_servers=2,ring`` is ``ps-ssp:num_servers=2,staleness=4`` and
``ring``. (A str option whose value holds ``,`` ``:`` or ``=`` cannot be spelled; no row has one.)

Everything a caller needs to know about a variant is asked of its row (the facts in
:mod:`hvdkit.strategies.base`): :attr:`Variant.layout`, :meth:`Variant.ranks`,
:meth:`Variant.servers`, :attr:`Variant.lockstep`, :attr:`Variant.staleness_bound`,
:attr:`Variant.traffic`, and
:meth:`Variant.train_args`, the ``hvdkit.train`` flags that run it. A row registered at run time
(an entry added to ``STRATEGIES``) is a variant at once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from hvdkit.errors import UsageError
from hvdkit.strategies import STRATEGIES

__all__ = ["Variant", "parse_variant", "parse_variants", "split_variants", "default_variants"]


def _text(value: Any) -> str:
    """A value as a variant (and a flag) spells it: true/false, the shortest float repr, else str."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


@dataclass(frozen=True, eq=False)
class Variant:
    """One strategy row with every one of its options set (build it with :func:`parse_variant`).

    Attributes:
        name: the registry name (``"ps-sync"``).
        opts: option name -> typed value for EVERY option of the row, defaults filled in
            (a dict; do not change it). Two variants are equal when their labels are.
    """

    name: str
    opts: dict

    @property
    def cls(self) -> type:
        """The strategy class, ``hvdkit.strategies.STRATEGIES[name]``."""
        return STRATEGIES[self.name]

    @property
    def label(self) -> str:
        """The canonical spelling: name, then only the non-default options, keys sorted
        (``"ps-sync:num_servers=2"``; ``"ps-sync"`` at the defaults). ``parse_variant(label)`` equals self."""
        changed = [f"{o.name}={_text(self.opts[o.name])}" for o in sorted(self.cls.options, key=lambda o: o.name)
                   if self.opts[o.name] != o.default]
        return self.name + (":" + ",".join(changed) if changed else "")

    def train_args(self) -> list[str]:
        """The ``hvdkit.train`` flags that run this variant: ``--strategy NAME`` and one flag per
        non-default option, in the label's order (``["--strategy", "ps-sync", "--num-servers", "2"]``;
        a bool is ``--x`` or ``--no-x``). Options at their defaults are left to the declarations."""
        args = ["--strategy", self.name]
        for o in sorted(self.cls.options, key=lambda o: o.name):
            v = self.opts[o.name]
            if v == o.default:
                continue
            if o.type is bool:
                args.append(o.flag if v else "--no-" + o.flag[2:])
            else:
                args += [o.flag, _text(v)]
        return args

    @property
    def layout(self) -> str:
        """The row's layout at these options (``replicas``, ``dedicated``, ``colocated``, ``pipeline``, ``tf-ps``)."""
        return self.cls.layout_for(self.opts)

    @property
    def traffic(self) -> str | None:
        """Name of the :mod:`hvdkit.costs` function pricing one step (``ring_allreduce_time``, ...), or None."""
        return self.cls.traffic_for(self.opts)

    @property
    def lockstep(self) -> bool:
        """The row's ``lockstep``: False for the asynchronous ps modes (each worker at its own pace)."""
        return bool(self.cls.lockstep)

    @property
    def staleness_bound(self) -> int | None:
        """The row's ``staleness_bound``: 0 for lockstep rows, s for ps-ssp, None where unbounded."""
        return self.cls.staleness_bound(self.opts)

    def ranks(self, workers: int) -> int:
        """MPI ranks a job with ``workers`` training workers needs (the row's ``ranks_for``).

        Raises:
            UsageError: ``workers`` < 1, or a count the row cannot run (a one-process row and N > 1).
        """
        return self.cls.ranks_for(workers, self.opts)

    def servers(self, workers: int) -> int:
        """Dedicated server ranks in that job (the row's ``servers_for``; 0 where none)."""
        return self.cls.servers_for(workers, self.opts)

    def __eq__(self, other) -> bool:
        return isinstance(other, Variant) and other.label == self.label

    def __hash__(self) -> int:
        return hash(self.label)

    def __str__(self) -> str:
        return self.label

    def __repr__(self) -> str:
        return f"Variant({self.label!r})"


def parse_variant(text: str | Variant) -> Variant:
    """The :class:`Variant` spelt ``NAME[:option=value,...]`` (module docstring); a Variant is returned as is.
    A text is parsed once per process and row: the same text again gives the same object (so a
    report over many rows of one variant does not parse it per row; its ``opts`` are not to change).

    Raises:
        UsageError: one line starting ``variant 'TEXT': ``: an unknown strategy (the message lists
            the registered ones), an option the row does not have (lists the row's options), an
            option given twice or without a value, a value its Option refuses (the Option's own
            message, e.g. ``--num-servers=0 must be >= 1``), or a combination the row refuses
            (:meth:`~hvdkit.strategies.base.Strategy.check_options`).
    """
    if isinstance(text, Variant):
        return text
    if not isinstance(text, str):
        raise UsageError(f"a strategy variant is a string NAME[:option=value,...], not {text!r}")
    name = text.strip().partition(":")[0].strip()
    if name not in STRATEGIES:
        raise UsageError(f"variant {text!r}: unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}")
    return _parse(text, STRATEGIES[name])


@functools.lru_cache(maxsize=1024)
def _parse(text: str, cls: type) -> Variant:
    """:func:`parse_variant` of ``text`` naming row ``cls`` (cached per text and row; errors are not)."""
    where = f"variant {text!r}"
    name, sep, rest = text.strip().partition(":")
    name = name.strip()
    by_name = {o.name: o for o in cls.options}
    given: dict[str, Any] = {}
    for token in (rest.split(",") if sep else []):
        key, eq, raw = (s.strip() for s in token.partition("="))
        if not eq or not key:
            raise UsageError(f"{where}: expected option=value after ':', got {token.strip()!r} "
                             f"(e.g. {name}:{next(iter(by_name), 'option')}=VALUE)")
        if key not in by_name:
            known = f"its options: {', '.join(by_name)}" if by_name else "it takes no options"
            raise UsageError(f"{where}: {name} has no option {key!r}; {known}")
        if key in given:
            raise UsageError(f"{where}: option {key!r} is given twice")
        if not raw:
            raise UsageError(f"{where}: option {key!r} has no value ({key}=VALUE)")
        given[key] = by_name[key].convert(raw, where)
    opts = {}
    for o in cls.options:
        value = given.get(o.name, o.default)
        try:
            opts[o.name] = o.validate(value)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
    try:
        cls.check_options(opts)   # the combinations a run refuses (Strategy.check_options)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return Variant(name, opts)


def split_variants(text: str) -> list[str]:
    """A comma-separated list of variants as one string per variant, the continuation rule applied:
    a token with ``=`` and no ``:`` belongs to the variant before it. Empty tokens are skipped.

    ``"ps-ssp:staleness=4,num_servers=2,ring"`` -> ``["ps-ssp:staleness=4,num_servers=2", "ring"]``.

    Raises:
        UsageError: the list starts with an ``option=value`` token (no strategy before it).
    """
    out: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if "=" in token and ":" not in token:
            if not out:
                raise UsageError(f"strategy list {text!r}: {token!r} has no strategy before it; write "
                                 f"NAME:{token}")
            out[-1] += ("," if ":" in out[-1] else ":") + token
        else:
            out.append(token)
    return out


def parse_variants(text: str | Iterable[str], parse: Callable[[str], Any] = parse_variant,
                   choices: Iterable[str] | None = None) -> list:
    """Every variant of a comma-separated list (or of each string of an iterable of such lists),
    in order (:func:`split_variants`, then ``parse`` of each).

    Args:
        parse: one variant's text -> an object with a ``label`` (default :func:`parse_variant`:
            :class:`Variant`; ``hvdkit advise`` passes its own, which knows its own rows too).
        choices: the names an empty list's message offers (default: the registry's).

    Raises:
        UsageError: as ``parse``; also an empty list, or one variant listed twice (two spellings
            of one label count as twice).
    """
    texts = [text] if isinstance(text, str) else list(text)
    out: list = []
    for t in texts:
        for one in split_variants(t):
            v = parse(one)
            if any(v.label == w.label for w in out):
                raise UsageError(f"strategy list {', '.join(texts)!r}: {v.label} is listed twice")
            out.append(v)
    if not out:
        raise UsageError(f"strategy list {', '.join(texts)!r}: no strategy given; choose from "
                         f"{', '.join(STRATEGIES if choices is None else choices)}")
    return out


def default_variants() -> list[Variant]:
    """One variant per registered row, at its defaults, in the registry's order."""
    return [parse_variant(name) for name in STRATEGIES]
