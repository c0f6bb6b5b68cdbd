"""Loss by context position: each window read from an empty context, the same loss the evaluator gives it alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import yaml

from lmpipe.config import TrainParams
from lmpipe.evaluate import stream_nll
from lmpipe.model_params import ModelParams
from lmpipe.models import build_model, save_model
from lmpipe.ngram import NGramLM
from lmpipe.position import loss_by_position, seed_bands, window_losses, windows_of
from tests.helpers import ADAMW, SYNTHETIC_VOCAB, entry, project_params, synthetic_data, write_tokens

V = SYNTHETIC_VOCAB
ARCH = {"rnn": {"cell": "gru", "emb": 16, "hidden": 16, "layers": 1},
        "lstm": {"cell": "lstm", "emb": 16, "hidden": 16, "layers": 2},
        "transformer": {"dim": 16, "layers": 1, "heads": 2, "block_size": 16, "position": "rope"},
        "learned": {"dim": 16, "layers": 1, "heads": 2, "block_size": 16},
        "nplm": {"context": 3, "emb": 8, "hidden": 16}}
FAMILY = {"rnn": "rnn", "lstm": "rnn", "transformer": "transformer", "learned": "transformer", "nplm": "nplm"}


def untrained(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(FAMILY[name], ARCH[name], V, 0).eval()



def stream():
    return synthetic_data().splits["test"].tokens.astype(np.int64)


@pytest.mark.parametrize("name", list(ARCH))
@pytest.mark.parametrize("window", [16, 40])
def test_each_window_scores_as_the_evaluator_scores_it_alone(name, window):
    """Batched and chunked, every window's losses are those of `stream_nll` on that window as a stream of its own:
    a zero state, a fresh transformer window (sliding beyond its block as the evaluator's does), the NPLM padded."""
    model, tokens = untrained(name), stream()[:8 * window + 3]
    losses = window_losses(model, tokens, window, chunk=12)
    assert losses.shape == (8, window)
    for row, w in zip(losses, windows_of(tokens, window)):
        alone = []
        nll, _ = stream_nll(model, w, chunk=12, token_logprobs=alone)
        np.testing.assert_allclose(row, -np.concatenate(alone), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss_by_position(model, tokens, window, chunk=12), losses.mean(axis=0))


@pytest.mark.parametrize("name", ["rnn", "lstm"])
def test_recurrent_position_zero_is_the_zero_state_loss_of_each_windows_first_token(name):
    model, tokens, window = untrained(name), stream(), 20
    with torch.no_grad():
        logits, _, _ = model(torch.tensor([[model.boundary]]), None)  # the zero state, after the boundary
    log_p = torch.log_softmax(logits[0, -1].double(), -1).numpy()
    first = windows_of(tokens, window)[:, 0]
    curve = loss_by_position(model, tokens, window)
    assert curve[0] == pytest.approx(-log_p[first].mean(), rel=1e-5)


@pytest.mark.parametrize("name", ["transformer", "learned"])
def test_the_transformer_reads_only_its_windows_tokens_before_the_position(name):
    model, window = untrained(name), 16
    tokens = stream()[:4 * window]
    before = window_losses(model, tokens, window)
    earlier = tokens.copy()
    earlier[:2 * window] = (earlier[:2 * window] + 5) % V  # the two windows before window 2
    after = window_losses(model, earlier, window)
    np.testing.assert_array_equal(after[2:], before[2:])
    inside = tokens.copy()
    inside[2 * window + 5] = (inside[2 * window + 5] + 1) % V  # position 5 of window 2
    changed = window_losses(model, inside, window)
    np.testing.assert_array_equal(changed[2, :5], before[2, :5])
    assert np.all(np.abs(changed[2, 6:] - before[2, 6:]) > 0)
    np.testing.assert_array_equal(np.delete(changed, 2, axis=0), np.delete(before, 2, axis=0))


def test_a_window_longer_than_the_block_keeps_the_blocks_curve():
    model, tokens = untrained("transformer"), stream()
    block = model.block_size
    short, long = loss_by_position(model, tokens[:30 * block], block), loss_by_position(model, tokens[:30 * block],
                                                                                        2 * block)
    assert len(long) == 2 * block
    # the same tokens at the window's first block positions, but windows of 2 blocks start at every other block
    rows = window_losses(model, tokens[:30 * block], block)[::2]
    np.testing.assert_allclose(long[:block], rows.mean(axis=0), rtol=1e-6)
    assert short.shape == (block,)


def test_the_ngrams_history_stops_at_the_windows_start():
    data = synthetic_data()
    ngram = NGramLM(3, V, 0).fit(data.splits["train"].tokens)
    tokens, window = stream(), 20
    losses = window_losses(ngram, tokens, window)
    p0 = ngram.next_token_distribution([])  # the history of a window's first token: its boundary, nothing more
    first = windows_of(tokens, window)[:, 0]
    assert losses[:, 0].mean() == pytest.approx(-np.log(p0[first]).mean(), rel=1e-9)
    for row, w in zip(losses[:5], windows_of(tokens, window)):
        np.testing.assert_allclose(row, -ngram.token_log_probs(w), rtol=1e-12)
    second = windows_of(tokens, window)[:, 1]  # position 1 reads <s> and the first token: a trigram's history
    p1 = np.array([ngram.next_token_distribution([a])[b] for a, b in zip(first, second)])
    assert losses[:, 1].mean() == pytest.approx(-np.log(p1).mean(), rel=1e-9)


COMMON = TrainParams(seed=7, device="cpu", threads=0, log_every=5, checkpoint_every=1000, eval_chunk=32,
                     evals_per_epoch=1, compile=False, precision="fp32")
TRANSFORMER = ModelParams(**entry("transformer", {"dim": 32, "layers": 1, "heads": 2, "block_size": 32},
                                 optim={**ADAMW, "lr": 3e-3, "warmup_steps": 5}, batch_size=8, seq_len=32, epochs=2))


def test_a_trained_model_gains_from_the_token_before(tmp_path):
    """Token t+1 follows from token t: at position 0 the model has only the boundary, after it the previous token.
    Trained: position 0 near 3.6 nats (uniform: log 30 = 3.4), every later position below 2.3 (mean 2.04)."""
    from lmpipe.train import Trainer, setup_process

    model = Trainer("transformer", TRANSFORMER, COMMON, synthetic_data(), tmp_path / "transformer",
                    setup_process(COMMON), progress_bar=False).run().model.eval()
    curve = loss_by_position(model, stream(), 32)
    assert curve[0] > 3.0
    assert curve[1:].max() < curve[0] - 1.0
    assert curve[1:].mean() < 2.5


def test_seed_bands_are_the_mean_and_sample_sd_per_position():
    mean, sd = seed_bands([np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([5.0, 9.0])])
    np.testing.assert_allclose(mean, [3.0, 5.0])
    np.testing.assert_allclose(sd, [2.0, math.sqrt(13.0)])
    mean, sd = seed_bands([np.array([1.5, 2.5])])
    np.testing.assert_allclose(mean, [1.5, 2.5])
    assert np.isnan(sd).all()


def test_windows_leave_out_the_shorter_last_stretch_and_refuse_none():
    assert windows_of(np.arange(10), 3).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ValueError, match="no window of 20"):
        windows_of(np.arange(10), 20)


