"""What `dvc plots show` and `dvc plots diff` draw from the committed plots through dvc.yaml's definitions and the
templates in .dvc/plots, read from the SVG that Vega-Lite renders: what a person sees, not the config's text."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PERPLEXITY = "plots/eval/perplexity.csv"
CURVES = "learning_curves"
TEXT = re.compile(r'<text [^>]*?text-anchor="(\w+)" transform="translate\((-?[\d.]+),(-?[\d.]+)\)"[^>]*'
                  r'font-size="([\d.]+)px"[^>]*>([^<]*)</text>')


def plot_specs(*targets: str) -> dict:
    """{plot id: its Vega-Lite spec} as `dvc plots show --json` fills the templates with the workspace's data."""
    out = subprocess.run([str(Path(sys.executable).parent / "dvc"), "plots", "show", "--json", *targets],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {pid: plots[0]["content"] for pid, plots in json.loads(out)["data"].items()}


def as_diff(spec: dict, field: str, shift: float) -> dict:
    """The spec as `dvc plots diff HEAD` fills it: each row again for a second revision, its `field` moved by
    `shift` (a small change is the hard case: the two revisions' marks nearly coincide)."""
    rows = spec["data"]["values"]
    other = [r | {"rev": "HEAD", field: str(float(r[field]) + shift)} for r in rows]
    return spec | {"data": {"values": rows + other}}


def texts(svg: str) -> list[tuple[float, float, float, float, str]]:
    """(left, right, y, font size, text) of each text drawn, its width estimated from its length."""
    out = []
    for anchor, x, y, size, text in TEXT.findall(svg):
        x, size = float(x), float(size)
        width = 0.6 * size * len(text)
        left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        out.append((left, left + width, float(y), size, text))
    return out


def overprinted(labels: list) -> list[tuple[str, str]]:
    """Pairs of labels whose boxes meet."""
    return [(a[4], b[4]) for i, a in enumerate(labels) for b in labels[i + 1:]
            if a[0] < b[1] and b[0] < a[1] and abs(a[2] - b[2]) < min(a[3], b[3])]


def svg_of(spec: dict) -> str:
    vl_convert = pytest.importorskip("vl_convert")
    return vl_convert.vegalite_to_svg(json.dumps(spec), vl_version="5.21")


def test_learning_curves_are_one_panel_per_model_titled_by_name_on_one_y_scale():
    """Every model in params.yaml has its panel, headed by its name (not a file path), and all panels share one
    y-scale, so the curves compare at a glance."""
    vl_convert = pytest.importorskip("vl_convert")
    models = set(yaml.safe_load((ROOT / "params.yaml").read_text())["models"])
    spec = plot_specs(CURVES)[CURVES]
    drawn = {t[4] for t in texts(svg_of(spec))}
    assert models <= drawn
    assert not [t for t in drawn if ".csv" in t or "plots/" in t]
    vega = vl_convert.vegalite_to_vega(spec, vl_version="5.21")
    vega = json.loads(vega) if isinstance(vega, str) else vega

    def nested_scales(mark: dict) -> list[str]:
        return [s["name"] for m in mark.get("marks", []) for s in m.get("scales", [])] + [
            name for m in mark.get("marks", []) for name in nested_scales(m)]

    assert "y" in {s["name"] for s in vega["scales"]} and not nested_scales(vega)


def test_learning_curves_of_two_revisions_are_told_apart():
    """`dvc plots diff`: each revision its own colour and dash, both in the legend."""
    spec = as_diff(plot_specs(CURVES)[CURVES], "valid_bpb", 0.01)
    svg = svg_of(spec)
    assert {"HEAD", "workspace"} <= {t[4] for t in texts(svg)}
    assert len(set(re.findall(r'stroke="(#[0-9a-f]{6})"', svg))) >= 2
    assert "stroke-dasharray" in svg


def test_the_bpb_chart_prints_no_label_over_another_even_in_a_diff():
    """Axis ticks far enough apart to read ("1.921.93" was two ticks run together), and in `dvc plots diff` each
    revision's dot and value label on its own line: nothing printed over anything else."""
    shown = plot_specs(PERPLEXITY)[PERPLEXITY]
    rows = len(shown["data"]["values"])
    for spec, revisions in ((shown, 1), (as_diff(shown, "test_bpb", 0.0004), 2)):
        drawn = texts(svg_of(spec))
        ticks = [t for t in drawn if re.fullmatch(r"\d\.\d\d", t[4])]
        values = [t for t in drawn if re.fullmatch(r"\d\.\d{3}", t[4])]
        assert len(ticks) >= 3 and not overprinted(ticks)
        assert len(values) == rows * revisions and not overprinted(values)


def readme_command(start: str) -> list[str]:
    """The README's command line that starts with `start`, split as the shell would (its comment left out)."""
    import shlex

    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith(start))
    return shlex.split(line, comments=True)


