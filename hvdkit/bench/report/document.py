"""A report as a list of blocks, written out twice: as markdown and as one self-contained HTML page.

Blocks: :class:`Heading`, :class:`Paragraph`, :class:`Bullets`, :class:`Table`, :class:`Figure`
(a PNG held as bytes). :meth:`Document.markdown` links each figure's PNG file by name;
:meth:`Document.html` embeds it as a ``data:image/png;base64`` URI and styles the page with an
inline ``<style>``: no script, no external reference, so the file opens from disk anywhere.
Text is plain; inline ``**bold**`` and ```code``` are rendered in both outputs (HTML-escaped first).
"""
from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from typing import Sequence, Union

__all__ = ["Heading", "Paragraph", "Bullets", "Table", "Figure", "Document", "data_uri", "CSS"]


@dataclass
class Heading:
    """A section title; ``level`` 1 (the page title) to 4."""
    text: str
    level: int = 2


@dataclass
class Paragraph:
    """One paragraph; ``kind`` ``"note"`` or ``"verdict"`` gives it a box in HTML."""
    text: str
    kind: str = ""


@dataclass
class Bullets:
    """A bulleted list of strings."""
    items: Sequence[str]


@dataclass
class Table:
    """A table of strings; ``align`` one of ``"l"``/``"r"`` per column (default: left)."""
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    align: str = ""
    caption: str = ""


@dataclass
class Figure:
    """A PNG picture: ``name`` is its file name next to report.md (``report-scaling.png``)."""
    name: str
    png: bytes
    caption: str = ""


Block = Union[Heading, Paragraph, Bullets, Table, Figure]


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` of PNG bytes (RFC 2397)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


CSS = """
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; color: #1b1f24;
       max-width: 1150px; margin: 1.5em auto; padding: 0 1em; line-height: 1.45; font-size: 15px; }
h1 { font-size: 1.7em; border-bottom: 2px solid #2f6fb0; padding-bottom: .2em; }
h2 { font-size: 1.3em; margin-top: 1.8em; border-bottom: 1px solid #d0d7de; padding-bottom: .15em; }
h3 { font-size: 1.1em; margin-top: 1.3em; }
div.table { overflow-x: auto; margin: .6em 0 1.2em; }
table { border-collapse: collapse; font-size: 13.5px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; vertical-align: top; white-space: nowrap; }
td:last-child { white-space: normal; }
th { background: #eef2f6; text-align: left; }
tr:nth-child(even) td { background: #f8fafc; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
caption { caption-side: top; text-align: left; font-size: 13px; color: #57606a; padding-bottom: 3px; }
figure { margin: 1em 0 1.6em; }
figure img { max-width: 100%; height: auto; border: 1px solid #e1e4e8; }
figcaption { font-size: 13px; color: #57606a; }
code { background: #f1f3f5; padding: 0 3px; border-radius: 3px; font-size: 90%; }
p.note { background: #f6f8fa; border-left: 4px solid #8c959f; padding: .5em .8em; }
p.verdict { background: #eaf5ea; border-left: 4px solid #2e8540; padding: .5em .8em; font-size: 1.05em; }
p.verdict.noise { background: #fff8e5; border-left-color: #bf8700; }
"""


def _inline_html(text: str) -> str:
    t = html.escape(text, quote=False)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", t)


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


@dataclass
class Document:
    """A titled sequence of blocks (module docstring)."""
    title: str
    blocks: list = field(default_factory=list)

    def add(self, *blocks: Block) -> "Document":
        """Append blocks; returns self."""
        self.blocks.extend(blocks)
        return self

    def figures(self) -> list[Figure]:
        """The figures, in order."""
        return [b for b in self.blocks if isinstance(b, Figure)]

    def markdown(self) -> str:
        """GitHub-flavoured markdown; figures as ``![caption](name)`` links to their PNG files."""
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            if isinstance(b, Heading):
                out += ["#" * max(1, min(b.level, 6)) + " " + b.text, ""]
            elif isinstance(b, Paragraph):
                out += [("> " if b.kind else "") + b.text, ""]
            elif isinstance(b, Bullets):
                out += [f"- {i}" for i in b.items] + [""]
            elif isinstance(b, Table):
                if b.caption:
                    out += [b.caption, ""]
                al = b.align or "l" * len(b.header)
                out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
                out.append("|" + "|".join("---:" if a == "r" else "---" for a in al) + "|")
                out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
                out.append("")
            elif isinstance(b, Figure):
                out += [f"![{b.caption or b.name}]({b.name})", ""]
        return "\n".join(out).rstrip() + "\n"

    def html(self) -> str:
        """One self-contained HTML5 page (inline CSS, figures as data URIs, no script)."""
        out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
               '<meta name="viewport" content="width=device-width, initial-scale=1">',
               f"<title>{html.escape(self.title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
               f"<h1>{_inline_html(self.title)}</h1>"]
        for b in self.blocks:
            if isinstance(b, Heading):
                lv = max(2, min(b.level, 6))
                out.append(f"<h{lv}>{_inline_html(b.text)}</h{lv}>")
            elif isinstance(b, Paragraph):
                cls = f' class="{html.escape(b.kind)}"' if b.kind else ""
                out.append(f"<p{cls}>{_inline_html(b.text)}</p>")
            elif isinstance(b, Bullets):
                out.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + "</ul>")
            elif isinstance(b, Table):
                al = b.align or "l" * len(b.header)
                cls = lambda j: ' class="r"' if j < len(al) and al[j] == "r" else ""   # noqa: E731
                rows = ['<div class="table"><table>']
                if b.caption:
                    rows.append(f"<caption>{_inline_html(b.caption)}</caption>")
                rows.append("<thead><tr>" + "".join(f"<th{cls(j)}>{_inline_html(h)}</th>"
                                                   for j, h in enumerate(b.header)) + "</tr></thead><tbody>")
                for r in b.rows:
                    rows.append("<tr>" + "".join(f"<td{cls(j)}>{_inline_html(str(c))}</td>" for j, c in enumerate(r))
                                + "</tr>")
                rows.append("</tbody></table></div>")
                out.append("\n".join(rows))
            elif isinstance(b, Figure):
                alt = html.escape(b.caption or b.name)
                cap = f"<figcaption>{_inline_html(b.caption)}</figcaption>" if b.caption else ""
                out.append(f'<figure><img src="{data_uri(b.png)}" alt="{alt}">{cap}</figure>')
        out += ["</body>", "</html>", ""]
        return "\n".join(out)
