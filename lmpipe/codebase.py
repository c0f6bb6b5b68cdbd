"""Which project files a module runs: its import closure, read with `ast` (nothing is imported).

One walk for two readers, so they cannot disagree: the stage graph's test (every file a stage imports is in its DVC
deps) and `checkpoints.code_version` (the training code's hash, in every checkpoint folder's key and in the seeds'
and the scaling grid's cache keys). A hand-kept list of files would miss the next module someone adds.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lmpipe", "flows", "lmpipe_cli")
# Plumbing that cannot change any output, declared once: where runs are recorded, how errors read, the stage harness,
# the Prefect server probe, where tasks run (local threads or a cluster: the same results), the packages'
# import-time setup and telemetry switch, the process's memory settings (speed, never numbers), the harness's reading
# of the pipeline files (which stages ran, which outputs git holds) and of a command line's -S settings.
PLUMBING = frozenset({
    "lmpipe/tracking/__init__.py", "lmpipe/tracking/store.py", "lmpipe/tracking/runs.py",
    "lmpipe/tracking/registry.py", "lmpipe/errors.py", "lmpipe/__init__.py", "flows/__init__.py",
    "flows/_stage.py", "flows/_prefect.py", "flows/runners.py", "lmpipe/process.py", "lmpipe/telemetry.py",
    "lmpipe/dvc_files.py", "lmpipe/set_param.py"})
# Modules whose function-level imports build MLflow side outputs only (tracking.registry.log_lm: the registered model's
# serving code; tracking.runs.git_commit: the commit a run is tagged with), which DVC does not version: only their
# module-level imports are followed.
SIDE_OUTPUTS = frozenset({"lmpipe/tracking/registry.py", "lmpipe/tracking/runs.py"})
# The typed reading of params.yaml: plumbing for DVC, which tracks params.yaml itself (every setting is stated there,
# none is a default in these files), yet part of a checkpoint's key. What they import only to check params (the
# families' arch classes, the decoding rules) reaches an output only where a stage imports it itself.
PARAMS_SCHEMA = frozenset({"lmpipe/config.py", "lmpipe/model_params.py"})
TRAINING_ENTRY = "lmpipe.train.job"  # what every training entry point calls: prepare, the Trainer, publish


def module_file(dotted: str, root: Path = ROOT) -> Path | None:
    """The project file of a dotted module name (a package's __init__.py), or None outside the project."""
    if dotted.split(".")[0] not in PACKAGES:
        return None
    base = root / Path(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports_of(path: Path, root: Path = ROOT) -> set[Path]:
    """Project files that `path` imports, function-level imports and the packages on the way included (importing
    a.b runs a/__init__.py)."""
    found = set()

    def add(dotted: str) -> None:
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            file = module_file(".".join(parts[:i]), root)
            if file is not None:
                found.add(file)

    tree = ast.parse(path.read_text())
    top_level_only = path.relative_to(root).as_posix() in SIDE_OUTPUTS
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom) and (module := absolute(node, path, root)):
            add(module)
            for alias in node.names:  # `from lmpipe import tracking`: a submodule
                if module_file(f"{module}.{alias.name}", root):
                    add(f"{module}.{alias.name}")
    return found


def absolute(node: ast.ImportFrom, path: Path, root: Path = ROOT) -> str:
    """The dotted module a `from ... import` names, a relative one (`from .job import x` in path) resolved."""
    if not node.level:
        return node.module or ""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    base = ".".join(package[:len(package) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def closure(start: Path, root: Path = ROOT, stop: frozenset[str] = frozenset()) -> set[Path]:
    """`start` and every project file it imports, directly or through other project files; the files in `stop`
    (relative paths) are reached but not walked through."""
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            if path.relative_to(root).as_posix() not in stop:
                todo.extend(imports_of(path, root) - seen)
    return seen


def code_files(module: str = TRAINING_ENTRY, root: Path = ROOT) -> list[str]:
    """The files (relative, sorted) whose code decides what `module` computes: its closure less the plumbing."""
    files = {p.relative_to(root).as_posix() for p in closure(module_file(module, root), root)}
    return sorted(files - PLUMBING)


def code_hash(module: str = TRAINING_ENTRY, root: Path = ROOT) -> str:
    """12 hex digits over the names and the code (`code_of`) of `code_files(module)`: any edit to what runs changes
    it, an edit to a docstring, a comment or blank lines does not (so the seeds' rows and the grid's cached runs
    outlive it)."""
    digest = hashlib.sha256()
    for name in code_files(module, root):
        digest.update(name.encode() + b"\0" + code_of((root / name).read_text(encoding="utf-8")).encode() + b"\0")
    return digest.hexdigest()[:12]


def code_of(source: str) -> str:
    """`source` without what cannot run: its docstrings and comments blanked, then trailing spaces and blank lines
    dropped, except inside a string that spans lines, where they are its value. Found by position (`ast` for the
    docstrings and strings, `tokenize` for the comments), which every Python version reports alike, so the same file
    gives the same text on any machine."""
    import io
    import tokenize

    source = source.replace("\r\n", "\n")
    lines = source.split("\n")  # as ast and tokenize count lines (str.splitlines also breaks at \f, \x1c, ...)
    tree = ast.parse(source)
    docstrings = _docstrings(tree)

    def column(line: int, byte: int) -> int:  # ast counts columns in UTF-8 bytes
        return len(lines[line - 1].encode()[:byte].decode())

    spans = [(n.lineno, column(n.lineno, n.col_offset), n.end_lineno, column(n.end_lineno, n.end_col_offset))
             for n in docstrings]
    spans += [(*t.start, *t.end) for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type == tokenize.COMMENT]
    strings = {id(n.value) for n in docstrings}
    verbatim = {line for n in ast.walk(tree) if id(n) not in strings
                and (isinstance(n, ast.JoinedStr) or isinstance(n, ast.Constant) and isinstance(n.value, (str, bytes)))
                and n.end_lineno > n.lineno for line in range(n.lineno, n.end_lineno + 1)}
    for start_line, start_col, end_line, end_col in sorted(spans, reverse=True):  # from the end: positions hold
        first, last = lines[start_line - 1], lines[end_line - 1]
        lines[start_line - 1:end_line] = [first[:start_col] + last[end_col:]] + [""] * (end_line - start_line)
    return "\n".join(line if number in verbatim else line.rstrip()
                     for number, line in enumerate(lines, 1) if number in verbatim or line.strip())


def _docstrings(tree: ast.AST) -> list[ast.Expr]:
    """The docstring expressions of a module, its classes and its functions."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [node.body[0] for node in ast.walk(tree) if isinstance(node, kinds) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)]
