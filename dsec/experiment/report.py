"""The goodput experiment as one self-contained HTML page, and seeds combined."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from dsec.experiment.arms import arms_of
from dsec.report import svg_chart

NUMERIC = ("interruptions", "recovery_mean_s", "recovery_p95_s", "unrecovered", "lost_work_s",
           "effective_training_time_ratio", "steps", "steps_per_s", "gpu_utilisation",
           "final_mean_return", "return_auc", "degraded_ratio", "steps_skipped")


def combine_seeds(runs: list[dict]) -> dict:
    """Means over seeds of each arm's numbers, their spread (the sample standard
    deviation over seeds), and each seed's own beside them."""
    combined: dict = {"per_seed": runs}
    for arm in arms_of(runs[0]):
        arm_out: dict = {}
        for name in NUMERIC:
            values = [r[arm][name] for r in runs if r[arm].get(name) is not None]
            arm_out[name] = round(float(np.mean(values)), 4) if values else None
            arm_out[f"{name}_std"] = round(float(np.std(values, ddof=1)), 4) \
                if len(values) > 1 else None
            arm_out[f"{name}_by_seed"] = [r[arm].get(name) for r in runs]
        curves = [r[arm]["return_curve"] for r in runs]
        arm_out["return_curve"] = [
            round(float(np.mean([c[i] for c in curves if c[i] is not None])), 2)
            if any(c[i] is not None for c in curves) else None
            for i in range(len(curves[0]))
        ]
        combined[arm] = arm_out
    combined["run"] = {**runs[0]["run"], "seeds": [r["run"]["seed"] for r in runs]}
    return combined


def placement_rows(off: list[dict], on: list[dict], arms: tuple[str, ...]) -> list[dict]:
    """Per seed and arm, the runs without (``off``) and with (``on``) placement side by
    side: ``interruptions_off``, ``interruptions_on``, ``restarts_off``, ... The runs are
    in the same seed order."""
    rows = []
    for without, placed in zip(off, on, strict=True):
        for arm in arms:
            row: dict = {"seed": without["run"]["seed"], "arm": arm}
            for setting, run in (("off", without), ("on", placed)):
                restarts = run[arm].get("placement") or {}
                row[f"interruptions_{setting}"] = run[arm].get("interruptions")
                row[f"restarts_{setting}"] = restarts.get("restarts")
                row[f"restarts_on_leaky_model_{setting}"] = restarts.get(
                    "restarts_on_leaky_model")
            rows.append(row)
    return rows


def _curve_chart(curve: list[float | None]) -> str:
    values = [v if v is not None else 0.0 for v in curve]
    return svg_chart("line", [str(i) for i in range(len(values))], values, width=440, height=180)


def _timeline_svg(actions: list[dict], exits: list[dict], workers: int, duration_s: float,
                  width: int = 900) -> str:
    """Per-worker rows: actions applied (ticks), deaths (red crosses)."""
    row_h, pad = 18, 60
    height = row_h * workers + 30
    colours = {"snapshot": "#4878a8", "memory_cap": "#2a9d4b", "precision": "#d08c00",
               "grad_compression": "#8e44ad", "grad_accumulation": "#c0392b",
               "sampler": "#555", "sync_priority": "#16a085"}

    def x_of(t: float) -> float:
        return pad + max(0.0, min(t, duration_s)) / duration_s * (width - pad - 10)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for w in range(workers):
        y = 10 + w * row_h
        parts.append(f'<text x="2" y="{y + 12}" font-size="11">worker {w}</text>'
                     f'<line x1="{pad}" y1="{y + 8}" x2="{width - 10}" y2="{y + 8}" '
                     'stroke="#eee"/>')
    for action in actions:
        y = 10 + int(action["worker"]) * row_h
        colour = colours.get(action["kind"], "#000")
        parts.append(f'<rect x="{x_of(action["t"]):.1f}" y="{y + 2}" width="3" height="12" '
                     f'fill="{colour}"><title>{html.escape(action["kind"])} at '
                     f'{action["t"]:.1f} s</title></rect>')
    for death in exits:
        y = 10 + int(death["worker"]) * row_h
        x = x_of(death["t"])
        parts.append(f'<text x="{x - 4:.1f}" y="{y + 13}" font-size="13" fill="#c00">'
                     f'&#x2716;<title>{html.escape(death["cause"])} at {death["t"]:.1f} s'
                     '</title></text>')
    parts.append(f'<text x="{pad}" y="{height - 4}" font-size="11">0 s</text>'
                 f'<text x="{width - 60}" y="{height - 4}" font-size="11">'
                 f'{duration_s:.0f} s</text></svg>')
    legend = " ".join(f'<span style="color:{c}">&#9632; {k}</span>' for k, c in colours.items())
    return "".join(parts) + f"<p style='font-size:12px'>{legend} " \
        "<span style='color:#c00'>&#x2716; death</span></p>"


