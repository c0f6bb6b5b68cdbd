"""The MLflow model registry: each trained LM registered as `lmpipe-<model>` (a pyfunc that turns prompts into text),
its `champion` and `challenger` aliases, and a registered model's files fetched back for serving."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import mlflow

from lmpipe.errors import TrackingError
from lmpipe.tracking.store import project_root, relocate_store, temporary_env
from lmpipe.tracking import EXPERIMENT, OUTPUT, experiment_tags, output_hash, tracker

# all an lmpipe LM's pyfunc models import besides lmpipe's own code, which goes with them
MODEL_REQUIREMENTS = ("mlflow", "torch", "numpy", "pandas", "tokenizers", "pydantic", "pyyaml")


def pinned_requirements(names=MODEL_REQUIREMENTS, lock_file: str | Path = "constraints.txt") -> list[str]:
    """The lock file's pins of `names` (inferring requirements is slow and lists far more); bare names without it."""
    path = project_root() / lock_file
    lines = path.read_text().splitlines() if path.exists() else []
    pins = {line.split("==")[0].strip().lower(): line.strip() for line in lines if "==" in line and not line.startswith("#")}
    return [pins.get(name, name) for name in names]


def log_lm(model_dir: str | Path, tokenizer: str | Path, registered_name: str, vocab_size: int, defaults) -> None:
    """Log a trained LM as two pyfunc models of the active run (lmpipe.serving): `model`, prompts in and text out,
    registered as `registered_name` (so `mlflow models serve -m models:/<name>@champion` answers prompts), and
    `logits`, token ids in and next-token logits out. Both carry the model's files (a state dict and JSON), the
    tokenizer, the decoding settings a request does not set (`defaults`, a DecodeSettings: params.yaml's
    `evaluate`, as `lmpipe generate` and the study's samples use) and lmpipe's code, and are logged as code:
    loading them unpickles nothing."""
    import tempfile

    import mlflow.pyfunc
    import numpy as np
    import pandas as pd

    from lmpipe import serving

    here = Path(__file__).parents[1]  # lmpipe/: the code that goes with the model
    tracker()  # the fluent log_model writes to this store
    signatures = serving.signatures(vocab_size, defaults)
    with tempfile.TemporaryDirectory() as scratch:
        common = {"artifacts": serving.bundle_files(model_dir, tokenizer, defaults, Path(scratch)),
                  "code_paths": [str(here)], "pip_requirements": pinned_requirements()}
        mlflow.pyfunc.log_model(name="logits", python_model=str(here / "pyfunc/logits.py"), **common,
                                signature=signatures["logits"], input_example=np.zeros((1, 2), dtype=np.int64))
        info = mlflow.pyfunc.log_model(name="model", python_model=str(here / "pyfunc/text.py"), **common,
                                       signature=signatures["text"], registered_model_name=registered_name,
                                       input_example=(pd.DataFrame({"prompt": ["The history of"]}),
                                                      {"max_new_tokens": 8}))
    client, version = tracker().client, str(info.registered_model_version)
    # the model's files (the training run carries the same tag), and whether a `dvc exp run` made it
    for key, value in {OUTPUT: output_hash(model_dir), **experiment_tags()}.items():
        client.set_model_version_tag(registered_name, version, key, value)
    name_aliases(client, registered_name, version)


def registered_version(uri: str):
    """The ModelVersion a `models:/<name>/<version>` or `models:/<name>@<alias>` URI names."""
    client, ref = tracker().client, uri.removeprefix("models:/")
    if "@" in ref:
        return client.get_model_version_by_alias(*ref.split("@", 1))
    name, _, version = ref.rpartition("/")
    if version == "latest":
        found = client.search_model_versions(f"name = '{name}'")
        if found:
            return max(found, key=lambda v: int(v.version))
    return client.get_model_version(name, version)


def registered_artifacts(uri: str) -> dict[str, Path]:
    """A registered model's artifacts (e.g. models:/lmpipe-gru@champion), downloaded and named as it names them;
    nothing of it is imported or unpickled. A version the registry lacks and a version whose files are gone are
    told apart."""
    import yaml
    from mlflow.exceptions import MlflowException

    store = tracker()
    relocate_store()
    try:
        version = registered_version(uri)
    except MlflowException as exc:
        raise TrackingError(f"{uri}: not in the MLflow model registry at {store.uri} ({exc.error_code}; see the "
                            "versions with `lmpipe ui`, Models)") from None
    try:
        with temporary_env(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=str(sys.stderr.isatty()).lower()):  # a bar for a person only
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
        spec = yaml.safe_load((local / "MLmodel").read_text()).get("flavors", {}).get("python_function", {})
    except (MlflowException, OSError) as exc:
        raise TrackingError(f"{uri}: version {version.version} is registered, but its files are missing "
                            f"({type(exc).__name__}) under {version.source}: was mlartifacts/ removed?") from None
    if "artifacts" not in spec:
        raise TrackingError(f"{uri}: not an lmpipe text model (no artifacts in its MLmodel); register it anew by "
                            "re-training: dvc repro --force train@<model>")
    return {name: local / artifact["path"] for name, artifact in spec["artifacts"].items()}


