"""Human-readable forms of a what-if report: a rich console view and a self-contained HTML page.

The HTML page has no external resources (inline CSS and SVG), so it can be mailed or archived:
the DP × PP heatmap of S_w (colour scale fixed at 1.0–1.5 as in the paper's Fig. 14), S per step
and S by op type. Kineto inputs add a per-rank table (S_r with lateness, step length, busy and
NCCL time, waits and arrivals). When the verdict is ``unreliable`` every replayed table beneath it
is marked as not to be trusted (a titled warning in the console view; a banner, a ``not trusted``
tag per heading and an ``untrusted`` section in HTML).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from whatif.report import WhatIfReport

HEAT_MIN, HEAT_MAX = 1.0, 1.5
_MAX_TABLE_ROWS = 16


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f}"


_CAUSE_STYLE = {
    "none": "green",
    "unreliable": "yellow",
    "undetermined": "yellow",
}


def render_table(report: WhatIfReport) -> RenderableType:
    """A rich renderable: summary, verdict, and the main attribution tables."""
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    meta = report.meta
    summary.add_row("job", f"{report.job}  ({report.source})")
    summary.add_row(
        "layout",
        f"DP {meta.dp_size} × PP {meta.pp_size} × TP {meta.tp_size} × DSP {meta.dsp_size}"
        f" (world {meta.world_size}); {report.n_ops:,} ops, {len(report.steps)} steps",
    )
    summary.add_row("slowdown S", f"{report.slowdown:.4f}   waste {report.waste * 100:.1f} %")
    summary.add_row(
        "step time",
        f"actual {report.t_actual:.4f} s · original {report.t_original:.4f} s · "
        f"ideal {report.t_ideal:.4f} s",
    )
    summary.add_row(
        "model error",
        f"{report.model_error * 100:+.2f} %   (replay reproduces the trace to "
        f"{report.replay_error * 1e6:.1f} µs)",
    )
    summary.add_row("M_W / M_S", f"{_fmt(report.mw.value)} / {_fmt(report.ms.value)}")
    style = _CAUSE_STYLE.get(report.verdict.cause, "red")
    verdict = Panel(
        Text(report.verdict.summary),
        title=f"verdict: {report.verdict.cause}",
        border_style=style,
        box=box.ROUNDED,
    )
    parts: list[RenderableType] = [summary, verdict]
    if not report.trusted:
        parts.append(
            Panel(
                Text(f"The tables below are NOT to be trusted: {report.untrusted_reason}."),
                title="not trusted",
                border_style="bold red",
                box=box.HEAVY,
            )
        )
    tables: list[Table] = []
    if report.by_rank:
        tables.append(rank_table(report))
    tables.append(_ranked("S by op type (S_t)", "op type", report.by_optype.items()))
    tables.append(
        _ranked("S by PP stage (S_pp)", "stage", ((str(k), v) for k, v in report.by_stage.items()))
    )
    tables.append(
        _ranked(
            "S by DP rank (S_dp)", "dp rank", ((str(k), v) for k, v in report.by_dp_rank.items())
        )
    )
    workers = Table(title="top workers (S_w)", box=box.SIMPLE_HEAD)
    for col in ("stage", "dp rank", "rank", "S_w ≈ min", "S_w exact"):
        workers.add_column(col, justify="right")
    top = sorted(report.by_worker, key=lambda w: w.slowdown, reverse=True)[:8]
    for w in top:
        workers.add_row(
            str(w.stage),
            str(w.dp_rank),
            str(w.rank) if w.rank >= 0 else "-",
            _fmt(w.slowdown),
            _fmt(w.exact),
        )
    tables.append(workers)
    steps = Table(title="S per step", box=box.SIMPLE_HEAD)
    for col in ("step", "recorded s", "actual s", "original s", "ideal s", "S"):
        steps.add_column(col, justify="right")
    shown = (
        report.per_step
        if len(report.per_step) <= _MAX_TABLE_ROWS
        else [*report.per_step[: _MAX_TABLE_ROWS // 2], *report.per_step[-_MAX_TABLE_ROWS // 2 :]]
    )
    for s in shown:
        steps.add_row(
            str(s.step),
            f"{s.recorded:.4f}",
            f"{s.actual:.4f}",
            f"{s.original:.4f}",
            f"{s.ideal:.4f}",
            f"{s.slowdown:.4f}",
        )
    tables.append(steps)
    if report.whatifs:
        table = Table(title="what-ifs", box=box.SIMPLE_HEAD)
        for col in ("what-if", "step time s", "speed-up", "S after"):
            table.add_column(col, justify="right")
        for result in report.whatifs:
            table.add_row(
                result.name,
                f"{result.step_time:.4f}",
                f"{result.speedup:.4f}×",
                f"{result.slowdown_after:.4f}",
            )
        tables.append(table)
    for table in tables:
        if not report.trusted:
            table.title = f"{table.title} [NOT TRUSTED]"
            table.title_style = "bold red"
            table.min_width = len(str(table.title)) + 2  # the mark stays on the title's line
    parts.extend(tables)
    if report.notes:
        parts.append(Text("notes:\n" + "\n".join(f"  • {n}" for n in report.notes), style="dim"))
    return Group(*parts)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if math.isfinite(seconds) else "n/a"


def rank_table(report: WhatIfReport, limit: int = _MAX_TABLE_ROWS) -> Table:
    """The per-rank table of a Kineto input, highest S_r first."""
    table = Table(title="per rank: S_r (as recorded, lateness included)", box=box.SIMPLE_HEAD)
    columns = (
        "rank",
        "dp",
        "stage",
        "S_r",
        "S_w",
        "step ms",
        "busy ms",
        "NCCL ms",
        "waited ms",
        "last",
        "made wait ms",
        "of it CPU ms",
    )
    for col in columns:
        table.add_column(col, justify="right")
    rows = sorted(report.by_rank, key=lambda r: (-r.slowdown, r.rank))
    for r in rows[:limit]:
        table.add_row(
            str(r.rank),
            str(r.dp_rank),
            str(r.stage),
            _fmt(r.slowdown, 4),
            _fmt(r.durations, 4),
            _ms(r.step_s),
            _ms(r.busy_s),
            _ms(r.nccl_s),
            _ms(r.waited_s),
            f"{r.last_arrivals}/{r.collectives}",
            _ms(r.caused_wait_s),
            _ms(r.caused_wait_cpu_s),
        )
    shown = f"top {limit} of {len(rows)} shown; " if len(rows) > limit else ""
    table.caption = (
        f"{shown}S_w: durations only; times are means per step; last: collectives it reached last "
        "(of those it joined); made wait: time the others waited for it alone"
    )
    return table


def _ranked(title: str, key: str, items: Iterable[tuple[str, float]]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column(key)
    table.add_column("S", justify="right")
    table.add_column("", justify="left")
    rows = sorted(items, key=lambda kv: -kv[1])
    if len(rows) > _MAX_TABLE_ROWS:
        rows = rows[:_MAX_TABLE_ROWS]
        table.caption = f"top {_MAX_TABLE_ROWS} shown"
    for name, value in rows:
        bar = "█" * max(0, min(40, round((value - 1.0) * 100))) if math.isfinite(value) else ""
        table.add_row(str(name), _fmt(value, 4), bar)
    return table


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------


def _heat_colour(value: float) -> str:
    """The ``Reds`` colour of ``value`` on the fixed 1.0–1.5 scale."""
    if not math.isfinite(value):
        return "#eeeeee"
    t = min(1.0, max(0.0, (value - HEAT_MIN) / (HEAT_MAX - HEAT_MIN)))
    stops = [(255, 245, 240), (252, 187, 161), (251, 106, 74), (203, 24, 29), (103, 0, 13)]
    pos = t * (len(stops) - 1)
    i = min(int(pos), len(stops) - 2)
    f = pos - i
    rgb = [round(a + (b - a) * f) for a, b in zip(stops[i], stops[i + 1], strict=True)]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def heatmap_svg(matrix: Sequence[Sequence[float]]) -> str:
    """SVG heatmap: DP ranks across, PP stages down, S_w in each cell."""
    pp = len(matrix)
    dp = len(matrix[0]) if pp else 0
    cell = max(6, min(48, 900 // max(dp, 1)))
    height = max(6, min(40, 480 // max(pp, 1)))
    left, top = 60, 24
    width = left + dp * cell + 80
    total_h = top + pp * height + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" '
        'class="heatmap" role="img" aria-label="S_w heatmap">'
    ]
    label_every = max(1, dp // 16)
    for p in range(pp):
        y = top + p * height
        out.append(f'<text x="{left - 6}" y="{y + height / 2 + 4}" text-anchor="end">pp {p}</text>')
        for d in range(dp):
            value = matrix[p][d]
            x = left + d * cell
            out.append(
                f'<rect x="{x}" y="{y}" width="{cell}" height="{height}" '
                f'fill="{_heat_colour(value)}" stroke="#fff" stroke-width="0.5">'
                f"<title>stage {p}, dp {d}: S_w {_fmt(value)}</title></rect>"
            )
            if cell >= 34 and height >= 16:
                colour = "#fff" if math.isfinite(value) and value > 1.3 else "#222"
                out.append(
                    f'<text x="{x + cell / 2}" y="{y + height / 2 + 4}" '
                    f'text-anchor="middle" font-size="10" fill="{colour}">'
                    f"{_fmt(value, 2)}</text>"
                )
    for d in range(0, dp, label_every):
        out.append(
            f'<text x="{left + d * cell + cell / 2}" y="{top - 6}" text-anchor="middle" '
            f'font-size="10">{d}</text>'
        )
    out.append(
        f'<text x="{left + dp * cell / 2}" y="{total_h - 8}" text-anchor="middle">DP rank</text>'
    )
    # Colour legend.
    lx = left + dp * cell + 16
    for k in range(11):
        v = HEAT_MAX - k * (HEAT_MAX - HEAT_MIN) / 10
        out.append(
            f'<rect x="{lx}" y="{top + k * 12}" width="14" height="12" fill="{_heat_colour(v)}"/>'
        )
        if k % 5 == 0:
            out.append(f'<text x="{lx + 18}" y="{top + k * 12 + 10}" font-size="10">{v:.2f}</text>')
    out.append("</svg>")
    return "".join(out)


def bars_svg(items: Sequence[tuple[str, float]], *, baseline: float = 1.0) -> str:
    """Horizontal bars of S per label, drawn from ``baseline``."""
    row, left, width = 20, 220, 420
    finite = [v for _, v in items if math.isfinite(v)]
    hi = max([baseline + 0.01, *finite])
    lo = min([baseline, *finite])
    scale = width / (hi - lo)
    zero = left + (baseline - lo) * scale
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 70}" '
        f'height="{row * len(items) + 10}" class="bars">'
    ]
    for i, (name, value) in enumerate(items):
        y = 5 + i * row
        out.append(
            f'<text x="{left - 8}" y="{y + 14}" text-anchor="end">{html.escape(name)}</text>'
        )
        if math.isfinite(value):
            x0, x1 = sorted((zero, left + (value - lo) * scale))
            colour = "#cb181d" if value > baseline else "#3182bd"
            out.append(
                f'<rect x="{x0}" y="{y + 3}" width="{max(x1 - x0, 1)}" height="{row - 6}" '
                f'fill="{colour}"><title>{html.escape(name)}: {value:.4f}</title></rect>'
            )
            out.append(
                f'<text x="{max(x1, zero) + 4}" y="{y + 14}" font-size="11">{value:.4f}</text>'
            )
    out.append(
        f'<line x1="{zero}" x2="{zero}" y1="0" y2="{row * len(items) + 10}" stroke="#555"/></svg>'
    )
    return "".join(out)


def steps_svg(steps: Sequence[int], values: Sequence[float]) -> str:
    """S per step as a line with dots (x: step order, labelled by step id)."""
    width, height, left, bottom, top = 760, 220, 50, 30, 10
    finite = [v for v in values if math.isfinite(v)] or [1.0]
    lo, hi = min(1.0, *finite), max(finite) * 1.02 + 1e-9
    n = max(len(values) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        x = left + i * (width - left - 10) / n
        y = top + (hi - v) / (hi - lo) * (height - top - bottom)
        return x, y

    points = " ".join(
        f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(values) if math.isfinite(v))
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="steps">',
        f'<polyline points="{points}" fill="none" stroke="#cb181d" stroke-width="1.5"/>',
    ]
    for i, v in enumerate(values):
        if math.isfinite(v):
            x, y = xy(i, v)
            out.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#cb181d">'
                f"<title>step {steps[i]}: S {v:.4f}</title></circle>"
            )
    for v in (lo, (lo + hi) / 2, hi):
        _, y = xy(0, v)
        out.append(
            f'<text x="{left - 6}" y="{y + 4}" text-anchor="end" font-size="10">{v:.3f}</text>'
        )
        out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y}" y2="{y}" stroke="#ddd"/>')
    every = max(1, len(steps) // 12)
    for i in range(0, len(steps), every):
        x, _ = xy(i, lo)
        out.append(
            f'<text x="{x}" y="{height - 10}" text-anchor="middle" font-size="10">{steps[i]}</text>'
        )
    out.append("</svg>")
    return "".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;
max-width:1100px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.kpi{display:inline-block;margin:8px 18px 8px 0;padding:10px 14px;background:#f6f6f6;
border-radius:6px}
.kpi b{display:block;font-size:20px}
.verdict{padding:12px 16px;border-left:6px solid #cb181d;background:#fff5f0;margin:16px 0}
.verdict.none{border-color:#31a354;background:#f0fff0}
.verdict.unreliable,.verdict.undetermined{border-color:#d9a400;background:#fffbea}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 10px;text-align:right}
th{background:#f0f0f0} td:first-child,th:first-child{text-align:left}
svg text{font-family:inherit;font-size:12px;fill:#222} .notes{color:#666;font-size:13px}
.untrusted-banner{padding:12px 16px;margin:16px 0;border:2px solid #cb181d;background:#fee;
color:#67000d;font-weight:600}
.untrusted{opacity:.55;border-left:4px dashed #cb181d;padding-left:12px}
.untrusted-tag{font-size:12px;color:#cb181d;border:1px solid #cb181d;border-radius:4px;
padding:0 6px;margin-left:8px;vertical-align:middle}
"""


