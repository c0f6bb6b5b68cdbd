"""Did the study reproduce? Every model's valid/test numbers (metrics/eval.json) against the committed ones.

    python .ci/reproduced.py COMMITTED_METRICS_DIR metrics

Bit for bit where this machine trained a model at the committed precision (metrics/train/<model>.json); a model
trained otherwise (fp32 on a CPU without native bf16) is reported with its difference, not failed: its numbers
are a different, equally valid, run. The n-gram has no precision and must always match.
"""

import json
import sys
from pathlib import Path


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def main(committed: Path, fresh: Path) -> int:
    old, new = read(committed / "eval.json")["models"], read(fresh / "eval.json")["models"]
    failed = []
    for model in sorted(old):
        if model not in new:
            failed.append(f"{model}: missing from {fresh / 'eval.json'}")
            continue
        train = [read(d / "train" / f"{model}.json").get("precision") if (d / "train" / f"{model}.json").exists()
                 else None for d in (committed, fresh)]
        same = all(old[model][s] == new[model][s] for s in ("valid", "test"))
        delta = new[model]["test"]["bpb"] - old[model]["test"]["bpb"]
        if same:
            print(f"{model}: reproduced bit for bit (test bpb {new[model]['test']['bpb']:.4f})")
        elif train[0] != train[1]:
            print(f"{model}: trained in {train[1]} here, {train[0]} when committed: test bpb {delta:+.4f} (not compared)")
        else:
            failed.append(f"{model}: test bpb {old[model]['test']['bpb']!r} -> {new[model]['test']['bpb']!r} "
                          f"({delta:+.2e}) at the same precision ({train[1]})")
    for line in failed:
        print("NOT REPRODUCED", line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
