"""``hvdkit-bench figures [--check] [DIR]``: every measurement table is generated from its JSON, never typed.

For every ``*.json`` under DIR (default ``benchmarks/reference``, subdirectories included) the
table file of the same stem beside it, ``<stem>.md``, is written by the reporting code of the
benchmark that measured it (:data:`GENERATORS`, chosen by the JSON's content, so a new fair
directory needs nothing here). Each table shows the medians with the spread the JSON holds
([min-max] or the IQR), units in the headers, and a caption with the command, date and place
from the JSON's meta. Formulas (busbw, the alpha-beta costs): docs/performance.md.

    hvdkit-bench figures                      # rewrite the stale tables (and index) of benchmarks/reference
    hvdkit-bench figures --check              # write nothing; exit 1 naming each stale or missing table

An advise-check JSON's table is regenerated as ``hvdkit-bench advise-check`` writes it, from the
inputs the JSON names. Files in :data:`SKIP` are not tables. Where documents carry a ``reference``
block (``question``, ``commit``), DIR's ``index.md`` lists them (:func:`index`).

Exit status: 0 (every table written or up to date), 1 (``--check``: some table stale or missing,
or a JSON no generator knows), 2 (DIR is not a directory, a JSON that does not read).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable, Mapping

from hvdkit.errors import UsageError
from hvdkit.results import atomic_write, read_json

__all__ = ["main", "build_parser", "GENERATORS", "SKIP", "Generator", "generator_for", "render", "table_path", "json_files"]

PROG = "hvdkit-bench figures"
DEFAULT_DIR = os.path.join("benchmarks", "reference")

#: JSON files under DIR (paths relative to it, "/"-separated) that hold no table, with the reason (a
#: --timeline trace, say, which plot-timeline draws); the reference set has none
SKIP: dict[str, str] = {}


def _meta(doc: Mapping) -> Mapping:
    m = doc.get("meta")
    return m if isinstance(m, Mapping) else {}


def _bench(doc: Mapping) -> str:
    return str(doc.get("benchmark") or _meta(doc).get("benchmark") or "")


def _where(m: Mapping) -> str:
    """``DATE on HOST (C cores, load L1 L5 L15)`` of a ``host_meta`` dict (its ``date``, ``host``,
    ``cores``, ``loadavg``)."""
    load = m.get("loadavg")
    load = " ".join(f"{x:.2f}" for x in load) if isinstance(load, list) else "?"
    return f"{m.get('date', 'date not recorded')} on {m.get('host', '?')} ({m.get('cores', '?')} cores, load {load})"


def _cmd_training(doc: Mapping) -> str:
    from hvdkit.bench.report.sections import _command
    m, place = _meta(doc), doc.get("place") or {}
    cmd = _command(m["argv"]) if m.get("argv") else "hvdkit-bench training (command not recorded)"
    return f"`{cmd}`, {_where(m)}; place: {place.get('kind', '?')} `{place.get('source', '')}`"


def _cmd_cluster_collectives(doc: Mapping) -> str:
    m = _meta(doc)
    runs = m.get("runs") or [m]
    params = "; ".join(" ".join(f"--{k.replace('_', '-')} {','.join(v) if isinstance(v, list) else v}"
                                for k, v in (r.get("parameters") or {}).items() if v not in ("", None))
                       for r in runs)
    merged = f" (merged from {len(runs)} runs)" if m.get("merged") else ""
    # the hosts' CPU quota: recorded on the rows (a run without a share has none)
    quotas = sorted({r["cpus_per_host"] for r in doc.get("rows") or [] if r.get("cpus_per_host") is not None})
    quota = f" --cpus-per-host {','.join(f'{q:g}' for q in quotas)}" if quotas else ""
    return (f"`python -m hvdkit.bench.cluster_collectives` with {params or 'parameters not recorded'}{quota}{merged}, "
            f"{_where(m)}")


def _collectives_flag(key: str, value) -> str:
    """One recorded parameter of the collectives benchmark as the flag that gives it: ``park`` is
    ``--no-park`` or nothing; a per-rank list (``harness_wait`` as the first runs recorded it) is its
    one value, or ``auto`` where the ranks resolved it differently; a run without ``harness_wait``
    waited in MPI's blocking calls (``spin``)."""
    if key == "park":
        return "" if value else "--no-park"
    if key == "order" and value == "apart":   # hvdkit-bench suite --collectives-apart: one launch per method
        return ""
    if isinstance(value, list):
        values = list(dict.fromkeys(map(str, value)))
        value = values[0] if len(values) == 1 else "auto"
    return f"--{key.replace('_', '-')} {value}"


