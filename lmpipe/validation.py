"""The corpus gate: a Great Expectations suite over per-line, per-article and per-split tables.

Each split's clean text becomes rows; GX checks them and renders data docs. A failure is
summarised in a few human lines: which expectation, on which split, how many rows.
"""

from __future__ import annotations

import datetime
import re
import shutil
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
VENDOR = Path(__file__).parent / "data" / "datadocs"  # GX's CDN scripts and styles, from npm (its README)
VENDORED = {  # the address GX's pages load an asset from -> its copy in VENDOR
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper.js/popper.min.js",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap/bootstrap.min.css",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap/bootstrap.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "bootstrap-table/bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "bootstrap-table/bootstrap-table.min.js",
    **{f"https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/{name}":
       "bootstrap-table/bootstrap-table-filter-control.min.css"
       for name in ("bootstrap-table-filter-control.css", "bootstrap-table-filter-control.min.css")},
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js":
        "bootstrap-table/bootstrap-table-filter-control.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css":
        "bootstrap-datepicker/bootstrap-datepicker.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js":
        "bootstrap-datepicker/bootstrap-datepicker.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "fontawesome/css/all.min.css",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css":
        "bootstrap-dark/bootstrap-prefers-dark.min.css",
}
# Vega draws the charts of GX's profiling pages; this suite's pages have none, so its three scripts go
CHARTS = re.compile(r"<script src=\"https://cdn\.jsdelivr\.net/npm/vega(-lite|-embed)?@\d+\"></script>\s*")
REMOTE = re.compile(r"<(?:script|link|img)[^>]*\s(?:src|href)=\"(https?://[^\"]*)\"")
STATIC = re.compile(r"(?<=[\"'(])(?:\.\./)*static/")  # a page's relative link to its own static/ folder
# a CDN tag's subresource integrity and CORS mode: a browser refuses both for a file:// page's own files (the copies
# are the bytes those hashes name: tests/test_validation.py checks them against GX's templates)
CORS = re.compile(r"\s(?:integrity=\"sha\d+-[^\"]*\"|crossorigin=\"anonymous\")")
FOOTER = re.compile(r"<footer>\s*<p>Stay current on everything GX with our newsletter.*?</footer>\s*", re.S)
REMOTE_LOGO = re.compile(r"https://great-expectations-web-assets\.[^\"')]*\.png")  # the header logo; in dark mode, CSS's
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
STAMP = re.compile(r"\d{8}T\d{6}\.\d{6}Z")
# The run's constant date (RUN_ID), as the pages show it: not a true time, which only the validate stage's MLflow
# run has (a true time here would change the pages at every reproduction)
SHOWN_RUN_TIME = re.compile(r"2000-01-01T00:00:00Z|2000-01-01 00:00:00 UTC|(?<=>)20000101T000000\.000000Z(?=<)")
RUN_TIME_NOTE = "in MLflow: the validate run"  # no quote: it lands inside JavaScript strings too


def steady_docs(docs_dir: str | Path, run_time: str) -> None:
    """Make GX's data docs a function of the corpus alone, readable offline: its random element ids numbered in
    order, the times it stamps set to the run's constant time (and shown as where the true one is), the scripts,
    styles and logos it loads from the web served from copies beside the pages (`VENDORED`, `static/vendor/`), its
    newsletter footer gone. A page that would still load anything from the web is refused, naming it: a newer GX
    needs its copy added."""
    root = Path(docs_dir)
    shutil.copytree(VENDOR, root / "static" / "vendor", ignore=shutil.ignore_patterns("README.md"), dirs_exist_ok=True)
    styles = root / "static" / "styles" / "data_docs_default_styles.css"  # its dark mode's logo: an image on the web
    if styles.exists():
        styles.write_text(REMOTE_LOGO.sub("../images/logo-long-vector.svg", styles.read_text()))
    for page in sorted(root.rglob("*.html")):
        text, ids = page.read_text(encoding="utf-8"), {}
        text = UUID.sub(lambda m: ids.setdefault(m.group(0), f"id{len(ids) + 1}"), text)
        text = STAMP.sub(run_time, text)
        up = "../" * (len(page.relative_to(root).parts) - 1)
        text = STATIC.sub(f"{up}static/", text)  # GX counts one level too few on a validation's page
        text = REMOTE_LOGO.sub(f"{up}static/images/logo-long-vector.svg", text)
        for address, copy in VENDORED.items():
            text = text.replace(f'"{address}"', f'"{up}static/vendor/{copy}"')
        text = SHOWN_RUN_TIME.sub(RUN_TIME_NOTE, FOOTER.sub("", CHARTS.sub("", CORS.sub("", text))))
        if "vegaEmbed(" in text or (remote := REMOTE.search(text)):
            what = "a chart (Vega, not vendored)" if "vegaEmbed(" in text else remote.group(1)
            raise RuntimeError(f"{page}: GX's page loads {what} from the web; add a copy to {VENDOR} (its README)")
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