# ---------------- the command ----------------

def project(root):
    """A project holding the test split, KN-3 and two tiny models, their params as params.yaml states them."""
    data = synthetic_data()
    write_tokens(root, data)
    models = {"gru": entry("rnn", ARCH["rnn"]), "transformer": entry("transformer", ARCH["transformer"], seq_len=8)}
    tree = project_params(models=models, ngram={**project_params()["ngram"], "order": 3})
    (root / "params.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    NGramLM(3, V, 0).fit(data.splits["train"].tokens).save(root / "models/ngram")
    for name, seed in (("gru", 0), ("transformer", 0), ("gru", 1), ("gru", 2)):
        where = root / (f"models/{name}" if seed == 0 else f"more/{name}-seed{seed}")
        where.mkdir(parents=True)
        model = untrained("rnn" if name == "gru" else name, seed)
        save_model(model, FAMILY["rnn" if name == "gru" else name], ARCH["rnn" if name == "gru" else name],
                   where / "model.pt")
    return data


def test_the_command_writes_every_models_curve_with_its_seed_band(tmp_path, monkeypatch):
    import json

    from flows.position import main
    from lmpipe.context_use import baseline_identity
    from lmpipe.io import csv_records

    data = project(tmp_path)
    (tmp_path / "metrics/train").mkdir(parents=True)  # what made the GRU, as its training summary says
    (tmp_path / "metrics/train/gru.json").write_text('{"identity": "abc", "machine": "AMD family 26", "precision": "bf16"}')
    evaluation = {"models": {"ngram": {"test": {"bpb": 2.0485}}}}  # what identifies the n-gram: its results
    (tmp_path / "metrics/eval.json").write_text(json.dumps(evaluation))
    monkeypatch.chdir(tmp_path)
    main(["--seeds", "more", "--device", "cpu"])
    rows = csv_records(tmp_path / "plots/position.csv")
    window = 64  # the committed seq_len of the GRU's entry (64) beats the transformer's block (16)
    assert [r["model"] for r in rows] == ["ngram"] * window + ["gru"] * window + ["transformer"] * window
    gru = [r for r in rows if r["model"] == "gru"]
    curves = [loss_by_position(untrained("rnn", s), data.splits["test"].tokens, window) for s in (0, 1, 2)]
    mean, sd = seed_bands(curves)
    np.testing.assert_allclose([float(r["nats"]) for r in gru], mean, atol=1e-6)
    np.testing.assert_allclose([float(r["sd"]) for r in gru], sd, atol=1e-6)
    assert {r["seeds"] for r in gru} == {"3"}
    assert {(r["identity"], r["trained_on"]) for r in gru} == {("abc", "AMD family 26, bf16")}
    assert {(r["identity"], r["trained_on"]) for r in rows if r["model"] == "transformer"} == {("", "")}  # none
    assert {(r["identity"], r["trained_on"]) for r in rows if r["model"] == "ngram"} == {
        (baseline_identity(evaluation), "")}
    assert {r["sd"] for r in rows if r["model"] == "transformer"} == {""}


def test_the_command_names_a_missing_model_in_one_line(tmp_path, monkeypatch, capsys):
    import shutil

    from flows.position import main

    project(tmp_path)
    shutil.rmtree(tmp_path / "models/transformer")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main([])
    assert str(stopped.value).startswith("error: models/transformer: no trained model there")
    assert "\n" not in str(stopped.value)
    assert not (tmp_path / "plots/position.csv").exists()


# ---------------- the report's reading ----------------

def position_csv(path, curves: dict) -> None:
    """plots/position.csv as flows.position writes it: {model: (nats per position, identity)}, one seed each."""
    from flows.position import COLUMNS

    lines = [",".join(COLUMNS)]
    for model, (nats, identity) in curves.items():
        trained_on = '"AMD family 23, AVX2, fp32"' if identity and model != "ngram" else ""
        lines += [f"{model},{p},{v},,1,{identity},{trained_on}" for p, v in enumerate(nats)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_a_curve_levels_off_where_its_bins_stop_differing_from_the_last_beyond_the_scatter_between_positions():
    from lmpipe.context_use import Curve, doubling_bins

    assert doubling_bins(128) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128)]
    assert doubling_bins(130)[-2:] == [(32, 64), (64, 130)]  # two positions past 128 join the bin before
    step = Curve("ngram", np.array([5.0] * 3 + [4.0] * 61), None, 1, "", "")
    assert step.levels_off_at == 4 and step.late_gain == (0.0, 0.0)  # no scatter: any difference counts
    falling = Curve("transformer", np.linspace(5.0, 3.0, 64), None, 1, "t", "")
    assert falling.levels_off_at == 32  # still falling at the window's end: it keeps using its context
    ramp = np.linspace(5.0, 3.0, 64)
    assert falling.late_gain[0] == pytest.approx(ramp[16:32].mean() - ramp[32:].mean())  # 16-31 less 32-63
    assert falling.late_gain[0] > 2 * falling.late_gain[1] > 0
    found = []  # a real step at 8 tokens read, under the scatter a position's tokens give (0.1 nats), 100 draws
    for seed in range(100):
        nats = 4.0 + 0.1 * np.random.default_rng(seed).standard_normal(128)
        nats[:8] += 0.5
        curve = Curve("gru", nats, None, 1, "g", "")
        found.append(curve.levels_off_at)
        assert curve.scatter == pytest.approx(0.1, abs=0.03)
    assert min(found) == 8 and found.count(8) >= 75, found  # never before the step; mostly at it, not at the end