def _cmd_collectives(doc: Mapping) -> str:
    m = _meta(doc)
    hosts = sorted({h for _, h, _ in m.get("ranks") or []})
    recorded = {"harness_wait": "spin", **(m.get("parameters") or {})}   # runs before --harness-wait: blocking
    params = " ".join(f for f in (_collectives_flag(k, v) for k, v in recorded.items()) if f)
    methods = ", ".join(m.get("methods") or [])
    if (m.get("parameters") or {}).get("order") == "apart":
        return (f"`hvdkit-bench collectives -np {m.get('world_size', '?')} -- {params} --methods M` once per method "
                f"M ({methods}; `hvdkit-bench suite --collectives-apart`), date not recorded; ranks on "
                f"{', '.join(hosts) or '?'}")
    return (f"`hvdkit-bench collectives -np {m.get('world_size', '?')} -- {params}` (methods "
            f"{methods}), date not recorded; ranks on {', '.join(hosts) or '?'}")


def _cmd_recovery(doc: Mapping) -> str:
    m = _meta(doc)
    c = m.get("cluster") or {}
    return (f"`python -m tests.cluster.{'elastic_kill' if _bench(doc) == 'cluster_elastic' else 'restart_kill'}`, "
            f"{_where(m)}; emulated cluster {c.get('hosts', '?')} hosts x {c.get('slots', '?')} slot(s) at "
            f"{(c.get('bandwidth_bps') or 0) / 1e9:g} Gbit/s"
            + (f", {c['cpus_per_host']:.3g} core(s) of CPU per host" if c.get("cpus_per_host")
               else ", no CPU share per host (the hosts share this machine's cores)" if "cpus_per_host" in c else "")
            + f"; job: `{m.get('job', '?')}`")


def _cmd_timeline_cost(doc: Mapping) -> str:
    import re
    block = re.match(r"blocks of (\d+) steps", str(doc.get("interleave", "")))
    how = f" --interleave steps --block {block.group(1)}" if block else ""
    return (f"`hvdkit-bench timeline-cost -np {doc.get('world_size', '?')} --{how} --steps {doc.get('steps')} "
            f"--rounds {doc.get('rounds')}{' ' + doc['extra'] if doc.get('extra') else ''}`, "
            f"{_where(doc.get('host') or {})}")


def _cmd_horovod_transport(doc: Mapping) -> str:
    m = _meta(doc)
    cmd = (m.get("command") or "").split(": ", 1)
    when = cmd[0] if len(cmd) == 2 else "date not recorded"
    spec = m.get("spec") or {}
    up = (f"--hosts {spec.get('hosts', '?')} --bandwidth {(spec.get('bandwidth_bps') or 0) / 1e9:g}gbit "
          f"--cpus-per-host {m.get('cpus_per_host') or 'none'} --probe")
    return (f"`bash benchmarks/horovod_transport.sh {cmd[-1].split(' ', 1)[-1] if len(cmd) == 2 else 'OUT'}` inside "
            f"`hvdkit cluster run {up}`, then `python -m hvdkit.bench.horovod_transport OUT --json FILE`, {when}")


def _cmd_probe(doc: Mapping) -> str:
    spec = doc.get("spec") or {}
    return (f"`hvdkit-cluster up` ({spec.get('hosts', '?')} hosts at {(spec.get('bandwidth_bps') or 0) / 1e9:g} "
            f"Gbit/s), probed {doc.get('created', 'date not recorded')} on this machine")


@dataclass(frozen=True)
class Generator:
    """One kind of measurement JSON and its table.

    Attributes:
        name: the kind, for messages.
        match: whether a parsed JSON document is of this kind.
        title: the markdown page's title.
        caption: the one-line "measured by CMD, DATE on HOST; place" of a document.
        blocks: the document's :mod:`hvdkit.bench.report.document` blocks (import on use).
    """
    name: str
    match: Callable[[Mapping], bool]
    title: str
    caption: Callable[[Mapping], str]
    blocks: Callable[[Mapping], list]


def _lazy(module: str, name: str) -> Callable[[Mapping], list]:
    """``module.name(doc)``, imported on first use (``hvdkit-bench figures --help`` imports no table code)."""
    def blocks(doc: Mapping) -> list:
        import importlib
        return getattr(importlib.import_module(module), name)(doc)
    return blocks


_TABLES = "hvdkit.bench.report.tables"
_COLL = "hvdkit.bench.report.collective_tables"


def _is_advise_check(doc: Mapping) -> bool:
    return "held_out" in doc and "published" in doc and "inputs" in doc


