"""``dsec report``: the ready analysis queries (``infra/queries/*.sql``), run against the
stored history and rendered as tables, and as one self-contained HTML page with charts."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from importlib import resources

from dsec.history import query
from dsec.schemas.settings import DsecSettings


@dataclass(frozen=True)
class ReadyQuery:
    name: str
    title: str
    sql: str
    chart: tuple[str, str, str] | None  # (bar|line, x column, y column)


@dataclass(frozen=True)
class QueryResult:
    query: ReadyQuery
    columns: list[str]
    rows: list[list]


def ready_queries() -> list[ReadyQuery]:
    folder = resources.files("dsec.infra").joinpath("queries")
    found = []
    for entry in sorted(folder.iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text()
        title, chart = entry.name.removesuffix(".sql"), None
        for line in text.splitlines():
            if line.startswith("-- title:"):
                title = line.removeprefix("-- title:").strip()
            elif line.startswith("-- chart:"):
                kind, x, y = line.removeprefix("-- chart:").split()
                chart = (kind, x, y)
        found.append(ReadyQuery(entry.name.removesuffix(".sql"), title, text, chart))
    return found


def run_report(settings: DsecSettings) -> list[QueryResult]:
    results = []
    for ready in ready_queries():
        answer = query(settings, ready.sql)
        results.append(QueryResult(ready, answer["columns"], answer["rows"]))
    return results


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def svg_chart(kind: str, labels: list[str], values: list[float], width: int = 720,
              height: int = 240) -> str:
    """A small bar or line chart as inline SVG (no scripts, no network)."""
    if not values:
        return ""
    pad = 40
    top = max(max(values), 0.0)
    bottom = min(min(values), 0.0)
    span = (top - bottom) or 1.0

    def y_of(v: float) -> float:
        return pad / 2 + (top - v) / span * (height - pad)

    step = (width - 2 * pad) / max(len(values), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<line x1="{pad}" y1="{y_of(0):.1f}" x2="{width - pad}" y2="{y_of(0):.1f}" '
             'stroke="#999"/>',
             f'<text x="2" y="14" font-size="11">{top:.4g}</text>',
             f'<text x="2" y="{height - 4}" font-size="11">{bottom:.4g}</text>']
    if kind == "bar":
        for i, v in enumerate(values):
            x = pad + i * step
            y0, y1 = sorted((y_of(0), y_of(v)))
            parts.append(f'<rect x="{x + step * 0.1:.1f}" y="{y0:.1f}" width="{step * 0.8:.1f}" '
                         f'height="{max(y1 - y0, 1):.1f}" fill="#4878a8">'
                         f'<title>{html.escape(labels[i])}: {v:.4g}</title></rect>')
    else:
        points = " ".join(f"{pad + (i + 0.5) * step:.1f},{y_of(v):.1f}"
                          for i, v in enumerate(values))
        parts.append(f'<polyline points="{points}" fill="none" stroke="#4878a8" '
                     'stroke-width="2"/>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(results: list[QueryResult], title: str = "dsec training-health report") -> str:
    sections = []
    for result in results:
        ready = result.query
        chart = ""
        if ready.chart and result.rows and {ready.chart[1], ready.chart[2]} <= set(result.columns):
            x_index, y_index = (result.columns.index(ready.chart[1]),
                                result.columns.index(ready.chart[2]))
            pairs = [(str(row[x_index]), _number(row[y_index])) for row in result.rows]
            pairs = [(label, value) for label, value in pairs if value is not None]
            chart = svg_chart(ready.chart[0], [p[0] for p in pairs], [p[1] for p in pairs])
        head = "".join(f"<th>{html.escape(c)}</th>" for c in result.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
            for row in result.rows[:200]
        )
        empty = "" if result.rows else "<p><em>no rows</em></p>"
        sections.append(f"<section><h2>{html.escape(ready.title)}</h2>{chart}{empty}"
                        f"<table><tr>{head}</tr>{body}</table></section>")
    return html_page(title, sections)


def html_page(title: str, sections: list[str]) -> str:
    """One self-contained page (no scripts, no network) of ``sections`` of HTML."""
    style = ("body{font-family:sans-serif;margin:2em;max-width:1000px}"
             "table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:2px 6px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
            + "".join(sections) + "</body></html>")
