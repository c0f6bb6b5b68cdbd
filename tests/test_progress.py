"""The study's progress line (lmpipe_cli/progress.py): stage k of n from DVC's output, training minutes left from FLOPs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from lmpipe_cli.progress import Progress
from tests.helpers import as_in_a_terminal, with_fake_dvc

PLANNED = ["ngram", "train@nplm", "train@gru", "score@nplm", "report"]


def test_each_stage_dvc_starts_gets_a_line_and_the_training_left_is_timed_from_measured_flop_rates():
    progress = Progress(PLANNED, {"nplm": 3e13, "gru": 3e13})
    said = [progress.see(line) for line in [
        "Running stage 'ngram':",
        "> python -m flows.ngram",
        "Running stage 'train@nplm':",
        "03:10:01.1 | INFO | Flow run 'train@nplm' - nplm: best valid bpb 2.4315 (ppl 310.1) at epoch 3.9; "
        "2,049,024 tokens, 3.00e+13 FLOPs, 200 s",
        "Running stage 'train@gru':",
        "Running stage 'score@nplm':",
    ]]
    assert said[1] is said[3] is None  # a stage's own lines pass without a progress line
    assert said[0] == "[study] stage 1 of 5: ngram; 2 model(s) to train (a time estimate once the first one has)"
    assert said[2].startswith("[study] stage 2 of 5: train@nplm; 2 model(s) to train")
    # nplm spent 3e13 FLOPs in 200 s (150 GFLOP/s): gru's 3e13 take 200 s more, 3 min rounded
    assert said[4] == ("[study] stage 3 of 5: train@gru; about 3 min of training left (1 model(s), 3e+13 FLOPs at the "
                       "150 GFLOP/s measured so far)")
    assert said[5] == "[study] stage 4 of 5: score@nplm"  # nothing left to train: no estimate


def test_a_planned_stage_dvc_skips_leaves_the_count():
    """A fresh clone: the scaling fit sits below the n-gram stages, whose outputs are about to be re-made, so it is
    planned; DVC skips it when they come out as recorded, and the count ends at n of n."""
    progress = Progress(["ngram", "scaling/dvc.yaml:fit", "report"], {})
    assert progress.see("Running stage 'ngram':") == "[study] stage 1 of 3: ngram"
    assert progress.see("Stage 'scaling/dvc.yaml:fit' didn't change, skipping") is None
    assert progress.see("Running stage 'report':") == "[study] stage 2 of 2: report"


def test_a_stage_dvc_runs_beyond_the_dry_runs_list_still_counts():
    progress = Progress([], {})
    assert progress.see("Running stage 'evaluate':") == "[study] stage 1 of 1: evaluate"


def test_a_finished_study_says_where_its_stages_wall_time_went_by_kind_most_first():
    progress = Progress(PLANNED, {})
    for line, now in (("Running stage 'ngram':", 0.0), ("Running stage 'train@nplm':", 60.0),
                      ("Running stage 'train@gru':", 660.0), ("Running stage 'score@nplm':", 1260.0),
                      ("Running stage 'report':", 1290.0)):
        progress.see(line, now)
    assert progress.time_shares(1320.0) == ("[study] the stages' wall time, 22.0 min: train@* 20.0 min (91%), "
                                           "ngram 1.0 min (5%), score@* 0.5 min (2%), report 0.5 min (2%)")
    assert Progress([], {}).time_shares(5.0) == ""


def test_dvcs_output_passes_through_byte_for_byte_with_a_progress_line_after_each_stage_start(tmp_path, params_file):
    """A fake `dvc` on PATH: `repro --dry` names two stages, `repro` prints them with a progress bar's carriage
    returns, which must reach the terminal as they are (the bar stays on its line), and exits 3."""
    env = with_fake_dvc(tmp_path,
                        "if [ \"$2\" = --dry ]; then printf \"Running stage 'ngram':\\nRunning stage 'report':\\n\"; exit 0; fi\n"
                        "printf \"Running stage 'ngram':\\nbar 1/2\\rbar 2/2\\n\"\n"
                        "printf \"Running stage 'report':\\n\"\n"
                        "exit 3\n")
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli.progress"], cwd=tmp_path, env=env, capture_output=True)
    assert done.returncode == 3  # DVC's exit status
    said = done.stdout.decode()
    assert said.startswith("[study] no plan of the stages (")  # not a DVC project: counted as they start
    assert said.split("\n", 1)[1] == ("Running stage 'ngram':\n"
                                      "[study] stage 1 of 1: ngram\n"
                                      "bar 1/2\rbar 2/2\n"
                                      "Running stage 'report':\n"
                                      "[study] stage 2 of 2: report\n")


def test_a_study_that_ran_to_its_end_ends_with_its_time_shares(tmp_path, params_file):
    env = with_fake_dvc(tmp_path, "[ \"$2\" = --dry ] && exit 0\nprintf \"Running stage 'ngram':\\n\"\nexit 0\n")
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli.progress"], cwd=tmp_path, env=env, capture_output=True)
    assert done.returncode == 0
    assert done.stdout.decode().splitlines()[-1].startswith("[study] the stages' wall time, 0.0 min: ngram 0.0 min (100%)")


def test_the_plan_holds_every_changed_stage_and_all_below_it(tmp_path, monkeypatch):
    """A real DVC project of two stages, a -> b: a fresh one runs both; after a repro none; a changed input of a
    both (b's input is about to change, though `dvc status` cannot see it yet); a changed command of b b alone."""
    import yaml

    from lmpipe_cli.plan import planned_stages

    monkeypatch.chdir(tmp_path)
    subprocess.run(["dvc", "init", "--no-scm", "-q"], check=True)
    (tmp_path / "in.txt").write_text("1")
    stages = {"a": {"cmd": "cp in.txt a.txt", "deps": ["in.txt"], "outs": ["a.txt"]},
              "b": {"cmd": "cp a.txt b.txt", "deps": ["a.txt"], "outs": ["b.txt"]}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    assert planned_stages() == ["a", "b"]
    subprocess.run(["dvc", "repro", "-q"], check=True)
    assert planned_stages() == []
    (tmp_path / "in.txt").write_text("2")
    assert planned_stages() == ["a", "b"]
    subprocess.run(["dvc", "repro", "-q"], check=True)
    stages["b"]["cmd"] = "cp a.txt b.txt && true"
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    assert planned_stages() == ["b"]


def test_ctrl_c_twice_passes_on_dvcs_last_lines_and_its_exit_status_without_a_traceback(tmp_path, params_file):
    """The terminal's Ctrl-C reaches the whole group, pressed twice here: DVC (a fake on PATH that stops its stage
    and says so) gets both; the study's progress relays DVC's last line and DVC's exit status, and no traceback."""
    env = with_fake_dvc(tmp_path,
                        "if [ \"$2\" = --dry ]; then exit 0; fi\n"
                        "trap 'trap \"\" INT; sleep 1; echo \"train@gru: interrupted; dvc repro resumes it\"; exit 130' INT\n"
                        "printf \"Running stage 'train@gru':\\n\"\n"
                        "while true; do sleep 0.1; done\n")
    study = subprocess.Popen([sys.executable, "-m", "lmpipe_cli.progress"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True, preexec_fn=as_in_a_terminal)
    while b"stage 1 of 1: train@gru" not in study.stdout.readline():  # the stage runs (a line per line of DVC's)
        assert study.poll() is None, study.stderr.read().decode()
    for _ in range(2):
        os.killpg(study.pid, signal.SIGINT)
        time.sleep(0.3)
    out, err = study.communicate(timeout=60)
    assert study.returncode == 130, err.decode()  # DVC's exit status
    assert out.decode().endswith("train@gru: interrupted; dvc repro resumes it\n")
    assert b"Traceback" not in err, err.decode()
