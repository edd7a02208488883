"""The documentation pages and what the docs tests read from them (no MPI, no TensorFlow).

Pages: ``README.md`` and ``docs/*.md`` of the checkout these tests live in.

Command lines are taken from fenced code blocks whose language is ``bash``, ``sh``, ``shell`` or
``console`` (in ``console`` blocks only the lines that start with ``$ ``), with ``\\``-continued lines
joined, ``#`` comments dropped and the line split at ``&&``, ``||``, ``|`` and ``;``; and from inline
code spans that begin with ``hvdkit`` and hold a flag (``hvdkit train --model cnn``,
``hvdkit-launch --dry-run``; a span without one, ``hvdkit advise``, names a command and is not a
command line). An inline span is checked for its flags and values, not for completeness: a
required flag it leaves out, or a flag named without its value, is not an error there.

Placeholders (a line or span holding one is not checked): ``...``, ``<...>``, a bracketed optional
part (``[ARGS]``, ``[--check]``), ``|`` inside a span (``train|launch``), and, in inline spans
only, a word written in capitals (``-np NP``, ``DIR``), which stands for a value.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELLS = {"bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


def pages() -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_blocks(text: str):
    """``(language, first line number, [lines])`` of every fenced code block (indented fences too)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start, body = m.group(2), m.group(3).lower(), i + 2, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence[:3]):
            body.append(lines[i])
            i += 1
        yield lang, start, body
        i += 1


def _outside_fences(text: str):
    """The lines of ``text`` outside fenced code blocks."""
    inside, fence = False, ""
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m and (not inside or line.strip().startswith(fence[:3])):
            inside, fence = (not inside), m.group(2)
            continue
        if not inside:
            yield line


def prose(text: str) -> str:
    """The text without fenced blocks and inline code (for links and headings)."""
    return "\n".join(re.sub(r"`[^`]*`", "", line) for line in _outside_fences(text))


def _joined(body: list[str], console: bool, start: int):
    """``(line number, command text)`` of a block's lines, continuations joined."""
    buf, first = "", None
    for n, raw in enumerate(body, start):
        line = raw.rstrip()
        if console:
            if first is None and not line.lstrip().startswith("$ "):
                continue
            if first is None:
                line = line.lstrip()[2:]
        if first is None:
            first = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            yield first, buf.strip()
        buf, first = "", None
    if buf.strip():
        yield first, buf.strip()


def placeholder(text: str) -> bool:
    """True when ``text`` holds a placeholder (module docstring) and is not checked."""
    return "..." in text or bool(re.search(r"<[^>]*>", text)) or bool(re.search(r"\[[A-Z-][^\]]*\]", text))


def split_commands(text: str) -> list[list[str]]:
    """One shell line -> its simple commands, each split with shlex, redirections dropped.

    Raises:
        ValueError: shlex could not split it (an unbalanced quote).
    """
    words = shlex.split(text, comments=True)
    cmds, cur, skip = [], [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("&&", "||", "|", ";"):
            cmds.append(cur)
            cur = []
        elif w in (">", ">>", "<", "2>"):
            skip = True
        elif re.match(r"^\d?>>?&?\S*$", w):
            continue
        else:
            cur.append(w)
    cmds.append(cur)
    return [c for c in cmds if c]


def command_lines(path: Path):
    """``(where, text)`` of every checked command line of a page: ``where`` = ``page:line``."""
    text = path.read_text()
    rel = path.relative_to(ROOT)
    for lang, start, body in fenced_blocks(text):
        if lang not in SHELLS:
            continue
        for n, line in _joined(body, lang == "console", start):
            if not placeholder(line):
                yield f"{rel}:{n}", line
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            continue
        for span in re.findall(r"`(hvdkit(?:-[a-z]+)?(?: [^`]*)?)`", line):
            if not re.search(r"(^| )-", span) or "|" in span or placeholder(span) \
                    or re.search(r"(^| )[A-Z][A-Z0-9_]*\b", span):
                continue
            yield f"{rel}:{n} (inline)", span


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, inline code marks and punctuation but ``-`` and
    ``_`` dropped, spaces to ``-``."""
    h = re.sub(r"[`*]", "", heading.strip().lower())
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a page (repeated headings get ``-1``, ``-2`` as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _heading_lines(path.read_text()):
        s = slug(line)
        k = seen.get(s, 0)
        out.add(s if k == 0 else f"{s}-{k}")
        seen[s] = k + 1
    return out


def _heading_lines(text: str):
    for line in _outside_fences(text):
        h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if h:
            yield h.group(1)


def links(path: Path):
    """``(target, is_image)`` of every Markdown link and image outside code."""
    for m in re.finditer(r"(!?)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose(path.read_text())):
        yield m.group(2), bool(m.group(1))
