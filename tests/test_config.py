import os
import subprocess
import sys

import pytest
import yaml

from lmpipe.config import Params, load_params, params_hash, parse_params
from lmpipe.overrides import apply_overrides
from lmpipe.errors import ConfigError
from tests.helpers import ADAMW, ROOT, committed_params, entry, project_params


def write(tmp_path, text):
    """params.yaml: the committed one with `text`'s sections merged in, or `text` itself where it is no mapping."""
    path = tmp_path / "params.yaml"
    try:
        changes = yaml.safe_load(text)
    except yaml.YAMLError:
        changes = None
    path.write_text(yaml.safe_dump(project_params(**changes)) if isinstance(changes, dict) else text)
    return path


@pytest.mark.parametrize("leave_out, key, message", [
    (("tokenizer", "min_frequency"), "tokenizer.min_frequency", "is missing"),
    (("models", "gru", "variable_bptt"), "models.gru", "a rnn states variable_bptt: true for AWD-LSTM's"),
    (("models", "gru", "optim", "decay_fraction"), "models.gru.optim", "schedule wsd needs decay_fraction"),
    (("models", "gru", "max_steps_per_epoch"), "models.gru.max_steps_per_epoch", "is missing"),
    (("audit", "word2vec", "seed"), "audit.word2vec.seed", "is missing"),
    (("seeds",), "seeds", "is missing")])
def test_a_setting_left_out_is_one_line_naming_it(tmp_path, leave_out, key, message):
    """params.yaml states every setting, so that DVC sees it: none is left to a default that DVC cannot see. The
    committed file states them all (it loads)."""
    load_params(ROOT / "params.yaml")
    tree = committed_params()
    *parents, last = leave_out
    node = tree
    for name in parents:
        node = node[name]
    del node[last]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError) as info:
        load_params(tmp_path / "params.yaml")
    assert key in str(info.value) and message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("text, expected", [
    ("corpus: {source: wikitext-5}", "corpus.source: Input should be 'enwiki-sample'"),
    ("corpus: {sorce: local}", "unknown key 'corpus.sorce'"),
    ("tokenizer: {vocab_size: lots}", "tokenizer.vocab_size: Input should be a valid integer"),
    ("split: {valid: 0.9}", "split.valid: Input should be less than 0.5"),
    ("corpus: {source: local}", "corpus.source 'local' needs corpus.files"),
    ("corpus: {source: wikipedia-dump}", "needs corpus.url"),
    ("corpus: {sha256: abc}", "corpus.sha256: String should match pattern"),
    ("validate: {min_words: 0}", "validate.min_words: Input should be greater than or equal to 1"),
    ("corpus: [source", "malformed YAML at line 1"),
    ("train:\n  seed: 1\n  device cpu\n  threads: 0\n", "malformed YAML at line 3, column 3: could not find expected ':'"),
    ("evaluate:\n  prompts: ['The history of\n  seed: 0\n", "malformed YAML at line 2, column 13: found unexpected end"),
    ("- a\n- b\n", "must be a mapping of sections"),
])
def test_bad_params_give_one_line_naming_the_key(tmp_path, text, expected):
    with pytest.raises(ConfigError) as info:
        load_params(write(tmp_path, text))
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    assert str(tmp_path / "params.yaml") in message


def test_missing_params_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "nope.yaml")


def test_params_hash_is_stable_and_sensitive():
    assert params_hash({"a": 1, "b": 2}) == params_hash({"b": 2, "a": 1})
    assert params_hash({"a": 1}) != params_hash({"a": 2})


