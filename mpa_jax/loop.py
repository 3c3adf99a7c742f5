"""`mpa loop`: the closed loop, in which data, training and harness improve each other round after round.

    round 0:  tokenizer -> data (constructed + train-split tasks, oracle [+ teacher] trajectories, curated)
              -> eval untrained [-> eval starter] -> SFT cold start -> eval SFT
    round r:  RL on the env mixture (config.envs.mixture; mpa_jax.rl)
              -> SFT refresh on the round's curated data (config.loop.refresh_steps; 0 = off)
              -> eval -> mine failures into harness proposals -> review -> release (harness evolution)
              -> data: the policy's competence per cell sets the generation weights, new gated
              tasks, oracle + the policy's verified successes, curated with a datasheet
    end:      the final model in Hugging Face format, `summary.json`, `report.html`

Every stage is a function of the run's state; each completed stage is recorded in
`<workdir>/loop_state.json` (atomically) with its result, so a killed run continues at the first
unfinished stage; inside a stage SFT resumes from its last orbax checkpoint and evaluation from its last
complete rollout file. A stage that has nothing to do (no RL steps configured, no harness proposal
approved) is recorded as skipped with the reason (in the state, `summary.json` and the report).

Every stage runs on the run services: episodes through the `EpisodeRunner`, evaluations through the
`eval.Evaluator` on one task selection, data through the `data.Collector`. The loop works on its own copy
of the config and hands each stage a copy of the sections it changes.
"""
from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from typing import Any, Callable

from mpa_jax import files
from mpa_jax.files import atomic_open, write_json

STATE_FILE = "loop_state.json"


