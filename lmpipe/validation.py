"""The corpus gate: a Great Expectations suite over per-line, per-article and per-split tables.

Each split's clean text becomes rows; GX checks them and renders data docs. A failure is
summarised in a few human lines: which expectation, on which split, how many rows.
"""

from __future__ import annotations

import ast
import datetime
import html
import re
from collections import Counter
from pathlib import Path

import pandas as pd

from lmpipe.config import ValidateParams
from lmpipe.corpus.articles import TITLE

SPLITS = ("train", "valid", "test")
MARKUP_RESIDUE = ("''", "==", "{{", "[[", "<ref", "|}")


def corpus_tables(clean_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Per-line, per-article and per-split tables of the clean splits, read as bytes so bad UTF-8 shows."""
    lines, articles, vocab, word_counts = [], [], {}, {}
    for split in SPLITS:
        data = (Path(clean_dir) / f"{split}.txt").read_bytes()
        title = None
        counts: Counter = Counter()
        for raw in data.split(b"\n"):
            text = raw.decode("utf-8", errors="replace")
            if not text.strip():
                continue
            match = TITLE.match(text)
            if match:
                title = match.group(1)
                articles.append({"split": split, "title": title})
            words = text.split()
            counts.update(words)
            lines.append({
                "split": split,
                "article": title,
                "text": text,
                "chars": len(text),
                "words": len(words),
                "utf8_ok": "\ufffd" not in text or _strict_utf8(raw),
            })
        vocab[split], word_counts[split] = counts, sum(counts.values())
    train_vocab = vocab["train"]
    splits = pd.DataFrame([
        {
            "split": split,
            "words": word_counts[split],
            "articles": sum(1 for a in articles if a["split"] == split),
            "oov_rate": sum(c for w, c in vocab[split].items() if w not in train_vocab) / max(word_counts[split], 1),
        }
        for split in SPLITS
    ])
    article_table = pd.DataFrame(articles, columns=["split", "title"]).drop_duplicates()
    return {"lines": pd.DataFrame(lines), "articles": article_table, "splits": splits}


def _strict_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def expectations(params: ValidateParams) -> dict[str, list]:
    """The suite, one list of expectations per table."""
    import great_expectations as gx

    E = gx.expectations
    lines = [E.ExpectColumnValuesToNotMatchRegex(column="text", regex=re.escape(r), meta={"why": f"no markup residue {r!r}"})
             for r in MARKUP_RESIDUE]
    lines += [
        E.ExpectColumnValuesToBeBetween(column="chars", min_value=params.min_line_chars, max_value=params.max_line_chars,
                                        meta={"setting": "validate.min_line_chars / validate.max_line_chars"}),
        E.ExpectColumnValuesToBeInSet(column="utf8_ok", value_set=[True]),
    ]
    return {
        "lines": lines,
        "articles": [E.ExpectColumnValuesToBeUnique(column="title", meta={"why": "splits disjoint by article"})],
        "splits": [
            E.ExpectColumnDistinctValuesToEqualSet(column="split", value_set=list(SPLITS)),
            E.ExpectColumnValuesToBeBetween(column="words", min_value=params.min_words,
                                            meta={"setting": "validate.min_words"}),
            E.ExpectColumnValuesToBeBetween(column="oov_rate", min_value=0, max_value=params.max_oov_rate,
                                            meta={"setting": "validate.max_oov_rate"}),
        ],
    }


def _describe(table: str, result) -> str:
    """One human line: what was expected, on which table and column, how many rows broke it, where."""
    config = result.expectation_config
    detail = result.result or {}
    meta = config.meta or {}
    what = meta.get("why") or _expected(config.kwargs)
    count, total = detail.get("unexpected_count"), detail.get("element_count")
    badly = f"{count} of {total} rows" if count is not None else f"observed {detail.get('observed_value')}"
    where = Counter(row.get("split") for row in detail.get("unexpected_index_list") or [])
    per_split = ", ".join(f"{split}: {n}" for split, n in sorted(where.items(), key=lambda kv: str(kv[0])))
    examples = [str(v)[:60] for v in (detail.get("partial_unexpected_list") or [])[:3]]
    fix = f" (change {meta['setting']} in params.yaml, or fix the corpus)" if meta.get("setting") else ""
    return (f"{table}.{config.kwargs.get('column')}: {what}: {badly}"
            + (f" [{per_split}]" if per_split else "") + (f" e.g. {examples}" if examples else "") + fix)


def _expected(kwargs: dict) -> str:
    """An expectation's bounds in words: 'values in [0, 0.2]', 'values >= 1000', 'values in ['test', 'train']'."""
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if "value_set" in kwargs:
        return f"values in {sorted(kwargs['value_set'], key=str)}"
    if low is not None and high is not None:
        return f"values in [{low:g}, {high:g}]"
    return f"values >= {low:g}" if low is not None else f"values <= {high:g}"


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
STAMP = re.compile(r"\d{8}T\d{6}\.\d{6}Z")
REMOTE_LOGO = re.compile(r"https://great-expectations-web-assets\.[^\"]*logo-long\.png[^\"]*")
# Bootstrap, jQuery, Vega and Font Awesome from CDNs: a page opened online would call those hosts. Offline they never
# loaded; the inline styles and static tables below stand in, so the tags go.
REMOTE_ASSET = re.compile(r"<script[^>]*\ssrc=\"https?://[^\"]*\"[^>]*>\s*</script>\s*|"
                          r"<link[^>]*\shref=\"https?://[^\"]*\"[^>]*>\s*")
# The run's constant date (RUN_ID), as the pages show it: not a true time, so it is not shown (paths keep it).
SHOWN_RUN_TIME = re.compile(r"2000-01-01T00:00:00Z|2000-01-01 00:00:00 UTC|(?<=>)20000101T000000\.000000Z(?=<)")


# Bootstrap's styles come from a CDN: offline, these few rules keep the pages' tables and cards legible
OFFLINE_STYLE = ("<style>body{font-family:system-ui,sans-serif;margin:1em 2em;color:#222}"
                 "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.2em .6em;"
                 "text-align:left;vertical-align:top}th{background:#f2f2f2}.card{border:1px solid #ddd;"
                 "margin:.8em 0;padding:.4em .8em}.fa-check-circle:before{content:'\\2713';color:#080}"
                 ".fa-times:before,.fa-times-circle:before,.fa-exclamation-triangle:before{content:'\\2717';"
                 "color:#c00}</style>\n")
TABLE_SCRIPT = re.compile(r"\$\('#(?P<id>[\w-]+)'\)\.bootstrapTable\(\s*Object\.assign\(\s*\{\s*"
                          r"columns: (?P<columns>\[.*?\]),\s*data: (?P<data>\[.*?\]),\s*toolbar:", re.S)


def static_tables(page: str) -> str:
    """GX's index page builds its tables in the browser with bootstrap-table from a CDN, so offline they are blank.
    Each table is written out as plain HTML rows in place (a row links to its page); online, bootstrap-table
    replaces them with its own."""
    for match in TABLE_SCRIPT.finditer(page):
        columns = [c for c in ast.literal_eval(match["columns"]) if c.get("visible", True) not in (False, "false")]
        head = "".join(f"<th>{html.escape(c['title'])}</th>" for c in columns)
        rows = []
        for row in ast.literal_eval(match["data"]):
            cells = []
            for c in columns:
                value = row.get(f"_{c['field']}_text", row.get(c["field"], ""))  # the status as a word, not an icon
                text = html.escape(" ".join(re.sub(r"<[^>]+>", " ", str(value)).split("Batch Spec:")[0].split()))
                cells.append(f'<td><a href="{html.escape(row["_table_row_link_path"])}">{text}</a></td>'
                             if c is columns[0] and "_table_row_link_path" in row else f"<td>{text}</td>")
            rows.append(f"<tr>{''.join(cells)}</tr>")
        empty = f'<table\n  id="{match["id"]}"'
        start = page.index(empty)
        end = page.index("</table>", start)
        opening = page[start:page.index(">", start) + 1]
        page = page[:start] + f"{opening}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody>" + page[end:]
    return page


def steady_docs(docs_dir: str | Path, run_time: str) -> None:
    """Make GX's data docs a function of the corpus alone: its random element ids numbered in order, the times it
    stamps (render time, validation time) set to the run's constant time, and the logo it loads from the web taken
    from its own static/ folder instead. The index page's tables are written out as HTML (`static_tables`) and a
    few inline styles stand in for Bootstrap's, so the docs read offline; the tags that would load assets from the
    web are removed, and the constant run time is not shown."""
    root = Path(docs_dir)
    for page in sorted(root.rglob("*.html")):
        text, ids = page.read_text(encoding="utf-8"), {}
        text = UUID.sub(lambda m: ids.setdefault(m.group(0), f"id{len(ids) + 1}"), text)
        text = STAMP.sub(run_time, text)
        logo = Path(*[".."] * (len(page.relative_to(root).parts) - 1), "static/images/logo-long-vector.svg")
        text = REMOTE_LOGO.sub(logo.as_posix(), text).replace("</head>", OFFLINE_STYLE + "</head>", 1)
        text = static_tables(text) if page == root / "index.html" else text
        text = SHOWN_RUN_TIME.sub("not recorded", REMOTE_ASSET.sub("", text))
        page.write_text(text, encoding="utf-8")


def validate_corpus(clean_dir: str | Path, params: ValidateParams, docs_dir: str | Path) -> dict:
    """Run the suite, build data docs into `docs_dir`; return metrics/validation.json's content. The run is named
    and dated by a constant (RUN_ID), so the same corpus gives the same pages byte for byte: a reproduced study
    leaves git clean."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    RUN_ID = RunIdentifier(run_name="lmpipe-validate", run_time=datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc))
    from great_expectations.data_context.types.base import ProgressBarsConfig

    tables = corpus_tables(clean_dir)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.add_data_docs_site(
        site_name="lmpipe",
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(Path(docs_dir).resolve())},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    source = context.data_sources.add_pandas("corpus")
    definitions = []
    for table, expectation_list in expectations(params).items():
        batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe(table)
        suite = context.suites.add(gx.ExpectationSuite(name=f"corpus_{table}", expectations=expectation_list))
        definitions.append(context.validation_definitions.add(gx.ValidationDefinition(name=table, data=batch, suite=suite)))
    failures, results, total = [], [], 0
    for table, definition in zip(tables, definitions):
        checkpoint = context.checkpoints.add(gx.Checkpoint(
            name=f"corpus_{table}",
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="docs", site_names=["lmpipe"])],
            result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["split"]},
        ))
        outcome = checkpoint.run(batch_parameters={"dataframe": tables[table]}, run_id=RUN_ID)
        for run in outcome.run_results.values():
            for result in run.results:
                total += 1
                detail = result.result or {}
                results.append({
                    "table": table,
                    "expectation": result.expectation_config.type,
                    "column": result.expectation_config.kwargs.get("column"),
                    "success": bool(result.success),
                    "unexpected_count": detail.get("unexpected_count"),
                    "unexpected_percent": detail.get("unexpected_percent"),
                })
                if not result.success:
                    failures.append(_describe(table, result))
    steady_docs(docs_dir, RUN_ID.to_tuple()[1])
    return {
        "success": not failures,
        "evaluated": total,
        "failed": len(failures),
        "failures": failures,
        "results": results,
        "rows": {table: len(frame) for table, frame in tables.items()},
    }
