"""sweeps/grid_seed_check.py: the grid's runs it trains again with another seed are those around each minimum."""

import importlib.util

import pandas as pd
import pytest

from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("grid_seed_check", ROOT / "sweeps" / "grid_seed_check.py")
seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seeds)


def test_the_seed_check_takes_each_budgets_best_size_and_its_neighbours():
    sizes = {"gru": [{"emb": 8}, {"emb": 16}, {"emb": 32}, {"emb": 64}]}
    grid = pd.DataFrame([{"model": "gru", "size": f"emb{e}", "budget": c, "n_params": e * 1000, "valid_bpb": b}
                         for c, losses in ((1e12, [2.9, 2.8, 2.7, 2.75]), (2e12, [2.6, 2.7, 2.8, 2.9]))
                         for e, b in zip((8, 16, 32, 64), losses)])
    chosen = seeds.around_minima(grid, sizes, [1e12, 2e12], seed=3)
    assert [(p.size["emb"], p.budget, p.seed) for p, _ in chosen] == [(16, 1e12, 3), (32, 1e12, 3), (64, 1e12, 3),
                                                                        (8, 2e12, 3), (16, 2e12, 3)]
    assert chosen[0][1].valid_bpb == 2.8  # each point with the grid's own row
    with pytest.raises(SystemExit, match=r"--budgets 3e\+12: not a budget of scaling/runs.csv \(have: 1e\+12 2e\+12\)"):
        seeds.around_minima(grid, sizes, [1e12, 3e12], seed=3)
