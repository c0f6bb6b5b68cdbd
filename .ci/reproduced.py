"""Did the study reproduce? Every model's numbers from a fresh `make study` against the committed ones.

    python .ci/reproduced.py [--only MODEL]... COMMITTED_METRICS_DIR metrics

Compared: each neural model's validation bpb from its training stage (metrics/train/<model>.json, rewritten by
every fresh run), the n-gram's valid/test bpb (metrics/ngram.json), and every model's valid/test bpb in
metrics/eval.json (DVC skips `score@<model>` when a retrained model hashes the same as the committed one: then the
training numbers are what shows the run reproduced). Judged by the rule users read in `lmpipe reproduced`
(lmpipe.seeds.reproduction): bit for bit, within noise (no number more than twice the model's seed sd, over the
committed seeds/seeds.csv, from its committed value) or differs. The n-gram has no seed: only bit for bit holds. The
same machine kind reproduces the neural models bit for bit; another CPU's kernels or precision round otherwise, and
training amplifies that like a change of seed, so a neural model within noise passes with a loud "NOT bit for bit"
line, as long as the models still rank as committed (models within TIE_BPB of each other are a tie).

The WEAT audit (metrics/weat.json) follows the same rule: a model's effect sizes must match bit for bit when its
numbers did (word2vec's too: every AVX2 CPU runs OpenBLAS's Haswell kernels, lmpipe/blas.py). Otherwise its embedding
is another sample, as another seed's, and on word sets of 4 to 8 words its effect sizes move far (the RNN trained
in fp32 against the committed bf16 run, same seed: weat8 +0.77 -> -0.43, p 0.08 -> 0.78): what must stand is
the report's reading, which tests are significant (q < 0.05, Benjamini-Hochberg over the tests the model ran) and
their sign, said loudly.
"""

import itertools
import json
import math
import sys
from pathlib import Path

TIE_BPB = 0.01  # two models committed closer than this (2-5x their seed sds) may change places on another CPU
WEAT_Q = 0.05  # the report reads a WEAT test as significant where its adjusted p-value q is below this


def read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def numbers(metrics: Path, model: str) -> dict:
    """The bpb figures a fresh run recomputes for `model`, by name (NaN where missing)."""
    evaluated = read(metrics / "eval.json").get("models", {}).get(model, {})
    found = {f"eval {split}": evaluated.get(split, {}).get("bpb", math.nan) for split in ("valid", "test")}
    if model == "ngram":
        ngram = read(metrics / "ngram.json")
        found |= {f"ngram {split}": ngram.get(split, {}).get("bpb", math.nan) for split in ("valid", "test")}
    else:
        found["train valid"] = read(metrics / "train" / f"{model}.json").get("valid_bpb", math.nan)
    return found


SEEDS = Path("seeds/seeds.csv")  # the committed seed rows (`make study` never rewrites them)


def seed_sd(model: str, seeds: Path = SEEDS) -> dict | float | None:
    """The sd of `model`'s valid and of its test bpb over the committed seeds (seeds/seeds.csv,
    lmpipe.seeds.split_sds: each number is judged in its split's), 0 for the n-gram."""
    from lmpipe.seeds import read_rows, split_sds

    if model == "ngram":
        return 0.0
    rows = [r for r in read_rows(seeds) if r["model"] == model]
    return split_sds(rows) if rows else None


def verdict(model: str, old: dict, new: dict, precisions: list, seeds: Path = SEEDS) -> tuple[bool, str]:
    """(passes, one line) for one model's numbers, by lmpipe.seeds.reproduction in the model's seed sd."""
    from lmpipe.seeds import BIT_FOR_BIT, DIFFERS, reproduction

    if old == new:
        return True, f"{model}: reproduced bit for bit (test bpb {new['eval test']:.4f})"
    deltas = {name: new[name] - old[name] for name in old}
    change = ", ".join(f"{name} {d:+.2e}" for name, d in deltas.items())
    if not all(math.isfinite(d) for d in deltas.values()):
        return False, f"{model}: NOT REPRODUCED: a number is missing or not finite ({change})"
    if model == "ngram":
        return False, f"{model}: NOT REPRODUCED: the n-gram must match bit for bit ({change})"
    trained = (f"trained in {precisions[1]}, committed in {precisions[0]}" if precisions[0] != precisions[1]
               else f"both {precisions[1]}")
    sds = seed_sd(model, seeds)
    seen = reproduction(old, new, sds)
    known = ", ".join(f"{split} {sd:.4f}" for split, sd in (sds or {}).items() if sd)  # each number's split's sd
    if seen.verdict == BIT_FOR_BIT:
        return True, f"{model}: reproduced bit for bit but for the last digits ({change})"
    if seen.verdict != DIFFERS:
        return True, f"{model}: NOT bit for bit, {seen.text()} (seed sd {known}; {change}; {trained}): another CPU?"
    return False, (f"{model}: NOT REPRODUCED: bpb {change}, " + (f"{seen.sds:.1f} seed sds (seed sd {known})"
                   if seen.sds is not None else "and no seed sd to judge by") + f" ({trained})")


def weat_rows(metrics: Path, model: str) -> dict:
    """{test: (effect size, p-value)} of `model` in metrics/weat.json (None, None where a test did not run)."""
    return {test: (row.get("effect_size"), row.get("p_value")) for test, row in
            read(metrics / "weat.json").get("models", {}).get(model, {}).items()}


