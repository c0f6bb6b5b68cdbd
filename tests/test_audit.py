"""The audit's data side: shipped word lists, coverage rules, BPE word vectors, interoperable output."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from lmpipe.audit import audit, bpe_vector, choose_form, load_tests, word_counts, write_word2vec_text
from lmpipe.errors import ConfigError
from tests.helpers import SHARED


def test_ten_tests_ship_with_the_package():
    tests = load_tests()
    assert [t.id for t in tests] == [f"weat{i}" for i in range(1, 11)]
    assert tests[0].sets["X"][:3] == ["aster", "clover", "hyacinth"] and tests[0].paper_effect_size == 1.5


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "weat/weat_tests.json").exists(), reason="../shared is absent")
def test_package_copy_equals_the_shared_reference():
    import json
    from importlib import resources

    packaged = json.loads(resources.files("lmpipe").joinpath("data/weat_tests.json").read_text())
    assert packaged == json.loads((SHARED / "weat/weat_tests.json").read_text())


def test_custom_tests_from_yaml(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("cats_dogs:\n  X: [cat]\n  Y: [dog]\n  A: [good]\n  B: [bad]\n")
    assert load_tests(path)[-1].sets == {"X": ["cat"], "Y": ["dog"], "A": ["good"], "B": ["bad"]}
    path.write_text("broken:\n  X: [cat]\n  Y: [dog]\n")
    with pytest.raises(ConfigError, match="'broken' needs non-empty word lists A, B"):
        load_tests(path)


def test_form_is_the_more_frequent_case():
    counts = word_counts("Rose rose rose. Paris is Paris, and the rose garden")
    assert choose_form("rose", counts) == ("rose", 3)
    assert choose_form("Paris", counts) == ("Paris", 2)
    assert choose_form("Tulip", counts) == ("Tulip", 0)  # absent in both forms: kept as listed, count 0


class PieceTokenizer:
    """Splits ' word' into two pieces with known ids, like a BPE that knows no whole word."""

    class Encoding:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, text, add_special_tokens=False):
        assert text.startswith(" ")  # the leading-space form
        return self.Encoding([len(text) % 5, 5 + len(text) % 3])


def test_bpe_vector_is_the_mean_of_the_pieces():
    embedding = np.arange(24, dtype=float).reshape(8, 3)
    vector = bpe_vector("ab", PieceTokenizer(), embedding)  # ' ab': pieces 3 and 5 + 0
    np.testing.assert_allclose(vector, (embedding[3] + embedding[5]) / 2)


def test_absent_words_give_insufficient_coverage_not_a_number():
    tests = load_tests()[:1]  # flowers/insects, pleasant/unpleasant
    counts = Counter({w: 10 for w in tests[0].sets["A"] + tests[0].sets["B"] + ["rose", "tulip"]})
    rng = np.random.default_rng(0)
    table = {}
    lookup = lambda w: table.setdefault(w, rng.normal(size=8))  # noqa: E731
    results, used = audit(lookup, counts, tests, min_count=5, min_words=4, max_permutations=1000, seed=0)
    r = results["weat1"]
    assert r["status"] == "insufficient_coverage" and r["effect_size"] is None
    assert (r["x_words"], r["y_words"], r["a_words"]) == (2, 0, 25)
    assert r["coverage"]["X"] == "2/25"
    assert r["frequency"]["rose"] == {"form": "rose", "count": 10} and r["frequency"]["ant"]["count"] == 0
    counts.update({w: 10 for w in tests[0].sets["X"] + tests[0].sets["Y"]})
    results, used = audit(lookup, counts, tests, min_count=5, min_words=4, max_permutations=1000, seed=0)
    assert results["weat1"]["status"] == "ok" and results["weat1"]["n_permutations"] == 1000
    assert len(used) == 100


def test_embeddings_file_loads_in_gensim(tmp_path):
    from gensim.models import KeyedVectors

    vectors = {"rose": np.array([0.1, 0.2, 0.3]), "ant": np.array([-1.0, 0.5, 2.0])}
    write_word2vec_text(vectors, tmp_path / "e.txt")
    loaded = KeyedVectors.load_word2vec_format(str(tmp_path / "e.txt"), binary=False)
    np.testing.assert_allclose(loaded["ant"], vectors["ant"], atol=1e-6)