def test_the_report_shows_the_curves_of_the_models_as_they_are_and_names_the_others(tmp_path):
    import json

    from lmpipe.context_use import baseline_identity
    from lmpipe.paths import EVAL, POSITION_CURVES
    from lmpipe.report import build_report
    from tests.helpers import fixture_study

    fixture_study(tmp_path)
    for name, identity in (("lstm", "lstm-now"), ("transformer", "tr-now")):
        summary = tmp_path / f"metrics/train/{name}.json"
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "identity": identity}))
    before = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    assert "## Loss by context position" not in before  # no curves made: no section
    position_csv(tmp_path / POSITION_CURVES, {
        "ngram": ([5.0] * 3 + [4.0] * 61, ""), "transformer": (list(np.linspace(5.0, 3.0, 64)), "tr-now"),
        "lstm": ([4.0] * 64, "lstm-before"),  # made from an earlier training of the LSTM: stale
        "gru": ([4.0] * 64, "gone")})  # a model no longer in the study
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    section = md[md.index("## Loss by context position"):md.index("## Decoding samples")]
    assert "Not shown: ngram, lstm" in section  # a curve of an n-gram with other results: another corpus or n-gram
    position_csv(tmp_path / POSITION_CURVES, {"ngram": ([5.0] * 3 + [4.0] * 61, ""),  # made before it had an identity
                                              "gru": ([4.0] * 32 + [4.5] * 32, "gone")})
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    assert "Not shown: ngram, lstm, transformer" in md
    position_csv(tmp_path / POSITION_CURVES, {
        "ngram": ([5.0] * 3 + [4.0] * 61, baseline_identity(json.loads((tmp_path / EVAL).read_text()))),
        "transformer": (list(np.linspace(5.0, 3.0, 64)), "tr-now"), "lstm": ([4.0] * 64, "lstm-before"),
        "gru": ([4.0] * 64, "gone")})
    md = build_report(tmp_path, tmp_path / "reports", label="KN-5").read_text()
    section = md[md.index("## Loss by context position"):md.index("## Decoding samples")]
    assert "in its 64-token window" in section and "one seed a model, so no seed band yet" in section
    assert "of models trained on AMD family 23, AVX2, fp32." in section
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in section.splitlines()
            if line.startswith("| ") and "read " not in line}
    assert list(rows) == ["transformer", "KN-5 n-gram"]  # the longest to level off first
    assert rows["transformer"][-2:] == ["32", "+0.762 ± 0.182"] and rows["KN-5 n-gram"][-2:] == ["4", "+0.000 ± 0.000"]
    assert rows["KN-5 n-gram"][:4] == ["5.000", "5.000", "4.500", "4.000"]  # 0, 1, 2-3 and 4-7 tokens read
    assert ("Gaining longest: transformer, up to 32 tokens read; transformer still gains in the window's second half."
            in section)
    assert "Not shown: lstm: no curve of the training that made the model now" in section
    assert "gru" not in section
    assert (tmp_path / "reports/figures/position.png").stat().st_size > 1000
    assert (tmp_path / "reports/study.html").read_text().count("data:image/png;base64,") == 3


def test_a_loss_that_rises_in_the_windows_second_half_is_said_to_be_worse_not_a_gain():
    from lmpipe.context_use import Curve
    from lmpipe.report import _context_reading

    scatter = 0.1 * np.random.default_rng(0).standard_normal(128)
    flat = Curve("lstm", 4.0 + scatter, None, 1, "l", "")
    rising = Curve("gru", 4.0 + scatter + np.r_[np.zeros(64), np.full(64, 0.5)], None, 1, "g", "")
    falling = Curve("transformer", 4.0 + scatter + np.r_[np.zeros(64), np.full(64, -0.5)], None, 1, "t", "")
    said = _context_reading([rising, falling, flat], lambda c: c.model)
    assert "transformer still gains in the window's second half; gru does worse there than before it." in said, said
    assert "lstm" not in said.split("read; ", 1)[1], said
    assert _context_reading([flat], lambda c: c.model).endswith(
        "no model gains or loses beyond noise in the window's second half."), said
