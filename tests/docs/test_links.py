"""Every relative link and image of README.md and docs/*.md resolves to a file, and every
``#anchor`` to a heading of its page.

A generated figure table (``benchmarks/reference/**/<stem>.md``) may be missing only while the
generator that writes it (``hvdkit bench figures``) is not in the checkout and its ``<stem>.json``
is: then the link names a file the generator will write."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs import pages


def _generator_present() -> bool:
    from hvdkit.bench import cli
    return "figures" in cli.COMMANDS


def broken(page: Path) -> list[str]:
    """The unresolved links of one page, each as ``page: target (why)``."""
    out = []
    rel = page.relative_to(pages.ROOT)
    for target, _image in pages.links(page):
        if "://" in target or target.startswith(("mailto:", "//")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if path and not dest.exists():
            gen = dest.suffix == ".md" and (pages.ROOT / "benchmarks" / "reference") in dest.parents
            if not (gen and dest.with_suffix(".json").exists() and not _generator_present()):
                out.append(f"{rel}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in pages.anchors(dest):
            out.append(f"{rel}: {target} (no heading #{anchor} in {dest.name})")
    return out


@pytest.mark.parametrize("page", pages.pages(), ids=lambda p: str(p.relative_to(pages.ROOT)))
def test_links_resolve(page):
    assert not broken(page), "\n".join(broken(page))


def test_the_check_can_fail(tmp_path, monkeypatch):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n[a](missing.md) [b](#title) [c](#nowhere) ![i](img.png) `[x](no.md)`\n"
                    "```bash\n[y](no2.md)\n```\n")
    monkeypatch.setattr(pages, "ROOT", tmp_path)
    assert broken(page) == ["p.md: missing.md (no such file)", "p.md: #nowhere (no heading #nowhere in p.md)",
                            "p.md: img.png (no such file)"]


def test_slugs_as_github_makes_them():
    assert pages.slug("The container: `Dockerfile.gpu`") == "the-container-dockerfilegpu"
    assert pages.slug("Slurm: `--render slurm`") == "slurm---render-slurm"
    assert pages.slug("GPUs: one per rank, parameter servers on the CPU") == \
        "gpus-one-per-rank-parameter-servers-on-the-cpu"


def test_pages_exist():
    names = {p.name for p in pages.pages()}
    for n in ("performance.md", "benchmarks.md", "launching.md", "clusters.md", "fault-tolerance.md",
              "advise.md", "strategies.md", "compression.md", "timeline.md", "layout.md", "testing.md",
              "install.md"):
        assert n in names
