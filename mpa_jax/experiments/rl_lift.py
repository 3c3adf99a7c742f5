"""`mpa experiment rl-lift`: can RL lift the planner on held-out tasks? A learning result that can fail.

    mpa experiment rl-lift --config configs/rl_lift.py --checkpoint starter --seeds 2 [--algos care,vanilla]

From one start (e.g. the shipped starter; named as every command names one, the config fitted to it:
`experiments/arms.py`), each (algo, seed) arm runs `run_rl` (its directory carries its resolved config and card) with competence-aware selection
(`configs/rl_lift.py`) in segments of `--eval-every` steps; after each segment its checkpoint is exported and
evaluated greedily, harness off, on the same dev tasks (`--seen` of templates seen in training + `--held-out`
of held-out templates; 96 + 48 by default), and a row goes to `<arm>/curve.jsonl`: step, training episodes
so far, success overall / seen / held-out, mean output tokens (of all, of successful and of failed episodes) and tool calls. Everything resumes: RL from
its last checkpoint (exact), evaluations from their eval.json. The start is evaluated once. With
`config.lift.refresh_steps` > 0 every arm starts instead from one world-general SFT refresh of the start
(`mpa_jax.sft.world_refresh`, made once into `<workdir>/refresh` and evaluated as a row of its own). `--until N`
stops every arm at step N of the `config.rl.steps` schedule (the same learning rate as a full run). Each point
also splits its successful episodes' output tokens into tool calls, reasoning and replies (`turn_split`, read
off the evaluation's trajectories), so the verdicts can say how much a length term could cut at all. At the end:
`summary.json`, `table.md` (start vs each arm's last point, seed means, the targets' verdicts; then every
point of every arm), `rl_lift.png` (success overall, seen / held-out, and output tokens against steps and
episodes) and `report.html` (all of it in one page). Target (issue 28): +8 points over the start on the
144 tasks, and CARE within 2 points of vanilla at >= 25% fewer output tokens.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from mpa_jax.experiments.arms import arm_config, fitted, prepare_arm
from mpa_jax.files import write_json, write_text


def _read_curve(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def _point(report: dict[str, Any], step: int, episodes: float) -> dict[str, Any]:
    m = report["harness"]["off"]
    o, groups = m["overall"], m["by_templates"]
    return {"step": step, "episodes": episodes, "success": o["success"],
            "success_seen": groups.get("seen", {}).get("success"), "success_held_out": groups.get("held_out", {}).get("success"),
            "output_tokens": o["mean_output_tokens"], "tool_calls": o["mean_tool_calls"],
            "output_tokens_success": o.get("mean_output_tokens_success"), "output_tokens_failure": o.get("mean_output_tokens_failure")}


def _turns(tokens: Sequence[int], loss_mask: Sequence[int]) -> list[list[int]]:
    """The planner's turns of a trajectory: its runs of loss-masked (generated) tokens."""
    turns: list[list[int]] = []
    prev = 0
    for t, m in zip(tokens, loss_mask):
        if m and not prev:
            turns.append([])
        if m:
            turns[-1].append(int(t))
        prev = m
    return turns


def _reasoning(turn: list[int], think: tuple[int, int] | None) -> int:
    """Tokens inside the turn's <think> ... </think> blocks."""
    if think is None:
        return 0
    n, inside = 0, False
    for t in turn:
        if t in think:
            inside = t == think[0]
        elif inside:
            n += 1
    return n


SPLIT_KEYS = ("tool_call_tokens_success", "reply_tokens_success", "reasoning_tokens_success", "replies_success", "shortest_reply")


def turn_split(trajs: Sequence[Any], tool_call_id: int, think: tuple[int, int] | None = None) -> dict[str, float | None]:
    """Successful episodes' output tokens split into reasoning (inside `think` = (open, close) ids), tool-call turns
    and the other turns (replies to the user), both without their reasoning, and the shortest reply of any: what a
    length term can cut without changing what the planner does is the reasoning and the replies above the shortest."""
    rows, lengths = [], []
    for t in trajs:
        if not t.verification.success:
            continue
        row = [0, 0, 0, 0]  # tool-call tokens, reply tokens, reasoning tokens, replies
        for turn in _turns(t.tokens, t.loss_mask):
            k = _reasoning(turn, think)
            row[2] += k
            if tool_call_id in turn:
                row[0] += len(turn) - k
            else:
                row[1] += len(turn) - k
                row[3] += 1
                lengths.append(len(turn) - k)
        rows.append(row)
    if not rows:
        return dict.fromkeys(SPLIT_KEYS)
    means = np.mean(np.asarray(rows, np.float64), axis=0)
    return {**dict(zip(SPLIT_KEYS[:4], map(float, means))), "shortest_reply": float(min(lengths)) if lengths else 0.0}


