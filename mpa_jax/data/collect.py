"""`Collector`: trajectories for training data from the scripted oracle, a teacher endpoint and the current policy.

    col = Collector(config, tok)                       # envs, context format and vocabulary from the config
    demos = col.oracle(tasks, seed=0, variants=1)      # scripted demonstrations (mpa oracle, SFT data, the starter)
    more = col.teacher(tasks, OpenAIChatPlanner(url, model=...), max_turns=8)   # any OpenAI-compatible endpoint
    policy = col.policy(engine, tasks, out_path=...)   # the current policy through the episode runner

Every trajectory has provenance `planner` = "oracle" | "teacher:<model>" | the policy's label, so curation
and datasheets can tell the sources apart. Oracle and teacher episodes are text-level chats from the one
chat-level driver under the episode rules (`envs.episode.run_chat_episode`; the oracle is a planner,
`envs.oracle.OraclePlanner`, and the teacher an `harness.planners.OpenAIChatPlanner`), encoded once with the
chat template (loss mask on assistant turns); policy episodes come from the `EpisodeRunner`, token-in/token-out.
Infra is what an env or the endpoint reports as infra; any other exception fails the run with its traceback
and a note naming the task. A task keeps its gold arguments in schema order through its JSON round trip
(`Task.to_json`), so a demonstration does not depend on whether its task was generated or read back.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from mpa_jax import seeds
from mpa_jax.envs.contract import Step, Trajectory, Verification


def _bar(total: int, label: str, enabled: bool) -> tuple[Any, Any] | None:
    if not enabled or total <= 0:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    p = Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    p.start()
    return p, p.add_task(label, total=total)


def encode_episode(tok: Any, task: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], steps: list[Step],
                   verification: Verification, planner: str, seed: int, vocab_limit: int | None,
                   env_kind: str = "sandbox") -> Trajectory:
    """A text-level episode as a Trajectory: the chat rendered once by the template, the loss mask on
    assistant turns, log-probs 0 (no behaviour policy)."""
    from mpa_jax.tokenizer import encode_chat

    ids, mask = encode_chat(tok, messages, tools)
    if vocab_limit is not None and ids and max(ids) >= vocab_limit:
        raise ValueError(f"token id {max(ids)} does not fit the model vocabulary ({vocab_limit})")
    n_out = int(sum(mask))
    return Trajectory(
        task_id=task.id, tokens=list(ids), loss_mask=list(mask), logprobs=[0.0] * len(ids), steps=list(steps),
        verification=verification,
        costs={"output_tokens": float(n_out), "input_tokens": float(len(ids) - n_out),
               "tool_calls": float(sum(1 for s in steps if s.action.kind == "tool_call"))},
        provenance={"task": task.id, "env": env_kind, "planner": planner, "weight_version": "", "harness_version": "",
                    "template": task.template, "domain": task.domain, "category": task.category,
                    "difficulty": int(task.difficulty), "seed": seed},
        messages=list(messages), finish_reason="stop",
        infra_failure=bool(verification is not None and verification.infra_error),
    )


def oracle_tasks(config: Any, split: str | None = None, max_tasks: int | None = None) -> list[Any]:
    """The tasks `config.oracle` demonstrates: the first `max_tasks` (`config.oracle.max_tasks`; 0 = all) of
    `split` (`config.oracle.split`; a split name or a task JSONL)."""
    from mpa_jax.envs import load_tasks

    split = split or str(config.oracle.split)
    n = int(config.oracle.max_tasks if max_tasks is None else max_tasks)
    tasks = load_tasks(split, seed=int(config.tasks.seed), per_template=int(config.tasks.per_template))
    tasks = tasks[:n] if n > 0 else tasks
    if not tasks:
        raise ValueError(f"split {split!r} has no tasks")
    return list(tasks)


def oracle_dataset(config: Any, workdir: str, *, split: str | None = None, max_tasks: int | None = None,
                   out: str | None = None, progress: bool = True,
                   on_infra: Callable[[Any, Exception], None] | None = None) -> tuple[str, list[Any], list[Trajectory]]:
    """Oracle demonstrations of `config.oracle`'s tasks (`oracle_tasks`) written to `out` (default
    `<workdir>/oracle-<split>.jsonl`): (path, tasks, trajectories). What `mpa oracle`, `mpa sft` without
    data, the starter build and the RL experiment's SFT start use."""
    from mpa_jax.tokenizer import tokenizer_for_config

    split = split or str(config.oracle.split)
    out = out or os.path.join(workdir, f"oracle-{os.path.basename(split).replace('.jsonl', '')}.jsonl")
    tasks = oracle_tasks(config, split, max_tasks)
    tok = tokenizer_for_config(config, workdir)  # checked against the model's embedding (init_from's when set)
    trajs = Collector(config, tok, progress=progress).oracle(tasks, seed=int(config.seed), variants=int(config.oracle.variants),
                                                             out=out, on_infra=on_infra)
    return out, tasks, trajs


