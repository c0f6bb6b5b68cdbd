"""Scaling laws: which family, at which size N and tokens D, reaches the lowest loss for a compute budget C.

The grid trains every size of a family at every budget C (training FLOPs, lmpipe.flops), each run ending at
its budget with the schedule annealed to it, so its tokens are D = C / (FLOPs per token). Two views of the
same runs, as Hoffmann et al. 2022 ("Chinchilla"):

- IsoFLOP (their approach 2): at each C, loss against log N is fitted by a parabola; its minimum is N_opt(C),
  and D_opt(C) = C / (6 N_opt). A line through log N_opt against log C gives the exponent a in N_opt ~ C^a.
- Parametric (their approach 3): L(N, D) = E + A / N^alpha + B / D^beta, fitted by minimising the Huber loss
  (delta 1e-3) of log L against log(exp(a - alpha log N) + exp(b - beta log D) + exp(e)) with L-BFGS from a
  grid of starting points; A = exp(a), B = exp(b), E = exp(e). Its compute-optimal frontier follows from
  minimising L(N, C / (6 N)) over N.

N counts every parameter (embeddings too, as Hoffmann et al.): with tied embeddings the output layer's matmul,
which dominates a small model's FLOPs, is 6 N_embedding FLOPs per training token, so C ~ 6 N D holds here
(within a few % for these families: attention and the recurrence add the rest). The loss is validation bits
per byte, a constant multiple of nats per token on a fixed corpus, so the law's form is unchanged.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np

from lmpipe import stats

KEEP_STARTS = 64
HUBER_DELTA = 1e-3  # Hoffmann et al.'s choice: nearly an L1 fit of log-loss, robust to outlying runs
MAX_EPOCHS = 8  # a grid run that would read the training tokens more often is left out: so many repeats make the
# data, not the size, decide its loss (Muennighoff et al. 2023), it lies far below its budget's optimum, and on CPU it
# is the slowest run of its budget (the smallest sizes run at the lowest FLOP/s)


def size_label(size: dict) -> str:
    """A size's arch overrides as a short name: {dim: 64, layers: 2} -> 'dim64-layers2'."""
    return "-".join(f"{k}{v}" for k, v in size.items())


@dataclass(frozen=True)
class GridPoint:
    model: str  # an entry of params.yaml's `models`: the family's settings
    size: dict  # arch overrides for this size
    budget: float  # training FLOPs C
    seed: int | None = None  # train.seed of this run; None: params.yaml's

    @property
    def name(self) -> str:
        seed = "" if self.seed is None else f"-seed{self.seed}"
        return f"{self.model}-{size_label(self.size)}-C{self.budget:.1e}{seed}"


def grid_points(sizes_by_model: dict[str, list[dict]], budgets: list[float], extra_seeds: list[int] = (),
                seeded_budgets: list[float] = (), around_best: list[tuple[float, dict]] = ()) -> list[GridPoint]:
    """Every size of every model at every budget, and at each budget of `around_best` the sizes it lists, smallest
    budgets first (a short grid reads early); at each of `seeded_budgets` every size again with each of
    `extra_seeds`."""
    plan = sorted([(b, sizes_by_model) for b in budgets] + list(around_best), key=lambda entry: entry[0])
    return [GridPoint(model, dict(size), float(budget), seed)
            for budget, sizes_of in plan for model, sizes in sizes_of.items()
            for size in sizes for seed in [None, *(extra_seeds if budget in seeded_budgets else [])]]


def mean_over_seeds(rows: list[dict]) -> list[dict]:
    """One row per point (model, size, budget): its first run's (train.seed's) row with the mean valid bpb of its
    runs, `seeds` their number, `seed_sd` their sd (None for one run) and `replicates` their valid bpb (train.seed's
    first: what the bootstrap resamples), in the order of their first runs."""
    points: dict[tuple, list[dict]] = {}
    for r in rows:
        points.setdefault((r["model"], r["size"], float(r["budget"])), []).append(r)
    out = []
    for runs in points.values():
        losses = [float(r["valid_bpb"]) for r in runs]
        mean, sd = stats.mean_sd(losses)
        out.append({**runs[0], "valid_bpb": mean if len(runs) > 1 else runs[0]["valid_bpb"], "seeds": len(runs),
                    "seed_sd": sd, "replicates": losses})
    return out


