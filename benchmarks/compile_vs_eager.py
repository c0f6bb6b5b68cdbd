"""How far a torch.compile'd training run lands from the eager one, per precision: the numbers behind the compile
smoke test's tolerance (tests/test_train.py), on whatever device the trainer picks (docs/benchmarks.md, "On a GPU").

    python benchmarks/compile_vs_eager.py
    python benchmarks/compile_vs_eager.py --models transformer --precisions fp32 --steps 2 --backend eager  # smoke

The tiny GPT-2-recipe and modern transformers of the trainer's tests, 6 steps each, without dropout (inductor draws
its own masks); printed: the relative difference of valid bpb and the parameters that moved most. --backend picks
torch.compile's backend (default inductor, what train.compile uses; `eager` traces the graph and runs it as is).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tests.test_train import COMMON, SETTINGS, revised, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=("transformer", "modern"), default=["transformer", "modern"])
    parser.add_argument("--precisions", nargs="+", choices=("auto", "fp32", "bf16"), default=["auto", "fp32"])
    parser.add_argument("--steps", type=int, default=6, help="training steps of each run")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    args = parser.parse_args()
    if args.backend != "inductor":  # the Trainer calls torch.compile(module): its default backend is inductor
        torch.compile = functools.partial(torch.compile, backend=args.backend)
    for name in args.models:
        for precision in args.precisions:
            short = revised(SETTINGS[name], epochs=1, max_steps_per_epoch=args.steps,
                            arch={**SETTINGS[name].arch, "dropout": 0.0})
            common = COMMON.model_copy(update={"precision": precision})
            with tempfile.TemporaryDirectory() as tmp:
                eager = train(Path(tmp) / "eager", name, settings=short, common=common)
                compiled = train(Path(tmp) / "compiled", name, settings=short,
                                 common=common.model_copy(update={"compile": True}))
            moved = sorted(((a - b).abs().max().item(), key) for (key, a), (_, b) in
                           zip(eager.model.state_dict().items(), compiled.model.state_dict().items()))[::-1]
            relative = abs(compiled.metrics["valid_bpb"] / eager.metrics["valid_bpb"] - 1)
            print(f"{name}, {precision} ({eager.metrics['precision']} on {eager.metrics['device']}): valid bpb "
                  f"relative difference {relative:.2e}; largest |difference|: "
                  + ", ".join(f"{key} {d:.1e}" for d, key in moved[:4]), flush=True)


if __name__ == "__main__":
    main()
