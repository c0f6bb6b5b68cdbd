# Two commands: `make study` sets up .venv (once) and runs the whole study; `make test-all` runs every test (`make
# test`: all but the slow ones, the loop while editing; `make test-fast`: no end-to-end test either).
# Both are idempotent: a second `make study` finds everything up to date. The long form is in the README.
VENV := .venv
READY := $(VENV)/.installed
export PATH := $(abspath $(VENV)/bin):$(PATH)

.PHONY: study test test-all test-fast lint deps server stop

study: $(READY) server
	lmpipe check-params --store
	python -m lmpipe_cli.progress     # = dvc repro --force-downstream, with a line per stage: k of n, the minutes left
	-lmpipe reproduced           # each model against the committed numbers: bit for bit, within seed noise or differs
	@echo "report: reports/study.html   numbers: dvc metrics show   MLflow: lmpipe ui   (tools in $(VENV)/bin)"
	@[ -n "$$PREFECT_API_URL" ] || echo "the Prefect server (http://127.0.0.1:4200) is still up, for the next run and its UI: stop it with make stop"

# -n auto: a worker per core (pytest-xdist); --dist loadgroup in collection order: a module per worker, the two
# end-to-end groups first (tests/conftest.py). `make test` is the loop while editing: every test but those marked
# slow (each re-runs a study, a retrain, a schedule or a cluster); `make test-all`, what CI runs, adds them.
XDIST := -n auto --dist loadgroup --no-loadscope-reorder

test: $(READY) lint
	python -m pytest -q $(XDIST) -m "not slow" --durations=25

test-all: $(READY) lint
	python -m pytest -q $(XDIST) --durations=25

lint: $(READY)
	ruff check lmpipe flows lmpipe_cli tests benchmarks sweeps .ci   # the rules in pyproject.toml's [tool.ruff.lint]

test-fast: $(READY)
	python -m pytest -q $(XDIST) -m "not e2e and not slow"

# Each stage's code deps in the pipeline files, from the import walk (tests/test_graph.py fails when they drift).
deps: $(READY)
	python -m lmpipe.stage_deps

server: $(READY)
	lmpipe server

stop:
	lmpipe server --stop

# (Re)installed when the pins or the package's metadata change. pip byte-compiles the packages as it installs them
# (80 s of one core on a Zen 1): keep it, as where PYTHONDONTWRITEBYTECODE is set (these machines) Python would
# compile every module in every stage process instead (importing flows.train, flows.score and the CLI: 15.5 s
# against 7.7 s, beside a training run).
$(READY): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	pip install -q -c constraints.txt -e ".[dev,team]"
	touch $@