def replicates(row: dict) -> list[float]:
    """A point's runs' valid bpb (`mean_over_seeds`), or its one run's."""
    return row.get("replicates") or [float(row["valid_bpb"])]


def seed_spread(points: list[dict]) -> list[dict]:
    """Each budget whose points (`mean_over_seeds`) had several seeds: how many, how many points, and a run's seed sd
    pooled over the points (the root of their variances' mean), smallest budget first."""
    by_budget: dict[float, list[dict]] = {}
    for p in points:
        if p["seeds"] > 1:
            by_budget.setdefault(float(p["budget"]), []).append(p)
    return [{"budget": budget, "seeds": max(p["seeds"] for p in ps), "points": len(ps),
             "sd": float(np.sqrt(np.mean([p["seed_sd"] ** 2 for p in ps])))} for budget, ps in sorted(by_budget.items())]


# ---------------- the parametric law L(N, D) = E + A / N^alpha + B / D^beta ----------------

@dataclass(frozen=True)
class Law:
    E: float
    A: float
    alpha: float
    B: float
    beta: float

    def loss(self, n, d):
        return self.E + self.A / np.power(n, self.alpha) + self.B / np.power(d, self.beta)

    @property
    def degenerate(self) -> bool:
        """An exponent at its bound 0: the loss does not fall with N (or D), so all compute goes to the other."""
        return self.alpha == 0 or self.beta == 0

    def optimal_n(self, compute: float) -> float:
        """N minimising L(N, C / 6N): G (C / 6)^(beta / (alpha + beta)), G = (alpha A / (beta B))^(1 / (alpha + beta))."""
        if self.degenerate:
            return 0.0 if self.alpha == 0 else math.inf
        s = self.alpha + self.beta
        return (self.alpha * self.A / (self.beta * self.B)) ** (1 / s) * (compute / 6) ** (self.beta / s)

    def optimal_loss(self, compute: float) -> float:
        if self.degenerate:  # the infimum: E plus the term that no split of the compute reduces
            return self.E + (self.A if self.alpha == 0 else 0.0) + (self.B if self.beta == 0 else 0.0)
        n = self.optimal_n(compute)
        return float(self.loss(n, compute / (6 * n)))

    def exponents(self) -> dict:
        """N_opt ~ C^a and D_opt ~ C^b with a = beta / (alpha + beta), b = alpha / (alpha + beta)."""
        s = self.alpha + self.beta
        return {"a": self.beta / s, "b": self.alpha / s} if s > 0 else {"a": math.nan, "b": math.nan}


def _objective(theta, log_n, log_d, log_loss, delta):
    """Huber loss of log L and its gradient in (a, alpha, b, beta, e)."""
    a, alpha, b, beta, e = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    r = top + np.log(total) - log_loss
    weights /= total
    small = np.abs(r) <= delta
    value = np.where(small, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta)).sum()
    slope = np.clip(r, -delta, delta)
    grad = np.array([(slope * weights[0]).sum(), -(slope * weights[0] * log_n).sum(),
                     (slope * weights[1]).sum(), -(slope * weights[1] * log_d).sum(), (slope * weights[2]).sum()])
    return value, grad