def _with_spread(arm: dict, name: str) -> str:
    spread = arm.get(f"{name}_std")
    return html.escape(str(arm.get(name)) if spread is None else f"{arm.get(name)} ± {spread}")


PER_SEED = ("interruptions", "recovery_mean_s", "effective_training_time_ratio",
            "steps_per_s", "final_mean_return", "return_auc", "degraded_ratio")


def render_report(result: dict, runs: list[dict]) -> str:
    run = result["run"]
    arms = arms_of(result)
    rows = "".join(
        f"<tr><td>{name}</td>"
        + "".join(f"<td>{_with_spread(result[arm], name)}</td>" for arm in arms)
        + "</tr>" for name in NUMERIC)
    per_seed = "".join(
        f"<tr><td>{r['run']['seed']}</td><td>{html.escape(str(r['run']['scenario']))}</td>"
        f"<td>{arm}</td>"
        + "".join(f"<td>{html.escape(str(r[arm].get(name)))}</td>" for name in PER_SEED)
        + "</tr>" for r in runs for arm in arms)
    causes = "".join(
        f"<tr><td>{arm}</td><td>{html.escape(str(r[arm].get('causes')))}</td>"
        f"<td>{html.escape(str(r[arm].get('actions')))}</td>"
        f"<td>{html.escape(str(r[arm].get('actions_not_applied')))}</td>"
        f"<td>{html.escape(str(r[arm].get('policy_decisions')))}</td></tr>"
        for r in runs for arm in arms)
    curves = "".join(
        f"<div style='display:inline-block;margin-right:1em'><h3>{arm}</h3>"
        f"{_curve_chart(result[arm]['return_curve'])}</div>" for arm in arms)
    timelines = []
    for r in runs:
        for arm in arms:
            timelines.append(
                f"<h3>{arm}, seed {r['run']['seed']}</h3>" + _timeline_svg(
                    r[arm].get("action_timeline", []), r[arm].get("deaths", []),
                    r["run"]["workers"], r["run"]["duration_s"]))
    per_worker = "".join(
        f"<tr><td>{arm}</td><td>{r['run']['seed']}</td><td>{w}</td>"
        + "".join(f"<td>{v}</td>" for v in stats.values()) + "</tr>"
        for r in runs for arm in arms for w, stats in r[arm].get("per_worker", {}).items())
    style = ("body{font-family:sans-serif;margin:2em;max-width:1100px}"
             "table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:2px 6px}")
    title = (f"goodput: {run['scenario']}, {run['workers']} workers, "
             f"{run['duration_s']:.0f} s, seeds {run.get('seeds', [run['seed']])}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>"
        "<p>The same cluster, faults and seeds under three arms. plain: every dsec policy in "
        "dry run (dsec observes only); a dead worker's group resumes from its last full "
        "checkpoint. strong: dsec observes only; each worker checkpoints asynchronously at "
        "dsec's snapshot interval, and only the failed worker restarts (the survivors keep "
        "their weights), with a progress watchdog for hangs. dsec: the strong arm's launcher "
        "with dsec's policies acting; it resumes from dsec snapshots.</p>"
        "<h2>Side by side</h2><table><tr><th>measure</th>"
        + "".join(f"<th>{arm}</th>" for arm in arms) + "</tr>"
        f"{rows}</table><h2>Per seed</h2><table><tr><th>seed</th><th>scenario</th>"
        "<th>arm</th>" + "".join(f"<th>{name}</th>" for name in PER_SEED) + "</tr>"
        f"{per_seed}</table><h2>Return curves (mean episode return per twelfth of the run)</h2>"
        f"{curves}<h2>Actuation timeline and deaths</h2>{''.join(timelines)}"
        "<h2>Causes, actions applied, policy decisions</h2><table><tr><th>arm</th>"
        "<th>interruption causes</th><th>actions applied</th>"
        f"<th>not applied (deferred, unsupported, …)</th><th>decisions</th></tr>{causes}"
        "</table><h2>Per worker</h2><table><tr><th>arm</th><th>seed</th><th>worker</th>"
        "<th>interruptions</th><th>productive s</th><th>lost work s</th><th>updates kept</th>"
        f"</tr>{per_worker}</table></body></html>")


def write_report(path: Path, result: dict, runs: list[dict]) -> None:
    path.write_text(render_report(result, runs))
