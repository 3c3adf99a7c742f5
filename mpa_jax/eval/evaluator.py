"""`Evaluator`: a checkpoint, a live engine or a chat planner on a task list, greedy or sampled, with and/or
without the harness. The one evaluation path: `mpa eval`, `mpa harness eval`, the SFT success hook, the loop.

    ev = Evaluator(config, tasks)                       # tasks: eval.tasks.select_tasks(...)
    report = ev.evaluate("runs/x/hf", out_dir="runs/x/eval", harness="both", k=1)   # -> eval.json

Episodes run through one `EpisodeRunner` (envs, env pool, harness session) per harness mode of an
evaluation. k = 1 is one greedy run (`<out_dir>/<mode>/run0.jsonl`); k > 1 is the one sampled mode: every
task repeated k times in one batch at `temperature` (default config.rollout.temperature; each episode its
own sampling seed) to `<out_dir>/<mode>/sampled.jsonl`, reported as pass@1, pass@k (unbiased, for every k
in `ks`) and pass^k together. Each run's metrics go beside it (`<run>.summary.json`, written last: a run
whose summary exists is complete and is reused, so an interrupted evaluation continues where it stopped);
`eval.json` is written once, at the end. Every figure comes from `eval.metrics.eval_metrics` (per task,
infra failures excluded and counted apart).

A chat planner (anything with `respond(messages, tools)`, e.g. `harness.planners.OpenAIChatPlanner`) or
`ORACLE` (the scripted oracle) runs through the same runner's envs and harness session with the one chat-level
driver and the same episode rules (`envs.episode`): `config.rollout.max_turns` turns and
`max_output_errors` (the oracle: its plan's bound).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from mpa_jax import seeds
from mpa_jax.eval.metrics import PriceTable, eval_metrics
from mpa_jax.files import write_json, write_jsonl

HARNESS_MODES = ("off", "on", "both")


class _Oracle:
    """The scripted oracle planner as an evaluation source (`ORACLE`)."""

    name = "oracle"
    weight_version = "oracle"


ORACLE = _Oracle()


def harness_modes(harness: str) -> list[str]:
    """["off"], ["on"] or ["off", "on"] for --harness off|on|both."""
    if harness not in HARNESS_MODES:
        raise ValueError(f"--harness must be one of {', '.join(HARNESS_MODES)}, got {harness!r}")
    return ["off", "on"] if harness == "both" else [harness]


def default_ks(k: int, ks: Sequence[int] = ()) -> tuple[int, ...]:
    """The k values of pass@k for `k` runs per task (default 1 and `k`); ValueError when one is not in 1..k."""
    ks = tuple(int(j) for j in ks) or ((1, k) if k > 1 else (1,))
    if min(ks) < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={min(ks)}")
    if k and max(ks) > k:
        raise ValueError(f"pass@k with k={max(ks)} needs at least {max(ks)} samples per task, got {k}")
    return ks


def _is_chat(source: Any) -> bool:
    return source is ORACLE or callable(getattr(source, "respond", None))


class Evaluator:
    """Runs and scores episodes of one fixed task list for a config."""

    def __init__(self, config: Any, tasks: Sequence[Any], *, tokenizer: Any = None, progress: bool = True) -> None:
        self.config = config
        self.tasks = list(tasks)
        if not self.tasks:
            raise ValueError("no tasks to evaluate")
        self.tokenizer = tokenizer
        self.progress = progress
        self.prices = PriceTable.from_config(config.eval.prices)

    def engine_for(self, source: Any, workdir: str) -> Any:
        """An engine for `source`: an engine or chat planner as it is, an exported HF directory, or None (the
        config's model, untrained); the tokenizer comes with the checkpoint when it carries one."""
        from mpa_jax.rollout import engines

        if _is_chat(source):
            return source
        if source is not None and not isinstance(source, (str, os.PathLike)):
            if self.tokenizer is None:
                raise ValueError("Evaluator: pass tokenizer= with an engine")
            engines.check_engine_vocab(source, self.tokenizer)
            return source
        checkpoint = os.fspath(source) if source is not None else None
        if self.tokenizer is None:
            self.tokenizer = engines.load_rollout_tokenizer(self.config, checkpoint, workdir)
        return engines.make_engine(self.config, checkpoint, tokenizer=self.tokenizer)

    def runner(self, *, harness: bool | None = None, harness_version_dir: str = "", harness_config: Any = None) -> Any:
        """The `EpisodeRunner` of one harness mode (close it, or use it as a context manager). `harness_config`
        (a `HarnessConfig`) runs that harness instead of `config.harness`."""
        from mpa_jax.envs.pool import EnvPool, limits_from_config
        from mpa_jax.rollout.runner import EnvFactory, EpisodeRunner

        if harness_config is None:
            return EpisodeRunner.from_config(self.config, harness=harness, harness_version_dir=harness_version_dir)
        from mpa_jax.harness.runtime import HarnessSession

        return EpisodeRunner(EnvFactory(self.config), pool=EnvPool(limits_from_config(self.config)),
                             harness=HarnessSession(harness_config))

    def run(self, engine: Any, out_path: str, *, harness: bool | None = None, harness_version_dir: str = "", greedy: bool = True,
            seed: int | None = None, label: str = "", tasks: Sequence[Any] | None = None, temperature: float | None = None,
            runner: Any = None) -> list[Any]:
        """One run of every task (or `tasks`): trajectories to `out_path`, metrics to `<out_path>.summary.json`;
        a complete earlier run there is read back instead. `runner` (from `runner()`) is used as it is; without
        one, a runner for `harness` (None: `config.harness.enabled`) is built for this run and closed."""
        from mpa_jax.envs import Trajectory, read_jsonl
        from mpa_jax.rollout.runner import EpisodeConfig

        summary_path = out_path[:-6] + ".summary.json" if out_path.endswith(".jsonl") else out_path + ".summary.json"
        if os.path.exists(summary_path) and os.path.exists(out_path):
            return read_jsonl(out_path, Trajectory)
        tasks = list(tasks) if tasks is not None else self.tasks
        if runner is None:
            with self.runner(harness=harness, harness_version_dir=harness_version_dir) as own:
                return self.run(engine, out_path, greedy=greedy, seed=seed, label=label, tasks=tasks, temperature=temperature,
                                runner=own)
        self._check_positions(engine)
        overrides = {} if temperature is None else {"temperature": float(temperature)}
        cfg = EpisodeConfig.from_config(self.config.rollout, seed=int(self.config.seed if seed is None else seed), greedy=greedy,
                                        planner=label or "policy", **overrides)
        t0 = time.perf_counter()
        if _is_chat(engine):
            trajs = self._with_progress(lambda on_done: self._chat(engine, tasks, runner, cfg, on_done), len(tasks), label)
        else:
            trajs = self._with_progress(lambda on_done: runner.run(engine, self.tokenizer, tasks, cfg, on_done=on_done),
                                        len(tasks), label)
        write_jsonl(out_path, trajs)
        repeats = max(1, len(tasks) // max(1, len({t.id for t in tasks})))
        metrics = eval_metrics(trajs, k=repeats, prices=self.prices)
        metrics.update(label=label, weight_version=str(getattr(engine, "weight_version", "")), greedy=greedy,
                       temperature=cfg.temperature, wall_s=time.perf_counter() - t0, out_path=out_path)
        write_json(summary_path, metrics)
        return trajs

    def sample(self, engine: Any, out_path: str, n: int, *, temperature: float | None = None, seed: int | None = None,
               label: str = "sampled", runner: Any = None, harness: bool | None = None) -> list[Any]:
        """The sampled mode: `n` rollouts of every task in one run (each task repeated n times, every episode its
        own sampling seed) at `temperature` (default `config.rollout.temperature`)."""
        if n < 1:
            raise ValueError(f"samples per task must be >= 1, got {n}")
        temp = float(self.config.rollout.temperature if temperature is None else temperature)
        if temp <= 0:
            raise ValueError(f"sampled runs need a temperature > 0, got {temp} (greedy is k = 1)")
        repeated = [t for t in self.tasks for _ in range(n)]
        return self.run(engine, out_path, greedy=False, seed=seed, label=label, tasks=repeated, temperature=temp,
                        runner=runner, harness=harness)

    def evaluate(self, source: Any, *, out_dir: str, harness: str = "off", k: int = 1, label: str = "eval",
                 harness_version_dir: str = "", workdir: str | None = None, temperature: float | None = None,
                 ks: Sequence[int] = (), split: str | None = None, harness_config: Any = None) -> dict[str, Any]:
        """Per harness mode, one greedy run (k = 1) or the sampled mode (k > 1: pass@k for `ks`, default 1 and k,
        and pass^k); writes `<out_dir>/eval.json` once and returns it. `harness_config` replaces
        `config.harness` for the "on" mode (`mpa harness eval`'s settings)."""

        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        ks = default_ks(k, ks)
        modes = harness_modes(harness)
        os.makedirs(out_dir, exist_ok=True)
        t0 = time.perf_counter()
        with self._phase(f"loading {os.fspath(source)} and building the engine" if isinstance(source, (str, os.PathLike))
                         else "building the engine"):
            engine = self.engine_for(source, workdir or out_dir)
        results: dict[str, Any] = {}
        for mode in modes:
            with self.runner(harness=mode == "on", harness_version_dir=harness_version_dir,
                             harness_config=harness_config if mode == "on" else None) as runner:
                if k == 1:
                    trajs = self.run(engine, os.path.join(out_dir, mode, "run0.jsonl"), greedy=True, label=f"{label}/{mode}",
                                     runner=runner)
                else:
                    trajs = self.sample(engine, os.path.join(out_dir, mode, "sampled.jsonl"), k, temperature=temperature,
                                        label=f"{label}/{mode}", runner=runner)
                version = runner.harness_version
            results[mode] = eval_metrics(trajs, k=k, prices=self.prices, ks=ks)
            results[mode]["harness_version"] = version
        checkpoint = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
        report: dict[str, Any] = {
            "checkpoint": os.path.abspath(checkpoint) if checkpoint else None,
            "weight_version": str(getattr(engine, "weight_version", "")),
            "tasks": len(self.tasks), "k": k, "ks": list(ks), "greedy": k == 1, "harness": results,
            "temperature": 0.0 if k == 1 else float(self.config.rollout.temperature if temperature is None else temperature),
            # the version the harness-on runner actually ran (an argument or config.harness.version_dir)
            "harness_version": results["on"]["harness_version"] if "on" in modes else "none",
            "wall_s": time.perf_counter() - t0,
        }
        if split is not None:
            report["split"] = split
        if len(modes) == 2:
            report["harness_delta_success"] = results["on"]["overall"]["success"] - results["off"]["overall"]["success"]
        write_json(os.path.join(out_dir, "eval.json"), report)
        write_tensorboard(out_dir, report)
        return report

    def _chat(self, planner: Any, tasks: list[Any], runner: Any, cfg: Any, on_done: Callable[[Any], None] | None) -> list[Any]:
        """Chat-level episodes of `planner` (or the oracle), one task after another, on the runner's envs and
        harness session."""
        from mpa_jax.envs.episode import run_chat_episode
        from mpa_jax.envs.oracle import OraclePlanner, plan_turn_bound

        out = []
        for task in tasks:
            env = runner.envs(runner.envs.kind_for(task))
            if runner.harness is not None:
                from mpa_jax.harness.runtime import HarnessEnv

                env = HarnessEnv(env, runner.harness)
            # the oracle's turn limit is its plan's bound (a ground truth may need more replies than the policy's)
            # the oracle's seed is the collector's (`seeds` stream "oracle", variant 0): the same demonstration of the
            # task as `Collector.oracle` gives under the same base, wherever the task stands in either list
            p, turns = ((OraclePlanner(task.gold, seeds.derive("oracle", cfg.seed, seeds.task_key(task.id), 0),
                                       runner.envs.context.reasoning),
                         plan_turn_bound(task.gold))
                        if planner is ORACLE else (planner, cfg.max_turns))
            try:
                ep = run_chat_episode(p, env, task, max_turns=turns, max_output_errors=cfg.max_output_errors)
            finally:
                env.close()
            traj = ep.trajectory(runner.harness_version)
            out.append(traj)
            if on_done is not None:
                on_done(traj)
        return out

    def _check_positions(self, engine: Any) -> None:
        from mpa_jax.rollout.engines import RolloutSetupError

        max_pos = getattr(getattr(engine, "cfg", None), "max_position_embeddings", None)
        if max_pos is not None and int(self.config.rollout.max_total_tokens) > max_pos:
            raise RolloutSetupError(f"config.rollout.max_total_tokens ({self.config.rollout.max_total_tokens}) exceeds the model's"
                                    f" max_position_embeddings ({max_pos})")

    def _phase(self, what: str) -> Any:
        """A named start-up phase in the log (nothing without progress)."""
        from mpa_jax.train.progress import Progress

        return Progress("eval", 0, section=self.config.progress, enabled=self.progress).phase(what)

    def _with_progress(self, go: Callable[[Any], list[Any]], total: int, label: str) -> list[Any]:
        """Run `go(on_done)` with episode progress: a bar on a terminal, plain periodic lines otherwise."""
        if not self.progress:
            return go(None)
        from mpa_jax.train.progress import Progress

        prog = Progress(f"eval {label}" if label else "eval", total, unit="episode", section=self.config.progress)
        done = {"n": 0, "succ": 0}

        def on_done(traj: Any) -> None:
            done["n"] += 1
            done["succ"] += int(bool(traj.verification is not None and traj.verification.success))
            prog.update(done["n"], success=done["succ"])

        try:
            with prog.ticking():  # the first episodes wait for the engine's compiles: the log still ticks
                return go(on_done)
        finally:
            prog.close()


def evaluate(config: Any, checkpoint: Any, *, out_dir: str, split: str | None = None, harness: str = "off", k: int | None = None,
             tasks: Sequence[Any] | None = None, max_tasks: int | None = None, workdir: str | None = None, label: str = "eval",
             tokenizer: Any = None, progress: bool = True, harness_version_dir: str = "") -> dict[str, Any]:
    """`Evaluator(config, tasks).evaluate(checkpoint, ...)`; tasks default to `config.eval.max_tasks`
    stratified tasks of `split` (default `config.eval.split`). `checkpoint`: an HF directory, an engine
    (with `tokenizer`), or None (the config's untrained model)."""
    from mpa_jax.eval.tasks import evaluation_tasks

    split = split or str(config.eval.split)
    if tasks is None:
        tasks = evaluation_tasks(split, n=int(config.eval.max_tasks if max_tasks is None else max_tasks),
                             seed=int(config.tasks.seed), per_template=int(config.tasks.per_template))
    ev = Evaluator(config, tasks, tokenizer=tokenizer, progress=progress)
    return ev.evaluate(checkpoint, out_dir=out_dir, harness=harness, k=int(config.eval.k if k is None else k), label=label,
                       harness_version_dir=harness_version_dir, workdir=workdir, split=split)


def format_eval(report: dict[str, Any]) -> str:
    """The eval.json as a short table: overall, per template group and per category per harness mode, then costs."""
    k = report["k"]
    lines = []
    for mode, m in report["harness"].items():
        o = m["overall"]
        cur = m["prices"]["currency"]
        lines.append(f"harness {mode}: {report['tasks']} {report.get('split', '')} tasks, k={k}, infra failures {m['infra_failures']}")
        atk = [f"pass@{j}" for j in report.get("ks", [1]) if j > 1]  # sampled mode: pass@k beside pass^k
        lines.append(f"  {'':<18}{'success':>9}{'partial':>9}{'pass@1':>8}" + "".join(f"{a:>8}" for a in atk)
                     + f"{f'pass^{k}':>8}{'out tok':>9}{'calls':>7}")
        groups = {"seen": "seen templates", "held_out": "held-out tmpl"}
        rows = [("Overall", o)] + [(groups[g], b) for g, b in m.get("by_templates", {}).items()] + list(m["by_category"].items())
        for name, b in rows:
            lines.append(f"  {name:<18}{100 * b['success']:8.1f}%{b['partial_score']:9.3f}{100 * b['pass@1']:7.1f}%"
                         + "".join(f"{100 * b[a]:7.1f}%" for a in atk)
                         + f"{100 * b[f'pass^{k}']:7.1f}%{b['mean_output_tokens']:9.1f}{b['mean_tool_calls']:7.2f}")
        c = o["cost_per_1k_tasks"]
        lines.append(f"  cost per 1,000 tasks: {c['total']:.4f} {cur} (input {c['input_tokens']:.4f}, output {c['output_tokens']:.4f},"
                     f" tool calls {c['tool_calls']:.4f}, device {c['device_seconds']:.4f}); output tokens only (the seed's"
                     f" figure): {o['cost_per_1k_tasks_output_only']:.4f} {cur}")
    if "harness_delta_success" in report:
        lines.append(f"harness on - off: {100 * report['harness_delta_success']:+.1f} pts")
    return "\n".join(lines)


def write_tensorboard(out_dir: str, report: dict[str, Any], step: int = 0) -> str:
    """The report's figures as TensorBoard scalars in `<out_dir>/tb` (per harness mode: overall, per
    category and template group, costs); returns the directory."""
    from mpa_jax.train.metrics import TensorBoardWriter, scalar_leaves

    logdir = os.path.join(out_dir, "tb")
    tb = TensorBoardWriter(logdir)
    try:
        figures = {f"eval/{k}": v for k, v in scalar_leaves(report["harness"]).items()}
        if "harness_delta_success" in report:
            figures["eval/harness_delta_success"] = float(report["harness_delta_success"])
        tb.scalars(step, figures)
    finally:
        tb.close()
    return logdir