def starting_points(coarse: bool = False) -> list[tuple]:
    """A grid of initialisations (a, alpha, b, beta, e) as Hoffmann et al. use; `coarse` (8 spread-out starts) for the
    bootstrap refits, which also start from the full fit."""
    if coarse:
        return [(a, al, b, be, e) for (a, b), (al, be), e in
                itertools.product(((3.0, 6.0), (10.0, 12.0)), ((0.3, 0.3), (0.8, 0.5)), (-0.5, 0.5))]
    lin, exps, es = (0.0, 5.0, 10.0, 15.0, 20.0), (0.2, 0.5, 1.0, 1.5), (-1.0, 0.0, 0.5, 1.0)
    return [(a, al, b, be, e) for a, b in itertools.product(lin, lin) for al, be in itertools.product(exps, exps)
            for e in es]


def fit_law(n, d, loss, delta: float = HUBER_DELTA, starts: list[tuple] | None = None) -> Law:
    """The Chinchilla law fitted to runs (N, D, L): the best of L-BFGS from every starting point."""
    from scipy.optimize import minimize

    log_n, log_d, log_loss = (np.log(np.asarray(v, dtype=float)) for v in (n, d, loss))
    starts = starts or starting_points()
    if len(starts) > KEEP_STARTS:  # L-BFGS from the most promising starts only: the same optimum in tests
        initial = [_objective(np.array(s, dtype=float), log_n, log_d, log_loss, delta)[0] for s in starts]
        starts = [starts[i] for i in np.argsort(initial, kind="stable")[:KEEP_STARTS]]
    best = None
    for start in starts:
        res = minimize(_objective, np.array(start, dtype=float), args=(log_n, log_d, log_loss, delta), jac=True,
                       method="L-BFGS-B", bounds=[(None, None), (0.0, 3.0), (None, None), (0.0, 3.0), (None, None)])
        if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    a, alpha, b, beta, e = best.x
    return Law(E=math.exp(e), A=math.exp(a), alpha=float(alpha), B=math.exp(b), beta=float(beta))


def bootstrap_laws(n, d, runs: list[list[float]], samples: int, seed: int, around: Law,
                   delta: float = HUBER_DELTA) -> list[Law] | None:
    """The law refitted to `samples` draws of the bootstrap over seed replicates (`runs`: each point's runs,
    lmpipe.stats.bootstrap): its uncertainty from the seeds' noise; None where no point has several seeds."""
    n, d = (np.asarray(v, dtype=float) for v in (n, d))
    start = (math.log(around.A), around.alpha, math.log(around.B), around.beta, math.log(around.E))
    starts = [start] + starting_points(coarse=True)
    return stats.bootstrap(runs, lambda loss: fit_law(n, d, loss, delta, starts), samples, seed)


def interval(values, level: float = stats.LEVEL) -> tuple[float, float] | None:
    """The central `level` percentile interval of bootstrap values (lmpipe.stats.interval)."""
    return stats.interval(values, level)


def law_degenerate(law: Law, loss) -> bool:
    """A fit that says nothing of its constants: an exponent at a bound of its search (0 or 3), or a floor E that
    collapsed to nothing (below 1% of the lowest loss: no irreducible loss the runs could have placed)."""
    return law.degenerate or max(law.alpha, law.beta) >= 3.0 - 1e-6 or law.E < 0.01 * float(np.min(loss))


# ---------------- IsoFLOP profiles ----------------

def isoflop_minimum(n, loss) -> dict:
    """At one budget: the parabola of loss against log N through the best run and its two neighbours in size, and
    its minimum N_opt.

    Local, not through every run: a profile over a 32x range of sizes is not a parabola (it rises faster on the
    small side), and a far run tilts a global fit's vertex away from the best run, even outside the sizes. Through
    three runs whose middle one is the lowest, the vertex lies between its neighbours; so the minimum is bracketed
    exactly when the best run has a run on each side. When it sits at the edge of the sizes tried, N_opt is the
    best run's N, flagged `bracketed: False` (the grid should extend that way). `span`: the sizes the parabola
    was drawn through."""
    order = np.argsort(np.asarray(n, dtype=float))
    n, loss = np.asarray(n, dtype=float)[order], np.asarray(loss, dtype=float)[order]
    i = int(loss.argmin())
    if 0 < i < len(n) - 1:
        x = np.log(n[i - 1:i + 2])
        c2, c1, c0 = np.polyfit(x, loss[i - 1:i + 2], 2)
        vertex = -c1 / (2 * c2)
        return {"n_opt": float(math.exp(vertex)), "loss_opt": float(c0 + c1 * vertex + c2 * vertex ** 2),
                "bracketed": True, "edge": None, "coefficients": [float(c2), float(c1), float(c0)],
                "span": [float(n[i - 1]), float(n[i + 1])]}
    edge = "smallest" if i == 0 else "largest"
    return {"n_opt": float(n[i]), "loss_opt": float(loss[i]), "bracketed": False, "edge": edge,
            "coefficients": None, "span": None}


