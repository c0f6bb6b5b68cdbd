"""The study's statistical rules, each written once: what a seed spread is, when a gap is real, which run is a
budget's best, how an interval is drawn, and whether a fitted form survives its replicates.

- A point's seed spread is the mean and sd of its replicates; one run has no sd (None), so no gap to it is judged.
- A gap between two results is real only beyond REAL_GAP_SDS times the larger of their sds.
- An interval comes from a bootstrap over seed replicates (Besiroglu et al. 2024): each draw resamples every
  point's own replicates and refits; a point with one run borrows the replicates' pooled deviations, so it moves
  by the noise the seeds measured instead of standing still.
- A fitted form is checked for lack of fit against the replicates (the pure error between seeds against the
  residual of the means); a form the test rejects is not used for intervals or extrapolation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

REAL_GAP_SDS = 2.0
LEVEL = 0.9  # every interval's coverage
REJECT_P = 0.05  # a lack-of-fit p below this rejects the form
SAMPLES = 200  # bootstrap draws


def mean_sd(values: Iterable[float]) -> tuple[float, float | None]:
    """The mean and sample sd of a point's replicates; sd None for a single run."""
    xs = [float(v) for v in values]
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def known(sd: float | None) -> bool:
    return sd is not None and math.isfinite(sd)


def larger_sd(*sds: float | None) -> float | None:
    """The larger of the sds, None where any is unknown (None or nan): no verdict without both spreads."""
    return max(sds) if sds and all(known(s) for s in sds) else None


def beyond_noise(gap: float, sd: float | None) -> bool | None:
    """Is |gap| more than REAL_GAP_SDS sds? None where the sd is unknown."""
    return None if not known(sd) else abs(gap) > REAL_GAP_SDS * sd


def gap_is_real(a: float, sd_a: float | None, b: float, sd_b: float | None) -> bool | None:
    """The rule every reader calls: a gap is real beyond REAL_GAP_SDS times the larger sd."""
    return beyond_noise(a - b, larger_sd(sd_a, sd_b))


def lowest(rows: Iterable[dict], group: Callable[[dict], Hashable], loss: str = "valid_bpb") -> dict:
    """{group: its row of lowest `loss`} (the first on ties), groups in the order first seen: with group (model,
    budget) a family's compute-optimal frontier, with budget alone the best run of each budget."""
    best: dict = {}
    for r in rows:
        key = group(r)
        if key not in best or float(r[loss]) < float(best[key][loss]):
            best[key] = r
    return best


# ---------------- the bootstrap over seed replicates ----------------

def _deviations(replicates: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """Each point's deviations from its mean, scaled by sqrt(k / (k - 1)) so a resampled mean has the variance of
    a new mean of k runs; empty for a single run."""
    out = []
    for ys in replicates:
        ys = np.asarray(ys, dtype=float)
        k = len(ys)
        out.append((ys - ys.mean()) * math.sqrt(k / (k - 1)) if k > 1 else np.empty(0))
    return out


def replicate_draws(replicates: Sequence[Sequence[float]], samples: int = SAMPLES, seed: int = 0) -> np.ndarray | None:
    """(samples, points) resampled point means: each point's own replicates drawn with replacement, a single run's
    one deviation drawn from every replicated point's pooled deviations. None where no point has replicates: the
    seeds measured no noise, so there is no interval to draw."""
    means = np.array([float(np.mean(ys)) for ys in replicates])
    own = _deviations(replicates)
    pool = np.concatenate(own) if own else np.empty(0)
    if pool.size == 0:
        return None
    rng = np.random.default_rng(seed)
    draws = np.empty((samples, len(means)))
    for j, dev in enumerate(own):
        source, k = (dev, len(dev)) if dev.size else (pool, 1)
        draws[:, j] = means[j] + source[rng.integers(0, len(source), (samples, k))].mean(axis=1)
    return draws


def bootstrap(replicates: Sequence[Sequence[float]], fit: Callable[[np.ndarray], object], samples: int = SAMPLES,
              seed: int = 0) -> list | None:
    """`fit` refitted to each draw of `replicate_draws` (its result per draw, None where a refit failed); None
    where no point has replicates."""
    draws = replicate_draws(replicates, samples, seed)
    return None if draws is None else [fit(d) for d in draws]


def interval(values: Iterable[float | None], level: float = LEVEL) -> tuple[float, float] | None:
    """The central `level` percentile interval of bootstrap values (failed or infinite draws left out); None with
    fewer than half the draws usable."""
    values = list(values)
    kept = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not values or len(kept) < len(values) / 2:
        return None
    lo, hi = np.percentile(kept, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


# ---------------- lack of fit ----------------

@dataclass(frozen=True)
class LackOfFit:
    """The F test of a form's residual against the pure error between seeds."""
    f: float
    p: float
    df_lack: int
    df_pure: int

    @property
    def rejected(self) -> bool:
        return self.p < REJECT_P

    def text(self) -> str:
        verdict = "rejected" if self.rejected else "not rejected"
        return f"{verdict} (lack-of-fit F = {self.f:.2f} on {self.df_lack} and {self.df_pure} df, p = {self.p:.2g})"


def lack_of_fit(replicates: Sequence[Sequence[float]], fitted: Sequence[float], parameters: int) -> LackOfFit | None:
    """Does the form (its value at each point: `fitted`, with `parameters` fitted constants) miss the points' means
    by more than the seeds' own noise explains? F = (sum_i k_i (mean_i - fit_i)^2 / (m - p)) over (the pooled
    within-point variance on sum_i (k_i - 1) df). None where no point has replicates or the form has as many
    constants as points (nothing left to test)."""
    from scipy import stats

    fitted = np.asarray(fitted, dtype=float)
    counts = np.array([len(ys) for ys in replicates])
    means = np.array([float(np.mean(ys)) for ys in replicates])
    pure = math.fsum(float(np.sum((np.asarray(ys, dtype=float) - np.mean(ys)) ** 2)) for ys in replicates)
    df_pure, df_lack = int(np.sum(counts - 1)), len(means) - parameters
    if df_pure < 1 or df_lack < 1 or pure <= 0:
        return None
    lack = float(np.sum(counts * (means - fitted) ** 2))
    f = (lack / df_lack) / (pure / df_pure)
    return LackOfFit(float(f), float(stats.f.sf(f, df_lack, df_pure)), df_lack, df_pure)