def _completed(point: dict[str, Any], eval_dir: str, markers: dict[str, Any] | None) -> dict[str, Any]:
    """A point gets what its evaluation's trajectories say and it lacks (read, not re-run): successes' and failures'
    output tokens (a point written before the curve kept them apart) and the successes' `turn_split`."""
    path = os.path.join(eval_dir, "off", "run0.jsonl")
    need_split = point.get("output_tokens_success") is None
    need_turns = markers is not None and any(k not in point for k in SPLIT_KEYS)
    if not (need_split or need_turns) or not os.path.exists(path):
        return point
    from mpa_jax.envs import Trajectory, read_jsonl
    from mpa_jax.eval.metrics import eval_metrics

    trajs = read_jsonl(path, Trajectory)
    point = dict(point)
    if need_split:
        o = eval_metrics(trajs)["overall"]
        point.update(output_tokens_success=o["mean_output_tokens_success"], output_tokens_failure=o["mean_output_tokens_failure"])
    if need_turns:
        point.update(turn_split(trajs, **markers))
    return point


def _markers(checkpoint: str) -> dict[str, Any] | None:
    """`turn_split`'s token ids in `checkpoint`'s tokenizer: the one that opens a tool call and the think pair
    (None: no tokenizer there, or no tool-call token in it)."""
    from mpa_jax.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(checkpoint)
    except Exception:  # noqa: BLE001 - an orbax run dir without a tokenizer: the split is left out
        return None
    if not tok.has_token("<tool_call>"):
        return None
    think = (tok.token_id("<think>"), tok.token_id("</think>")) if tok.has_token("<think>") and tok.has_token("</think>") else None
    return {"tool_call_id": tok.token_id("<tool_call>"), "think": think}