def power_law(x, y, level: float = 0.9) -> dict:
    """y = k x^p fitted as a line in log-log space. From three points on, p's `level` interval and the points'
    `scatter` about the line (the sd of log y): the points are the measurements (IsoFLOP minima, one per budget), so
    their scatter is their error, and p's interval is Student's t on n - 2 degrees of freedom."""
    from scipy import stats

    log_x, log_y = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    p, log_k = np.polyfit(log_x, log_y, 1)
    fit = {"exponent": float(p), "coefficient": float(math.exp(log_k))}
    if len(log_x) > 2:
        scatter = math.sqrt(float(np.sum((log_y - p * log_x - log_k) ** 2)) / (len(log_x) - 2))
        spread = math.sqrt(float(np.sum((log_x - log_x.mean()) ** 2)))
        half = stats.t.ppf(0.5 + level / 2, len(log_x) - 2) * scatter / spread
        fit.update(interval=[float(p - half), float(p + half)], scatter=scatter)
    return fit


def law_dict(law: Law) -> dict:
    return asdict(law)


def _minima(n, budgets, loss) -> list[dict]:
    """Each budget's IsoFLOP minimum of the points (`n`, `budgets`, `loss` aligned), smallest budget first."""
    out = []
    for c in sorted(set(budgets)):
        at = budgets == c
        out.append({"budget": float(c), **isoflop_minimum(n[at], loss[at])})
    return out


def _vertex_exponent(n, budgets, loss) -> float | None:
    """N_opt's exponent through the bracketed parabola vertices; None with fewer than two."""
    inside = [m for m in _minima(n, budgets, loss) if m["bracketed"]]
    return power_law([m["budget"] for m in inside], [m["n_opt"] for m in inside])["exponent"] if len(inside) > 1 \
        else None


def _best_size_exponent(n, budgets, loss) -> float | None:
    """N_opt's exponent through each budget's best run's N (no parabola)."""
    minima = _minima(n, budgets, loss)
    best = [(m["budget"], n[(budgets == m["budget"])][np.argmin(loss[budgets == m["budget"]])]) for m in minima]
    return power_law(*zip(*best))["exponent"] if len(best) > 1 else None


N_OPT_METHODS = {"vertex": "three-point vertex on seed means", "one_seed": "train.seed's runs only",
                 "best_size": "best size only"}


def n_opt_methods(runs: list[dict], samples: int, seed: int) -> dict:
    """N_opt ~ C^a by three methods, each a defensible reading of the same runs: the parabola vertices through the
    seed means, the vertices through train.seed's runs alone, and the best run's N without a parabola. Each
    method's bootstrap interval over seed replicates where the seeds give one; `interval` spans them all and every
    method's value, since the spread between methods is part of the exponent's uncertainty. `bracketed_share`:
    per budget, the share of draws whose minimum stays inside the sizes tried."""
    n, budgets = (np.array([float(r[k]) for r in runs]) for k in ("n_params", "budget"))
    reps = [replicates(r) for r in runs]
    means = np.array([float(np.mean(ys)) for ys in reps])
    first = np.array([ys[0] for ys in reps])
    values = {"vertex": _vertex_exponent(n, budgets, means), "one_seed": _vertex_exponent(n, budgets, first),
              "best_size": _best_size_exponent(n, budgets, means)}
    draws = stats.replicate_draws(reps, samples, seed) if samples else None
    intervals, share = {}, {}
    if draws is not None:
        for key, method in (("vertex", _vertex_exponent), ("best_size", _best_size_exponent)):
            intervals[key] = stats.interval(method(n, budgets, d) for d in draws)
        inside = np.array([[m["bracketed"] for m in _minima(n, budgets, d)] for d in draws])
        share = {float(c): float(s) for c, s in zip(sorted(set(budgets)), inside.mean(axis=0))}
    ends = [v for v in values.values() if v is not None] + [x for i in intervals.values() if i for x in i]
    return {"methods": {k: {"name": N_OPT_METHODS[k], "exponent": v, "interval": intervals.get(k)}
                        for k, v in values.items()},
            "interval": [min(ends), max(ends)] if draws is not None and ends else None,
            "bracketed_share": share}


