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


def model_lookup(model, tokenizer, embedding: str) -> Callable[[str], np.ndarray | None]:
    """A word form's vector in a neural model (`bpe_vector`), from its input embedding or its output rows
    (`audit.embedding`)."""
    matrix = model.embedding_matrix() if embedding == "input" else model.output_matrix()
    rows = matrix.detach().cpu().numpy().astype(np.float64)
    return lambda form: bpe_vector(form, tokenizer, rows)


def effect_sizes(results: dict) -> dict[str, dict]:
    """{test: {effect_size, p_value}} of the tests that ran: what seeds/weat.csv keeps of an audit."""
    return {t: {"effect_size": r["effect_size"], "p_value": r["p_value"]} for t, r in results.items()
            if r.get("effect_size") is not None}


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


def weat_heatmap(results: dict, out: str | Path) -> None:
    """Tests (rows, by name) x models (columns), effect size as colour; '*' marks p < 0.05, grey cells lacked coverage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results)
    tests = sorted({t for r in results.values() for t in r}, key=lambda t: (len(t), t))
    titles = {t: next((r[t]["title"] for r in results.values() if r.get(t, {}).get("title")), t) for t in tests}
    grid = np.array([[results[m].get(t, {}).get("effect_size") or np.nan for m in models] for t in tests], dtype=float)
    fig, ax = plt.subplots(figsize=(0.9 * len(models) + 6.5, 0.42 * len(tests) + 1.6))
    cmap = plt.get_cmap("RdBu_r").copy()
    cmap.set_bad("lightgray")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=-2, vmax=2, aspect="auto")
    for i, t in enumerate(tests):
        for j, m in enumerate(models):
            r = results[m].get(t, {})
            if r.get("effect_size") is not None:
                mark = "*" if r["p_value"] < 0.05 else ""
                ax.text(j, i, f"{r['effect_size']:.2f}{mark}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right")
    ax.set_yticks(range(len(tests)), [f"{t}: {titles[t]}" if titles[t] != t else t for t in tests], fontsize=8)
    ax.set_title("WEAT effect size (* p < 0.05; grey: too few words in the corpus)")
    fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
