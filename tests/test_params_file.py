"""params.yaml edited in place: only the changed values move, the layout and comments stay."""

import difflib

import pytest
import yaml

from lmpipe.errors import ConfigError
from lmpipe.overrides import apply_overrides
from lmpipe.params_file import edit_params
from tests.helpers import ROOT

TEXT = (ROOT / "params.yaml").read_text()


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and line[:3] not in ("+++", "---")]


@pytest.mark.parametrize("override", ["corpus.sha256=" + "ab" * 32, "models.gru.max_steps_per_epoch=100",
                                      "models.gru.optim.lr=0.003", "train.seed=7", "tokenizer.boundary_token='<x>'"])
def test_one_override_changes_one_line_and_loads_as_dvc_would_set_it(override):
    edited = edit_params(TEXT, [override])
    assert len(changed_lines(TEXT, edited)) == 2  # one line out, one in: comments, nulls, inline maps as they were
    assert yaml.safe_load(edited) == apply_overrides(yaml.safe_load(TEXT), [override])
    assert "sha256: null" in edited or override.startswith("corpus.sha256")


def test_a_comment_stays_on_its_line_after_the_new_value():
    edited = edit_params(TEXT, ["corpus.sha256=" + "ab" * 32])
    line = next(l for l in edited.splitlines() if l.strip().startswith("sha256:"))
    assert line.startswith("  sha256: " + "ab" * 32) and "# optional: verified when given" in line


def test_a_key_the_file_does_not_hold_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="models.newmodel is not in the file; add it by hand"):
        edit_params(TEXT, ["models.newmodel={family: rnn}"])