CHAMPION, CHALLENGER = "champion", "challenger"


def describe_versions(registered_name: str, model_dir: str | Path, description: str, tags: dict[str, str]) -> list[str]:
    """Give the registered versions of the files now in `model_dir` (by the content hash each version is tagged
    with) a description and tags: what the registry page shows beside a version, so a champion says why. Their
    version numbers."""
    from mlflow.exceptions import MlflowException

    client, made, described = tracker().client, output_hash(model_dir), []
    try:
        versions = client.search_model_versions(f"name = '{registered_name}'")
    except MlflowException:
        return []  # never registered
    for version in versions:
        if version.tags.get(OUTPUT) != made:
            continue
        client.update_model_version(version.name, version.version, description=description)
        for key, value in tags.items():
            client.set_model_version_tag(version.name, version.version, key, value)
        described.append(str(version.version))
    return described


def name_aliases(client, registered_name: str, version: str) -> None:
    """The first version of the study's own becomes the `champion`, which after that only a passing retrain moves
    (`promote_experiment`); every other new version is the `challenger`. One version never holds both. Users load
    `models:/<name>@champion` (MLflow aliases replaced stages in 2.9)."""
    from mlflow.exceptions import MlflowException

    if not experiment_tags():
        try:
            client.get_model_version_by_alias(registered_name, CHAMPION)
        except MlflowException:
            client.set_registered_model_alias(registered_name, CHAMPION, version)
            return
    client.set_registered_model_alias(registered_name, CHALLENGER, version)


def retire(models) -> list[str]:
    """Models removed from the study: their registered models lose the `champion` and `challenger` aliases (no
    `models:/lmpipe-<model>@champion` points at a model the study no longer has) and are tagged as retired; their
    versions stay, to load by number. The names of those that had an alias. Nothing inside an experiment (a
    retrain's copy), whose outcome only a passing gate applies."""
    from mlflow.exceptions import MlflowException

    if experiment_tags():
        return []
    client, retired = tracker().client, []
    for model in models:
        name = registered_name(model)
        try:
            aliases = client.get_registered_model(name).aliases
        except MlflowException:
            continue  # never registered
        for alias in (CHAMPION, CHALLENGER):
            if alias in aliases:
                client.delete_registered_model_alias(name, alias)
        client.set_registered_model_tag(name, "lmpipe.retired", "removed from params.yaml's models")
        if aliases:
            retired.append(model)
    return retired


def registered_name(model: str) -> str:
    """The registry's name of a model of params.yaml's `models`."""
    return f"lmpipe-{model}"


def champion_versions(models) -> dict:
    """{model: its champion ModelVersion}, for the models that have one (the n-gram is never registered)."""
    from mlflow.exceptions import MlflowException

    client, found = tracker().client, {}
    for model in models:
        with contextlib.suppress(MlflowException):
            found[model] = client.get_model_version_by_alias(registered_name(model), CHAMPION)
    return found


def champion_metrics(models) -> dict[str, dict]:
    """{model: {version, word_ppl, bpb}}: each champion's test metrics, from its run (the retrain gate's baseline)."""
    client, found = tracker().client, {}
    for model, version in champion_versions(models).items():
        metrics = client.get_run(version.run_id).data.metrics
        if {"test_word_ppl", "test_bpb"} <= set(metrics):
            found[model] = {"version": str(version.version), "word_ppl": metrics["test_word_ppl"],
                            "bpb": metrics["test_bpb"]}
    return found


def promote_experiment(name: str) -> dict[str, str]:
    """A passing retrain: the versions its experiment registered become the champions. {registered name: version}."""
    client, moved = tracker().client, {}
    for version in client.search_model_versions(f"tags.`{EXPERIMENT}` = '{name}'"):
        client.set_registered_model_alias(version.name, CHAMPION, str(version.version))
        if CHALLENGER in client.get_model_version(version.name, version.version).aliases:  # (a search omits them)
            client.delete_registered_model_alias(version.name, CHALLENGER)  # it is the champion now: one alias
        moved[version.name] = str(version.version)
    return moved