def render_html(report: WhatIfReport) -> str:
    """A self-contained HTML report (inline CSS and SVG, no external resources)."""
    e = html.escape
    v = report.verdict
    meta = report.meta
    kpis = [
        ("slowdown S", f"{report.slowdown:.4f}"),
        ("resource waste", f"{report.waste * 100:.1f} %"),
        ("model error", f"{report.model_error * 100:+.2f} %"),
        ("M_W", _fmt(report.mw.value)),
        ("M_S", _fmt(report.ms.value)),
        ("ideal step", f"{report.t_ideal:.3f} s"),
    ]
    evidence = "".join(
        f"<tr><td>{e(str(k))}</td><td>{e(_fmt(val) if isinstance(val, float) else str(val))}"
        "</td></tr>"
        for k, val in v.evidence.to_dict().items()
        if k != "top_workers"
    )
    thresholds = ", ".join(f"{k} = {val}" for k, val in v.thresholds.to_dict().items())
    optype_items = sorted(report.by_optype.items(), key=lambda kv: -kv[1])
    stage_items = [(f"stage {k}", val) for k, val in report.by_stage.items()]
    dp_rows = "".join(
        f"<tr><td>{k}</td><td>{val:.4f}</td></tr>"
        for k, val in sorted(report.by_dp_rank.items(), key=lambda kv: -kv[1])[:32]
    )
    workers = sorted(report.by_worker, key=lambda w: w.slowdown, reverse=True)[:10]
    worker_rows = "".join(
        f"<tr><td>{w.stage}</td><td>{w.dp_rank}</td><td>{w.rank if w.rank >= 0 else '-'}</td>"
        f"<td>{w.slowdown:.4f}</td><td>{_fmt(w.exact, 4)}</td></tr>"
        for w in workers
    )
    whatif_rows = "".join(
        f"<tr><td>{e(w.name)}</td><td>{w.step_time:.4f}</td><td>{w.speedup:.4f}×</td>"
        f"<td>{w.slowdown_after:.4f}</td></tr>"
        for w in report.whatifs
    )
    step_rows = "".join(
        f"<tr><td>{s.step}</td><td>{s.recorded:.4f}</td><td>{s.actual:.4f}</td>"
        f"<td>{s.original:.4f}</td><td>{s.ideal:.4f}</td><td>{s.slowdown:.4f}</td></tr>"
        for s in report.per_step
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in report.notes)
    tag = "" if report.trusted else '<span class="untrusted-tag">not trusted</span>'

    def h2(title: str) -> str:
        return f"<h2>{title}{tag}</h2>"

    head = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        f"<title>What-if analysis: {e(report.job)}</title><style>{_CSS}</style></head><body>",
        f"<h1>What-if straggler analysis: {e(report.job)}</h1>",
        f"<div>{e(report.source)} · DP {meta.dp_size} × PP {meta.pp_size} × TP {meta.tp_size} × "
        f"DSP {meta.dsp_size} (world {meta.world_size}) · {report.n_ops:,} ops · "
        f"{len(report.steps)} steps</div>",
        "".join(f'<div class="kpi">{e(k)}<b>{e(val)}</b></div>' for k, val in kpis),
        f'<div class="verdict {e(v.cause)}"><b>Verdict: {e(v.cause)}</b><p>{e(v.summary)}</p>'
        f"<details><summary>evidence and thresholds</summary><table>{evidence}</table>"
        f'<p class="notes">thresholds: {e(thresholds)}</p></details></div>',
    ]
    if not report.trusted:
        head.append(
            '<div class="untrusted-banner" role="alert">The tables below are not to be trusted: '
            f"{e(report.untrusted_reason or '')}.</div>"
        )
    body = []
    if report.by_rank:
        body += [h2("Per rank (S_r: as recorded, lateness included)"), _rank_html(report)]
    body += [
        h2("Per-worker slowdown S_w (DP × PP)"),
        '<p class="notes">S_w ≈ min(S_dp, S_pp); colour scale fixed at 1.0–1.5. A lone hot '
        "cell is a slow worker, a hot row a slow stage, an even tint a job-wide cause.</p>",
        heatmap_svg(report.worker_matrix()),
        h2("S per step"),
        steps_svg([s.step for s in report.per_step], [s.slowdown for s in report.per_step]),
        h2("S by op type (S_t)"),
        bars_svg(optype_items),
        h2("S by PP stage"),
        bars_svg(stage_items),
        h2("Top workers") + "<table><tr><th>stage</th><th>dp rank</th><th>rank</th>"
        f"<th>S_w ≈ min</th><th>S_w exact</th></tr>{worker_rows}</table>",
        h2("S by DP rank") + f"<table><tr><th>dp rank</th><th>S</th></tr>{dp_rows}</table>",
    ]
    if whatif_rows:
        body.append(
            h2("What-ifs") + "<table><tr><th>what-if</th><th>step time s</th>"
            f"<th>speed-up</th><th>S after</th></tr>{whatif_rows}</table>"
        )
    body.append(
        h2("Steps") + "<table><tr><th>step</th><th>recorded s</th><th>actual s</th>"
        f"<th>original s</th><th>ideal s</th><th>S</th></tr>{step_rows}</table>"
    )
    if report.trusted:
        parts = [*head, *body]
    else:
        parts = [*head, '<div class="untrusted" data-trusted="false">', *body, "</div>"]
    parts += [
        f'<h2>Notes</h2><ul class="notes">{notes or "<li>none</li>"}</ul>',
        "</body></html>",
    ]
    return "\n".join(parts)


