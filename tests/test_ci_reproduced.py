"""CI's reproduction check (.ci/reproduced.py): bit for bit passes, a seed-sized difference passes loudly, more fails."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("reproduced", ROOT / ".ci" / "reproduced.py")
reproduced = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduced)


def metrics(tmp_path: Path, name: str, bpb: dict, precision: dict) -> Path:
    folder = tmp_path / name
    (folder / "train").mkdir(parents=True)
    models = {m: {s: {"bpb": b, "ppl": 2 ** b} for s in ("valid", "test")} for m, b in bpb.items()}
    (folder / "eval.json").write_text(json.dumps({"models": models}))
    for model, p in precision.items():
        (folder / "train" / f"{model}.json").write_text(json.dumps({"precision": p}))
    return folder


def test_bit_for_bit_passes_a_seed_sized_difference_passes_loudly_and_more_fails(tmp_path, capsys):
    committed = metrics(tmp_path, "old", {"gru": 1.97, "lstm": 1.99, "ngram": 2.05}, {"gru": "bf16", "lstm": "bf16"})
    same = metrics(tmp_path, "same", {"gru": 1.97, "lstm": 1.99, "ngram": 2.05}, {"gru": "bf16", "lstm": "bf16"})
    assert reproduced.main(committed, same) == 0
    assert capsys.readouterr().out.count("reproduced bit for bit") == 3

    close = metrics(tmp_path, "close", {"gru": 1.975, "lstm": 1.99, "ngram": 2.05}, {"gru": "fp32", "lstm": "bf16"})
    assert reproduced.main(committed, close) == 0
    assert "gru: NOT bit for bit, within 0.02 bpb" in capsys.readouterr().out

    far = metrics(tmp_path, "far", {"gru": 1.97, "lstm": 2.02, "ngram": 2.05}, {"gru": "bf16", "lstm": "bf16"})
    assert reproduced.main(committed, far) == 1
    assert "lstm: NOT REPRODUCED" in capsys.readouterr().err

    missing = metrics(tmp_path, "missing", {"gru": 1.97, "ngram": 2.05}, {"gru": "bf16"})
    assert reproduced.main(committed, missing) == 1
    assert "lstm: missing" in capsys.readouterr().err
