"""Job templates: a Slurm batch script, the benchmark suite's Slurm batch script and a Kubeflow
``MPIJob``, filled in with ``--set``.

The templates ship inside the package (``hvdkit/launch/jobs/``, package data) and are read
with :mod:`importlib.resources`, so an installed hvdkit renders them without a checkout.
A placeholder is a key in double braces, ``{{ nodes }}``. Values are put in as given but for
``venv``, a path of any characters, which the Slurm scripts get as one shell word
(:func:`shlex.quote`); ``job_name``, which Slurm reads in ``#SBATCH`` lines and the scripts put in
a default output path, is letters, digits, ``.``, ``_`` and ``-``.
"""
from __future__ import annotations

import re
import shlex
from importlib import resources
from typing import Mapping

from hvdkit.errors import UsageError

__all__ = ["TEMPLATES", "template_text", "template_values", "render_template", "render"]

_INT_KEYS = {"nodes", "gpus_per_node", "cpus_per_task", "workers", "gpus_per_worker", "np"}
#: name -> (file in the package's ``jobs/`` folder, default values)
TEMPLATES: dict[str, tuple[str, dict[str, str]]] = {
    "slurm": ("hvdkit.sbatch", {
        "job_name": "hvdkit", "nodes": "2", "gpus_per_node": "4", "cpus_per_task": "8",
        "time": "01:00:00", "venv": ".venv",
        "train_args": "--model resnet50 --dataset synthetic --epochs 1"}),
    "suite": ("hvdkit-suite.sbatch", {
        "job_name": "hvdkit-suite", "nodes": "2", "gpus_per_node": "4", "cpus_per_task": "8",
        "time": "04:00:00", "venv": ".venv", "suite_args": ""}),
    "k8s": ("mpijob.yaml", {
        "name": "hvdkit", "image": "hvdkit:gpu", "workers": "2", "gpus_per_worker": "4",
        "train_args": "--model resnet50 --dataset synthetic --epochs 1"}),
}
def _choices() -> str:
    names = list(TEMPLATES)
    return ", ".join(names[:-1]) + " or " + names[-1]


_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


def template_text(name: str) -> str:
    """The unrendered text of template ``name`` (a key of :data:`TEMPLATES`), from the package data.

    Raises:
        UsageError: an unknown template, or its file is missing from the installed package.
    """
    if name not in TEMPLATES:
        raise UsageError(f"--render {name!r}: choose {_choices()}")
    resource = resources.files("hvdkit.launch").joinpath("jobs").joinpath(TEMPLATES[name][0])
    try:
        return resource.read_text(encoding="utf-8")
    except OSError:
        raise UsageError(f"template {TEMPLATES[name][0]} is missing from the installed hvdkit package "
                         f"(hvdkit/launch/jobs/); reinstall hvdkit or pass --template PATH") from None


def template_values(name: str, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Defaults of template ``name`` updated with ``overrides``, plus derived values
    (k8s: ``np`` = workers x gpus_per_worker unless given).

    Raises:
        UsageError: an unknown template or key, or a count that is not a positive integer.
    """
    if name not in TEMPLATES:
        raise UsageError(f"--render {name!r}: choose {_choices()}")
    values = dict(TEMPLATES[name][1])
    known = set(values) | ({"np"} if name == "k8s" else set())
    for k, v in (overrides or {}).items():
        if k not in known:
            raise UsageError(f"--set {k}={v}: template {name} has no {k!r}; known: {', '.join(sorted(known))}")
        values[k] = str(v)
    if name == "k8s":
        values.setdefault("np", str(int(values["workers"]) * int(values["gpus_per_worker"]))
                          if values["workers"].isdigit() and values["gpus_per_worker"].isdigit() else "")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", values["name"]):
            raise UsageError(f"--set name={values['name']}: a Kubernetes name is lower-case letters, digits "
                             f"and '-' (e.g. hvdkit-resnet)")
    if "job_name" in values and not re.fullmatch(r"[A-Za-z0-9._-]+", values["job_name"]):
        raise UsageError(f"--set job_name={values['job_name']}: Slurm reads it in #SBATCH lines and the script puts it "
                         f"in a path; use letters, digits, '.', '_' and '-' (e.g. hvdkit-resnet)")
    if "venv" in values:   # one shell word in the scripts (VENV=...), whatever the path holds
        values["venv"] = shlex.quote(values["venv"])
    for k in _INT_KEYS & set(values):
        if not values[k].isdigit() or int(values[k]) < 1:
            raise UsageError(f"--set {k}={values[k]}: must be a positive integer")
    return values


def render_template(text: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{ key }}`` in ``text`` with ``values[key]``.

    Raises:
        UsageError: a placeholder without a value (the message names it).
    """
    missing = sorted({k for k in _PLACEHOLDER.findall(text) if k not in values})
    if missing:
        raise UsageError(f"template placeholders without a value: {', '.join(missing)}; pass --set KEY=VALUE")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def render(name: str, overrides: Mapping[str, str] | None = None, template: str | None = None) -> str:
    """Template ``name`` (a key of :data:`TEMPLATES`) rendered with its defaults and ``overrides``.

    ``template`` is a path to a file to render instead of the packaged template.

    Raises:
        UsageError: unknown template or key, bad value, or the template file is missing.
    """
    values = template_values(name, overrides)
    if template is None:
        text = template_text(name)
    else:
        try:
            with open(template) as fh:
                text = fh.read()
        except OSError as e:
            raise UsageError(f"--template {template}: cannot read it ({e.strerror})") from None
    return render_template(text, values)
