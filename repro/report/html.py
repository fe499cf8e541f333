"""Small HTML building blocks for `repro report`: escaped text, tables from DataFrames, and a page with its CSS
inline (a report opens from disk, with no server and no network)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

import pandas as pd

CSS = """
:root { --fg: #111827; --muted: #6b7280; --line: #e5e7eb; --bg: #f9fafb; --ok: #15803d; --bad: #b91c1c;
        --warn: #b45309; --accent: #1d4ed8; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); background: white; }
header { padding: 14px 24px 10px; border-bottom: 1px solid var(--line); background: var(--bg); }
header h1 { margin: 0 0 2px; font-size: 20px; }
header p { margin: 0; color: var(--muted); }
nav a { margin-right: 14px; }
main { padding: 8px 24px 40px; max-width: 1600px; }
h2 { font-size: 17px; margin: 16px 0 6px; border-bottom: 1px solid var(--line); padding-bottom: 3px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0 8px; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.muted { color: var(--muted); }
.note { color: var(--muted); font-size: 12.5px; margin: 2px 0 8px; max-width: 1100px; }
.banner { border: 1px solid; border-radius: 6px; padding: 8px 12px; margin: 10px 0; }
.banner.refused { border-color: #fca5a5; background: #fef2f2; color: var(--bad); }
.banner.warn { border-color: #fcd34d; background: #fffbeb; color: var(--warn); }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(290px, 1fr)); gap: 10px; }
.plots figure { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 6px; background: white; }
.plots figure.wide { grid-column: 1 / -1; }
.plots img { width: 100%; height: auto; display: block; }
.plots figcaption { font-size: 12px; color: var(--muted); }
.outcome { font-weight: 600; }
.resolved, .solved { color: var(--ok); }
.unresolved, .failed, .error, .timeout, .infra { color: var(--bad); }
.ungraded { color: var(--muted); }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 6px 12px; }
.pair > .cell { border: 1px solid var(--line); border-radius: 6px; padding: 6px 8px; min-width: 0; }
.pair > .head { background: var(--bg); }
.pair > .head.solved { border-top: 3px solid var(--ok); }
.pair > .head.failed { border-top: 3px solid var(--bad); }
.pair > .empty { color: var(--muted); border-style: dashed; }
.label { font-size: 11px; font-weight: 700; text-transform: uppercase; letter-spacing: .03em; color: var(--muted); }
pre { margin: 2px 0 6px; padding: 5px 7px; background: var(--bg); border-radius: 4px; white-space: pre-wrap;
      word-break: break-word; font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, monospace;
      max-height: 260px; overflow: auto; }
pre.action { background: #eff6ff; }
details > summary { cursor: pointer; color: var(--accent); }
.mask { display: flex; height: 14px; min-width: 240px; border: 1px solid var(--line); border-radius: 3px;
        overflow: hidden; }
.mask span { display: block; height: 100%; }
.mask .m0 { background: #d1d5db; }
.mask .m1 { background: #22c55e; }
.legend span { display: inline-block; width: 12px; height: 10px; margin: 0 4px 0 10px; vertical-align: middle; }
"""


def esc(value: Any) -> str:
    return escape("" if value is None else str(value))


def tag(name: str, body: str = "", **attrs: Any) -> str:
    """``<name attrs>body</name>``; ``class_`` sets ``class``; attributes with None are left out."""
    parts = [f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items() if v is not None]
    return f"<{name}{''.join(parts)}>{body}</{name}>"


def pre(text: str, class_: str | None = None) -> str:
    return tag("pre", esc(text), class_=class_)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def table(rows: Sequence[dict[str, Any]] | pd.DataFrame, html_columns: Iterable[str] = (),
          id_: str | None = None) -> str:
    """An HTML table of ``rows`` (dicts or a DataFrame); cells are escaped except in ``html_columns``."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if frame.empty:
        return tag("p", "(none)", class_="muted")
    raw = set(html_columns)
    head = "".join(tag("th", esc(c)) for c in frame.columns)
    body = []
    for record in frame.to_dict("records"):
        cells = []
        for column, value in record.items():
            if _is_number(value):
                text = "" if value != value else f"{value:.4g}" if isinstance(value, float) else str(value)  # NaN
                cells.append(tag("td", esc(text), class_="num"))
            else:
                cells.append(tag("td", str(value) if column in raw else esc(value)))
        body.append(tag("tr", "".join(cells)))
    return tag("div", tag("table", tag("thead", tag("tr", head)) + tag("tbody", "".join(body)), id=id_),
               class_="scroll")


def page(title: str, subtitle: str, body: str, nav: Sequence[tuple[str, str]] = ()) -> str:
    """A whole HTML document with the CSS inline; ``nav``: (href, text) links in the header."""
    links = tag("nav", " ".join(tag("a", esc(text), href=href) for href, text in nav)) if nav else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p>{links}</header><main>{body}</main></body></html>\n")
