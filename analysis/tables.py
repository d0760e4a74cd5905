"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    """Columns padded to fit; numbers right-aligned, text left-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    numeric = [all(_is_number(row[i]) for row in cells) if cells else False
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [title] if title else []
    out += [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    return "\n".join(out)


def key_values(pairs: Sequence[tuple[str, object]], title: str = "") -> str:
    width = max((len(k) for k, _ in pairs), default=0)
    out = [title] if title else []
    out += [f"{k.ljust(width)}  {v}" for k, v in pairs]
    return "\n".join(out)


def _is_number(text: str) -> bool:
    token = text.split(" ")[0].rstrip("%x").replace(",", "")
    try:
        float(token)
        return True
    except ValueError:
        return text in ("-", "")
