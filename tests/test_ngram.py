"""The n-gram LM against a dictionary-based reference, hand computation, KenLM, and the real corpus."""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np
import pytest

from lmpipe.ngram import NGramLM, perplexity, write_arpa

BOS = "<s>"
V, B = 12, 0  # vocabulary size, boundary id


def lines_of(stream, boundary=B):
    """Sentences of a stream that ends with the boundary: token lists without it."""
    lines, current = [], []
    for t in stream:
        if t == boundary:
            lines.append(current)
            current = []
        else:
            current.append(int(t))
    assert not current, "test streams end with the boundary"
    return lines


class Reference:
    """Obviously-correct n-gram LM over sentences: dicts and the textbook formulas, no vectorisation.

    Each line is `<s> tokens </s>` with </s> the boundary id; n-grams never cross lines.
    Kneser-Ney: Chen & Goodman's interpolated modified KN, continuation counts below the top order
    except for n-grams that start with <s> (raw counts, as KenLM does), uniform 1/V at the bottom.
    """

    def __init__(self, train, order, method, k=0.01, alpha=0.4):
        self.order, self.method, self.k, self.alpha = order, method, k, alpha
        self.counts = [Counter() for _ in range(order)]
        for line in lines_of(train):
            seq = [BOS] + line + [B]
            for i in range(1, len(seq)):
                for n in range(1, order + 1):
                    if i - n + 1 >= 0:
                        self.counts[n - 1][tuple(seq[i - n + 1:i + 1])] += 1
        self.used = [dict(c) for c in self.counts]
        if method == "kneser_ney":
            for n in range(1, order):
                left = defaultdict(set)
                for g in self.counts[n]:
                    left[g[1:]].add(g[0])
                self.used[n - 1] = {g: (c if g[0] == BOS and n > 1 else len(left[g])) for g, c in self.counts[n - 1].items()}
        self.children = [defaultdict(list) for _ in range(order)]
        for n in range(order):
            for g, c in self.used[n].items():
                self.children[n][g[:-1]].append(c)
        self.discounts = []
        for n in range(order):
            values = list(self.used[n].values())
            nn = [values.count(j) for j in (1, 2, 3, 4)]
            if nn[0] == 0 or nn[1] == 0:  # counts-of-counts too thin to estimate: the model's fixed fallback
                self.discounts.append([0.0, 0.5, 1.0, 1.5])
                continue
            y = nn[0] / (nn[0] + 2 * nn[1])
            d = [j - (j + 1) * y * (nn[j] / nn[j - 1] if nn[j - 1] else 0) for j in (1, 2, 3)]
            self.discounts.append([0.0] + [min(max(x, 0.0), j) for j, x in zip((1, 2, 3), d)])

    def prob(self, w, ctx):
        ctx = tuple(ctx)
        n = len(ctx) + 1
        children = self.children[n - 1].get(ctx, [])
        total = sum(children)
        count = self.used[n - 1].get(ctx + (w,), 0)
        if self.method == "kneser_ney":
            lower = self.prob(w, ctx[1:]) if ctx else 1 / V
            if total == 0:
                return lower
            d = self.discounts[n - 1]
            gamma = sum(d[min(c, 3)] for c in children)
            return max(count - d[min(count, 3)], 0) / total + gamma / total * lower
        if self.method == "add_k":
            return (count + self.k) / (total + self.k * V)
        if not ctx:
            return (count + 1) / (sum(self.counts[0].values()) + V)
        return count / total if count else self.alpha * self.prob(w, ctx[1:])

    def log_probs(self, stream):
        out = []
        for line in lines_of(stream):
            seq = [BOS] + line + [B]
            for i in range(1, len(seq)):
                out.append(math.log(self.prob(seq[i], seq[max(0, i - self.order + 1):i])))
        return np.array(out)


def random_stream(seed, n_lines, vocab=range(1, V)):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_lines):
        out += list(rng.choice(list(vocab), size=rng.integers(0, 9), p=None)) + [B]
    return np.array(out, dtype=np.uint16)


TRAIN = random_stream(0, 60, vocab=range(1, V - 1))  # id V-1 never occurs in training
HELD_OUT = random_stream(1, 30)