class LoopState:
    """The record of completed and skipped stages, saved after every change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"done": {}, "order": [], "skipped": {}}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)

    def done(self, name: str) -> bool:
        return name in self.data["done"]

    def result(self, name: str) -> Any:
        return self.data["done"].get(name)

    def record(self, name: str, result: Any, skipped: str | None = None) -> None:
        self.data["done"][name] = result
        if name not in self.data["order"]:
            self.data["order"].append(name)
        if skipped:
            self.data["skipped"][name] = skipped
        write_json(self.path, self.data)


class Loop:
    """One run of the closed loop in `workdir` (see the module doc)."""

    def __init__(self, config: Any, workdir: str, *, progress: bool = True, console: Any = None,
                 after_stage: Callable[[str], None] | None = None) -> None:
        from rich.console import Console

        self.config = _resolved(config)
        self.workdir = os.path.abspath(workdir)
        self.progress = progress
        self.console = console or Console()
        self.state = LoopState(os.path.join(self.workdir, STATE_FILE))
        self.after_stage = after_stage
        self._tok: Any = None
        self._heldout: list[Any] | None = None
        self.resumed: list[str] = []

    # ------------------------------------------------------------------ plumbing
    def stage(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run `fn` unless `name` is already done; record its result (a JSON-able dict)."""
        if self.state.done(name):
            self.resumed.append(name)
            self.console.print(f"[dim]resume: stage {name} already done[/]")
            return self.state.result(name)
        self.console.rule(f"[bold]{name}")
        t0 = time.perf_counter()
        result = fn()
        skipped = result.get("skipped") if isinstance(result, dict) else None
        if isinstance(result, dict):
            result.setdefault("wall_s", time.perf_counter() - t0)
        self.state.record(name, result, skipped)
        if skipped:
            self.console.print(f"[yellow]skipped {name}: {skipped}[/]")
        if self.after_stage is not None:
            self.after_stage(name)
        return result

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            from mpa_jax import tokenizer as tk

            self._tok = tk.tokenizer_for_config(self.config, self.workdir)
            if self._tok.vocab_size > int(self.config.model.vocab_size) and not str(self.config.model.init_from):
                raise ValueError(f"tokenizer has {self._tok.vocab_size} ids, more than config.model.vocab_size={self.config.model.vocab_size}")
        return self._tok

    def tokenizer_dir(self) -> str:
        return str(self.config.tokenizer.path) or self.path("tokenizer")

    @property
    def eval_split(self) -> str:
        """The split every stage is evaluated on: `config.loop.eval_split`, else `config.eval.split`
        ("preregistered" = the pre-registered test set, `eval.tasks.evaluation_tasks`)."""
        return str(self.config.loop.eval_split) or str(self.config.eval.split)

    @property
    def heldout(self) -> list[Any]:
        """The evaluation tasks of every stage: `loop.eval_seen` of templates seen in training and
        `loop.eval_held_out` of held-out templates (the demo's table), else `eval.max_tasks` stratified ones.
        The evaluation stages are the only readers of the pre-registered list in the loop."""
        if self._heldout is None:
            from mpa_jax.eval.tasks import evaluation_tasks

            lp, seed, per = self.config.loop, int(self.config.tasks.seed), int(self.config.tasks.per_template)
            if int(lp.eval_seen) or int(lp.eval_held_out):
                self._heldout = evaluation_tasks(self.eval_split, n_seen=int(lp.eval_seen), n_held_out=int(lp.eval_held_out),
                                             seed=seed, per_template=per)
            else:
                self._heldout = evaluation_tasks(self.eval_split, n=int(self.config.eval.max_tasks), seed=seed, per_template=per)
        return self._heldout

    # ------------------------------------------------------------------ stages
    def build_data(self, round_index: int, checkpoint: str | None, rl_rollouts: str = "") -> dict[str, Any]:
        """Construct gated tasks by the current generation weights, collect, curate, write a datasheet.

        The weights come from the policy's competence per cell, measured on fresh probe tasks and on the
        round's RL rollouts (`rl_rollouts`: their directory; groups of samples on fresh tasks)."""
        from mpa_jax.data import (Collector, CurationConfig, all_keys, competence_from_trajectories, construct_tasks,
                                  curate, generation_weights)
        from mpa_jax.envs import Trajectory, read_jsonl

        cfg, d = self.config, self.config.data
        out_dir = self.path("data", f"r{round_index}")
        keys = all_keys("train")
        trajs: list[Any] = []
        competence: dict[str, Any] = {}
        collector = Collector(cfg, self.tokenizer, progress=self.progress)
        if checkpoint is not None and int(d.policy_tasks) > 0:
            # the policy's competence per cell on fresh probe tasks sets this round's generation weights
            probe, _ = construct_tasks(int(d.policy_tasks), None, round_index=round_index, seed=int(cfg.seed) + 7919)
            policy_trajs = collector.policy(checkpoint, probe, out_path=os.path.join(out_dir, "policy.jsonl"), label=f"policy r{round_index}",
                                            greedy=False, seed=int(cfg.seed) + round_index, workdir=self.workdir)
            trajs += policy_trajs
            rl_trajs = []
            if rl_rollouts and os.path.isdir(rl_rollouts):
                for f in sorted(os.listdir(rl_rollouts)):
                    if f.endswith(".jsonl"):
                        rl_trajs += read_jsonl(os.path.join(rl_rollouts, f), Trajectory)
            # simulated episodes are training-only: they say nothing about the benchmark's cells
            rl_trajs = [t for t in rl_trajs if t.provenance.get("env") != "simulated"]
            competence = competence_from_trajectories(policy_trajs + rl_trajs)
        weights = generation_weights(competence, keys, floor=float(d.weight_floor))
        para = None
        if str(d.teacher_url) and bool(d.paraphrase):
            from mpa_jax.data import paraphraser
            from mpa_jax.harness.planners import OpenAIChatPlanner

            para = paraphraser(OpenAIChatPlanner(str(d.teacher_url), model=str(d.teacher_model), max_tokens=512, temperature=0.7))
        tasks, stats = construct_tasks(int(d.tasks_per_round), weights, round_index=round_index, seed=int(cfg.seed), paraphrase=para)
        # the constructed tasks (fresh instances, weighted by competence) are also the next RL stage's tasks
        os.makedirs(out_dir, exist_ok=True)
        tasks_path = os.path.join(out_dir, "tasks.jsonl")
        files.write_jsonl(tasks_path, tasks)  # atomic: the next RL stage reads it
        if round_index == 0 and int(cfg.oracle.max_tasks) != 0:
            from mpa_jax.envs import load_tasks

            train = load_tasks("train", seed=int(cfg.tasks.seed), per_template=int(cfg.tasks.per_template))
            tasks = list(train[: int(cfg.oracle.max_tasks)] if int(cfg.oracle.max_tasks) > 0 else train) + tasks
        trajs += collector.oracle(tasks, seed=int(cfg.seed) + round_index, variants=int(cfg.oracle.variants))
        if str(d.teacher_url) and int(d.teacher_tasks) > 0:
            from mpa_jax.harness.planners import OpenAIChatPlanner

            teacher = OpenAIChatPlanner(str(d.teacher_url), model=str(d.teacher_model), max_tokens=512)
            trajs += collector.teacher(tasks[: int(d.teacher_tasks)], teacher, max_turns=int(cfg.rollout.max_turns))
        result = curate(trajs, CurationConfig.from_config(d, max_tokens=min(int(d.max_tokens), int(cfg.sft.seq_len)), target=weights))
        sheet_path = result.write(os.path.join(out_dir, "sft.jsonl"), name=f"round {round_index}")
        write_json(os.path.join(out_dir, "construction.json"), {"weights": weights, "competence": competence, **stats.to_dict()})
        sheet = result.datasheet
        self.console.print(f"data r{round_index}: {sheet['examples']} examples ({sheet['recovery_traces']} recovery traces), "
                           f"{sheet['failures']} failures kept for harness mining; sources {sheet['sources']}; "
                           f"gate kept {stats.kept}/{stats.draws} draws")
        return {"path": os.path.join(out_dir, "sft.jsonl"), "datasheet": sheet_path, "tasks_path": tasks_path, "constructed": stats.kept, "examples": sheet["examples"],
                "failures_path": sheet["failures_path"], "weights": weights, "competence": competence,
                "construct": {"kept": stats.kept, "draws": stats.draws, "rejected": sum(stats.rejected.values())}}

    def evaluate(self, name: str, checkpoint: str | None, harness_version_dir: str = "") -> dict[str, Any]:
        """Held-out eval; with a released harness version, the same checkpoint with and without it
        (the headline is the harness-on figure, the off figure is kept beside it)."""
        from mpa_jax.eval import Evaluator

        mode = "on" if harness_version_dir else "off"
        ev = Evaluator(self.config, self.heldout, tokenizer=self.tokenizer, progress=self.progress)
        rep = ev.evaluate(checkpoint, out_dir=self.path("eval", name), harness="both" if harness_version_dir else "off",
                          k=int(self.config.eval.k), label=name, harness_version_dir=harness_version_dir, workdir=self.workdir)
        m = rep["harness"][mode]
        o = m["overall"]
        groups = {}
        for g in ("seen", "held_out"):
            b = m["by_templates"].get(g)
            groups[f"tasks_{g}"] = b["tasks"] if b else 0
            groups[f"success_{g}"] = b["success"] if b else None
        return {"checkpoint": checkpoint, "eval_json": self.path("eval", name, "eval.json"), "weight_version": rep["weight_version"],
                "success": o["success"], "partial_score": o["partial_score"], "mean_output_tokens": o["mean_output_tokens"],
                "mean_tool_calls": o["mean_tool_calls"], "cost_per_1k_tasks": o["cost_per_1k_tasks"]["total"],
                "cost_per_1k_tasks_output_only": o["cost_per_1k_tasks_output_only"], "harness_mode": mode,
                "success_harness_off": rep["harness"]["off"]["overall"]["success"],
                "by_category": {k: v["success"] for k, v in m["by_category"].items()}, "tasks": rep["tasks"], **groups}

    def _learner_mesh(self, cfg: Any) -> None:
        """`loop.learner_devices` > 0: the SFT and RL stages train data-parallel on that many devices
        (CPU: the forced host devices share two cores, and each holds its own micro-batch at once)."""
        learners = int(self.config.loop.learner_devices)
        if learners > 0:
            cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, cfg.mesh.expert = learners, 1, 1, 1

    def sft(self, name: str, data_path: str, init_from: str | None, steps: int, lr: float | None = None) -> dict[str, Any]:
        from mpa_jax.sft import run_sft

        cfg = copy.deepcopy(self.config)
        self._learner_mesh(cfg)
        cfg.sft.steps = int(steps)
        cfg.sft.export_dtype = str(self.config.loop.export_dtype)
        if init_from:
            cfg.model.init_from = init_from
        if lr is not None:
            cfg.sft.lr = float(lr)
            cfg.sft.warmup_steps = min(int(cfg.sft.warmup_steps), max(1, steps // 10))
        if not str(cfg.tokenizer.path):
            cfg.tokenizer.path = self.tokenizer_dir()
        res = run_sft(cfg, self.path(name), data_path, export=True, progress=self.progress)
        return {"export_dir": res.export_dir, "steps": res.steps, "train_loss": res.train_loss, "eval_loss": res.eval_loss,
                "losses": res.losses, "metrics_path": res.metrics_path, "resumed_from": res.resumed_from}

    def rl(self, round_index: int, checkpoint: str, tasks_path: str = "", prior: str = "") -> dict[str, Any]:
        """CARE RL (`config.rl`) from the current HF model, exported to HF; skipped with the reason when
        `config.loop.rl_steps` is 0. Tasks by `loop.rl_tasks`: "select" = competence-aware selection of fresh
        instances (selection "competence"); "data" = `tasks_path` (the previous data stage's constructed tasks);
        "split" = `config.rl.split`. `prior` (the data stage's probe of this policy) seeds CARE's competence table in
        every mode. All three are passed to `run_rl` explicitly (config.rl is left as configured)."""
        steps = int(self.config.loop.rl_steps)
        if steps <= 0:
            return {"skipped": "config.loop.rl_steps is 0", "export_dir": checkpoint}
        from mpa_jax.export import export_checkpoint
        from mpa_jax.rl.trainer import RLSetupError, run_rl

        cfg = copy.deepcopy(self.config)
        cfg.rl.steps = steps
        source = str(self.config.loop.rl_tasks)
        if source not in ("select", "data", "split"):
            raise RLSetupError(f"config.loop.rl_tasks={source!r} must be 'select', 'data' or 'split'")
        # the task source and the competence prior are passed to run_rl, not written into config.rl
        split = tasks_path if source == "data" and tasks_path and os.path.exists(tasks_path) else None
        selection = "competence" if source == "select" else None
        # the data stage's probe of this policy seeds CARE's competence table (and, with selection, its weights)
        prior = prior if prior and os.path.exists(prior) else None
        self._learner_mesh(cfg)
        if not str(cfg.tokenizer.path):
            cfg.tokenizer.path = self.tokenizer_dir()
        run_dir = self.path(f"r{round_index}", "rl")
        res = run_rl(cfg, run_dir, init=checkpoint, tokenizer=self.tokenizer, progress=self.progress, split=split,
                     selection=selection, prior=prior)
        hf = export_checkpoint(res.checkpoint_dir, os.path.join(run_dir, "hf"), dtype=str(self.config.loop.export_dtype),
                               tokenizer_dir=self.tokenizer_dir())
        hist = list(res.history)
        return {"export_dir": hf, "steps": int(res.steps), "weight_version": int(res.weight_version),
                "rollouts_dir": os.path.join(run_dir, "rollouts") if bool(cfg.rl.save_rollouts) else "",
                "metrics_path": res.metrics_path, "resumed_from": res.resumed_from,
                "history": [{k: float(v) for k, v in h.items() if isinstance(v, (int, float)) and math.isfinite(float(v))} for h in hist]}

    def harness(self, round_index: int, eval_result: dict[str, Any], data_result: dict[str, Any] | None,
                rollouts_dir: str = "") -> dict[str, Any]:
        """Mine failure traces into proposals, review them by `config.harness.review.policy`, release a version
        when any is approved (harness evolution). Proposals come from the training side only (the round's
        data: curated episodes and the failures kept apart; its RL rollouts), so the evaluation tasks never
        shape the harness they are measured with; the evaluation's failures are clustered for the report."""
        from mpa_jax.data import failure_clusters
        from mpa_jax.envs import Trajectory, read_jsonl

        def read_dir(run_dir: str) -> list[Any]:
            return [t for f in (sorted(os.listdir(run_dir)) if run_dir and os.path.isdir(run_dir) else [])
                    if f.endswith(".jsonl") for t in read_jsonl(os.path.join(run_dir, f), Trajectory)]

        eval_dir = os.path.dirname(eval_result["eval_json"])
        evaluated = read_dir(os.path.join(eval_dir, "off")) + read_dir(os.path.join(eval_dir, "on"))
        # simulated episodes are training-only: never mined into the harness the benchmark runs with
        episodes: list[Any] = [t for t in read_dir(rollouts_dir) if t.provenance.get("env") != "simulated"]
        if data_result:
            for key in ("failures_path", "path"):
                if os.path.exists(data_result.get(key, "")):
                    episodes += read_jsonl(data_result[key], Trajectory)
        failures = [t for t in episodes + evaluated if not t.infra_failure and t.verification is not None
                    and not t.verification.success]
        clusters = failure_clusters(failures)
        mined = self.path("harness", f"r{round_index}", "failure_clusters.json")
        write_json(mined, {"failures": len(failures), "clusters": clusters})
        prev = self.state.result(f"r{round_index - 1}/harness") if round_index > 1 else None
        base = {"mined": mined, "failures": len(failures), "clusters": clusters[:5],
                "version": (prev or {}).get("version", "none"), "version_dir": (prev or {}).get("version_dir", ""), "changes": []}
        from mpa_jax.harness import evolution

        root = self.path("harness")
        policy = str(self.config.harness.review.policy)
        evolved = evolution.evolve(root, episodes, policy)
        proposals, added, version = evolved.proposals, evolved.added, evolved.version
        changes = [f"{p['kind']}: {p['cluster']}" for p in proposals if p["id"] in set(added)]
        current = evolution.current_version(root)
        if version is None and os.path.isdir(os.path.join(root, "versions", current)) \
                and os.path.join(root, "versions", current) != base["version_dir"]:
            version = current  # released by an interrupted earlier attempt of this stage, not gated yet
        if version is not None and int(self.config.loop.release_gate_tasks) > 0:
            gate = self.release_gate(round_index, eval_result.get("checkpoint"), os.path.join(root, "versions", version),
                                     base["version_dir"])
            if gate["candidate"] < gate["baseline"]:
                reason = (f"release gate: success {gate['candidate']:.1%} with it vs {gate['baseline']:.1%} without "
                          f"on {gate['tasks']} train tasks")
                evolution.withdraw(root, version, reason)
                return {**base, "proposals": len(proposals), "queued": len(added), "gate": gate, "withdrawn": version,
                        "skipped": f"release {version} withdrawn by the {reason}"}
            base["gate"] = gate
        if version is None:
            why = ("no proposals mined" if not proposals else
                   f"{len(added)} proposal(s) queued for review (harness.review.policy={policy!r}); none approved yet")
            return {**base, "proposals": len(proposals), "queued": len(added), "skipped": f"release: {why}"}
        return {**base, "proposals": len(proposals), "queued": len(added), "version": version,
                "version_dir": os.path.join(root, "versions", version), "changes": changes}

    def release_gate(self, round_index: int, checkpoint: str | None, candidate_dir: str, current_dir: str) -> dict[str, Any]:
        """Success of the round's checkpoint with the candidate harness version vs with the current one
        (or none), on `loop.release_gate_tasks` train-split tasks (never the headline evaluation tasks): a
        version that makes the planner worse is not released (`withdraw`)."""
        from mpa_jax.eval import Evaluator, select_tasks

        tasks = select_tasks("train", n=int(self.config.loop.release_gate_tasks), seed=int(self.config.tasks.seed) + 1,
                             per_template=int(self.config.tasks.per_template))
        out = self.path("harness", f"r{round_index}", "gate")
        ev = Evaluator(self.config, tasks, tokenizer=self.tokenizer, progress=self.progress)

        def success(name: str, mode: str, version_dir: str) -> dict[str, Any]:
            rep = ev.evaluate(checkpoint, out_dir=os.path.join(out, name), harness=mode, k=1, label=f"gate r{round_index} {name}",
                              harness_version_dir=version_dir, workdir=self.workdir)
            return rep["harness"]

        cand = success("candidate", "both" if not current_dir else "on", candidate_dir)
        base = cand["off"] if not current_dir else success("current", "on", current_dir)["on"]
        return {"tasks": len(tasks), "candidate": float(cand["on"]["overall"]["success"]),
                "baseline": float(base["overall"]["success"]), "baseline_harness": os.path.basename(current_dir) or "none"}

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        cfg = self.config
        t0 = time.perf_counter()
        os.makedirs(self.workdir, exist_ok=True)
        self.stage("tokenizer", lambda: {"vocab_size": self.tokenizer.vocab_size, "dir": self.tokenizer_dir()})
        init = str(cfg.model.init_from)
        # from a starter, its competence already weights round 0's cells (and so round 1's RL tasks)
        data0 = self.stage("r0/data", lambda: self.build_data(0, init or None))
        untrained = self.stage("eval/untrained", lambda: self.evaluate("untrained", None))
        rows = [("untrained", untrained, "none")]
        if init:
            rows.append(("starter", self.stage("eval/starter", lambda: self.evaluate("starter", init)), "none"))
        if init:  # from a pretrained start (the starter planner), the cold start is a refresh: few steps, small lr
            sft = self.stage("r0/sft", lambda: self.sft("sft", data0["path"], init, int(cfg.loop.refresh_steps) or int(cfg.sft.steps),
                                                        float(cfg.loop.refresh_lr)))
        else:
            sft = self.stage("r0/sft", lambda: self.sft("sft", data0["path"], None, int(cfg.sft.steps)))
        current = sft["export_dir"]
        rows.append(("SFT", self.stage("eval/sft", lambda: self.evaluate("sft", current)), "none"))
        data_prev = data0
        datasets = [data0]
        harness_version, harness_dir = "none", ""
        for r in range(1, int(cfg.loop.rounds) + 1):
            prior = os.path.join(os.path.dirname(data_prev["path"]), "policy.jsonl")  # the data stage's probe of this policy
            rl = self.stage(f"r{r}/rl", lambda: self.rl(r, current, data_prev.get("tasks_path", ""), prior))
            current = rl.get("export_dir") or current
            if int(cfg.loop.refresh_steps) > 0:
                mix = self.mix_data(r, [d["path"] for d in datasets])
                ref = self.stage(f"r{r}/refresh", lambda: self.sft(f"r{r}/refresh", mix, current,
                                                                   int(cfg.loop.refresh_steps), float(cfg.loop.refresh_lr)))
                current = ref["export_dir"]
            ev = self.stage(f"eval/r{r}", lambda: self.evaluate(f"r{r}", current, harness_dir))
            h = self.stage(f"r{r}/harness", lambda: self.harness(r, ev, data_prev, rl.get("rollouts_dir", "")))
            rows.append((f"round {r}", ev, harness_version))
            harness_version, harness_dir = h.get("version", harness_version), h.get("version_dir", harness_dir)
            data_prev = self.stage(f"r{r}/data", lambda: self.build_data(r, current, rl.get("rollouts_dir", "")))
            datasets.append(data_prev)
        final = self.stage("export", lambda: self.export(current))
        summary = self.summary(rows, final, time.perf_counter() - t0)
        from mpa_jax.report import write_report

        summary["report"] = write_report(self.workdir, summary)
        write_json(self.path("summary.json"), summary)
        return summary

    def mix_data(self, round_index: int, paths: list[str]) -> str:
        """The refresh data of a round: every curated dataset so far (the newest round's cells are
        weighted by competence; replaying the earlier ones keeps what was learned)."""
        out = self.path(f"r{round_index}", "refresh_data.jsonl")
        with atomic_open(out) as f:
            for p in paths:
                with open(p, encoding="utf-8") as src:
                    shutil.copyfileobj(src, f)
        return out

    def export(self, current: str) -> dict[str, Any]:
        """The final model as a Hugging Face directory `<workdir>/final` (weights, config, tokenizer)."""
        out = self.path("final")
        if os.path.isdir(out):
            shutil.rmtree(out)
        shutil.copytree(current, out)
        return {"export_dir": out, "from": current}

    def summary(self, rows: list[tuple[str, dict[str, Any], str]], final: dict[str, Any], wall_s: float) -> dict[str, Any]:
        st = self.state.data
        datasheets = [st["done"][n]["datasheet"] for n in st["order"] if n.endswith("/data") and n in st["done"]]
        losses = {n: st["done"][n].get("losses", []) for n in st["order"] if n.endswith("sft") or n.endswith("refresh")}
        return {
            "config": str(self.config.name),
            "split": self.eval_split,
            "heldout_tasks": len(self.heldout),
            "stages": [{"name": name, "success": ev["success"], "partial_score": ev["partial_score"],
                        "by_category": ev["by_category"], "mean_output_tokens": ev["mean_output_tokens"],
                        "mean_tool_calls": ev["mean_tool_calls"], "cost_per_1k_tasks": ev["cost_per_1k_tasks"],
                        "cost_per_1k_tasks_output_only": ev["cost_per_1k_tasks_output_only"],
                        "weight_version": ev["weight_version"], "harness_version": hv, "eval_json": ev["eval_json"],
                        "harness_mode": ev.get("harness_mode", "off"), "success_harness_off": ev.get("success_harness_off", ev["success"]),
                        **{k: ev.get(k) for k in ("success_seen", "success_held_out", "tasks_seen", "tasks_held_out")}}
                       for name, ev, hv in rows],
            "skipped": [{"stage": k, "reason": v} for k, v in st["skipped"].items()],
            "harness": [{"round": n.split("/")[0], **{k: v for k, v in st["done"][n].items() if k in ("version", "changes", "failures", "clusters", "skipped", "gate", "withdrawn")}}
                        for n in st["order"] if n.endswith("/harness")],
            "datasheets": datasheets,
            "training_losses": losses,
            "rl": {n.split("/")[0]: [{"step": h.get("step"), "output_tokens": h.get("rl/output_tokens"), "success": h.get("rl/success"),
                                      "groups_kept": h.get("rl/groups_kept"), "groups_drawn": h.get("rl/groups_drawn"),
                                      "updates": h.get("rl/updates")}
                                     for h in st["done"][n].get("history", [])]
                   for n in st["order"] if n.endswith("/rl") and not st["done"][n].get("skipped")},
            "final_export": final["export_dir"],
            "resumed_stages": list(self.resumed),
            "wall_s_this_run": wall_s,
        }


def _resolved(config: Any) -> Any:
    """The loop's own copy of the run's config: a pretrained start brings its own tokenizer (DESIGN §9)."""
    from mpa_jax import tokenizer as tk

    config = config.copy_and_resolve_references()
    init = str(config.model.init_from)
    if not str(config.tokenizer.path) and init and tk.is_tokenizer_dir(init):
        config.tokenizer.path = init
    return config


def run_loop(config: Any, workdir: str, **kw: Any) -> dict[str, Any]:
    """Run (or continue) the closed loop in `workdir`; returns the summary (also in summary.json)."""
    return Loop(config, workdir, **kw).run()