class Collector:
    """Collects trajectories for one config: its env kind (`config.envs.kind`), context format and the model's
    vocabulary (`tokenizer.model_vocab_size`)."""

    def __init__(self, config: Any, tokenizer: Any, *, progress: bool = False, kind: str | None = None) -> None:
        from mpa_jax.rollout.runner import EnvFactory
        from mpa_jax.tokenizer import model_vocab_size

        self.config, self.tok, self.progress = config, tokenizer, progress
        self.envs = EnvFactory(config, default_kind=kind)
        self.vocab_limit = model_vocab_size(config)

    def oracle(self, tasks: Sequence[Any], *, seed: int = 0, variants: int = 1, out: str | None = None,
               on_episode: Callable[[Trajectory], None] | None = None,
               on_infra: Callable[[Any, Exception], None] | None = None) -> list[Trajectory]:
        """The oracle's demonstrations of `tasks` (`variants` differently seeded phrasings each), in order;
        with `out` also written there (atomically: a partial file is never mistaken for the result). An
        episode that ends as infra (the env reported a fault: a device lost at reset) is reported to
        `on_infra` and left out; an env that is gone for good (`envs.base.EnvUnavailable`: a dead device)
        stops the run with that error. The oracle's turn limit is its plan's bound (`envs.oracle.plan_turn_bound`):
        two BFCL ground truths need 35 replies in one user turn."""
        from mpa_jax.envs import run_oracle_episode
        from mpa_jax.envs.base import EnvFault, EnvUnavailable
        from mpa_jax.files import write_jsonl

        kind = self.envs.default_kind
        env = self.envs(kind)
        reasoning = self.envs.context.reasoning
        trajs: list[Trajectory] = []
        bar = _bar(len(tasks) * max(1, variants), "oracle", self.progress)
        try:
            for i, task in enumerate(tasks):
                for v in range(max(1, variants)):
                    s = seeds.derive("oracle", seed, seeds.task_key(task.id), v)
                    try:
                        ep = run_oracle_episode(env, task, seed=s, reasoning=reasoning)
                    except EnvUnavailable as e:  # every remaining episode would fail the same way: stop the run
                        raise EnvUnavailable(f"{e}; stopped after {i} of {len(tasks)} tasks") from None
                    if ep.infra:
                        if on_infra is not None:
                            on_infra(task, EnvFault(ep.infra))
                        continue
                    traj = encode_episode(self.tok, task, ep.messages, ep.tools, ep.steps, ep.verification, "oracle", s,
                                          self.vocab_limit, kind)
                    trajs.append(traj)
                    if on_episode is not None:
                        on_episode(traj)
                    if bar:
                        bar[0].update(bar[1], advance=1)
        finally:
            if bar:
                bar[0].stop()
            env.close()
        if out is not None:
            write_jsonl(out, trajs)
        return trajs

    def teacher(self, tasks: Sequence[Any], planner: Any, *, max_turns: int,
                on_error: Callable[[Any, Exception], None] | None = None) -> list[Trajectory]:
        """Teacher episodes of `tasks`, planned by `planner` (an `OpenAIChatPlanner` on the teacher endpoint, or any
        `Planner`), under the episode rules with `max_turns` per user turn. An episode that ends as infra (the
        endpoint or the env failed) is kept, flagged and never a training example, and reported to `on_error`."""
        from mpa_jax.envs.episode import run_chat_episode

        env = self.envs(self.envs.default_kind)
        out: list[Trajectory] = []
        label = f"teacher:{getattr(planner, 'model', '') or getattr(planner, 'name', type(planner).__name__)}"
        bar = _bar(len(tasks), "teacher", self.progress)
        try:
            for task in tasks:
                ep = run_chat_episode(planner, env, task, max_turns=max_turns)
                if ep.infra:
                    if on_error is not None:
                        on_error(task, RuntimeError(f"teacher episode of {task.id}: {ep.infra}"))
                    traj = ep.trajectory()
                    traj.provenance.update({"planner": label, "difficulty": int(task.difficulty), "env": self.envs.default_kind})
                else:
                    traj = encode_episode(self.tok, task, ep.messages, ep.tools, ep.steps, ep.verification, label, 0,
                                          self.vocab_limit, self.envs.default_kind)
                    traj.costs["wall_s"] = ep.costs["wall_s"]
                out.append(traj)
                if bar:
                    bar[0].update(bar[1], advance=1)
        finally:
            if bar:
                bar[0].stop()
            env.close()
        return out

    def policy(self, source: Any, tasks: Sequence[Any], *, out_path: str, label: str = "policy", greedy: bool = False,
               seed: int | None = None, workdir: str | None = None) -> list[Trajectory]:
        """The current policy's episodes on `tasks` (sampled unless `greedy`) through the episode runner;
        `source`: an engine or an exported HF directory."""
        from mpa_jax.eval import Evaluator

        ev = Evaluator(self.config, tasks, tokenizer=self.tok, progress=self.progress)
        engine = ev.engine_for(source, workdir or os.path.dirname(os.path.abspath(out_path)))
        return ev.run(engine, out_path, greedy=greedy, seed=seed, label=label)


PARAPHRASE_PROMPT = ("Rewrite the user's request to a phone assistant in different words. Keep every name, number, "
                     "date, time, place and quoted value exactly as written. Answer with the rewritten request only.")


def paraphraser(planner: Any) -> Callable[[Any], str | None]:
    """A `construct_tasks(paraphrase=...)` hook that asks `planner` (an `OpenAIChatPlanner` on the teacher
    endpoint, or any `Planner`) to reword a task's instruction. Rewordings that drop a quoted value or a
    number of the original are refused (None), and so is a failed request: the task keeps its words; every
    kept rewording goes through the quality gate again."""
    import re

    def rewrite(task: Any) -> str | None:
        reply = planner.respond([{"role": "system", "content": PARAPHRASE_PROMPT}, {"role": "user", "content": task.instruction}], None)
        if reply.error is not None:
            return None
        text = str(reply.text or "").strip()
        must = re.findall(r"\d+(?:[.,:]\d+)*|'[^']+'|\"[^\"]+\"", task.instruction)
        if not text or any(m not in text for m in must):
            return None
        return text

    return rewrite