def _rank_html(report: WhatIfReport, limit: int = 64) -> str:
    """The per-rank table (highest S_r first) as HTML."""
    rows = sorted(report.by_rank, key=lambda r: (-r.slowdown, r.rank))
    body = "".join(
        f"<tr><td>{r.rank}</td><td>{r.dp_rank}</td><td>{r.stage}</td>"
        f"<td>{_fmt(r.slowdown, 4)}</td><td>{_fmt(r.durations, 4)}</td><td>{_ms(r.step_s)}</td>"
        f"<td>{_ms(r.busy_s)}</td><td>{_ms(r.nccl_s)}</td><td>{_ms(r.waited_s)}</td>"
        f"<td>{r.last_arrivals}/{r.collectives}</td><td>{_ms(r.caused_wait_s)}</td>"
        f"<td>{_ms(r.caused_wait_cpu_s)}</td></tr>"
        for r in rows[:limit]
    )
    more = f" Top {limit} of {len(rows)} shown." if len(rows) > limit else ""
    return (
        '<table class="ranks"><tr><th>rank</th><th>dp</th><th>stage</th><th>S_r</th>'
        "<th>S_w</th><th>step ms</th><th>busy ms</th><th>NCCL ms</th><th>waited ms</th>"
        "<th>last</th><th>made wait ms</th><th>of it CPU ms</th></tr>"
        f"{body}</table>"
        '<p class="notes">S_r replays the rank as recorded (its launch delays included) with '
        "every other rank ideal; S_w its durations only. Times are means per step; last: "
        "collectives it reached last, of those it joined; made wait: time every other rank "
        f"waited for it alone, and the part where its launch itself was late.{more}</p>"
    )