def test_cli_reports_bad_params_without_traceback(tmp_path):
    path = write(tmp_path, "corpus: {source: nonsense}")
    done = subprocess.run([sys.executable, "-m", "lmpipe_cli", "check-params", str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "corpus.source" in done.stderr


def test_gpu_profile_is_valid_params_and_becomes_dvc_overrides(tmp_path, capsys):
    import shlex

    from lmpipe_cli.main import main
    from lmpipe.overrides import profile_overrides

    profile = yaml.safe_load((ROOT / "profiles/wikitext2-gpu.yaml").read_text())
    overrides = profile_overrides(profile)
    assert main(["profile", str(ROOT / "profiles/wikitext2-gpu.yaml")]) == 0
    printed = shlex.split(capsys.readouterr().out)  # what `eval "dvc exp run $(lmpipe profile ...)"` passes to dvc
    assert printed == [word for o in overrides for word in ("-S", o)]
    assert "++corpus.source=wikitext-2" in overrides  # ++: set whether or not params.yaml holds the key
    assert any(o.startswith("++models.lstm.optim={") and "nt_asgd: true" in o for o in overrides)
    merged = apply_overrides(yaml.safe_load((ROOT / "params.yaml").read_text()), overrides)
    params = parse_params(merged)
    assert params.models["lstm"].optim.name == "sgd" and params.models["lstm"].arch["hidden"] == 1150
    assert params.corpus.source == "wikitext-2"
    assert all(m.budget is None for m in params.models.values())  # its epochs, not the CPU study's budgets
    assert main(["profile", str(ROOT / "profiles/wikitext2-gpu.yaml"), "--write", str(tmp_path / "gpu.yaml")]) == 0
    assert load_params(tmp_path / "gpu.yaml") == params  # the same params as one file, for python -m lmpipe.train


def test_model_arch_must_fit_its_family(tmp_path):
    text = yaml.safe_dump({"models": {"x": entry("nplm", {"context": 3, "heads": 4})}})
    with pytest.raises(ConfigError, match=r"models.x: .*arch has \['heads'\], not settings of a nplm"):
        load_params(write(tmp_path, text))


def dvc_applies(tmp_path, overrides: list[str]) -> Params:
    """params.yaml with `overrides` applied by DVC's own code for `dvc exp run -S`, loaded as a stage loads it."""
    from dvc.utils.hydra import apply_overrides as dvc_apply

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text())
    dvc_apply(path, overrides)
    return load_params(path)


@pytest.mark.parametrize("overrides", [["models.lstm.arch={emb: 400}", "corpus.source=wikitext-2"],
                                       ["+models.gru.budget={tokens: 3000000}", "study.budget={flops: 4.0e+13}"],
                                       ["++models.gru.epochs=3", "++models.gru.patience=3", "++train.seed=7",
                                        "models.gru.optim.lr=3e-3"]])
def test_overrides_are_applied_as_dvc_exp_run_applies_them(tmp_path, overrides):
    """A dict value merges into the one there, `+` adds a key, `++` sets it either way: DVC's result, exactly."""
    assert parse_params(apply_overrides(yaml.safe_load((ROOT / "params.yaml").read_text()), overrides)) == \
        dvc_applies(tmp_path, overrides)


@pytest.mark.parametrize("override, says", [
    ("models.gru.budget={tokens: 1000}", r"the params have no models.gru.budget .*add it with '\+models.gru.budget="),
    ("models.gru.optim.lrr=0.003", r"the params have no models.gru.optim.lrr \(did you mean models.gru.optim.lr\?\)$"),
    ("+corpus.source=local", r"corpus.source is already set \(change it with 'corpus.source=local'\)"),
    ("tokenizer.boundary_token=<x>", r"expected KEY=VALUE in DVC's -S syntax")])
def test_an_override_dvc_would_refuse_is_one_line_saying_how_to_write_it(tmp_path, override, says):
    from dvc.exceptions import InvalidArgumentError

    with pytest.raises(ConfigError, match=says):
        apply_overrides(yaml.safe_load((ROOT / "params.yaml").read_text()), [override])
    with pytest.raises(InvalidArgumentError):  # and DVC refuses it too
        dvc_applies(tmp_path, [override])


@pytest.mark.parametrize("profile", ["wikitext2-gpu", "scaling-gpu"])
def test_a_profile_runs_under_dvc_exp_run_as_lmpipe_checked_it(tmp_path, profile):
    """`eval "dvc exp run $(lmpipe profile FILE)"`: every override DVC accepts, with the params lmpipe checked."""
    from lmpipe.overrides import profile_overrides

    overrides = profile_overrides(yaml.safe_load((ROOT / f"profiles/{profile}.yaml").read_text()))
    assert dvc_applies(tmp_path, overrides) == parse_params(
        apply_overrides(yaml.safe_load((ROOT / "params.yaml").read_text()), overrides))


def test_the_library_imports_without_prefect_or_the_command_line():
    """lmpipe is the bottom floor: importable where Prefect is not installed (a blocked import stands for that)."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("prefect", "flows"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
import lmpipe, lmpipe.train, lmpipe.ngram, lmpipe.scaling, lmpipe.sweep, lmpipe.tuning_doc, lmpipe.evaluate, lmpipe.config
print(sorted(m for m in sys.modules if m.split(".")[0] in ("prefect", "flows")))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_importing_the_library_changes_no_environment_variable():
    """`import lmpipe` in a notebook leaves the process as it was: the entry points switch telemetry off
    (lmpipe.telemetry.switch_off, called by flows/__init__.py and the tests), the library never does."""
    code = """
import os
before = dict(os.environ)
import lmpipe, lmpipe.config, lmpipe.seeds, lmpipe.compare, lmpipe.io, lmpipe.telemetry
print(sorted(set(os.environ.items()) ^ set(before.items())))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("DO_NOT_TRACK", "MLFLOW_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_importing_the_flows_opens_no_socket_and_a_stage_finds_the_running_server(prefect_api):
    """`import flows` probes nothing; running a flow under `on_running_server` (what every stage entry point does)
    puts it on the local server that answers, although Prefect read its settings at import."""
    code = """
import socket, sys
opened = []
connect = socket.socket.connect
socket.socket.connect = lambda self, address: (opened.append(address), connect(self, address))[1]
import flows, flows.train, flows.evaluate, flows.report, flows.seeds, flows.study
print(opened, flush=True)
import flows._prefect as server
server.api_url = lambda port=None: sys.argv[1]
from prefect import flow
from prefect.client.orchestration import get_client

@flow(name="where-it-ran")
def where():
    return 1

with server.on_running_server() as url:
    run_id = where(return_state=True).state_details.flow_run_id
    with get_client(sync_client=True) as client:  # on the ephemeral server instead, the run is not found here
        print(url == sys.argv[1], client.read_flow_run(run_id).flow_id is not None)
"""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run([sys.executable, "-c", code, prefect_api], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["[]", "True True"]


@pytest.mark.parametrize("name, expected", [
    ("gru_small", None), ("gru-2", None), ("GRU", "model name 'GRU': use lowercase letters"),
    ("gru/small", "model name 'gru/small'"), ("2gru", "model name '2gru'"), ("x" * 41, "at most 40 characters"),
    ("ngram", "model name 'ngram' is taken by the study's own ngram"), ("word2vec", "is taken"),
])
def test_model_names_that_every_tool_takes_or_one_line_before_training(tmp_path, name, expected):
    """A name is a DVC stage, a folder, a Prefect artifact key and an MLflow model: refused before any training."""
    text = yaml.safe_dump({"models": {name: entry("rnn", {"cell": "gru"}, epochs=1)}})
    if expected is None:
        assert list(load_params(write(tmp_path, text)).models) == [name]
        return
    with pytest.raises(ConfigError) as info:
        load_params(write(tmp_path, text))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_family_registry_is_one_table(tmp_path):
    """lmpipe.families.FAMILIES gives each family's settings, and they name its model class: the model builder is derived from
    it, and a family not in it is one line naming where to register it."""
    from lmpipe.families import FAMILIES as SETTINGS
    from lmpipe.models import FAMILIES

    assert {f: f"{c.__module__}:{c.__name__}" for f, c in FAMILIES.items()} == {f: s.model for f, s in SETTINGS.items()}
    with pytest.raises(ConfigError, match=r"family 'mylm' is not registered \(have: nplm, rnn, transformer; "
                                          r"register yours in lmpipe/families.py FAMILIES\)"):
        load_params(write(tmp_path, yaml.safe_dump({"models": {"mine": {**entry("nplm"), "family": "mylm"}}})))


@pytest.mark.parametrize("arch, expected", [
    ("{dim: 30, heads: 4}", "models.t: arch: dim 30 must be divisible by heads 4"),
    ("{position: rotary}", "models.t: arch.position: Input should be 'learned' or 'rope' (got 'rotary')"),
    ("{layers: two}", "models.t: arch.layers: Input should be a valid integer, unable to parse string as an integer "
                      "(got 'two')"),
    ("{zero_init: true}", "models.t: arch: zero_init starts the head at zero: it needs an untied head (tie: false)")])
def test_an_arch_setting_is_checked_by_its_familys_schema_when_params_load(tmp_path, arch, expected):
    """Before any stage runs (and DVC deletes its outputs): a wrong type, an unknown choice or an inconsistent pair."""
    with pytest.raises(ConfigError) as info:
        load_params(write(tmp_path, yaml.safe_dump({"models": {"t": entry("transformer", yaml.safe_load(arch))}})))
    assert str(info.value) == f"{tmp_path / 'params.yaml'}: {expected}"


def test_the_study_budget_is_every_models_length_unless_an_entry_states_its_own():
    from lmpipe.config import parse_params

    gru = entry("rnn", {"cell": "gru"})
    params = parse_params(project_params(study={"budget": {"flops": 3e13}},
                                         models={"gru": gru, "own": {**gru, "budget": {"tokens": 1000}}}))
    assert params.model_settings("gru").budget.flops == 3e13 and params.models["gru"].budget is None
    assert params.model_settings("own").budget.tokens == 1000  # the stated exception (the report marks it)
    by_epochs = parse_params(project_params(models={"gru": {**gru, "epochs": 2, "patience": 3}})).model_settings("gru")
    assert by_epochs.budget is None and by_epochs.epochs == 2 and by_epochs.patience == 3
    assert params.budget_exceptions() == ["own"]
    with pytest.raises(ConfigError, match=r"models.gru states neither epochs nor budget, and study.budget is null"):
        parse_params(project_params(study={"budget": None, "branches": []}, models={"gru": gru}))
    with pytest.raises(ConfigError, match=r"a run of `epochs` needs patience"):
        parse_params(project_params(models={"gru": {**gru, "epochs": 2}}))


@pytest.mark.parametrize("changes, message", [
    ({"epochs": 2, "budget": {"tokens": 1000}}, "states both epochs and budget: a run's length is one of them"),
    ({"patience": 2}, "patience stops a run of `epochs` early; a budget trains to its end (remove it)"),
    ({"family": "transformer", "variable_bptt": False}, "variable_bptt is a recurrent model's setting, not a "
                                                        "transformer's (remove it)"),
    ({"optim": {**ADAMW, "momentum": 0.9}}, "models.gru.optim.momentum' is not a setting of adam, adamw and muon"),
    ({"optim": {**ADAMW, "name": "muon", "decay_fraction": 0.2}}, "decay_fraction is the wsd schedule's"),
])
def test_a_setting_that_would_do_nothing_is_refused_in_one_line(changes, message):
    """A model states only what changes its training: a run's length once, SGD's settings with SGD, variable BPTT on
    recurrent models, the wsd decay with wsd."""
    from lmpipe.config import parse_params

    gru = entry("rnn", {"cell": "gru"})
    with pytest.raises(ConfigError) as info:
        parse_params(project_params(models={"gru": {**gru, **changes}}))
    assert message in str(info.value) and "\n" not in str(info.value)
    sgd = parse_params(project_params(models={"gru": {**gru, "optim": {
        **ADAMW, "name": "sgd", "lr": 20.0, "momentum": 0.0, "nt_asgd": True, "nonmono": 5}}})).models["gru"].optim
    assert (sgd.name, sgd.nt_asgd, sgd.nonmono, sgd.decay_fraction) == ("sgd", True, 5, None)
    with pytest.raises(ConfigError, match=r"study: budget must be \{flops: F\}: the study compares the families"):
        parse_params(project_params(study={"budget": {"tokens": 1000}}))


def test_branches_divide_the_study_budget():
    from lmpipe.config import StudyParams

    study = StudyParams.model_validate({"budget": {"flops": 3e13}, "branches": [2, 16, 4, 8]})
    assert study.branch_budgets == [3e13 / 16, 3e13 / 8, 3e13 / 4, 3e13 / 2]
    for bad, why in (({"budget": None, "branches": [2]}, "set study.budget"), ({"budget": {"flops": 1e12}, "branches": [1]}, "above 1"),
                     ({"budget": {"flops": 1e12}, "branches": [2, 2]}, "once")):
        with pytest.raises(ValueError, match=why):
            StudyParams.model_validate(bad)


def refusal(raw: dict, renamed: list[tuple[str, str, str]]) -> str:
    """parse_params' one line for `raw` with each (section path, key, new name) renamed."""
    for path, key, name in renamed:
        section = raw
        for part in path.split("."):
            section = section[part]
        section[name] = section.pop(key)
    with pytest.raises(ConfigError) as caught:
        parse_params(raw, "params.yaml")
    return str(caught.value)


def test_a_misspelt_key_is_named_first_with_the_key_it_misspells():
    """`lrr` for `lr`: one mistake, said once: the unknown key, and the missing key it most likely means."""
    lrr = ("models.gru.optim", "lr", "lrr")
    assert refusal(committed_params(), [lrr]) == ("params.yaml: 'models.gru.optim.lrr' is not a setting of adam, "
                                                  "adamw and muon (did you mean 'lr'?)")
    assert refusal(committed_params(), [lrr, ("tokenizer", "vocab_size", "vocab_sise")]).startswith(
        "params.yaml: unknown key 'tokenizer.vocab_sise' (did you mean 'vocab_size'?); also 'models.gru.optim.lrr' is "
        "not a setting")


def test_an_unknown_key_like_no_missing_one_is_named_first_and_the_missing_key_beside_it():
    """`learning_rate` for `lr` is not a misspelling difflib finds: the unknown key first, then the missing one."""
    said = refusal(committed_params(), [("models.gru.optim", "lr", "learning_rate")])
    assert said.startswith("params.yaml: 'models.gru.optim.learning_rate' is not a setting of adam, adamw and muon "
                           "(remove it or fix its spelling")
    assert said.endswith("; also 'models.gru.optim.lr' is missing: params.yaml states every setting, so that DVC sees "
                         "it (add it)")
