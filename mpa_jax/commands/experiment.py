"""`mpa experiment care-vs-vanilla|rl-lift|prereg|coevolution --config ... [--checkpoint PATH|starter] [--seeds N]`:
named experiments (`mpa_jax.experiments.care_vs_vanilla`, `rl_lift`, `prereg`: configs/prereg_rl.py, `coevolution`:
configs/prereg_coevo.py).

`--checkpoint` is the start as every command names one (an HF directory, a run directory or `starter`): the CLI
fits the config to it (its shape, tokenizer, context format, positions) before the config is saved, and every arm
starts from it with that config (each arm's directory carries its own resolved config and card). `--init` is the
old spelling. `prereg` and `coevolution` take their start from their frozen config.
"""
from __future__ import annotations

import argparse
from typing import Any

EXPERIMENTS = ("care-vs-vanilla", "rl-lift", "prereg", "coevolution")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mpa_jax.cli import add_start_argument

    parser.epilog = ("example: mpa experiment rl-lift --config rl_lift --checkpoint starter --seeds 2 --algos care,vanilla"
                     " --eval-every 20 --until 40 --workdir runs/lift")
    parser.add_argument("name", help=f"the experiment: one of {', '.join(EXPERIMENTS)}")
    add_start_argument(parser, extra="; every arm starts from it (default: config.model.init_from; care-vs-vanilla without"
                                     " either: oracle demonstrations of config.rl.templates + SFT, made into <workdir>/sft)")
    parser.add_argument("--init", dest="checkpoint", help=argparse.SUPPRESS)  # the old spelling of --checkpoint
    parser.add_argument("--seeds", type=int, default=2, help="seeds per algorithm (config.seed, config.seed+1, ...)")
    parser.add_argument("--algos", default="care", help="rl-lift: comma-separated arms (care, vanilla)")
    parser.add_argument("--eval-every", type=int, default=25, help="rl-lift: RL steps between greedy dev evaluations")
    parser.add_argument("--until", type=int, default=None,
                        help="rl-lift: run and summarise every arm up to this step of the config.rl.steps schedule (default: all of it)")
    parser.add_argument("--seen", type=int, default=96, help="rl-lift: dev tasks of templates seen in training")
    parser.add_argument("--held-out", type=int, default=48, help="rl-lift: dev tasks of held-out templates")
    parser.add_argument("--table", action="store_true", help="prereg / coevolution: only regenerate the table and plot from the records")
    parser.add_argument("--arms", default="", help="prereg: comma-separated arms of config.prereg.arms (default: every unrecorded one)")


def run(args: argparse.Namespace, config: Any) -> int:
    from mpa_jax.cli import UserError

    if args.name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {args.name!r}; known: {', '.join(EXPERIMENTS)}")
    from mpa_jax.train import CheckpointError

    # the CLI resolved the start and fitted the config to it (config.model.init_from = its HF directory)
    start = getattr(args, "start", None)
    recipe = {"command": getattr(args, "command_line", None), "config_file": getattr(args, "config_file", None),
              "start": start.path if start is not None else None}
    try:
        if args.name in ("prereg", "coevolution"):
            from mpa_jax.experiments import coevolution, prereg

            mod = prereg if args.name == "prereg" else coevolution
            if not args.table:
                mod.run_arms(config, args.workdir, only=[a.strip() for a in args.arms.split(",") if a.strip()])
            out = mod.write_table(config)
            print(out["table"])
            print(f"table {out['table_md']}   plot {out['png']}")
            return 0
        if args.name == "rl-lift":
            from mpa_jax.experiments.rl_lift import rl_lift, table

            algos = [a.strip() for a in args.algos.split(",") if a.strip()]
            if start is None or any(a not in ("care", "vanilla") for a in algos):
                raise UserError("rl-lift needs --checkpoint PATH|starter and --algos from care, vanilla")
            summary = rl_lift(config, args.workdir, seeds=args.seeds, algos=algos, eval_every=args.eval_every,
                              n_seen=args.seen, n_held_out=args.held_out, until=args.until, recipe=recipe)
            print(table(summary))
            print(f"plot {summary['png']}   summary {args.workdir}/summary.json")
            return 0
        from mpa_jax.experiments.care_vs_vanilla import care_vs_vanilla, table

        summary = care_vs_vanilla(config, args.workdir, seeds=args.seeds, recipe=recipe)
    except (CheckpointError, ValueError) as e:
        raise UserError(str(e)) from None
    print(table(summary))
    print(f"plot {summary['png']}   summary {args.workdir}/summary.json")
    return 0
