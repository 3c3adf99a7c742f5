"""`mpa sft [--config NAME] [--checkpoint PATH|starter] [--data FILE] [--export]`: the supervised planning cold start.

From scratch (the config's model and the project BPE) or from a checkpoint (`--checkpoint`: an HF
directory, a run directory or `starter`; its shape, tokenizer and context format). The run directory
always carries its tokenizer and card (`mpa_checkpoint.json`), so it is itself a start for `mpa rl
--checkpoint RUN`; `--export` also writes `<workdir>/hf` with its card. See `mpa_jax.sft`.

Example: mpa sft --checkpoint starter --max-steps 30 --export --workdir runs/my_sft
"""
from __future__ import annotations

import argparse
import os
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mpa_jax.cli import add_start_argument

    parser.epilog = "example: mpa sft --checkpoint starter --max-steps 30 --export --workdir runs/my_sft"
    add_start_argument(parser, extra="; default: config.model.init_from, else the config's model from scratch")
    parser.add_argument("--data", default=None, help="trajectory JSONL (default: config.sft.data; empty = make oracle trajectories first)")
    parser.add_argument("--export", action="store_true", help="also write the final model as a Hugging Face directory <workdir>/hf")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (the schedule keeps config.sft.steps)")
    parser.add_argument("--eval-success", type=int, default=0, metavar="N",
                        help="at every eval point, greedy task success on N dev tasks of templates seen in training"
                             " (plus --eval-held-out tasks of held-out templates), logged under eval/success*")
    parser.add_argument("--eval-held-out", type=int, default=0, metavar="M", help="held-out-template dev tasks (with --eval-success)")
    parser.add_argument("--eval-split", default="dev", help="split of the success evaluation (default dev)")
    parser.add_argument("--eval-samples", type=int, default=0, metavar="N",
                        help="also N sampled runs per task at every success evaluation: unbiased pass@k next to greedy,"
                             " logged under eval/pass@<k>* (temperature: --eval-temperature or config.rollout.temperature)")
    parser.add_argument("--eval-pass-k", type=int, nargs="+", default=None, metavar="K",
                        help="k values of pass@k (each <= --eval-samples; default 1 and N)")
    parser.add_argument("--eval-temperature", type=float, default=None, help="sampling temperature of --eval-samples")
    from mpa_jax.cli import add_distributed_arguments

    add_distributed_arguments(parser, "call jax.distributed.initialize() (auto-detected on TPU pods, SLURM, Open MPI; "
                                      "else give --coordinator/--num-processes/--process-id); run the same command on every host")


def jax_process_index() -> int:
    """This process' index among the hosts (0 on one host)."""
    import jax

    return jax.process_index()


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.errors import UserError

    data = args.data or str(config.sft.data or "")
    if not data and args.distributed:
        raise UserError("a multi-host run needs --data (make the trajectories once with `mpa oracle` first)")
    if not data:
        # no data given: make the oracle demonstrations the config describes, into the run directory
        from mpa_jax.data import oracle_dataset

        try:
            data, _, _ = oracle_dataset(config, args.workdir)
        except ValueError as e:
            raise UserError(str(e)) from None
    elif not os.path.isfile(data):
        raise UserError(f"SFT data file not found: {data}")

    from mpa_jax.cli import init_distributed

    init_distributed(args)
    from mpa_jax.sft import DataError, SFTDiverged, run_sft
    from mpa_jax.train import CheckpointError

    on_eval = None
    if args.eval_success or args.eval_held_out:
        from mpa_jax.eval import pass_ks, select_tasks, success_eval
        from mpa_jax.tokenizer import tokenizer_for_config

        if args.eval_split == str(config.oracle.split):
            raise UserError(f"--eval-split {args.eval_split!r} is the split the demonstrations come from")
        try:
            ks = pass_ks(max(0, args.eval_samples), args.eval_pass_k or ())
        except ValueError as e:
            raise UserError(f"--eval-samples/--eval-pass-k: {e}") from None
        if args.eval_temperature is not None and args.eval_temperature <= 0:
            raise UserError(f"--eval-temperature {args.eval_temperature}: must be > 0 (greedy is always reported)")
        tasks = select_tasks(args.eval_split, n_seen=args.eval_success, n_held_out=args.eval_held_out, seed=int(config.tasks.seed))
        on_eval = success_eval(config, tasks, tokenizer_for_config(config, args.workdir), os.path.join(args.workdir, "success"),
                               log=print, samples=max(0, args.eval_samples), ks=ks, temperature=args.eval_temperature)
    elif args.eval_samples or args.eval_pass_k:
        raise UserError("--eval-samples/--eval-pass-k need --eval-success N and/or --eval-held-out M (the tasks)")
    from mpa_jax.card import stamp_run_dir, write_hf_card

    recipe = dict(command=getattr(args, "command_line", None), config_file=getattr(args, "config_file", None),
                  start=args.start.path if getattr(args, "start", None) else None)
    try:
        if jax_process_index() == 0:  # the run dir is a start from its first checkpoint on: tokenizer + card first
            stamp_run_dir(args.workdir, config, stage="sft", **recipe)
        result = run_sft(config, args.workdir, data, export=args.export or None, max_steps=args.max_steps, on_eval=on_eval)
        if jax_process_index() == 0:
            stamp_run_dir(args.workdir, config, stage="sft", **recipe)  # again: tokenizer files written meanwhile
        if result.export_dir and jax_process_index() == 0:
            write_hf_card(result.export_dir, config, stage="sft", **recipe)
    except (DataError, CheckpointError, ValueError) as e:  # bad data, checkpoint or config value: one line
        raise UserError(str(e)) from None
    except SFTDiverged as e:
        print(f"mpa sft: stopped: {e}")
        return 1
    import jax

    if jax.process_index() == 0:
        from rich.console import Console

        c = Console()
        c.print(f"steps {result.steps}" + (f" (resumed from {result.resumed_from})" if result.resumed_from is not None else ""))
        c.print(f"train loss {result.train_loss:.4f}   unigram baseline {result.unigram_loss:.4f}"
                + (f"   held-out loss {result.eval_loss:.4f}" if result.eval_loss is not None else ""))
        c.print(f"checkpoints {result.checkpoint_dir}   metrics {result.metrics_path}")
        if result.export_dir:
            c.print(f"exported Hugging Face model {result.export_dir}")
    return 0
