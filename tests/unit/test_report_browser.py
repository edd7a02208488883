"""The report in a real browser: Debian's chromium, headless, renders report.html from disk to a
screenshot with no console message, and every image of the page loads.

What chromium 15x prints here with ``--enable-logging=stderr --v=0`` (checked by hand with a page
holding ``console.error`` and an undefined call): every console message as
``[pid:tid:date:INFO:CONSOLE:LINE] "text", source: file:///... (LINE)``, an uncaught exception as
``... "Uncaught ReferenceError: ...``; a broken image prints nothing, so a second run loads a copy
of the page with a probe script appended that logs how many of ``document.images`` loaded (the
report itself has no script). Lines about D-Bus, VA-API and the sandbox are the browser's own.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

FIX = os.path.join(ROOT, "tests", "fixtures", "report")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")

PROBE = ('<script>window.addEventListener("load", function () { var im = document.images, ok = 0;'
         'for (var i = 0; i < im.length; i++) { if (im[i].complete && im[i].naturalWidth > 0) ok++; }'
         'console.log("HVDKIT-IMAGES " + ok + "/" + im.length); });</script>')


def _render(page, shot) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
           f"--screenshot={shot}", "--window-size=1200,3000", f"file://{page}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(shot.parent)))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"chromium did not finish within 60 s: {e.stderr}")
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


def assert_renders(page, tmp_dir, images: int | None = None) -> int:
    """Headless Chromium renders ``page`` with no console message and every image loaded (``images``
    of them when given); returns the number of images. Also used by the cluster suite test."""
    log = _render(page, tmp_dir / "report.png")
    console = [ln for ln in log.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    assert not console, "\n".join(console)
    png = (tmp_dir / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 100_000      # a 1200 x 3000 page of tables and plots

    probe = tmp_dir / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    log = _render(probe, tmp_dir / "probe.png")
    m = re.search(r'"HVDKIT-IMAGES (\d+)/(\d+)"', log)
    assert m, log[-3000:]
    assert m.group(1) == m.group(2) and (images is None or int(m.group(2)) == images), m.group(0)
    others = [ln for ln in log.splitlines() if (":CONSOLE" in ln or "Uncaught" in ln) and "HVDKIT-IMAGES" not in ln]
    assert not others, "\n".join(others)
    return int(m.group(2))


def test_chromium_renders_the_report(tmp_path):
    for name in ("training.json", "collectives.json"):
        shutil.copy(os.path.join(FIX, name), tmp_path / name)
    from hvdkit.bench.report.writer import write_report
    write_report(str(tmp_path))
    assert_renders(tmp_path / "report.html", tmp_path, images=4)
