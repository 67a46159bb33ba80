"""GitHub-flavoured Markdown from a list of blocks: the model card's (:mod:`.model_card`) and the reports'
(:mod:`mixln_convert.report.render`, which adds their HTML). Here, beside the card, because the writer of
every checkpoint writes one and needs nothing of the reports.

A block is ("h1"|"h2"|"p", text), ("ul", [texts]), ("table", header, rows) or ("img", file, caption).
"""


def to_markdown(blocks: list) -> str:
    """Markdown of ``blocks``; images are linked beside the file."""
    parts = []
    for kind, *content in blocks:
        if kind in ("h1", "h2"):
            parts.append(f"{'#' * int(kind[1])} {content[0]}")
        elif kind == "p":
            parts.append(content[0])
        elif kind == "ul":
            parts.append("\n".join(f"- {item}" for item in content[0]))
        elif kind == "table":
            header, rows = content
            lines = [header, ["---"] * len(header), *rows]
            cells = ([str(c).replace("|", "\\|") for c in line] for line in lines)  # a | in a label is no column
            parts.append("\n".join("| " + " | ".join(line) + " |" for line in cells))
        else:  # img
            name, caption = content
            parts.append(f"**{caption}**\n\n![{caption}]({name})")
    return "\n\n".join(parts) + "\n"
