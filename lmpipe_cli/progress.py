"""`dvc repro --force-downstream` with a progress line between its own: stage k of n, and the training minutes left.

    python -m lmpipe_cli.progress [target ...]          (what `make study` runs; targets as for `dvc repro`)

`--force-downstream`: every stage below one that ran runs too, even where its inputs came out as recorded. In a fresh
clone the models retrain to the committed bytes, and plain `dvc repro` would skip the stages whose outputs git holds
(evaluate, combine, report, publish): this clone's MLflow would have no run of them, no views' rows and no registry
cards. Forced, each writes the same bytes and makes its own run. A second run finds nothing changed and runs nothing.

First the MLflow runs that a process of this host left RUNNING when it died without a word (SIGKILL) are ended
FAILED, in one line naming them (no stage ends another process's run). Then DVC's status and graph name the stages that may run (n; given targets, n grows as they start; n shrinks as DVC
skips a planned stage whose inputs came out as recorded). As DVC starts each, one line says where the study is. Once
a model has trained, the minutes left follow from the FLOPs the training stages still to run will spend (each
model's budget, `study.budget`) at the FLOP/s the finished ones measured (their log line '..., 3.00e13 FLOPs, 176 s').
Everything DVC and the stages print passes through unchanged; the exit status is DVC's. A study that ran to its end
gets one more line: where its stages' wall time went on this machine, by kind of stage, most first.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from flows._stage import PARAMS_FILE
from lmpipe_cli.plan import budgets, planned_stages, summary
from lmpipe import tracking
from lmpipe.config import load_params
from lmpipe.errors import first_line

STARTED = re.compile(r"Running stage '([^']+)'")
SKIPPED = re.compile(r"Stage '([^']+)' didn't change, skipping")  # its inputs came out as recorded: DVC's own call
TRAINED = re.compile(r"(\S+): best valid bpb .*?([\d.]+e[+-]?\d+) FLOPs, (\d+) s")


class Progress:
    """What DVC's output says of the study so far; `see` returns the progress line a DVC line calls for, or None."""

    def __init__(self, planned: list[str], budgets: dict[str, float]):
        self.planned, self.budgets = planned, budgets  # stages that will run; training FLOPs per model
        self.started: list[str] = []
        self.start_times: list[float] = []  # when each of `started` started (time.monotonic)
        self.skipped: set[str] = set()  # planned, but DVC found their inputs unchanged once the stages above had run
        self.flops = self.seconds = 0.0  # spent by the trainings finished so far

    def see(self, line: str, now: float | None = None) -> str | None:
        if trained := TRAINED.search(line):
            self.flops += float(trained[2])
            self.seconds += float(trained[3])
            return None
        if skipped := SKIPPED.search(line):
            self.skipped.add(skipped[1])
            return None
        if not (started := STARTED.search(line)):
            return None
        stage = started[1]
        self.started.append(stage)
        self.start_times.append(time.monotonic() if now is None else now)
        k, n = len(self.started), max(len(self.to_run()), len(self.started))
        return f"[study] stage {k} of {n}: {stage}" + self.time_left()

    def to_run(self) -> list[str]:
        """The plan less what DVC skipped: a stage below one that re-made its outputs exactly as recorded (a fresh
        clone's) is planned, as its inputs are about to be re-made, but runs only if they come out changed."""
        return [s for s in self.planned if s not in self.skipped]

    def time_left(self) -> str:
        left = [s for s in self.to_run() if s not in self.started[:-1] and s.startswith("train@")]
        if not left:
            return ""
        flops = sum(self.budgets.get(s.removeprefix("train@"), 0.0) for s in left)
        if not self.seconds or not flops:
            return f"; {len(left)} model(s) to train (a time estimate once the first one has)"
        rate = self.flops / self.seconds
        return (f"; about {flops / rate / 60:.0f} min of training left ({len(left)} model(s), {flops:.2g} FLOPs at "
                f"the {rate / 1e9:.0f} GFLOP/s measured so far)")


    def time_shares(self, end: float) -> str:
        """Where the stages' wall time went, from each start to the next (the last to `end`): each kind of stage
        (train@<model> and score@<model> summed over the models) with its minutes and share, most first."""
        if not self.started:
            return ""
        spans: dict[str, float] = {}
        for stage, start, stop in zip(self.started, self.start_times, [*self.start_times[1:], end]):
            kind = f"{stage.split('@')[0]}@*" if "@" in stage else stage
            spans[kind] = spans.get(kind, 0.0) + stop - start
        total = sum(spans.values())
        return (f"[study] the stages' wall time, {total / 60:.1f} min: " + ", ".join(
            f"{kind} {seconds / 60:.1f} min ({100 * seconds / total:.0f}%)"
            for kind, seconds in sorted(spans.items(), key=lambda item: -item[1])))


def main(targets: list[str]) -> int:
    try:  # housekeeping: a store or params.yaml that fails here fails the stages too, each in its own line
        said = tracking.runs.end_ghost_runs(load_params(PARAMS_FILE).tracking.experiment, "make study")
    except Exception as exc:
        said = f"MLflow runs left RUNNING by a process that died: not checked ({first_line(str(exc))})"
    if said:
        print(f"[study] {said}", flush=True)
    try:
        planned = planned_stages()
    except Exception as exc:  # no plan is no reason to stop the study: the count then grows as stages start
        print(f"[study] no plan of the stages ({first_line(str(exc))}): counting them as they start", flush=True)
        planned = []
    if planned and not targets:  # the plan first: what will run, and the training it holds at this machine's rate
        for line in summary(planned, load_params(PARAMS_FILE)).splitlines():
            print(f"[study] {line}", flush=True)
    progress = Progress(planned if not targets else [], budgets())
    process = subprocess.Popen(["dvc", "repro", "--force-downstream", *targets], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, pending = sys.stdout.buffer, b""  # pending: the start of a line already passed on, its end not yet come
    try:
        while chunk := process.stdout.read1(65536):
            *ended, rest = chunk.split(b"\n")
            for piece in ended:  # as DVC wrote them, carriage returns included: a progress bar stays on its line
                out.write(piece + b"\n")
                if said := progress.see((pending + piece).decode("utf-8", "replace")):
                    out.write(f"{said}\n".encode())
                pending = b""
            out.write(rest)
            pending += rest
            out.flush()
        if (status := process.wait()) == 0 and (shares := progress.time_shares(time.monotonic())):
            print(shares, flush=True)
        return status
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached DVC too: it stops its stage and says so
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C reaches DVC as well; this one waits for it
        out.write(process.stdout.read())  # DVC's last lines, the stage's own line on how it stopped among them
        out.flush()
        return process.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
