"""How far a torch.compile'd training run lands from the eager one, per precision: the numbers behind the compile
smoke test's tolerance (tests/test_train.py), on whatever device the trainer picks (docs/benchmarks.md, "On a GPU").

    python benchmarks/compile_vs_eager.py

The tiny GPT-2-recipe and modern transformers of the trainer's tests, 6 steps each, without dropout (inductor draws
its own masks); printed: the relative difference of valid bpb and the parameters that moved most.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_train import COMMON, SETTINGS, revised, train  # noqa: E402


def main() -> None:
    for name in ("transformer", "modern"):
        for precision in ("auto", "fp32"):
            short = revised(SETTINGS[name], epochs=1, max_steps_per_epoch=6,
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
