"""Did the study reproduce? Every model's valid/test numbers (metrics/eval.json) against the committed ones.

    python .ci/reproduced.py COMMITTED_METRICS_DIR metrics

The same machine type reproduces them bit for bit. Another CPU runs other kernels (oneDNN, NumPy's SIMD dispatch)
that round otherwise, or trains at another precision (fp32 on a CPU without native bf16: metrics/train/<model>.json),
and a training run amplifies that like a change of seed; such a run passes when every number is within
SEED_SPREAD_BPB of the committed one (4x the largest seed spread measured, the GRU's ~0.005 bpb; fp32 and bf16
runs of equal tokens measured within 0.001) and says it is not bit for bit.
"""

import json
import sys
from pathlib import Path

SEED_SPREAD_BPB = 0.02


def read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def verdict(model: str, old: dict, new: dict, precisions: list) -> tuple[bool, str]:
    """(passes, one line) for one model."""
    if not new:
        return False, f"{model}: missing from the new metrics/eval.json"
    deltas = {split: new[split]["bpb"] - old[split]["bpb"] for split in ("valid", "test")}
    shown = f"test bpb {new['test']['bpb']:.4f}"
    if all(old[split] == new[split] for split in ("valid", "test")):
        return True, f"{model}: reproduced bit for bit ({shown})"
    worst = max(abs(d) for d in deltas.values())
    change = ", ".join(f"{split} {d:+.2e}" for split, d in deltas.items())
    trained = (f"trained in {precisions[1]}, committed in {precisions[0]}" if precisions[0] != precisions[1]
               else f"both {precisions[1]}")
    if worst <= SEED_SPREAD_BPB:
        return True, f"{model}: NOT bit for bit, within {SEED_SPREAD_BPB} bpb ({change}; {trained}): another CPU?"
    return False, f"{model}: NOT REPRODUCED: bpb {change}, beyond {SEED_SPREAD_BPB} ({trained})"

def main(committed: Path, fresh: Path) -> int:
    old, new = read(committed / "eval.json")["models"], read(fresh / "eval.json").get("models", {})
    passed = True
    for model in sorted(old):
        precisions = [read(d / "train" / f"{model}.json").get("precision") for d in (committed, fresh)]
        ok, line = verdict(model, old[model], new.get(model, {}), precisions)
        print(line, file=sys.stdout if ok else sys.stderr)
        passed &= ok
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