def as_after_a_gru_experiment(root: Path) -> dict:
    """What `dvc exp run -S models.gru.optim.lr=0.003` changes in a copy of the study at `root`: the setting; the
    GRU's row of `dvc metrics show` (a little worse, still between its neighbours, and no sd: its seed rows are of
    other params now); in dvc.lock, the hashes of the GRU's outputs and of the folders that join every model's.
    Returns the GRU's new row."""
    import hashlib

    text = (root / "params.yaml").read_text()
    lr = yaml.safe_load(text)["models"]["gru"]["optim"]["lr"]
    at = text.index(f"lr: {lr}", text.index("\n  gru:"))
    (root / "params.yaml").write_text(text[:at] + "lr: 0.003" + text[at + len(f"lr: {lr}"):])
    assert yaml.safe_load((root / "params.yaml").read_text())["models"]["gru"]["optim"]["lr"] == 0.003
    (row,) = (root / "metrics/models").glob("*-gru.json")
    old = json.loads(row.read_text())
    new = {"bpb": round(old["bpb"] + 0.0047, 4), "vs_kn5": round(old["vs_kn5"] + 0.0047, 4), "tflop": old["tflop"]}
    row.write_text(json.dumps(new, indent=2) + "\n")
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    joined = ("models", "metrics/eval", "metrics/train", "plots/train", "data/logprobs", "metrics/models")
    for entry in (e for stage in lock["stages"].values() for e in stage.get("deps", []) + stage.get("outs", [])):
        if "md5" in entry and ("gru" in entry["path"] or entry["path"] in joined):
            other = hashlib.md5(entry["md5"].encode()).hexdigest()
            entry["md5"] = other + (".dir" if entry["md5"].endswith(".dir") else "")
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    return {"file": row.name, **new}


def test_dvc_exp_show_of_a_changed_learning_rate_fits_160_columns(tmp_path):
    """The README's `dvc exp show --only-changed --drop ...` on the study's own pipelines, metrics and params, after
    what a changed learning rate changes: at most 160 columns (without --drop the changed folders' hashes take a
    line past them), and what changed is in them."""
    import os

    dvc = str(Path(sys.executable).parent / "dvc")
    for path in ("dvc.yaml", "dvc.lock", "params.yaml", "seeds/dvc.yaml", "seeds/dvc.lock", "scaling/dvc.yaml",
                 "scaling/dvc.lock", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "metrics").rglob("*.json"))):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes((ROOT / path).read_bytes())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for command in (["git", "init", "-q"], [dvc, "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "study"]):
        subprocess.run(command, cwd=tmp_path, check=True, capture_output=True)
    gru = as_after_a_gru_experiment(tmp_path)

    def shown(command: list[str]) -> list[str]:
        out = subprocess.run([dvc, *command[1:]], cwd=tmp_path, capture_output=True, text=True, check=True,
                             env={**os.environ, "COLUMNS": "160"}).stdout
        return [ln.rstrip() for ln in out.splitlines() if ln.strip()]

    command = readme_command("dvc exp show --only-changed")
    assert "--drop" in command
    lines = shown(command)
    assert max(len(ln) for ln in lines) <= 160, "\n".join(lines)
    header = next(ln for ln in lines if "Experiment" in ln)
    for column in (f"{gru['file']}:bpb", f"{gru['file']}:vs_kn5", "models.gru.optim.lr"):
        assert column in header, header
    assert "transformer" not in header and "Created" not in header and "models/gru" not in header, header
    workspace = next(ln for ln in lines if ln.split()[0] == "workspace")
    assert str(gru["bpb"]) in workspace and "0.003" in workspace, "\n".join(lines)
    assert max(len(ln) for ln in shown(command[:command.index("--drop")])) > 160  # what --drop takes away