#: the kinds of measurement JSON, first match wins; advise-check's are handled by :func:`render`
GENERATORS = [
    Generator("training", lambda d: _bench(d) == "training" and "summary" in d,
              "Training: samples/s, scaling efficiency and the step's split", _cmd_training,
              _lazy(_TABLES, "training_blocks")),
    Generator("cluster_collectives", lambda d: _bench(d) == "cluster_collectives",
              "Collectives on a cluster: busbw / link and time / prediction", _cmd_cluster_collectives,
              _lazy(_COLL, "cluster_blocks")),
    Generator("collectives", lambda d: _bench(d) == "collectives", "Collectives: busbw per method and size",
              _cmd_collectives, _lazy(_COLL, "collectives_blocks")),
    Generator("cluster_elastic", lambda d: _bench(d) == "cluster_elastic", "Elastic Horovod: losing and re-adding "
              "a host", _cmd_recovery, _lazy(_TABLES, "elastic_blocks")),
    Generator("cluster_restarts", lambda d: _bench(d) == "cluster_restarts", "Restarts from the last checkpoint "
              "after a host is killed", _cmd_recovery, _lazy(_TABLES, "restarts_blocks")),
    Generator("timeline_cost", lambda d: "strategies" in d and "interleave" in d, "What --timeline costs a step",
              _cmd_timeline_cost, _lazy("hvdkit.bench.timeline_cost", "blocks")),
    Generator("cluster_probe", lambda d: "probe" in d and "spec" in d, "The emulated cluster's probed links",
              _cmd_probe, _lazy(_TABLES, "probe_blocks")),
    Generator("peer", lambda d: _bench(d) == "peer", "Each hvdkit row beside a bare loop of its library",
              _lazy("hvdkit.bench.peer", "caption"), _lazy("hvdkit.bench.peer", "blocks")),
    Generator("horovod_transport", lambda d: _bench(d) == "horovod_transport",
              "Horovod over MPI and over Gloo on the same hosts", _cmd_horovod_transport,
              _lazy("hvdkit.bench.horovod_transport", "blocks")),
]


def generator_for(doc) -> Generator | None:
    """The :data:`GENERATORS` entry of a parsed JSON document, or None (advise-check's: None too)."""
    if not isinstance(doc, Mapping):
        return None
    return next((g for g in GENERATORS if g.match(doc)), None)


def table_path(json_path: str) -> str:
    """``x/y.json`` -> ``x/y.md``."""
    return os.path.splitext(json_path)[0] + ".md"


def render(json_path: str, doc=None) -> str | None:
    """The markdown table file of one measurement JSON, or None if no generator knows its kind.

    Args:
        json_path: the JSON's path (its name goes into the caption).
        doc: its parsed content (read from ``json_path`` when None).

    Raises:
        UsageError: the JSON does not read, or an advise-check JSON's inputs do not.
    """
    doc = read_json(json_path) if doc is None else doc
    if isinstance(doc, Mapping) and _is_advise_check(doc):
        from hvdkit.advise import check as advise_check
        return advise_check.render_recorded(json_path, dict(doc))[0]
    g = generator_for(doc)
    if g is None:
        return None
    from hvdkit.bench.report.document import Document, Paragraph

    name = os.path.basename(json_path)
    page = Document(g.title).add(Paragraph(f"Measured by {g.caption(doc)}. Generated from `{name}` by "
                                           f"`hvdkit-bench figures` (do not edit by hand)."), *g.blocks(doc))
    return page.markdown()


#: the reference set's index, written beside its documents
INDEX = "index.md"


def _check_caption(doc: Mapping) -> str:
    """How an advise-check document is regenerated, and on what machine its inputs were measured."""
    cmd = " ".join(["hvdkit bench advise-check", *doc["inputs"]]
                   + [f"--{k.replace('_', '-')} {doc[k]}" for k in ("transport", "at_scale") if doc.get(k)])
    one = (doc.get("summary") or {}).get("one_boot")
    machine = {True: "inputs measured in one boot of one machine", False: "inputs from different boots"}.get(
        one, "machine not recorded")
    return f"`{cmd}` (the reference set's: `hvdkit bench advise-check` with no argument); {machine}"


def _date(doc: Mapping, ref: Mapping) -> str:
    """When a document was measured: its meta's ``date`` (or its ``host`` block's), else its reference
    block's ``date`` (documents whose meta has none: a suite's collectives, a script's table)."""
    host = doc.get("host") if isinstance(doc.get("host"), Mapping) else {}
    return str(_meta(doc).get("date") or host.get("date") or ref.get("date") or "not recorded")


def _machine(doc: Mapping) -> str:
    """The machine boot that measured a document (``meta.boot_id``; an advise check's: its inputs'),
    with the host name where the meta has it."""
    m = _meta(doc)
    boots = [m.get("boot_id")] + list(m.get("boot_ids") or [])
    for ids in ((doc.get("summary") or {}).get("boots") or {}).values() if _is_advise_check(doc) else ():
        boots += list(ids)
    boot = next((b for b in boots if b), None)
    host = m.get("host") or (doc.get("host") or {}).get("host") if isinstance(doc.get("host"), Mapping) \
        else m.get("host")
    if not boot:
        return f"{host}, boot not recorded" if host else "not recorded"
    return f"{host + ', ' if host else ''}boot {str(boot)[:8]}"


