"""A micro learning check: train a micro Qwen3 on one template family and measure task success on its
held-out instances (dev split: other persona worlds and instance seeds).

    python -m mpa_jax.sft.micro --workdir /tmp/micro [--template contact_group.create[,folder.create]] [--steps 200]
        [--eval-every 50] [--loss-tasks 8]

prints one JSON line (success, train loss, unigram baseline, seconds; with --eval-every, the curve: greedy
success, held-out loss and training seconds at every eval point). Several comma-separated templates train
one model on all of them (`--train` instances each) and report success per template. tests/integration/test_learning.py runs it in a
subprocess on one host device (eight virtual devices on two busy cores make the all-reduce rendezvous of
XLA:CPU wait on threads the OS has not scheduled), docs/learning.md uses it for quick sweeps.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs", "tiny.py")


def micro_config(vocab: int, hidden: int, layers: int, steps: int, lr: float, fmt: str = "compact",
                 reasoning: str = "none", eval_every: int = 0, eval_fraction: float = 0.0) -> Any:
    """configs/tiny.py shrunk to a micro model and a short SFT schedule (default: compact context, no reasoning)."""
    from mpa_jax.config import load_config_file

    c = load_config_file(CONFIG)
    m = c.model
    m.vocab_size, m.hidden_size, m.intermediate_size, m.num_hidden_layers = vocab, hidden, 3 * hidden, layers
    m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.max_position_embeddings = 4, 2, hidden // 4, 1024
    c.context.format, c.context.reasoning = fmt, reasoning
    c.sft.update(dict(seq_len=512 if fmt == "compact" else 2048, batch_size=8, steps=steps, lr=lr, warmup_steps=5, eval_every=eval_every, log_every=50, eval_fraction=eval_fraction))
    c.checkpoint.every, c.checkpoint.async_save = 10_000, False
    c.rollout.update(dict(max_turns=3, max_new_tokens=40, max_total_tokens=1024, batch_size=16))
    return c


def learn_one_family(workdir: str, template: str = "contact_group.create", n_train: int = 64, n_dev: int = 12,
                     steps: int = 200, hidden: int = 128, layers: int = 2, lr: float = 3e-3, vocab: int = 512,
                     fmt: str = "compact", reasoning: str = "none", eval_every: int = 0, n_loss: int = 0) -> dict[str, Any]:
    """Oracle demonstrations of `template` (one name or several, comma-separated) on the train split -> a
    project BPE of `vocab` ids -> SFT of a micro model -> greedy success on the dev split's instances of the
    template(s), at every `eval_every` steps and at the end. `n_loss` more train-split instances per
    template are held out of training for the held-out loss (`eval/loss`)."""
    from mpa_jax.data import encode_episode
    from mpa_jax.envs import make_env, run_oracle_episode, write_jsonl
    from mpa_jax.envs.benchmark import generate_split
    from mpa_jax.eval import success_eval
    from mpa_jax.sft import run_sft
    from mpa_jax.tokenizer.build import build_tokenizer
    from mpa_jax.tokenizer.template import QWEN3_CHAT_TEMPLATE, render_chat

    t0 = time.perf_counter()
    templates = [t.strip() for t in template.split(",") if t.strip()]
    train = generate_split("train", per_template=n_train + n_loss, templates=templates)
    dev = generate_split("dev", per_template=n_dev, templates=templates)
    missing = [t for t in templates if not any(x.template == t for x in train) or not any(x.template == t for x in dev)]
    if missing or not templates:
        raise ValueError(f"template(s) {missing or template!r} have no train or no dev instances (held-out or unknown template?)")
    # split_lines holds out round(lines * fraction) episodes: exactly n_loss per template on average
    frac = n_loss / (n_train + n_loss) if n_loss else 0.0
    c = micro_config(vocab, hidden, layers, steps, lr, fmt, reasoning, eval_every=eval_every, eval_fraction=frac)
    env = make_env("sandbox", config=c)
    episodes = [run_oracle_episode(env, t, seed=i, reasoning=str(c.context.reasoning)) for i, t in enumerate(train)]
    tok_dir = os.path.join(workdir, "tokenizer")
    texts = [render_chat(None, e.messages, e.tools or None, chat_template=QWEN3_CHAT_TEMPLATE) for e in episodes]
    tok = build_tokenizer(texts, vocab, tok_dir)
    data = os.path.join(workdir, "data.jsonl")
    write_jsonl(data, [encode_episode(tok, t, e.messages, e.tools, e.steps, e.verification, "oracle", i, vocab)
                       for i, (t, e) in enumerate(zip(train, episodes))])
    c.tokenizer.path = tok_dir
    hook = success_eval(c, dev, tok, os.path.join(workdir, "success"))
    curve: dict[int, dict[str, float]] = {}

    def on_eval(step: int, params: Any) -> dict[str, float]:
        curve[step] = hook(step, params)
        return curve[step]

    result = run_sft(c, os.path.join(workdir, "run"), data, on_eval=on_eval, progress=False)
    return {"template": template, "train_tasks": len(train) - n_loss * len(templates), "loss_tasks": n_loss * len(templates),
            "dev_tasks": len(dev), "steps": steps,
            "hidden": hidden, "layers": layers, "lr": lr, "context": f"{fmt}/{reasoning}", "success": curve[steps]["success"],
            "success_seen": curve[steps].get("success_seen"), "train_loss": result.train_loss,
            "unigram_loss": result.unigram_loss, "eval_loss": result.eval_loss, "metrics_path": result.metrics_path,
            "by_template": _by_template(os.path.join(workdir, "success", f"step_{steps}.jsonl"), dev),
            "curve": _curve(result.metrics_path), "mean_episode_tokens": sum(len(e["tokens"]) for e in _lines(data)) / len(train),
            "seconds": time.perf_counter() - t0}


def _lines(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def _curve(metrics_path: str) -> list[dict[str, Any]]:
    """One row per eval point: step, training seconds so far (evaluations excluded), held-out loss, success."""
    out, seconds, row = [], 0.0, None
    for rec in _lines(metrics_path):
        if "train/seconds" in rec:
            seconds += float(rec["train/seconds"])
        if "eval/success" in rec or "eval/loss" in rec:
            if row is None or row["step"] != rec["step"]:
                row = {"step": rec["step"], "train_seconds": seconds}
                out.append(row)
            for key in ("eval/loss", "eval/success"):
                if key in rec:
                    row[key[5:]] = rec[key]
    return out


def _by_template(path: str, dev: list[Any]) -> dict[str, str]:
    """'solved/total' per template from a success evaluation's trajectories."""
    from mpa_jax.envs import Trajectory, read_jsonl

    tmpl = {t.id: t.template for t in dev}
    counts: dict[str, list[int]] = {}
    for tr in read_jsonl(path, Trajectory):
        c = counts.setdefault(tmpl[tr.task_id], [0, 0])
        c[0] += int(bool(tr.verification and tr.verification.success))
        c[1] += 1
    return {k: f"{a}/{b}" for k, (a, b) in sorted(counts.items())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--template", default="contact_group.create")
    p.add_argument("--train", type=int, default=64)
    p.add_argument("--dev", type=int, default=12)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--format", default="compact", choices=("compact", "json"))
    p.add_argument("--reasoning", default="none", choices=("none", "full"))
    p.add_argument("--eval-every", type=int, default=0, help="success (and held-out loss) every N steps; 0 = at the end only")
    p.add_argument("--loss-tasks", type=int, default=0, help="train-split instances per template held out for the held-out loss")
    a = p.parse_args(argv)
    out = learn_one_family(a.workdir, a.template, a.train, a.dev, a.steps, a.hidden, a.layers, a.lr, fmt=a.format,
                           reasoning=a.reasoning, eval_every=a.eval_every, n_loss=a.loss_tasks)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