def significant(rows: dict) -> dict:
    """{test: sign of d} for the tests the report reads as significant: q < WEAT_Q, q as the report adjusts it."""
    from lmpipe.report import weat_adjusted_p

    q = weat_adjusted_p({t: {"p_value": p} for t, (d, p) in rows.items()})
    return {t: math.copysign(1, rows[t][0]) for t, q_t in q.items() if q_t < WEAT_Q}


def weat_verdict(model: str, old: dict, new: dict, exact_numbers: bool) -> tuple[bool, str]:
    """(passes, one line) for one model's WEAT rows; `exact_numbers`: its bpb figures were bit for bit."""
    if old == new:
        return True, f"{model}: WEAT reproduced bit for bit"
    if set(old) != set(new) or any((old[t][0] is None) != (new[t][0] is None) for t in old):
        return False, f"WEAT {model}: NOT REPRODUCED: other tests ran ({sorted(old)} vs {sorted(new)})"
    moved = max(abs(new[t][0] - old[t][0]) for t in old if old[t][0] is not None)
    if exact_numbers:
        return False, f"WEAT {model}: NOT REPRODUCED: effect sizes moved by up to {moved:.2e} though its numbers are bit for bit"
    before, after = significant(old), significant(new)
    if before == after:
        return True, (f"WEAT {model}: NOT bit for bit (effect sizes moved by up to {moved:.2e}), the same tests "
                      f"significant at q < {WEAT_Q} ({', '.join(sorted(after)) or 'none'}): another CPU?")
    return False, (f"WEAT {model}: NOT REPRODUCED: significant at q < {WEAT_Q}: {sorted(before.items())} committed, "
                   f"{sorted(after.items())} now (+1/-1: the sign of d)")


def judged(old, new, exact: bool, say) -> bool:
    """`exact`: whether old equals new, silently; else `say()`'s verdict, its line printed (errors to stderr)."""
    if exact:
        return old == new
    ok, line = say()
    print(line, file=sys.stdout if ok else sys.stderr)
    return ok


def main(committed: Path, fresh: Path, only: list[str] | None = None, exact: bool = False,
         seeds: Path = SEEDS) -> int:
    """0 when the study reproduced (`exact`: bit for bit, every model), else 1."""
    models = sorted(m for m in read(committed / "eval.json")["models"] if not only or m in only)
    passed, ranks = True, []
    audited = sorted(m for m in read(committed / "weat.json").get("models", {}) if not only or m in only)
    for model in audited:  # the embeddings: word2vec, trained apart, is exact whenever every model is
        same = all(numbers(committed, m) == numbers(fresh, m) for m in (models if model == "word2vec" else [model]))
        old, new = weat_rows(committed, model), weat_rows(fresh, model)
        passed &= judged(old, new, exact, lambda: weat_verdict(model, old, new, same))
    for model in models:
        precisions = [read(d / "train" / f"{model}.json").get("precision") for d in (committed, fresh)]
        old, new = numbers(committed, model), numbers(fresh, model)
        passed &= judged(old, new, exact, lambda: verdict(model, old, new, precisions, seeds))
        ranks.append((old["eval test"], new["eval test"], model))
    before, after = ([m for *_, m in sorted(ranks, key=lambda r: (r[i], r[2]))] for i in (0, 1))
    swapped = [f"{a} and {b}" for (old_a, new_a, a), (old_b, new_b, b) in itertools.combinations(ranks, 2)
               if abs(old_a - old_b) > TIE_BPB and (old_a - old_b) * (new_a - new_b) < 0]
    if swapped:
        print(f"NOT REPRODUCED: the models rank {' < '.join(after)} by test bpb; committed: {' < '.join(before)} "
              f"({'; '.join(swapped)} changed places, more than {TIE_BPB} bpb apart when committed)", file=sys.stderr)
        passed = False
    elif before != after:
        print(f"the models rank {' < '.join(after)} by test bpb; committed: {' < '.join(before)}: only models within "
              f"{TIE_BPB} bpb of each other changed places (a tie, as their seed spread says)")
    return 0 if passed else 1


def same_machine(committed: Path, fresh: Path) -> bool:
    """Whether every model was trained on the kind of machine its committed summary names (`machine`: provenance,
    which a reproduction on another kind rewrites even where every number is the same)."""
    kinds = [[read(d / "train" / f.name).get("machine") for d in (committed, fresh)]
             for f in sorted((committed / "train").glob("*.json"))]
    return all(old == new for old, new in kinds)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="compare a fresh study's numbers with the committed ones")
    parser.add_argument("--only", action="append", help="this model only, repeatable (e.g. ngram: the stages CI re-ran)")
    parser.add_argument("--exact", action="store_true", help="succeed only when every number is equal bit for bit")
    parser.add_argument("--same-machine", action="store_true",
                        help="succeed only when every model trained on the kind of machine it was committed from")
    parser.add_argument("--seeds", type=Path, default=SEEDS, help="the committed seed rows (default: %(default)s)")
    parser.add_argument("committed", type=Path)
    parser.add_argument("fresh", type=Path)
    args = parser.parse_args()
    if args.same_machine:
        sys.exit(0 if same_machine(args.committed, args.fresh) else 1)
    sys.exit(main(args.committed, args.fresh, args.only, args.exact, args.seeds))
