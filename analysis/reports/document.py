"""A report document built as HTML and Markdown side by side, with its figures saved beside it
(PNG and SVG) and the PNGs embedded, so the HTML file is self-contained."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Document:
    """The report being built, as HTML and Markdown side by side."""

    title: str
    figures_dir: Path
    html: list[str] = field(default_factory=list)
    markdown: list[str] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)

    def heading(self, text: str) -> None:
        self.html.append(f"<h2>{html.escape(text)}</h2>")
        self.markdown.append(f"\n## {text}\n")

    def paragraph(self, text: str) -> None:
        self.html.append(f"<p>{html.escape(text)}</p>")
        self.markdown.append(f"{text}\n")

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row)
                       + "</tr>" for row in rows)
        self.html.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        cell = lambda c: str(c).replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
                 "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
        self.markdown.append("\n".join(lines) + "\n")

    def figure(self, name: str, fig, caption: str) -> None:
        """Save ``fig`` as PNG and SVG beside the report and embed the PNG."""
        import matplotlib.pyplot as plt
        self.figures_dir.mkdir(parents=True, exist_ok=True)
        png, svg = self.figures_dir / f"{name}.png", self.figures_dir / f"{name}.svg"
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        png.write_bytes(buf.getvalue())
        fig.savefig(svg, format="svg")
        plt.close(fig)
        self.figures += [png, svg]
        data = base64.b64encode(buf.getvalue()).decode()
        self.html.append(f'<figure><img alt="{html.escape(caption)}" '
                         f'src="data:image/png;base64,{data}"><figcaption>'
                         f"{html.escape(caption)}</figcaption></figure>")
        self.markdown.append(f"![{caption}]({self.figures_dir.name}/{png.name})\n")

    def render_html(self) -> str:
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><link rel=\"icon\" href=\"data:,\">"
                f"<style>{STYLE}</style></head><body><h1>{html.escape(self.title)}</h1>"
                + "\n".join(self.html) + "</body></html>\n")

    def render_markdown(self) -> str:
        return f"# {self.title}\n" + "\n".join(self.markdown)


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;"
         "color:#222}table{border-collapse:collapse;font-size:13px;margin:1em 0}"
         "th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}"
         "th{background:#f0f0f0}td:nth-child(2){text-align:left}"
         "figure{margin:1em 0}img{max-width:100%}figcaption{font-size:13px;color:#555}")


def _fmt(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"



def json_tables(doc: Document, data, depth: int = 0) -> None:
    """Scalars as a key/value table, lists of mappings as tables, nested mappings in turn."""
    if not isinstance(data, Mapping):
        doc.paragraph(json.dumps(data)[:2000])
        return
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, (Mapping, list))]
    if scalars:
        doc.table(["", "value"], [(k, _fmt(v, 4) if isinstance(v, float) else v)
                                  for k, v in scalars])
    for key, value in data.items():
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            headers = list(dict.fromkeys(k for v in value for k in v
                                         if not isinstance(v[k], (Mapping, list))))
            doc.paragraph(f"{key}:")
            doc.table(headers, [[_fmt(v.get(h), 4) if isinstance(v.get(h), float)
                                 else v.get(h, "") for h in headers] for v in value[:40]])
        elif isinstance(value, Mapping) and depth < 2:
            doc.paragraph(f"{key}:")
            json_tables(doc, value, depth + 1)




def write_document(doc: Document, out: Path) -> list[Path]:
    """Write ``out`` (HTML) and its Markdown twin; returns them and the figure files."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc.render_html())
    markdown = out.with_suffix(".md")
    markdown.write_text(doc.render_markdown())
    return [out, markdown, *doc.figures]
