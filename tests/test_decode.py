"""Decoding strategies on hand-made models whose right answers are known."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lmpipe.decode import (DecodeSettings, diversity, filter_top_p, filter_typical, generate, repeating,
                           without_repeats)
from tests.helpers import project_params, section


class TableModel:
    """P(next | last token) from a fixed table: a tiny bigram model written by hand."""

    def __init__(self, table):
        self.table = np.asarray(table, dtype=float)

    def next_token_distribution(self, context):
        return self.table[context[-1] if context else 0]


# From 0, greedy takes 1 (0.6) but every continuation of 1 is flat (0.25 each), while 2 (0.4) leads
# to 3 with 0.9: the best two-token sequence is [2, 3] (0.36) although greedy finds [1, x] (0.15).
TRAP = TableModel([
    [0.0, 0.6, 0.4, 0.0],
    [0.25, 0.25, 0.25, 0.25],
    [0.0, 0.05, 0.05, 0.9],
    [0.7, 0.1, 0.1, 0.1],
])
RANDOM = TableModel(np.random.default_rng(0).dirichlet(np.ones(8), size=8))


def run(model, strategy, **kwargs):
    settings = DecodeSettings(strategy=strategy, max_new_tokens=kwargs.pop("n", 12), **kwargs)
    return generate(model, [0], settings, boundary=0)


def test_beam_finds_the_sequence_greedy_misses():
    assert run(TRAP, "greedy", n=2) == [1, 0]
    assert run(TRAP, "beam", n=2, beam_size=2) == [2, 3]


def test_beam_of_one_is_greedy():
    assert run(RANDOM, "beam", beam_size=1) == run(RANDOM, "greedy")


def test_top_k_one_and_top_p_zero_are_greedy():
    greedy = run(RANDOM, "greedy")
    assert run(RANDOM, "top-k", top_k=1, seed=3) == greedy
    assert run(RANDOM, "top-p", top_p=1e-9, seed=4) == greedy
    # a vanishing typical mass keeps only the single most typical token: no randomness left
    assert run(RANDOM, "typical", typical_p=1e-9, seed=5) == run(RANDOM, "typical", typical_p=1e-9, seed=6)


@pytest.mark.parametrize("strategy", ["sample", "top-k", "top-p", "typical"])
def test_sampling_is_reproducible_with_a_seed(strategy):
    a = run(RANDOM, strategy, seed=11, n=30)
    assert a == run(RANDOM, strategy, seed=11, n=30)
    assert a != run(RANDOM, strategy, seed=12, n=30)


def test_beam_stops_at_the_boundary():
    out = run(TRAP, "beam", n=10, beam_size=3, stop_at_boundary=True)
    assert out[-1] == 0 and 0 not in out[:-1]


# Each token is most likely followed by the next one round a ring of 8: every strategy's likeliest text is a loop.
RING = TableModel(np.roll(np.eye(8), 1, axis=1) * 0.6 + 0.05)


def ngrams(tokens, n):
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def test_the_no_repeat_rule_bans_what_would_repeat_an_ngram():
    assert repeating([1, 2, 3, 1, 2], 3) == [3]  # 1 2 was followed by 3 once: 1 2 3 may not come again
    assert sorted(repeating([4, 1, 4, 2, 4], 2)) == [1, 2]
    assert sorted(set(repeating([5, 6, 5], 1))) == [5, 6]  # 1: no token twice
    assert repeating([1, 2, 3, 1, 2], 0) == [] and repeating([1, 2], 3) == []
    assert sorted(repeating([7, 1, 2, 7, 1, 2, 7, 1], 3)) == [2, 2]  # 7 1 was followed by 2, twice


def test_the_rule_renormalises_so_top_p_measures_the_tokens_left():
    """Banning 2 (0.1 of the mass) leaves 0, 1, 3, 4, 5: a nucleus of 0.9 of what is left is {0, 1, 3}, not all of
    them, as it would be against the mass from before the ban."""
    p = np.array([0.5, 0.3, 0.1, 0.05, 0.03, 0.02])
    left = without_repeats(p, [0, 2, 0], 2)
    assert left[2] == 0 and left.sum() == pytest.approx(1.0)
    assert sorted(np.flatnonzero(filter_top_p(left, 0.9))) == [0, 1, 3]


@pytest.mark.parametrize("strategy", ["greedy", "beam", "top-k", "top-p", "typical", "sample"])
def test_no_text_repeats_an_ngram_with_the_rule_on(strategy):
    """The loop every strategy falls into on RING is gone with `no_repeat_ngram`: no bigram of the prompt and the
    text comes twice; off, the loop is back (so the rule, not the model, made the difference)."""
    looping = [0, *run(RING, strategy, n=20, seed=1)]
    assert len(set(ngrams(looping, 2))) < len(ngrams(looping, 2))
    text = [0, *run(RING, strategy, n=20, seed=1, no_repeat_ngram=2)]
    assert len(text) == 21 and len(set(ngrams(text, 2))) == len(ngrams(text, 2))


def test_the_rule_gives_way_when_every_token_would_repeat():
    """Eight tokens with no token twice (n = 1) leave nothing for the ninth: the text goes on rather than stop."""
    for strategy in ("greedy", "beam", "top-p"):
        text = run(RING, strategy, n=12, seed=2, no_repeat_ngram=1)
        assert len(text) == 12 and len(set([0, *text[:7]])) == 8


def test_filters_keep_the_right_tokens():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    np.testing.assert_allclose(filter_top_p(p, 0.75), [0.625, 0.375, 0, 0])
    # entropy 1.14 nats; surprisals 0.69, 1.20, 1.90, 3.0: the most typical token is 1, then 0
    np.testing.assert_allclose(filter_typical(p, 0.5), [0.5 / 0.8, 0.3 / 0.8, 0, 0])


def test_diversity_numbers():
    stats = diversity([[1, 2, 1, 2], [3, 3]])
    assert stats["distinct_1"] == pytest.approx(3 / 6)
    assert stats["distinct_2"] == pytest.approx(3 / 4)  # (1,2) (2,1) (1,2) (3,3)
    assert stats["repetition_rate"] == pytest.approx(3 / 6)  # 1, 2 repeat; 3 repeats


def test_each_prompt_samples_its_own_stream():
    """A model that forgets its prompt (a unigram) used to continue every prompt with the same text, because each
    prompt restarted one random stream; now every (prompt position) has its own, still reproducible from the seed."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from lmpipe.config import EvaluateParams
    from lmpipe.samples import sample_all

    class Unigram:
        def next_token_distribution(self, context):
            return np.full(26, 1 / 26)

    vocab = {chr(ord("a") + i): i for i in range(26)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    params = EvaluateParams(**section("evaluate", prompts=["b", "c", "d"], strategies=["top-k", "sample"],
                                            max_new_tokens=12, seed=3))
    first = sample_all({"unigram": Unigram()}, tokenizer, 0, params)
    again = sample_all({"unigram": Unigram()}, tokenizer, 0, params)
    for strategy in params.strategies:
        continuations = [s["tokens"] for s in first["unigram"][strategy]["samples"]]
        assert len({tuple(c) for c in continuations}) == 3  # independent prompts
        assert continuations == [s["tokens"] for s in again["unigram"][strategy]["samples"]]  # reproducible


@pytest.mark.parametrize("family, arch", [
    ("rnn", {"cell": "gru", "emb": 32, "layers": 2, "hidden": 48}),
    ("transformer", {"dim": 32, "layers": 2, "heads": 4, "block_size": 32}),
    ("nplm", {"context": 4, "emb": 32, "hidden": 64}),
])
def test_surprisals_in_one_pass_equal_token_by_token(family, arch):
    """A neural model scores a continuation in one forward pass: the same numbers as one call per token."""
    import torch

    from lmpipe.decode import distributions, surprisals
    from lmpipe.models import build_model

    torch.manual_seed(0)
    model = build_model(family, arch, 40, boundary=0)
    prompt, tokens = [3, 4, 5], [7, 1, 0, 9, 2, 2]
    context, expected = list(prompt), []
    for token in tokens:
        expected.append(-np.log(distributions(model, [context])[0][token]))
        context.append(token)
    np.testing.assert_allclose(surprisals(model, prompt, tokens), expected, rtol=1e-5)
    assert model.training  # mode restored


def byte_level_tokenizer():
    """A small byte-level BPE (the study's kind) trained on text with 2-, 3- and 4-byte characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["Ŭσμϯ naïve café 東京 𝄞 music " * 50, "the history of"], trainer)
    return tokenizer


@pytest.mark.parametrize("strategy", ["greedy", "beam", "top-k", "top-p", "typical"])
def test_no_strategy_emits_bytes_that_are_not_utf8(strategy):
    """A model that prefers the tokens which break UTF-8 (lone continuation bytes, characters started and never
    finished): with the tokenizer's guard every strategy's text decodes without U+FFFD, and stays readable."""
    from lmpipe.utf8 import Utf8Guard

    tokenizer = byte_level_tokenizer()
    guard = Utf8Guard.for_tokenizer(tokenizer)
    breaking = ~guard.allowed[0]  # the tokens that cannot start a character
    starting = np.array([guard.successor[0, t] > 0 for t in range(tokenizer.get_vocab_size())])  # a lead byte ends it
    weights = np.where(breaking | starting, 50.0, 1.0)
    weights[0] = 0.0  # no boundary

    class Breaker:
        def next_token_distribution(self, context):
            return np.random.default_rng(len(context)).dirichlet(weights)

    prompt = tokenizer.encode("the history of", add_special_tokens=False).ids
    settings = DecodeSettings(strategy=strategy, max_new_tokens=30, beam_size=3, seed=1)
    unguarded = tokenizer.decode(generate(Breaker(), prompt, settings, boundary=0))
    assert "\ufffd" in unguarded  # the model does break UTF-8 when nothing stops it
    new = generate(Breaker(), prompt, settings, 0, guard)
    assert len(new) >= 10 and "\ufffd" not in tokenizer.decode(new)  # whole characters only


def test_a_text_cut_inside_a_character_is_held_back_to_the_one_before():
    from lmpipe.utf8 import Utf8Guard

    tokenizer = byte_level_tokenizer()
    guard = Utf8Guard.for_tokenizer(tokenizer)
    ids = tokenizer.encode("café 東京", add_special_tokens=False).ids
    whole = guard.whole(ids)
    assert whole == ids and tokenizer.decode(whole) == " café 東京"
    cut = [t for t in range(tokenizer.get_vocab_size()) if tokenizer.id_to_token(t) == "æ"]  # 東's first byte, alone
    assert cut and guard.whole(ids + cut) == ids


def test_every_decoding_setting_has_one_rule_wherever_it_is_given():
    """params.yaml's `evaluate`, DecodeSettings and a served request are checked by the same rule of each setting
    (lmpipe.decode_rules.check_decoding; `lmpipe generate`'s flags: tests/test_cli.py)."""
    import pytest

    from lmpipe.config import parse_params
    from lmpipe.decode import DecodeSettings
    from lmpipe.errors import ConfigError
    from lmpipe.serving import BadRequest, request_settings

    with pytest.raises(ConfigError, match="evaluate.top_p"):
        parse_params(project_params(evaluate={"top_p": 1.5}), "params.yaml")
    with pytest.raises(ConfigError, match="^top_p must be a number above 0 and at most 1$"):
        DecodeSettings(top_p=1.5)
    with pytest.raises(ConfigError, match="^max_new_tokens must be a whole number from 1 to 1024$"):
        DecodeSettings(max_new_tokens=1025)
    with pytest.raises(BadRequest, match="^max_new_tokens must be a whole number from 1 to 1024$"):
        request_settings(DecodeSettings(), {"max_new_tokens": 1025})
    with pytest.raises(BadRequest, match="^no_repeat_ngram must be a whole number of at least 0$"):
        request_settings(DecodeSettings(), {"no_repeat_ngram": -1})
    assert request_settings(DecodeSettings(), {"no_repeat_ngram": 3}).no_repeat_ngram == 3
    assert DecodeSettings(seed=(3, 1)).seed == (3, 1)  # a seed and a prompt's position: numpy's entropy, no rule


class Reread:
    """A neural model asked afresh with each whole context, as decoding did before it carried the model's state."""

    def __init__(self, model):
        self.model = model

    def next_token_distributions(self, contexts):
        return self.model.next_token_distributions(contexts)


INCREMENTAL = [
    ("rnn", {"cell": "gru", "emb": 32, "layers": 2, "hidden": 48}),
    ("rnn", {"cell": "lstm", "emb": 32, "layers": 2, "hidden": 48}),
    ("rnn", {"cell": "rnn_tanh", "emb": 32, "layers": 1, "hidden": 48}),
    ("nplm", {"context": 4, "emb": 32, "hidden": 64}),
    ("transformer", {"dim": 32, "layers": 2, "heads": 4, "block_size": 12}),
    ("transformer", {"dim": 32, "layers": 2, "heads": 4, "block_size": 9, "position": "rope", "qk_norm": True}),
]


def peaked(family, arch, seed=0):
    """A tiny model whose next-token distributions are far from flat (its logits scaled up), so a rounding difference
    between two ways of computing them cannot pass for a change of the chosen token."""
    import torch

    from lmpipe.models import build_model

    torch.manual_seed(seed)
    model = build_model(family, arch, 40, boundary=0)
    with torch.no_grad():
        model.output_matrix().mul_(8.0)
    return model


@pytest.mark.parametrize("family, arch", INCREMENTAL, ids=[f"{f}-{a.get('cell', a.get('position', ''))}"
                                                         for f, a in INCREMENTAL])
def test_decoding_with_the_carried_state_gives_what_rereading_gives(family, arch):
    """Every family's incremental decoding (hidden states, key/value cache, last window), every strategy: the same
    tokens as asking the model afresh with each whole context, and the same distributions at every step, past the
    transformer's window (block_size 12 and 9: the window slides several times) and through beam reordering."""
    from lmpipe.decode import Contexts, evaluating

    model = peaked(family, arch)
    prompt, grown = [3, 4, 5, 6, 7], [1, 8, 2, 9, 2, 5, 0, 11, 3, 3, 7, 6, 1, 9, 4, 4, 2, 8, 10, 5]
    with evaluating(model):
        contexts = Contexts(model, [prompt, prompt[::-1]])
        np.testing.assert_allclose(contexts.probs, Reread(model).next_token_distributions([prompt, prompt[::-1]]),
                                   atol=1e-6)
        rows, now = [1, 0], [prompt, prompt[::-1]]
        for step, token in enumerate(grown):
            rows = rows if step % 3 else rows[::-1]  # reorder as beam search does
            contexts.advance([token, token + 1], rows)
            now = [now[rows[0]] + [token], now[rows[1]] + [token + 1]]
            np.testing.assert_allclose(contexts.probs, Reread(model).next_token_distributions(now), atol=1e-6)
    assert model.training  # mode restored
    for strategy in ("greedy", "beam", "top-k", "top-p", "typical", "sample"):
        settings = DecodeSettings(strategy=strategy, max_new_tokens=30, beam_size=3, seed=5)
        for start in ([], prompt, list(range(1, 15))):
            assert generate(model, start, settings, 0) == generate(Reread(model), start, settings, 0), strategy


def test_the_transformers_window_slides_by_half_a_block_as_the_evaluation_does():
    """Every prediction reads at least half a block and at most a block; the window restarts half a block on."""
    model = peaked("transformer", {"dim": 16, "layers": 1, "heads": 2, "block_size": 8})
    starts = [model.window_start(n) for n in range(1, 22)]
    assert starts == [0] * 8 + [4] * 4 + [8] * 4 + [12] * 4 + [16]
    assert all(4 < n - s <= 8 for n, s in zip(range(9, 22), starts[8:]))


def test_top_k_by_partition_keeps_what_a_full_stable_sort_keeps():
    """filter_top_k partitions before it sorts: the same tokens as the head of a stable sort, ties to the lower ids."""
    from lmpipe.decode import filter_top_k

    rng = np.random.default_rng(0)
    for trial in range(300):
        p = rng.dirichlet(np.full(int(rng.choice([7, 300, 8192])), float(rng.choice([0.05, 1.0]))))
        if trial % 2:  # many ties
            p = np.round(p, 2) + 1e-3
            p /= p.sum()
        for k in (1, 5, 40, 299):
            keep = np.argsort(-p, kind="stable")[:k]
            expected = np.zeros_like(p)
            expected[keep] = p[keep]
            np.testing.assert_array_equal(filter_top_k(p, k), expected / expected.sum())


def test_top_p_and_typical_from_a_head_keep_what_a_full_stable_sort_keeps():
    """filter_top_p and filter_typical sort a head of the vocabulary, grown until it holds the mass: bit for bit what
    sorting the whole vocabulary keeps, ties included, for flat and peaked distributions and every mass."""
    rng = np.random.default_rng(1)

    def by_full_sort(p, key, mass):
        order = np.argsort(key, kind="stable")
        n = int(np.searchsorted(np.cumsum(p[order]), mass) + 1)
        expected = np.zeros_like(p)
        expected[order[:n]] = p[order[:n]]
        return expected / expected.sum()

    for trial in range(200):
        p = rng.dirichlet(np.full(int(rng.choice([7, 300, 8192])), float(rng.choice([0.01, 0.3, 5.0]))))
        if trial % 2:  # many ties
            p = np.round(p, 3) + 1e-4
            p /= p.sum()
        logp = np.log(np.maximum(p, 1e-300))
        typical = np.abs(-logp + (p * logp).sum())
        for mass in (0.0, 0.3, 0.9, 0.999, 1.0):
            np.testing.assert_array_equal(filter_top_p(p, mass), by_full_sort(p, -p, mass))
            np.testing.assert_array_equal(filter_typical(p, mass), by_full_sort(p, typical, mass))


@pytest.mark.parametrize("family, arch", INCREMENTAL, ids=[f"{f}-{a.get('cell', a.get('position', ''))}"
                                                         for f, a in INCREMENTAL])
def test_prompts_decoded_together_get_what_each_gets_alone(family, arch):
    """A request's prompts go through the model as one batch (a transformer's only when their windows are alike):
    each prompt's tokens are those it gets decoded alone, re-reading its context, also when some stop early at the
    boundary and leave the batch."""
    from lmpipe.decode import generate_each, prompt_seed

    model = peaked(family, arch)
    for prompts, repeat in (([[3, 4, 5], [7], list(range(1, 15)), [3, 4, 5]], [0, 0, 0, 1]),
                            ([[3, 4, 5], [5, 4, 3], [1, 1, 1]], [0, 0, 0])):
        for strategy in ("greedy", "top-k", "top-p", "typical", "sample"):
            for stop in (False, True):
                settings = DecodeSettings(strategy=strategy, max_new_tokens=25, seed=3, stop_at_boundary=stop)
                alone = [generate(Reread(model), prompt, replace(settings, seed=prompt_seed(3, r)), 0)
                         for r, prompt in zip(repeat, prompts)]
                assert generate_each(model, prompts, settings, 0) == alone, (strategy, stop)
    assert model.training


def test_identical_prompts_in_one_call_sample_independently_and_reproducibly():
    """A served request of the same prompt four times: four samples (each repeat its own stream from the seed and
    the repeats before it), the first what the prompt gets alone, and the same four again with the same seed. A
    prompt among others gets what it gets alone, wherever it stands: a server's batch of requests changes nothing."""
    from lmpipe.decode import generate_each

    class Uniform:  # every token equally likely: only the random stream decides
        def next_token_distribution(self, context):
            return np.full(26, 1 / 26)

    settings = DecodeSettings(strategy="sample", max_new_tokens=8, seed=5)
    four = generate_each(Uniform(), [[1, 2]] * 4, settings, 0)
    assert len({tuple(t) for t in four}) == 4
    assert four == generate_each(Uniform(), [[1, 2]] * 4, settings, 0)
    assert four[0] == generate(Uniform(), [1, 2], settings, 0)
    mixed = generate_each(Uniform(), [[3], [1, 2], [4], [1, 2]], settings, 0)
    assert mixed[1] == four[0] and mixed[3] == four[1]  # the same prompt, the same stream, wherever it stands
    assert mixed[0] == generate(Uniform(), [3], settings, 0) and mixed[2] == generate(Uniform(), [4], settings, 0)
    greedy = generate_each(Uniform(), [[1, 2]] * 2, replace(settings, strategy="greedy"), 0)
    assert greedy[0] == greedy[1]  # nothing random: the same prompt, the same text
