"""`python -m lmpipe.train`: one model of params.yaml trained without orchestration, any of its settings changed.

Apart from the trainer (lmpipe.train.trainer), so that the train stage, which never runs this, does not depend on
the settings it reads (evaluate.chunk, for --score).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lmpipe import checkpoints, distributed
from lmpipe.config import load_params
from lmpipe.overrides import assignments
from lmpipe.errors import Interrupted, LmpipeError
from lmpipe.evaluate import evaluate_lm
from lmpipe.io import OUT_MARK, check_out_dir, disk_full, out_dir
from lmpipe.paths import CACHE_DIR
from lmpipe.set_param import add_set_param, parse_args
from lmpipe.train.job import Outputs, prepare, publish


def main(argv: list[str] | None = None) -> None:
    """Train one model of params.yaml without orchestration, any of its settings changed for this run (a probe
    before a sweep): `python -m lmpipe.train --model gru -S optim.lr=0.003 --seed 7 --budget '{tokens: 1e6}'`,
    or under `torchrun ... -m lmpipe.train`. Prints a JSON line per evaluation; --score adds a last line with valid
    and test scored as the evaluate stage scores them; --out saves the model, its metrics and its curve as the train
    stage does."""
    parser = argparse.ArgumentParser(prog="python -m lmpipe.train", description=main.__doc__.split(":")[0])
    parser.add_argument("--model", required=True, help="an entry of params.yaml's `models`")
    add_set_param(parser, "a dotted setting of models.<model> as dvc exp run -S reads it, with or without the "
                          "models.<model>. prefix (repeatable: -S optim.lr=0.003 -S arch.layers=2)")
    parser.add_argument("--seed", type=int, help="train.seed of this run (default: params.yaml's)")
    parser.add_argument("--budget", help="this run's length instead of the model's: '{tokens: N}' or '{flops: F}'")
    parser.add_argument("--threads", type=int, help="CPU threads (1: two runs side by side on 2 cores) (default: "
                                                    "params.yaml's train.threads; 0 there: torch's own choice)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (train.compile)")
    parser.add_argument("--score", action="store_true", help="score valid and test as the evaluate stage does")
    parser.add_argument("--out", help="a new or empty folder for model.pt, metrics.json and curve.csv, or one an "
                                      f"earlier --out wrote (it holds {OUT_MARK}, which lists lmpipe's files there; only those are "
                                      "replaced) (default: none)")
    parser.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    parser.add_argument("--checkpoints", default=str(Path(CACHE_DIR) / "ckpt"),
                        help=f"root of the resumable checkpoints (default: {Path(CACHE_DIR) / 'ckpt'})")
    args = parse_args(parser, argv)  # a bare key=value or --set: one line naming -S
    sets = model_settings(args.overrides, args.model)
    ranks = distributed.launched()
    train = {k: v for k, v in (("seed", args.seed), ("threads", args.threads), ("compile", args.compile or None))
             if v is not None}
    try:
        if args.out:  # before any training: a folder of the user's is never replaced
            check_out_dir(args.out, "python -m lmpipe.train")
        budget = None if args.budget is None else assignments([f"budget={args.budget}"], "--budget")["budget"]
        params = load_params(args.params)
        job = prepare(params, args.model, args.checkpoints, overrides=assignments(sets, "-S"), budget=budget,
                      train=train, params_file=args.params, progress_bar=sys.stderr.isatty())
        result = job.trainer.run(on_eval=lambda record: print(json.dumps(record), flush=True))
    except (LmpipeError, OSError, RuntimeError) as exc:
        if not isinstance(exc, LmpipeError) and not (exc := disk_full(exc)):
            raise
        if not ranks.main:  # the main process meets the same error and says it: torchrun would stop it on our exit
            time.sleep(2)
        sys.exit(f"error: {exc}" if ranks.main else 1)  # one line, from one process
    except Interrupted as exc:  # Ctrl-C or SIGTERM: the trainer finished its step and saved it
        sys.exit(f"{exc}; the same command resumes" if ranks.main else 130)
    finally:
        distributed.leave(ranks)
    if not ranks.main:
        return
    if args.out:  # lmpipe's files only: anything else in the folder stays
        try:
            with out_dir(args.out, {"written_by": "python -m lmpipe.train", "model": args.model, "set": args.overrides,
                                    "processes": ranks.world}) as tmp:
                publish(None, result, Outputs(tmp, tmp / "metrics.json", tmp / "curve.csv"))  # model.pt first, into it
        except (LmpipeError, OSError) as exc:  # the checkpoints stay: the same command resumes the finished run
            if not isinstance(exc, LmpipeError) and not (exc := disk_full(exc)):
                raise
            sys.exit(f"error: {exc}")
    if args.score:
        scores = evaluate_lm(result.model.eval(), job.data, params.evaluate.chunk)
        print(json.dumps({"model": args.model, "set": args.overrides, "seed": job.common.seed, "valid_bpb": scores["valid"]["bpb"],
                          "test_bpb": scores["test"]["bpb"], "test_word_ppl": scores["test"]["word_ppl"],
                          "train_seconds": result.metrics["seconds"]}), flush=True)
    checkpoints.discard(job.ckpt_dir)


def model_settings(items: list[str], model: str) -> list[str]:
    """-S settings relative to models.<model>: `models.gru.optim.lr=0.003` (as dvc exp run -S takes it) is
    `optim.lr=0.003` for --model gru; a `+`/`++` prefix stays."""
    prefix, relative = f"models.{model}.", []
    for item in items:
        rest = item.lstrip("+")
        relative.append(item[:len(item) - len(rest)] + rest.removeprefix(prefix))
    return relative


if __name__ == "__main__":
    main()