@pytest.mark.parametrize("method", ["kneser_ney", "add_k", "stupid_backoff"])
@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_agrees_with_dictionary_reference(method, order):
    model = NGramLM(order, V, B, method).fit(TRAIN)
    reference = Reference(TRAIN, order, method)
    ours = model.token_log_probs(HELD_OUT)
    assert np.all(np.isfinite(ours))
    np.testing.assert_allclose(ours, reference.log_probs(HELD_OUT), rtol=0, atol=1e-9)
    np.testing.assert_allclose(model.token_log_probs(TRAIN), reference.log_probs(TRAIN), rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", ["kneser_ney", "add_k"])
@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_normalised_over_the_whole_vocabulary(method, order):
    model = NGramLM(order, V, B, method).fit(TRAIN)
    rng = np.random.default_rng(order)
    contexts = [[], [B], [V - 1, V - 1, V - 1]]  # empty, line start, never-seen token
    contexts += [list(TRAIN[i:i + rng.integers(1, 6)]) for i in rng.integers(0, len(TRAIN) - 6, 10)]  # seen
    contexts += [list(rng.integers(1, V, rng.integers(1, 6))) for _ in range(10)]  # mostly unseen
    for context in contexts:
        p = model.next_token_distribution(context)
        assert p.shape == (V,) and np.all(p > 0) and np.all(np.isfinite(p))
        assert abs(p.sum() - 1) < 1e-9, (context, p.sum())


def test_next_token_distribution_matches_stream_scores():
    model = NGramLM(4, V, B).fit(TRAIN)
    scores = model.token_log_probs(HELD_OUT)
    for i in (0, 3, 10, 25, len(HELD_OUT) - 1):
        assert math.log(model.next_token_distribution(HELD_OUT[:i])[HELD_OUT[i]]) == pytest.approx(scores[i], abs=1e-12)


def test_stupid_backoff_says_it_is_not_normalised():
    model = NGramLM(3, V, B, "stupid_backoff").fit(TRAIN)
    assert model.normalised is False
    assert abs(model.next_token_distribution([1, 2]).sum() - 1) < 1e-12  # renormalised for sampling


def test_hand_computed_bigram_example():
    """Two sentences, 'a b' and 'a c' (a=1, b=2, c=3, </s>=0, V=4), order 2, modified KN.

    Bigrams (raw counts, top order): <s> a:2, a b:1, a c:1, b </s>:1, c </s>:1
      -> n1=4, n2=1: Y = 4/(4+2) = 2/3, D1 = 1 - 2Y(n2/n1) = 2/3, D2 = 2 - 3Y(n3/n2) = 2.
    Unigrams (continuation counts): a:1 (<s>), b:1 (a), c:1 (a), </s>:2 (b, c); total 5
      -> n1=3, n2=1: Y = 3/5, D1 = 1 - 2(3/5)(1/3) = 0.6, D2 = 2.
      gamma = (0.6*3 + 2*1)/5 = 0.76; P1(a) = (1-0.6)/5 + 0.76/4 = 0.27 = P1(b) = P1(c); P1(</s>) = 0 + 0.19.
    P(b|a) = (1 - 2/3)/2 + (2*(2/3))/2 * 0.27 = 1/6 + 0.18 = 0.346667
    P(a|<s>) = (2 - 2)/2 + (2/2) * 0.27 = 0.27
    P(</s>|a) = 0 + (2/3) * 0.19 = 0.126667
    P(</s>|b) = (1 - 2/3)/1 + (2/3) * 0.19 = 0.46;  P(a|b) = (2/3) * 0.27 = 0.18
    """
    model = NGramLM(2, 4, 0).fit(np.array([1, 2, 0, 1, 3, 0]))
    np.testing.assert_allclose(model.discounts[1], [2 / 3, 2, 3])
    np.testing.assert_allclose(model.discounts[0], [0.6, 2, 3])
    np.testing.assert_allclose(model.next_token_distribution([]), [0.19, 0.27, 0.27, 0.27], atol=1e-12)
    after_a = model.next_token_distribution([1])
    assert after_a[2] == pytest.approx(1 / 6 + 0.18, abs=1e-12)
    assert after_a[0] == pytest.approx(2 / 3 * 0.19, abs=1e-12)
    after_b = model.next_token_distribution([1, 2])
    assert after_b[0] == pytest.approx(0.46, abs=1e-12) and after_b[1] == pytest.approx(0.18, abs=1e-12)
    scores = np.exp(model.token_log_probs(np.array([1, 2, 0])))
    np.testing.assert_allclose(scores, [0.27, 1 / 6 + 0.18, 0.46], atol=1e-12)


def test_perplexity_definitions():
    log_probs = np.log(np.full(10, 0.25))
    result = perplexity(log_probs, words=5, n_bytes=20)
    assert result["ppl"] == pytest.approx(4.0)
    assert result["word_ppl"] == pytest.approx(16.0)  # 10 tokens * ln 4 over 5 words
    assert result["bpb"] == pytest.approx(1.0)  # 20 bits over 20 bytes


def read_arpa(path):
    """A plain ARPA reader: {order: {ngram tuple: (log10 prob, log10 backoff)}} and the header counts."""
    header, tables, order = {}, defaultdict(dict), None
    for line in open(path, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("ngram "):
            n, count = line[6:].split("=")
            header[int(n)] = int(count)
        elif line.endswith("-grams:"):
            order = int(line[1:].split("-")[0])
        elif line and order and not line.startswith("\\"):
            fields = line.split("\t")
            tables[order][tuple(fields[1].split(" "))] = (float(fields[0]), float(fields[2]) if len(fields) > 2 else 0.0)
    return header, tables


def arpa_log10(tables, words, context):
    """Backoff query: the longest listed n-gram, plus the backoffs of the contexts skipped on the way."""
    for start in range(len(context) + 1):
        gram = tuple(context[start:]) + (words,)
        if gram in tables[len(gram)]:
            backoff = sum(tables[len(context) - s][tuple(context[s:])][1]
                          for s in range(start) if tuple(context[s:]) in tables[len(context) - s])
            return tables[len(gram)][gram][0] + backoff
    raise AssertionError(f"{words} missing from the unigrams")


@pytest.mark.parametrize("order", [2, 3, 5])
def test_arpa_round_trip_and_kenlm(tmp_path, order):
    model = NGramLM(order, V, B).fit(TRAIN)
    path = tmp_path / "model.arpa"
    written = []
    counts = write_arpa(model, path, written.append)
    header, tables = read_arpa(path)
    assert header == counts == {k: len(tables[k]) for k in range(1, order + 1)}
    assert sum(written) == sum(counts.values())  # the progress it reports reaches the whole file
    reference = Reference(TRAIN, order, "kneser_ney")
    for k in range(2, order + 1):
        assert len(tables[k]) == len(reference.counts[k - 1])  # every seen n-gram, nothing more
    assert len(tables[1]) == V + 2  # every id, plus <s> and <unk>
    name = lambda t: "</s>" if t == B else str(t)  # noqa: E731
    ours = model.token_log_probs(HELD_OUT) / math.log(10)
    i = 0
    for line in lines_of(HELD_OUT):
        context = ["<s>"]
        for token in line + [B]:
            assert arpa_log10(tables, name(token), context[-(order - 1):]) == pytest.approx(ours[i], abs=1e-6)
            context.append(name(token))
            i += 1
    kenlm = pytest.importorskip("kenlm")
    lm = kenlm.Model(str(path))
    kenlm_total = sum(lm.score(" ".join(map(str, line)), bos=True, eos=True) for line in lines_of(HELD_OUT))
    assert kenlm_total == pytest.approx(ours.sum(), abs=1e-4)


def test_default_corpus_order3_beats_unigram_and_kn_beats_add_k(default_tokens):
    tokens, metrics = default_tokens
    vocab, boundary = metrics["vocab_size"], metrics["boundary_id"]

    def valid_ppl(order, method):
        model = NGramLM(order, vocab, boundary, method).fit(tokens["train"])
        return math.exp(-model.token_log_probs(tokens["valid"]).mean())

    unigram, trigram, add_k = valid_ppl(1, "kneser_ney"), valid_ppl(3, "kneser_ney"), valid_ppl(3, "add_k")
    assert trigram < 0.5 * unigram
    assert add_k > 2 * trigram


@pytest.mark.parametrize("queries", ["sorted", "shuffled", "clustered"])
def test_chunked_search_equals_searchsorted(queries):
    """The stretch-by-stretch search gives numpy's positions for any query order, duplicates and misses included."""
    from lmpipe.ngram.lookup import SEARCH_CHUNK, search_sorted

    rng = np.random.default_rng(0)
    table = np.unique(rng.integers(0, 1 << 40, 50_000).astype(np.uint64))
    asked = np.concatenate([rng.choice(table, 3000), rng.integers(0, 1 << 41, 3000).astype(np.uint64), table[:5]])
    if queries == "sorted":
        asked = np.sort(asked)
    elif queries == "clustered":  # sorted runs, each run shuffled: what the n-gram key search sees
        asked = np.concatenate([rng.permutation(run) for run in np.array_split(np.sort(asked), 40)])
    else:
        asked = rng.permutation(asked)
    assert len(asked) > 10 * SEARCH_CHUNK
    np.testing.assert_array_equal(search_sorted(table, asked), np.minimum(np.searchsorted(table, asked), len(table) - 1))
