"""CI's reproduction check (.ci/reproduced.py): bit for bit passes; a neural model within twice its seed sd passes
loudly; the n-gram off by anything, a NaN, a bigger difference or a changed ranking fails."""

import importlib.util
import json
import math
from pathlib import Path

from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("reproduced", ROOT / ".ci" / "reproduced.py")
reproduced = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reproduced)

COMMITTED = {"gru": 1.97, "lstm": 1.99, "ngram": 2.05}


def metrics(tmp_path: Path, name: str, changed: dict | None = None, precision: str = "bf16") -> Path:
    """A metrics folder with every bpb of COMMITTED (the eval's valid = test, the training's valid too)."""
    bpb = COMMITTED | (changed or {})
    folder = tmp_path / name
    (folder / "train").mkdir(parents=True)
    models = {m: {s: {"bpb": b} for s in ("valid", "test")} for m, b in bpb.items()}
    (folder / "eval.json").write_text(json.dumps({"models": models}))
    (folder / "ngram.json").write_text(json.dumps(models["ngram"]))
    for model in ("gru", "lstm"):
        (folder / "train" / f"{model}.json").write_text(json.dumps({"precision": precision, "valid_bpb": bpb[model]}))
    return folder


def seed_rows(tmp_path: Path, sds: dict[str, float]) -> Path:
    """seeds.csv with three seeds per model about COMMITTED whose sd is `sds[model]`."""
    lines = ["model,seed,valid_bpb,test_bpb,test_word_ppl,precision,identity,machine"]
    for model, sd in sds.items():
        lines += [f"{model},{seed},{COMMITTED[model] + d * sd},{COMMITTED[model] + d * sd},1.0,bf16,x,a CPU"
                  for seed, d in ((1, -1.0), (2, 1.0), (1234, 0.0))]
    (tmp_path / "seeds.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "seeds.csv"


def test_bit_for_bit_and_differences_within_twice_the_seed_sd_pass_the_rest_fails(tmp_path, capsys):
    committed, seeds = metrics(tmp_path, "committed"), seed_rows(tmp_path, {"gru": 0.004, "lstm": 0.002})
    assert reproduced.main(committed, metrics(tmp_path, "same"), seeds=seeds) == 0
    assert capsys.readouterr().out.count("reproduced bit for bit") == 3

    assert reproduced.main(committed, metrics(tmp_path, "close", {"gru": 1.977}, precision="fp32"), seeds=seeds) == 0
    assert "gru: NOT bit for bit, within noise, 1.8 sd (seed sd valid 0.0040, test 0.0040;" in capsys.readouterr().out

    for name, changed, said in (("far", {"lstm": 1.995}, "lstm: NOT REPRODUCED: bpb"),  # 2.5 sd: a smaller gap
                                ("beyond", {"gru": 1.9781}, "gru: NOT REPRODUCED: bpb"),  # 2.03 sd
                                ("ngram", {"ngram": 2.05 + 1e-12}, "the n-gram must match bit for bit"),
                                ("nan", {"gru": math.nan}, "gru: NOT REPRODUCED: a number is missing"),
                                ("swapped", {"gru": 1.985, "lstm": 1.975}, "the models rank lstm < gru")):
        assert reproduced.main(committed, metrics(tmp_path, name, changed), seeds=seeds) == 1, name
        assert said in capsys.readouterr().err, name


def test_models_committed_within_a_tie_may_change_places(tmp_path, capsys):
    """lstm 1.99 and gru 1.985 are a tie (closer than 0.01 bpb): another CPU may order them otherwise."""
    committed, seeds = metrics(tmp_path, "committed", {"gru": 1.985}), seed_rows(tmp_path, {"gru": 0.004, "lstm": 0.002})
    assert reproduced.main(committed, metrics(tmp_path, "flipped", {"gru": 1.992}), seeds=seeds) == 0
    assert "only models within 0.01 bpb of each other changed places" in capsys.readouterr().out


def test_only_the_named_models_are_compared(tmp_path, capsys):
    """CI on a CPU without native bf16 re-runs the n-gram stages only: the neural models are not judged there."""
    committed = metrics(tmp_path, "committed")
    fresh = metrics(tmp_path, "fresh", {"gru": math.nan, "lstm": 3.0})
    assert reproduced.main(committed, fresh, only=["ngram"]) == 0
    assert capsys.readouterr().out.strip() == "ngram: reproduced bit for bit (test bpb 2.0500)"
    assert reproduced.main(committed, metrics(tmp_path, "off", {"ngram": 2.06}), only=["ngram"]) == 1



def test_the_command_line_ci_runs(tmp_path):
    import subprocess
    import sys

    committed, fresh = metrics(tmp_path, "committed"), metrics(tmp_path, "fresh", {"gru": math.nan})
    done = subprocess.run([sys.executable, str(ROOT / ".ci" / "reproduced.py"), "--only", "ngram", str(committed),
                           str(fresh)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ngram: reproduced bit for bit (test bpb 2.0500)"
    whole = subprocess.run([sys.executable, str(ROOT / ".ci" / "reproduced.py"), str(committed), str(fresh)],
                           capture_output=True, text=True)
    assert whole.returncode == 1 and "gru: NOT REPRODUCED" in whole.stderr


def test_exact_asks_for_every_number_bit_for_bit(tmp_path):
    """--exact: what .ci/run asks before it calls changed tracked files a failure (bit for bit, yet dirty)."""
    committed = metrics(tmp_path, "committed")
    assert reproduced.main(committed, metrics(tmp_path, "same"), exact=True) == 0
    assert reproduced.main(committed, metrics(tmp_path, "close", {"gru": 1.975}), exact=True) == 1
    assert reproduced.main(committed, metrics(tmp_path, "ngram-only", {"gru": 1.975}), ["ngram"], exact=True) == 0


def test_weat_must_match_where_the_numbers_did_and_keep_its_reading_where_they_did_not(tmp_path, capsys):
    """Bit for bit where the model's numbers are; else its effect sizes may move (another sample, as another seed:
    measured 1.2 on a fp32 retrain), but the tests read as significant (q < 0.05) and their sign must stand."""
    committed = metrics(tmp_path, "committed")
    weat = {"gru": {"weat7": {"effect_size": 0.8, "p_value": 0.30}, "weat8": {"effect_size": 1.5, "p_value": 0.001},
                    "weat1": {"effect_size": None, "p_value": None}},
            "word2vec": {"weat7": {"effect_size": 0.3, "p_value": 0.2}, "weat1": {"effect_size": None, "p_value": None}}}
    (committed / "weat.json").write_text(json.dumps({"models": weat}))

    def fresh(name, gru_bpb=None, gru_d=0.8, w2v_d=0.3, gru_8=(1.5, 0.001)):
        folder = metrics(tmp_path, name, {"gru": gru_bpb} if gru_bpb else None)
        rows = json.loads(json.dumps(weat))
        rows["gru"]["weat7"]["effect_size"], rows["word2vec"]["weat7"]["effect_size"] = gru_d, w2v_d
        rows["gru"]["weat8"]["effect_size"], rows["gru"]["weat8"]["p_value"] = gru_8
        (folder / "weat.json").write_text(json.dumps({"models": rows}))
        return folder

    assert reproduced.main(committed, fresh("same")) == 0
    assert reproduced.main(committed, fresh("same-exact"), exact=True) == 0
    assert reproduced.main(committed, fresh("w2v", w2v_d=0.3 + 4e-5)) == 1  # every model exact: word2vec must be too
    assert "WEAT word2vec: NOT REPRODUCED" in capsys.readouterr().err
    assert reproduced.main(committed, fresh("w2v-exact", w2v_d=0.3 + 4e-5), exact=True) == 1
    seeds = seed_rows(tmp_path, {"gru": 0.004, "lstm": 0.002})
    assert reproduced.main(committed, fresh("moved", gru_bpb=1.975, gru_d=-0.4, w2v_d=0.3 + 4e-5), seeds=seeds) == 0
    assert "WEAT gru: NOT bit for bit (effect sizes moved by up to 1.20e+00), the same tests significant at q < " \
           "0.05 (weat8)" in capsys.readouterr().out
    assert reproduced.main(committed, fresh("lost", gru_bpb=1.975, gru_8=(0.9, 0.2))) == 1  # no longer significant
    assert "WEAT gru: NOT REPRODUCED: significant at q < 0.05: [('weat8', 1.0)] committed, [] now" \
           in capsys.readouterr().err
    assert reproduced.main(committed, fresh("flipped", gru_bpb=1.975, gru_8=(-1.5, 0.001))) == 1  # the other sign
    assert "[('weat8', 1.0)] committed, [('weat8', -1.0)] now" in capsys.readouterr().err


def test_same_machine_tells_a_reproduction_on_another_kind_of_machine(tmp_path):
    """A study bit for bit on another kind of machine rewrites its summaries' `machine` (provenance): .ci/run then
    expects changed tracked files; on the same kind it does not."""
    committed, fresh = metrics(tmp_path, "committed"), metrics(tmp_path, "fresh")
    for folder, kind in ((committed, "AMD family 26, AVX512-BF16"), (fresh, "AMD family 26, AVX512-BF16")):
        for f in (folder / "train").glob("*.json"):
            f.write_text(json.dumps({**json.loads(f.read_text()), "machine": kind}))
    assert reproduced.same_machine(committed, fresh)
    (fresh / "train" / "gru.json").write_text(json.dumps({"valid_bpb": 1.97, "machine": "AMD family 25, AVX512-BF16"}))
    assert not reproduced.same_machine(committed, fresh)
