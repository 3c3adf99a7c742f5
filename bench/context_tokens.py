"""Tokens per oracle episode in each planner context format (docs/learning.md).

    python bench/context_tokens.py json full      # tool JSON schemas, oracle reasoning
    python bench/context_tokens.py compact none   # one-line signatures, no reasoning

Every 20th train task, rendered through the chat template and tokenised with the tiny config's project
BPE (built into /tmp/mpa-context-tokens once).
"""
import os
import statistics
import sys

from mpa_jax.config import load_config_file
from mpa_jax.envs import load_tasks, make_env, run_oracle_episode
from mpa_jax.tokenizer import encode_chat, tokenizer_for_config


def main() -> None:
    fmt, reasoning = (sys.argv[1:3] + ["json", "full"][len(sys.argv[1:3]):])[:2]
    cfg = load_config_file(os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"))
    cfg.context.format, cfg.context.reasoning = fmt, reasoning
    tok = tokenizer_for_config(cfg, "/tmp/mpa-context-tokens")
    env = make_env("sandbox", config=cfg)
    lengths, trained = [], []
    for i, task in enumerate(load_tasks("train")[::20]):
        ep = run_oracle_episode(env, task, seed=i, reasoning=reasoning)
        ids, mask = encode_chat(tok, ep.messages, ep.tools or None)
        lengths.append(len(ids))
        trained.append(sum(mask))
    print(f"{fmt}/{reasoning}: {len(lengths)} episodes, mean {statistics.mean(lengths):.0f} tokens (max {max(lengths)}),"
          f" mean {statistics.mean(trained):.0f} trained on")


if __name__ == "__main__":
    main()
