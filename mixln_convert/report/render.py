"""report.md and a self-contained report.html (figures embedded as base64) from one list of blocks.

A block is ("h1"|"h2"|"p", text), ("ul", [texts]), ("table", header, rows) or ("img", file, caption);
text may hold `code` spans. The Markdown is :mod:`mixln_convert.io.markdown`'s, the model card's too.
"""

import base64
import html
import re
import statistics
from pathlib import Path

from ..io.markdown import to_markdown

MISSING = "—"  # a cell or figure the input does not have


def mean_and_range(values: list[float], form: str) -> str:
    """A cell of figures over seeds: 'mean [min, max]' in ``form``, the value alone for one seed."""
    text = form.format(statistics.mean(values))
    return text + (f" [{form.format(min(values))}, {form.format(max(values))}]" if len(values) > 1 else "")


def _inline_html(text: str) -> str:
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(str(text)))


def to_html(blocks: list, folder: Path) -> str:
    """HTML of ``blocks`` with the images of ``folder`` embedded, so the file stands alone."""
    body = []
    for kind, *content in blocks:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{_inline_html(content[0])}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in content[0]) + "</ul>")
        elif kind == "table":
            header, rows = content
            head = "".join(f"<th>{_inline_html(c)}</th>" for c in header)
            cells = "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in row) + "</tr>" for row in rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
        else:  # img
            name, caption = content
            data = base64.b64encode((folder / name).read_bytes()).decode()
            body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
                        f"<figcaption>{_inline_html(caption)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}"
             "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
             "img{max-width:100%}figcaption{color:#555}code{background:#f3f3f3}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Mix-LN comparison</title>'
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(folder: Path, blocks: list) -> None:
    """``folder``/report.md and report.html of ``blocks``; the images they show are in ``folder`` already."""
    (folder / "report.md").write_text(to_markdown(blocks))
    (folder / "report.html").write_text(to_html(blocks, folder))
