"""`lmpipe reproduced`: a study re-made here against the committed one, judged in each model's seed sd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lmpipe.reproduced import reproduced
from tests.helpers import table_rows, write

ZEN5, XEON = "AMD family 26, AVX512-BF16", "Intel family 6, AMX"
COMMITTED = {"ngram": 2.05, "gru": 1.97, "lstm": 1.99}


def study(root, numbers: dict, machine: str, precision: str = "bf16") -> None:
    """metrics/eval.json and metrics/train/<model>.json holding `numbers` (valid = test + 0.1)."""
    write(root / "metrics/eval.json", {"models": {m: {"valid": {"bpb": b + 0.1}, "test": {"bpb": b}}
                                                  for m, b in numbers.items()}})
    for m, b in numbers.items():
        if m != "ngram":
            write(root / f"metrics/train/{m}.json", {"valid_bpb": b + 0.1, "precision": precision, "machine": machine})


def committed_study(root) -> None:
    """A git repository whose HEAD holds COMMITTED, made on a Zen 5, with three seeds per model: gru's sd 0.004,
    lstm's 0.002."""
    study(root, COMMITTED, ZEN5)
    lines = ["model,seed,valid_bpb,test_bpb,test_word_ppl,precision,identity,machine"]
    for m, sd in (("gru", 0.004), ("lstm", 0.002)):
        lines += [f"{m},{s},{COMMITTED[m] + 0.1 + d * sd},{COMMITTED[m] + d * sd},1.0,bf16,x,{ZEN5.replace(',', '')}"
                  for s, d in ((1, -1.0), (2, 1.0), (1234, 0.0))]
    (root / "seeds").mkdir()
    (root / "seeds/seeds.csv").write_text("\n".join(lines) + "\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "study"]):
        subprocess.run(["git", *args], cwd=root, check=True)


def test_bit_for_bit_then_within_noise_on_another_machine_then_differs(tmp_path):
    committed_study(tmp_path)
    ok, text = reproduced("HEAD", tmp_path)
    assert ok and "Reproduced bit for bit." in text and "keep them" not in text

    # Another CPU, in fp32: gru 1.75 sd off (valid too), lstm 0.5 sd: within noise, and the machines are named.
    study(tmp_path, {"ngram": 2.05, "gru": 1.97 + 0.007, "lstm": 1.99 - 0.001}, XEON, "fp32")
    ok, text = reproduced("HEAD", tmp_path)
    rows = {r[0]: r for r in table_rows(text)[1:]}
    assert ok and rows["gru"][1:] == ["1.9700", "1.9770", "+0.0070", "+0.0070", "0.0040", "within noise, 1.8 sd"]
    assert rows["lstm"][-1] == "within noise, 0.5 sd" and rows["ngram"][-1] == "bit for bit"
    assert list(rows) == ["gru", "lstm", "ngram"]  # best committed test bpb first
    assert f"committed on {ZEN5} (bf16); this run on {XEON} (fp32)." in text
    assert "Reproduced within noise" in text
    assert "keep them with: git commit -m 'Study re-made here' -- dvc.lock metrics plots reports seeds" in text

    # Beyond twice the sd (gru 2.25 sd), or the n-gram off in its last digits: differs, and the command fails.
    study(tmp_path, {"ngram": 2.05, "gru": 1.97 + 0.009, "lstm": 1.99}, XEON, "fp32")
    ok, text = reproduced("HEAD", tmp_path)
    assert not ok and {r[0]: r[-1] for r in table_rows(text)}["gru"] == "differs, 2.2 sd"
    assert "NOT reproduced: gru beyond noise" in text and "keep them" not in text
    study(tmp_path, {"ngram": 2.05 + 1e-6, "gru": 1.97, "lstm": 1.99}, ZEN5)
    assert not reproduced("HEAD", tmp_path)[0]


def test_the_command_prints_the_table_and_exits_nonzero_where_a_model_differs(tmp_path):
    committed_study(tmp_path)
    study(tmp_path, {"ngram": 2.05, "gru": 1.99, "lstm": 1.99}, XEON, "fp32")  # gru 5 sd off
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli", "reproduced"], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                                          "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stderr
    assert "| gru" in done.stdout and "NOT reproduced: gru" in done.stdout
    assert json.loads((tmp_path / "metrics/eval.json").read_text())["models"]["gru"]["test"]["bpb"] == 1.99