def index(root: str) -> str | None:
    """The markdown index of the documents under ``root`` that carry a ``reference`` block
    (``question``, ``commit``, optional ``date``): per document its question, its table, how it was
    measured (the command and place its meta records, as its table's caption says), the date, the
    machine's boot and the commit that wrote it; None when no document carries one."""
    rows = []
    for path in json_files(root):
        doc = read_json(path)
        ref = doc.get("reference") if isinstance(doc, Mapping) else None
        if not ref:
            continue
        g = generator_for(doc)
        how = _check_caption(doc) if _is_advise_check(doc) else g.caption(doc) if g else "?"
        md = _rel(table_path(path), root)
        rows.append(f"| {ref['question']} | [{md}]({md}) | {how.replace('|', '/')} | {_date(doc, ref)} | "
                    f"{_machine(doc)} | {ref['commit']} |")
    if not rows:
        return None
    return "\n".join([
        "# Reference measurements", "",
        "One current document per question: each JSON with the table generated from it. The docs link only "
        "these. Regenerate the tables and this index with `hvdkit bench figures` (DIR defaults to "
        "benchmarks/reference); the advisor's check with `hvdkit bench advise-check --json advise_check.json --markdown "
        "advise_check.md` (no argument: this set's inputs). Generated from each document's `reference` block "
        "and meta by `hvdkit bench figures` (do not edit by hand); older runs: docs/history.md.", "",
        "| question | table | measured by (command, place) | date | machine | commit |",
        "| --- | --- | --- | --- | --- | --- |", *rows]) + "\n"


def json_files(root: str) -> list[str]:
    """Every ``*.json`` under ``root``, sorted, as paths joined to ``root``; not symbolic links (a
    directory that reuses another's measurement links to it, and its table is generated there)."""
    out = []
    for d, subdirs, files in os.walk(root):
        subdirs.sort()
        out += [os.path.join(d, f) for f in sorted(files)
                if f.endswith(".json") and not os.path.islink(os.path.join(d, f))]
    return out


def _rel(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """``hvdkit-bench figures``' parser: ``DIR`` (default ``benchmarks/reference``) and ``--check``; ``prog``: the
    name ``--help`` shows."""
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog, doc=__doc__)
    p.add_argument("dir", nargs="?", default=DEFAULT_DIR, metavar="DIR",
                   help=f"the directory of the committed measurement JSONs (default {DEFAULT_DIR})")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 with one line per stale or missing table (and per JSON no generator "
                        "knows)")
    return p


def _refresh(md: str, text: str, source: str, check: bool, fix: str, problems: list[str], written: list[str]) -> int:
    """Bring the generated page ``md`` to ``text``: 1 where it already is; else, under ``check``, a
    line in ``problems`` (missing or stale, and ``source``), or the page written atomically and
    listed in ``written``; 0 then."""
    old = open(md, encoding="utf-8").read() if os.path.exists(md) else None
    if old == text:
        return 1
    if check:
        problems.append(f"{md}: {'missing' if old is None else 'stale'} ({source}); {fix}")
    else:
        atomic_write(md, text.encode("utf-8"))
        written.append(md)
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Write (or with ``--check`` compare) every table under DIR; the exit status (module docstring).
    ``prog``: the command as typed (``hvdkit bench figures``)."""
    from hvdkit.cliparse import print_error

    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    if not os.path.isdir(a.dir):
        print(f"{PROG}: error: {a.dir!r} is not a directory; give the directory of the measurement JSONs "
              f"(default {DEFAULT_DIR})", file=sys.stderr)
        return 2
    fix = f"run `{PROG}{'' if a.dir == DEFAULT_DIR else ' ' + a.dir}`"
    problems, written, current = [], [], 0
    for path in json_files(a.dir):
        rel = _rel(path, a.dir)
        if rel in SKIP:
            continue
        try:
            text = render(path)
        except UsageError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2
        md = table_path(path)
        if text is None:
            problems.append(f"{path}: no table generator knows this JSON; add one to "
                            f"hvdkit.bench.report.reference.GENERATORS or list the file in its SKIP")
            continue
        current += _refresh(md, text, f"from {os.path.basename(path)}", a.check, fix, problems, written)
    text = index(a.dir)
    if text is not None:
        current += _refresh(os.path.join(a.dir, INDEX), text, "the index of the reference blocks", a.check, fix,
                            problems, written)
    for line in problems:
        print(line)
    for md in written:
        print(f"wrote {md}")
    print(f"# {PROG}: {current} up to date, {len(written)} written, {len(problems)} to fix under {a.dir}",
          file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