# ---------------- the analysis of a finished grid ----------------

def analyse(rows: list[dict], bootstrap: int = 200, seed: int = 0, delta: float = HUBER_DELTA,
            workers: int | None = None, coarse: bool = False) -> dict:
    """Per family (`analyse_family`): the families fitted side by side, one process each up to `workers` (default:
    the CPU count), as they share nothing (the same numbers as one after the other). `coarse`: the main fits from
    the 8 coarse starts only, a quick look (tests).

    `rows`: one per run with model, n_params, tokens, flops, budget, valid_bpb."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    models = sorted({r["model"] for r in rows})
    families = [[r for r in rows if r["model"] == model] for model in models]
    workers = min(len(models), workers or os.cpu_count() or 1)
    if workers < 2:
        return {m: analyse_family(runs, bootstrap, seed, delta, coarse) for m, runs in zip(models, families)}
    # spawn, not fork: the caller is a Prefect flow with threads of its own; the children inherit the BLAS pin (env)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        each = [[value] * len(models) for value in (bootstrap, seed, delta, coarse)]
        return dict(zip(models, pool.map(analyse_family, families, *each)))


def analyse_family(runs: list[dict], bootstrap: int = 200, seed: int = 0, delta: float = HUBER_DELTA,
                   coarse: bool = False) -> dict:
    """One family's IsoFLOP minima and N_opt's exponent by three methods (`n_opt_methods`), the parametric law with
    its lack-of-fit test against the seed replicates, and, where the test does not reject it, its bootstrap
    intervals and predictions at 10x and 100x the largest budget; how well a fit without the largest budget
    predicts those runs. A rejected or degenerate law gives no intervals and no extrapolation."""
    n, d, loss = (np.array([float(r[k]) for r in runs]) for k in ("n_params", "tokens", "valid_bpb"))
    reps = [replicates(r) for r in runs]
    budgets = sorted({float(r["budget"]) for r in runs})
    iso = []
    for c in budgets:
        at = [r for r in runs if float(r["budget"]) == c]
        minimum = isoflop_minimum([float(r["n_params"]) for r in at], [float(r["valid_bpb"]) for r in at])
        iso.append({"budget": c, **minimum, "d_opt": c / (6 * minimum["n_opt"])})
    starts = starting_points(coarse)
    law = fit_law(n, d, loss, delta, starts)
    # in log-loss, where the law is fitted and a seed's noise is about the same share of every loss
    check = stats.lack_of_fit([np.log(ys) for ys in reps], np.log(law.loss(n, d)), 5)
    degenerate = law_degenerate(law, loss)
    usable = not degenerate and not (check and check.rejected)
    laws = bootstrap_laws(n, d, reps, bootstrap, seed, law, delta) if bootstrap and usable else None
    largest = budgets[-1]
    fitted = np.array([float(r["budget"]) < largest for r in runs])
    held_law = fit_law(n[fitted], d[fitted], loss[fitted], delta, starts) if fitted.sum() >= 5 else None
    held = [{"name": r["name"], "measured": float(r["valid_bpb"]),
             "predicted": float(held_law.loss(float(r["n_params"]), float(r["tokens"])))}
            for r, f in zip(runs, fitted) if not f] if held_law else []
    for h in held:
        h["relative_error"] = (h["predicted"] - h["measured"]) / h["measured"]
    predictions = {f"{k}x": {"budget": k * largest, "loss": law.optimal_loss(k * largest),
                             "n_opt": law.optimal_n(k * largest),
                             "interval": interval([b.optimal_loss(k * largest) for b in laws]) if laws else None}
                   for k in (10, 100)} if usable else {}
    bracketed = [p for p in iso if p["bracketed"]]
    methods = n_opt_methods(runs, bootstrap, seed)
    for p in iso:
        p["bracketed_share"] = methods["bracketed_share"].get(p["budget"])
    exponents = None
    if len(bracketed) >= 2:
        n_line = power_law([p["budget"] for p in bracketed], [p["n_opt"] for p in bracketed])
        d_line = power_law([p["budget"] for p in bracketed], [p["d_opt"] for p in bracketed])
        for line in (n_line, d_line):
            line.pop("interval", None)  # a line's own t interval treats the minima as exact: not the seeds' noise
        if methods["interval"]:
            n_line["interval"] = methods["interval"]
            d_line["interval"] = [1 - methods["interval"][1], 1 - methods["interval"][0]]  # D_opt = C / (6 N_opt)
        exponents = {"n_opt": n_line, "d_opt": d_line, "methods": methods["methods"]}
    return {
        "runs": len(runs),
        "law": law_dict(law),
        "law_fit": check and {"f": check.f, "p": check.p, "df_lack": check.df_lack, "df_pure": check.df_pure,
                              "rejected": check.rejected},
        "law_degenerate": degenerate,
        "law_intervals": {k: interval([getattr(b, k) for b in laws]) for k in ("E", "A", "alpha", "B", "beta")}
        if laws else {},
        "law_exponents": law.exponents(),
        "law_exponent_intervals": {k: interval([b.exponents()[k] for b in laws]) for k in ("a", "b")} if laws else {},
        "isoflop": iso,
        "isoflop_exponents": exponents,
        "predictions": predictions,
        "holdout": {"budget": largest, "runs": held,
                    "mean_abs_relative_error": float(np.mean([abs(h["relative_error"]) for h in held]))
                    if held else None},
    }


def best_per_budget(rows: list[dict]) -> list[dict]:
    """At each budget C, the run with the lowest validation bpb over all families and sizes."""
    best = stats.lowest(rows, lambda r: float(r["budget"]))
    return [{"budget": c, "model": b["model"], "size": b["size"], "n_params": int(b["n_params"]),
             "tokens": int(b["tokens"]), "valid_bpb": float(b["valid_bpb"])} for c, b in sorted(best.items())]


def frontier(rows: list[dict]) -> dict[str, list[dict]]:
    """Per family, its best point at each budget (the compute-optimal frontier), smallest budget first; a point of
    several seeds (`mean_over_seeds`) carries their number, sd and runs, what the report's ranking and the
    frontier's bootstrap read."""
    best = stats.lowest(rows, lambda r: (r["model"], float(r["budget"])))
    out: dict[str, list[dict]] = {}
    for (model, c), b in sorted(best.items()):
        sizes = sorted(float(r["n_params"]) for r in rows if r["model"] == model and float(r["budget"]) == c)
        edge = ("smallest" if float(b["n_params"]) == sizes[0] else
                "largest" if float(b["n_params"]) == sizes[-1] else None)
        point = {"budget": c, "size": b["size"], "n_params": int(b["n_params"]), "valid_bpb": float(b["valid_bpb"]),
                 "edge": edge}
        if b.get("seeds", 1) > 1:
            point.update(seeds=b["seeds"], seed_sd=b["seed_sd"], replicates=b["replicates"])
        out.setdefault(model, []).append(point)
    return out