def rl_lift(config: Any, workdir: str, *, init: str | None = None, seeds: int = 2, algos: Sequence[str] = ("care",),
            eval_every: int = 25, n_seen: int = 96, n_held_out: int = 48, until: int | None = None, progress: bool = True,
            recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run every arm (resuming) and summarise; see the module docstring. The start: `init` (the config is fitted to
    it), else the one the config names (`config.model.init_from`: the CLI's `--checkpoint`). `until` stops (and
    summarises) every arm at that step of the `config.rl.steps` schedule (the learning-rate schedule stays that of
    the whole run). `recipe`: what ran it (`command`, `config_file`, `start`), for the arms' cards."""
    from mpa_jax.eval import Evaluator, select_tasks
    from mpa_jax.export import export_checkpoint
    from mpa_jax.rl.trainer import run_rl
    from mpa_jax.tokenizer.select import tokenizer_dir_for_config
    from mpa_jax.train.metrics import read_metrics

    if seeds < 1 or eval_every < 1:
        raise ValueError(f"rl-lift needs seeds >= 1 and --eval-every >= 1, got {seeds} and {eval_every}")
    schedule = int(config.rl.steps)
    steps = schedule if until is None else int(until)
    if not 0 < steps <= schedule:
        raise ValueError(f"rl-lift --until must be in 1..config.rl.steps ({schedule}), got {until}")
    os.makedirs(workdir, exist_ok=True)
    config = fitted(config, init, workdir)
    init = str(config.model.init_from)  # the start's HF directory
    if not init:
        raise ValueError("rl-lift needs a start: --checkpoint PATH|starter (an HF directory, a run directory or the starter)")
    tasks = select_tasks("dev", n_seen=n_seen, n_held_out=n_held_out, seed=int(config.tasks.seed),
                         per_template=int(config.tasks.per_template))
    ev = Evaluator(config, tasks, progress=progress)
    markers = _markers(tokenizer_dir_for_config(config, workdir) or init)
    start_dir = os.path.join(workdir, "eval", "start")
    start = _completed(_point(ev.evaluate(init, out_dir=start_dir, label="start", workdir=workdir), 0, 0.0), start_dir, markers)
    refresh, arm_base = None, config
    if int(config.lift.refresh_steps) > 0:  # every arm starts from one world-general refresh of init
        from mpa_jax.sft.world_refresh import world_refresh

        lift = config.lift
        rl_init, refresh = world_refresh(config, init, os.path.join(workdir, "refresh"), worlds=int(lift.refresh_worlds),
                                         per_template=int(lift.refresh_per_template), steps=int(lift.refresh_steps),
                                         lr=float(lift.refresh_lr), progress=progress)
        refresh_dir = os.path.join(workdir, "eval", "refresh")
        refresh["point"] = _completed(_point(ev.evaluate(rl_init, out_dir=refresh_dir, label="refresh", workdir=workdir), 0, 0.0),
                                      refresh_dir, markers)
        arm_base = fitted(config, rl_init, workdir)
    arms: dict[str, dict[int, list[dict[str, Any]]]] = {a: {} for a in algos}
    base = int(config.seed)
    for seed in range(base, base + seeds):
        for algo in algos:
            cfg = arm_config(arm_base, algo, seed)
            run_dir = os.path.join(workdir, f"{algo}-s{seed}")
            prepare_arm(cfg, run_dir, recipe)
            curve_path = os.path.join(run_dir, "curve.jsonl")
            curve = [_completed(p, os.path.join(run_dir, "eval", f"step_{p['step']}"), markers) for p in _read_curve(curve_path)]
            done = {int(p["step"]) for p in curve}
            for stop in range(eval_every, steps + 1, eval_every):
                if stop in done:
                    continue
                res = run_rl(cfg, run_dir, max_steps=stop, progress=progress)
                hf = export_checkpoint(res.checkpoint_dir, os.path.join(run_dir, "hf", f"step_{stop}"), dtype="float32",
                                       tokenizer_dir=tokenizer_dir_for_config(cfg, run_dir))
                eval_dir = os.path.join(run_dir, "eval", f"step_{stop}")
                rep = ev.evaluate(hf, out_dir=eval_dir, label=f"{algo}-s{seed}@{stop}", workdir=workdir)
                episodes = sum(float(r.get("rl/rollouts", 0.0)) for r in {int(r["step"]): r for r in read_metrics(res.metrics_path)}.values())
                point = _point(rep, stop, episodes)
                with open(curve_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(point, sort_keys=True) + "\n")
                curve.append(_completed(point, eval_dir, markers))
            arms[algo][seed] = sorted((p for p in curve if p["step"] <= steps), key=lambda p: p["step"])  # the budget asked for
    summary = {"start": start, "init": init, "refresh": refresh, "tasks": len(tasks), "seen": n_seen, "held_out": n_held_out,
               "steps": steps, "schedule": schedule, "eval_every": eval_every,
               "arms": {a: {str(s): c for s, c in by.items()} for a, by in arms.items()}}
    write_json(os.path.join(workdir, "summary.json"), summary)
    write_text(os.path.join(workdir, "table.md"), table(summary) + "\n\n" + curve_table(summary) + "\n")
    summary["png"] = plot(summary, os.path.join(workdir, "rl_lift.png"))
    summary["report"] = write_lift_report(workdir, summary, summary["png"])
    return summary


def _mean(xs: list[Any]) -> float:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else float("nan")


def _last_points(summary: dict[str, Any], algo: str) -> list[dict[str, Any]]:
    return [c[-1] for c in summary["arms"].get(algo, {}).values() if c]


def _refresh_point(summary: dict[str, Any]) -> dict[str, Any] | None:
    return (summary.get("refresh") or {}).get("point")


def _refresh_label(summary: dict[str, Any]) -> str:
    r = summary["refresh"]
    think = f", {r['reasoning']} reasoning" if r.get("reasoning", "none") != "none" else ""
    return f"world refresh ({r['steps']} SFT steps, {r['tasks']} demos in {r['worlds'] or 'the train'} worlds{think})"


def verdicts(summary: dict[str, Any]) -> list[str]:
    """The issue's targets, judged on the arms' last points (seed means): +8 points over the start on all
    tasks; CARE within 2 points of vanilla with >= 25% fewer output tokens (when both ran)."""
    s, out = summary["start"], []
    for algo in summary["arms"]:
        lasts = _last_points(summary, algo)
        if lasts:
            gain = 100 * (_mean([p["success"] for p in lasts]) - s["success"])
            held = 100 * (_mean([p["success_held_out"] for p in lasts]) - s["success_held_out"])
            own = ""
            if r := _refresh_point(summary):
                own = f", RL over the refresh {100 * (_mean([p['success'] for p in lasts]) - r['success']):+.1f}"
            out.append(f"{algo} at step {lasts[0]['step']} ({len(lasts)} seed{'s' if len(lasts) > 1 else ''}): {gain:+.1f} points over the start"
                       f" (held-out templates {held:+.1f}{own}); target +8: {'met' if gain >= 8 else 'not met'}")
    care, van = _last_points(summary, "care"), _last_points(summary, "vanilla")
    if care and van:
        d = 100 * (_mean([p["success"] for p in care]) - _mean([p["success"] for p in van]))
        cut = 1 - _mean([p["output_tokens"] for p in care]) / _mean([p["output_tokens"] for p in van])
        ok = d >= -2 and cut >= 0.25
        care_ok, van_ok = ([p.get("output_tokens_success") for p in ps] for ps in (care, van))
        split = ""
        if None not in care_ok + van_ok:
            split = f" (successful episodes {-100 * (1 - _mean(care_ok) / _mean(van_ok)):+.1f}%)"
        out.append(f"CARE vs vanilla: success {d:+.1f} points, output tokens {-100 * cut:+.1f}%{split}; target (>= -2 points, <= -25%): "
                   f"{'met' if ok else 'not met'}")
    base, who = (van, "vanilla's last points") if van else ([_refresh_point(summary) or s], "the arms' start")
    if floor := length_floor(base):
        out.append(f"length floor ({who}): of the successful episodes' {floor['tokens']:.1f} output tokens {floor['tool_call_tokens']:.1f} are "
                   f"tool calls and {floor['reasoning_tokens']:.1f} reasoning, the shortest reply has {floor['shortest_reply']:.0f}: a length "
                   f"term can cut successes by at most {100 * floor['max_cut']:.1f}% without dropping a tool call")
    return out


def length_floor(points: list[dict[str, Any]]) -> dict[str, float] | None:
    """What the successful episodes of `points` cannot lose to a length term without doing less: their tool-call
    tokens (reasoning aside) plus, for each reply, the shortest reply seen; `max_cut` is the share of their
    tokens above that floor (the reasoning and the replies' excess)."""
    if not points or any(p.get(k) is None for p in points for k in SPLIT_KEYS):
        return None
    calls = _mean([p["tool_call_tokens_success"] for p in points])
    reasoning = _mean([p["reasoning_tokens_success"] for p in points])
    tokens = calls + reasoning + _mean([p["reply_tokens_success"] for p in points])
    shortest = min(p["shortest_reply"] for p in points)
    floor = calls + shortest * _mean([p["replies_success"] for p in points])
    return {"tool_call_tokens": calls, "reasoning_tokens": reasoning, "tokens": tokens, "shortest_reply": shortest,
            "max_cut": 1.0 - floor / tokens if tokens else 0.0}


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "-"


def _tok(x: float | None) -> str:
    return f"{x:.1f}" if x is not None and np.isfinite(x) else "-"


def _row(name: str, p: dict[str, Any], *extra: Any) -> list[Any]:
    return [name, p["step"], *extra, _pct(p["success"]), _pct(p["success_seen"]), _pct(p["success_held_out"]), _tok(p["output_tokens"]),
            _tok(p.get("output_tokens_success")), _tok(p.get("output_tokens_failure"))]


def _last_rows(summary: dict[str, Any]) -> list[list[Any]]:
    """Start, each arm's last point per seed, and the seed mean when there are several seeds."""
    rows = [_row("start", summary["start"])]
    if r := _refresh_point(summary):
        rows.append(_row(_refresh_label(summary), r))
    for algo, by in summary["arms"].items():
        rows += [_row(f"{algo}, seed {seed}", c[-1]) for seed, c in by.items() if c]
        lasts = _last_points(summary, algo)
        if len(lasts) > 1:
            mean = {k: _mean([p.get(k) for p in lasts])
                    for k in ("success", "success_seen", "success_held_out", "output_tokens", "output_tokens_success", "output_tokens_failure")}
            rows.append(_row(f"**{algo}, mean of {len(lasts)} seeds**", {"step": lasts[0]["step"], **mean}))
    return rows


def _curve_rows(summary: dict[str, Any]) -> list[list[Any]]:
    rows = [_row("start", summary["start"], 0)]
    if r := _refresh_point(summary):
        rows.append(_row("world refresh", r, 0))
    for algo, by in summary["arms"].items():
        for seed, c in by.items():
            rows += [_row(f"{algo} s{seed}", p, int(p["episodes"])) for p in c]
    return rows


def _markdown(headers: list[str], rows: list[list[Any]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows])


def _last_headers(summary: dict[str, Any]) -> list[str]:
    return ["policy", "step", f"all ({summary['tasks']})", f"seen ({summary['seen']})", f"held-out ({summary['held_out']})", *TOKEN_HEADERS]


TOKEN_HEADERS = ["output tokens", "tokens (successes)", "tokens (failures)"]
CURVE_HEADERS = ["arm", "step", "episodes", "all", "seen", "held-out", *TOKEN_HEADERS]


def table(summary: dict[str, Any]) -> str:
    """Start vs each arm's last evaluated point (per seed and seed means), then the targets' verdicts."""
    return "\n".join([_markdown(_last_headers(summary), _last_rows(summary)), ""] + [f"- {v}" for v in verdicts(summary)])


def curve_table(summary: dict[str, Any]) -> str:
    """Every evaluated point of every arm (the learning curve as a markdown table)."""
    return _markdown(CURVE_HEADERS, _curve_rows(summary))


def write_lift_report(workdir: str, summary: dict[str, Any], png: str) -> str:
    """`<workdir>/report.html`: the table, the verdicts, the plot and the whole curve."""
    import html

    from mpa_jax.report import html_table, png_img, write_page

    parts = [f"<p>Greedy success, harness off, on the same {summary['tasks']} dev tasks ({summary['seen']} of templates seen in training,"
             f" {summary['held_out']} of held-out templates), every {summary['eval_every']} RL steps.</p>",
             "<h2>Last point of each arm</h2>", html_table(_last_headers(summary), _last_rows(summary)),
             "<ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in verdicts(summary)) + "</ul>",
             "<h2>Learning curve</h2>", png_img(png, "rl-lift learning curve"), html_table(CURVE_HEADERS, _curve_rows(summary))]
    return write_page(os.path.join(workdir, "report.html"), "MPA-JAX RL lift", parts)


def plot(summary: dict[str, Any], path: str) -> str:
    """Greedy success on all tasks, on seen (solid) / held-out (dashed) templates, and mean output tokens, against
    RL steps (bottom axis) and training episodes (top axis); the start dotted grey, a world refresh dotted black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = {"care": "tab:blue", "vanilla": "tab:orange"}
    start = summary["start"]
    origin = _refresh_point(summary) or start  # where the arms begin
    panels = ((axes[0], (("success", "-"),), f"greedy dev success ({summary['tasks']} tasks)"),
              (axes[1], (("success_seen", "-"), ("success_held_out", "--")), "seen (solid) / held-out (dashed) templates"),
              (axes[2], (("output_tokens", "-"), ("output_tokens_success", "--")), "mean output tokens / episode (dashed: successes)"))
    per_step = 0.0
    for ax, keys, label in panels:
        for key, style in keys:
            if start.get(key) is None or origin.get(key) is None or any(p.get(key) is None for by in summary["arms"].values() for c in by.values() for p in c):
                continue  # points of a build without this figure
            ax.axhline(start[key], color="gray", linestyle=":", linewidth=1)
            if origin is not start:
                ax.axhline(origin[key], color="black", linestyle=":", linewidth=1)
            for algo, by in summary["arms"].items():
                for seed, c in by.items():
                    if c:
                        per_step = per_step or c[-1]["episodes"] / max(c[-1]["step"], 1)
                        ax.plot([0] + [p["step"] for p in c], [origin[key]] + [p[key] for p in c], color=colors.get(algo), alpha=0.7,
                                linestyle=style, marker="o", label=f"{algo} s{seed}" if style == "-" else None)
        ax.set_xlabel("RL step")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        if per_step:
            top = ax.secondary_xaxis("top", functions=(lambda x, k=per_step: x * k, lambda e, k=per_step: e / k))
            top.set_xlabel("training episodes", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
