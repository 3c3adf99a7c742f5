"""The run report: `<workdir>/report.html`, one self-contained file (inline CSS, PNG plots as base64
data URIs) that opens in a browser with no server.

Sections: the headline table; success by stage and by category; output length over training (and the
SFT loss); CARE vs vanilla curves when `<workdir>/care_vs_vanilla.json` exists; harness versions and what
each changed; cost per 1,000 tasks; skipped stages with their reasons; dataset datasheets.
"""
from __future__ import annotations

import base64
import html
import io
import json
import os
from typing import Any

from mpa_jax.files import write_text

_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 18px}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}
th{background:#eef}td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #ddd;margin:6px 0}
.note{color:#666;font-style:italic}h2{border-bottom:2px solid #88a;padding-bottom:2px}"""



def _released(gate: Any) -> str:
    """The status of a released harness version, with its release-gate figures when it had a gate."""
    if not gate:
        return "released"
    return f"released (gate: {gate['candidate']:.0%} with it vs {gate['baseline']:.0%} without, {gate['tasks']} train tasks)"

def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _img(uri: str, alt: str) -> str:
    return f'<img class="plot" alt="{html.escape(alt)}" src="{uri}">'


def _table(headers: list[str], rows: list[list[Any]], cls: str = "") -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "-"


def _plots(summary: dict[str, Any], workdir: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = summary["stages"]
    names = [s["name"] for s in stages]
    cats = sorted({c for s in stages for c in s["by_category"]})
    out: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(names, [100 * s["success"] for s in stages], "o-", lw=2.5, color="k", label="Overall")
    for key, label in (("success_seen", "seen templates"), ("success_held_out", "held-out templates")):
        if any(s.get(key) is not None for s in stages):
            ax.plot(names, [100 * s[key] if s.get(key) is not None else float("nan") for s in stages], "s:", lw=2, label=label)
    for c in cats:
        ax.plot(names, [100 * s["by_category"].get(c, float("nan")) for s in stages], "o--", label=c)
    ax.set_ylabel("held-out success (%)")
    ax.set_title("Success by stage and category")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    out["success"] = _png(fig)

    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(1, len(stages))
    for i, s in enumerate(stages):
        ax.bar([j + i * width for j in range(len(cats))], [100 * s["by_category"].get(c, 0.0) for c in cats], width, label=s["name"])
    ax.set_xticks([j + width * (len(stages) - 1) / 2 for j in range(len(cats))], cats)
    ax.set_ylabel("success (%)")
    ax.set_title("Success by category, per stage")
    ax.legend(fontsize=8)
    out["categories"] = _png(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
    a1.plot(names, [s["mean_output_tokens"] for s in stages], "s-")
    a1.set_title("Mean output tokens per episode")
    a1.grid(alpha=0.3)
    for name, losses in summary.get("training_losses", {}).items():
        if losses:
            a2.plot(range(1, len(losses) + 1), losses, label=name)
    rl = summary.get("rl", {})
    if any(rl.values()):  # RL output length over the rounds' steps, on a twin axis
        a3 = a1.twiny()
        xs, ys = [], []
        for rnd in sorted(rl):
            for h in rl[rnd]:
                if h.get("output_tokens") is not None:
                    xs.append(len(xs) + 1)
                    ys.append(h["output_tokens"])
        a3.plot(xs, ys, "^-", color="tab:red", label="RL rollouts (per RL step)")
        a3.set_xlabel("RL step (all rounds)")
        a3.legend(fontsize=8, loc="lower right")
    a2.set_title("Training loss (per log window)")
    a2.set_xlabel("log window")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3)
    out["length"] = _png(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(names, [s["cost_per_1k_tasks"] for s in stages], label="all (input+output+tools+device)")
    ax.bar(names, [s["cost_per_1k_tasks_output_only"] for s in stages], label="output tokens only")
    ax.set_title("Cost per 1,000 tasks")
    ax.legend(fontsize=8)
    out["cost"] = _png(fig)

    cv = os.path.join(workdir, "care_vs_vanilla.json")
    if os.path.exists(cv):
        with open(cv, encoding="utf-8") as f:
            curves = json.load(f)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
        for name, c in curves.items():
            a1.plot(c["step"], [100 * x for x in c["success"]], label=name)
            a2.plot(c["step"], c["output_tokens"], label=name)
        a1.set_title("success (%) over RL steps")
        a2.set_title("output tokens over RL steps")
        a1.legend()
        a2.legend()
        out["care"] = _png(fig)
    else:  # the PNG `mpa experiment care-vs-vanilla` writes, when it was run into this workdir
        for cand in (os.path.join(workdir, "care_vs_vanilla.png"), os.path.join(workdir, "care_vs_vanilla", "care_vs_vanilla.png")):
            if os.path.exists(cand):
                with open(cand, "rb") as f:
                    out["care"] = "data:image/png;base64," + base64.b64encode(f.read()).decode()
                break
    return out


def render_report(summary: dict[str, Any], workdir: str) -> str:
    """The report's HTML for `summary` (the loop's summary.json)."""

    p = _plots(summary, workdir)
    stages = summary["stages"]
    cats = sorted({c for s in stages for c in s["by_category"]})
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>MPA-JAX run report: {html.escape(summary.get('config', ''))}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>MPA-JAX closed loop: {html.escape(summary.get('config', ''))}</h1>",
             f"<p>Held-out success on {summary['heldout_tasks']} {html.escape(summary['split'])} tasks (greedy unless k &gt; 1).</p>",
             "<h2 id='headline'>Headline</h2>",
             _table(["stage", "overall", "seen templates", "held-out templates"] + cats + ["partial score", "output tokens", "tool calls", "weights", "harness", "overall, harness off"],
                    [[s["name"], _pct(s["success"]), _pct(s.get("success_seen")), _pct(s.get("success_held_out"))] + [_pct(s["by_category"][c]) if c in s["by_category"] else "-" for c in cats]
                     + [f"{s['partial_score']:.3f}", f"{s['mean_output_tokens']:.1f}", f"{s['mean_tool_calls']:.2f}",
                        s["weight_version"], s["harness_version"], _pct(s.get("success_harness_off", s["success"]))] for s in stages],
                    "headline"),
             f"<pre>{html.escape(format_headline(summary))}</pre>",
             "<h2 id='success'>Success by round and category</h2>", _img(p["success"], "success by stage"), _img(p["categories"], "success by category"),
             "<h2 id='length'>Output length over training</h2>", _img(p["length"], "output length and loss"),
             "<h2 id='care'>CARE vs vanilla RL</h2>",
             _img(p["care"], "CARE vs vanilla") if "care" in p else "<p class='note'>Not run in this loop (no care_vs_vanilla.json).</p>",
             "<h2 id='harness'>Harness versions</h2>"]
    hrows = []
    for h in summary.get("harness", []):
        changes = "; ".join(str(c) for c in h.get("changes", [])) or "-"
        top = ", ".join(f"{c['tool']}:{c['error']} x{c['count']}" for c in h.get("clusters", [])[:3]) or "-"
        hrows.append([h["round"], h.get("version", "none"), changes, h.get("failures", 0), top, h.get("skipped", "") or _released(h.get("gate"))])
    parts.append(_table(["round", "version", "changes", "failures mined", "top clusters", "status"], hrows, "harness") if hrows
                 else "<p class='note'>No rounds run.</p>")
    parts += ["<h2 id='cost'>Cost per 1,000 tasks</h2>", _img(p["cost"], "cost per 1000 tasks")]
    crow = []
    for s in stages:
        try:
            with open(s["eval_json"], encoding="utf-8") as f:
                c = json.load(f)["harness"][s.get("harness_mode", "off")]["overall"]["cost_per_1k_tasks"]
        except (OSError, KeyError, ValueError):
            c = {"input_tokens": float("nan"), "output_tokens": float("nan"), "tool_calls": float("nan"), "device_seconds": float("nan")}
        crow.append([s["name"], f"{c['input_tokens']:.4f}", f"{c['output_tokens']:.4f}", f"{c['tool_calls']:.4f}",
                     f"{c['device_seconds']:.4f}", f"{s['cost_per_1k_tasks']:.4f}", f"{s['cost_per_1k_tasks_output_only']:.4f}"])
    parts.append(_table(["stage", "input tokens", "output tokens", "tool calls", "device s", "total", "output only (seed's figure)"], crow, "cost"))
    parts.append("<h2 id='skipped'>Skipped stages</h2>")
    parts.append(_table(["stage", "reason"], [[s["stage"], s["reason"]] for s in summary.get("skipped", [])], "skipped")
                 if summary.get("skipped") else "<p>None.</p>")
    parts.append("<h2 id='datasheets'>Datasheets</h2>")
    for path in summary.get("datasheets", []):
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        parts.append(f"<h3>{html.escape(str(d.get('name', path)))}</h3>")
        L = d["lengths"]
        parts.append(_table(["examples", "failures kept", "recovery traces", "drops", "sources", "mean tokens", "p90 tokens", "max tokens"],
                            [[d["examples"], d["failures"], d["recovery_traces"], json.dumps(d["drops"]), json.dumps(d["sources"]),
                              f"{L['mean']:.0f}", f"{L['p90']:.0f}", f"{L['max']:.0f}"]], "datasheet"))
        parts.append(_table(["category", "examples"], [[k, v] for k, v in d["by_category"].items()], "datasheet-cats"))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_page(path: str, title: str, parts: list[str]) -> str:
    """A self-contained HTML page (the report's CSS) of `parts` (HTML fragments: `html_table`, `png_img`, ...)."""
    text = "\n".join([f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
                      f"<h1>{html.escape(title)}</h1>", *parts, "</body></html>"])
    return write_text(path, text)


def html_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A table fragment for `write_page`."""
    return _table(headers, rows)


def png_img(path: str, alt: str) -> str:
    """A PNG file inlined as an <img> fragment for `write_page`."""
    with open(path, "rb") as f:
        return _img("data:image/png;base64," + base64.b64encode(f.read()).decode(), alt)


def write_report(workdir: str, summary: dict[str, Any]) -> str:
    """Write `<workdir>/report.html`; returns its path."""
    path = os.path.join(workdir, "report.html")
    return write_text(path, render_report(summary, workdir))


def format_headline(summary: dict[str, Any]) -> str:
    """The headline table: held-out success per stage, overall, on seen / held-out templates and per
    category, with output tokens, tool calls, cost and versions."""
    stages = summary["stages"]
    cats = sorted({c for s in stages for c in s["by_category"]})
    n_seen = next((s.get("tasks_seen") for s in stages if s.get("tasks_seen") is not None), 0)
    n_held = next((s.get("tasks_held_out") for s in stages if s.get("tasks_held_out") is not None), 0)
    head = (f"{'stage':<11}{'overall':>9}{'seen tmpl':>11}{'held-out tmpl':>15}" + "".join(f"{c:>11}" for c in cats)
            + f"{'out tok':>9}{'calls':>7}{'cost/1k':>9}  weights / harness")
    lines = [f"greedy success on the same {summary['heldout_tasks']} held-out {summary['split']} tasks, none trained on "
             f"({n_seen} of templates seen in training, {n_held} of held-out templates)", head]
    for s in stages:
        lines.append(f"{s['name']:<11}{_pct(s['success']):>9}{_pct(s.get('success_seen')):>11}{_pct(s.get('success_held_out')):>15}" + "".join(
            f"{100 * s['by_category'][c]:10.1f}%" if c in s["by_category"] else f"{'-':>11}" for c in cats)
            + f"{s['mean_output_tokens']:9.1f}{s['mean_tool_calls']:7.2f}{s['cost_per_1k_tasks']:9.4f}  {s['weight_version']} / {s['harness_version']}"
            + (f" (harness off: {_pct(s.get('success_harness_off'))})" if s.get("harness_mode") == "on" else ""))
    for rnd, hist in summary.get("rl", {}).items():
        if hist:  # the RL stage's own figures: its training rollouts, first vs last step, and the groups it kept
            kept = sum(h.get("groups_kept") or 0 for h in hist)
            drawn = sum(h.get("groups_drawn") or 0 for h in hist)
            lines.append(f"RL {rnd}: {len(hist)} steps, training success {_pct(hist[0].get('success'))} (step 1) -> {_pct(hist[-1].get('success'))}"
                         f" (step {len(hist)}), output tokens {hist[0]['output_tokens'] or 0:.0f} -> {hist[-1]['output_tokens'] or 0:.0f},"
                         f" groups kept {kept:.0f} of {drawn:.0f} drawn")
    for sk in summary["skipped"]:
        lines.append(f"skipped {sk['stage']}: {sk['reason']}")
    return "\n".join(lines)


