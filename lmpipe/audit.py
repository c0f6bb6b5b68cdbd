"""The bias audit's data side: the WEAT word lists, corpus coverage, and word vectors from each model.

A word's vector in a BPE model is the mean of its pieces' embedding rows, in the leading-space form
(` word`) in which byte-level BPE sees it mid-sentence. The word is looked up as listed and
lower-cased, and the form more frequent in the training text is used. Words rarer than `min_count`
are dropped; a test whose sets keep fewer than `min_words` words is `insufficient_coverage`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from lmpipe.errors import ConfigError
from lmpipe.weat import weat

ROLES = ("X", "Y", "A", "B")
WORD = re.compile(r"[\w'-]+")


@dataclass(frozen=True)
class WeatTest:
    id: str
    title: str
    sets: dict  # role -> list of words
    paper_effect_size: float | None = None


def load_tests(custom: str | Path | None = None) -> list[WeatTest]:
    """The ten tests of Caliskan et al. (shipped with the package), plus the user's YAML tests if named."""
    data = json.loads(resources.files("lmpipe").joinpath("data/weat_tests.json").read_text())
    tests = [WeatTest(t["id"], t["title"], {r: data["sets"][t[r]] for r in ROLES}, t.get("paper_effect_size"))
             for t in data["tests"]]
    if custom:
        path = Path(custom)
        try:
            extra = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read the custom WEAT tests ({exc}); fix audit.custom_tests") from None
        for test_id, spec in (extra or {}).items():
            missing = [r for r in ROLES if not isinstance(spec.get(r), list) or not spec.get(r)]
            if missing:
                raise ConfigError(f"{path}: test {test_id!r} needs non-empty word lists {', '.join(missing)} (X, Y, A, B)")
            tests.append(WeatTest(str(test_id), spec.get("title", str(test_id)), {r: spec[r] for r in ROLES}))
    return tests


def word_counts(text: str) -> Counter:
    """Frequency of every word of the training text (case kept, punctuation around words ignored)."""
    return Counter(WORD.findall(text))


def choose_form(word: str, counts: Counter) -> tuple[str, int]:
    """The listed form or its lower-case, whichever the training text uses more."""
    forms = {word, word.lower()}
    best = max(sorted(forms), key=lambda f: counts.get(f, 0))
    return best, counts.get(best, 0)


def bpe_vector(form: str, tokenizer, embedding: np.ndarray) -> np.ndarray | None:
    """Mean of the embedding rows of ` form`'s BPE pieces (None when the word has no pieces)."""
    ids = tokenizer.encode(" " + form, add_special_tokens=False).ids
    return embedding[ids].mean(axis=0) if ids else None


def audit(lookup: Callable[[str], np.ndarray | None], counts: Counter, tests: list[WeatTest], min_count: int,
          min_words: int, max_permutations: int, seed: int) -> tuple[dict, dict]:
    """Run every test on one embedding. Returns (results per test id, {listed word: vector} of covered words)."""
    results, used = {}, {}
    for test in tests:
        vectors, kept, dropped, frequency = {}, {}, {}, {}
        for role in ROLES:
            rows = []
            kept[role], dropped[role] = [], []
            for word in test.sets[role]:
                form, count = choose_form(word, counts)
                frequency[word] = {"form": form, "count": count}
                vector = lookup(form) if count >= min_count else None
                if vector is None or not np.any(vector):
                    dropped[role].append(word)
                    continue
                rows.append(vector)
                kept[role].append(word)
                used[word] = vector
            vectors[role] = np.array(rows)
        record = {f"{r.lower()}_words": len(kept[r]) for r in ROLES}
        record |= {"coverage": {r: f"{len(kept[r])}/{len(test.sets[r])}" for r in ROLES},
                   "dropped": dropped, "frequency": frequency, "title": test.title,
                   "paper_effect_size": test.paper_effect_size}
        if min(len(kept[r]) for r in ROLES) < min_words:
            record |= {"status": "insufficient_coverage", "effect_size": None, "p_value": None, "n_permutations": 0}
        else:
            result = weat(vectors["X"], vectors["Y"], vectors["A"], vectors["B"], max_permutations, seed)
            record |= {"status": "ok", "effect_size": result.effect_size, "p_value": result.p_value,
                       "n_permutations": result.n_permutations, "exact": result.exact}
        results[test.id] = record
    return results, used


def write_word2vec_text(vectors: dict, path: str | Path) -> None:
    """The audited vectors in word2vec text format (gensim KeyedVectors.load_word2vec_format reads it)."""
    words = sorted(vectors)
    dim = len(next(iter(vectors.values()))) if vectors else 0
    lines = [f"{len(words)} {dim}"] + [w + " " + " ".join(f"{x:.6f}" for x in vectors[w]) for w in words]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
