"""The one markdown table writer: cells as their callers formatted them, columns lined up, readable back."""

from lmpipe.tables import markdown_table
from tests.helpers import table_rows


def test_cells_are_shown_as_formatted_never_re_parsed_as_numbers():
    lines = markdown_table(["model", "test bpb", "params"], [["gru", "2.100", "1,234"], ["ngram (baseline)", 7, "-"]])
    assert table_rows(lines) == [["model", "test bpb", "params"], ["gru", "2.100", "1,234"],
                                 ["ngram (baseline)", "7", "-"]]  # 2.100 not 2.1; an int shown as str() shows it
    assert len({len(line) for line in lines}) == 1  # every column padded to one width: the file reads as a table
    assert lines[1].startswith("|:-")  # the rule under the header


def test_a_table_without_rows_is_its_header():
    assert table_rows(markdown_table(["model", "bpb"], [])) == [["model", "bpb"]]
