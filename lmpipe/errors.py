"""User-facing errors: each carries one line that names the file, the field and the fix."""


def first_line(text: str, limit: int = 300) -> str:
    """The first line of a library's message, whole up to `limit` characters, else cut at a word with an ellipsis."""
    line = (text.strip().splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(" ,;:") + " ..."


def first_few(names: list[str], shown: int = 4) -> str:
    """`names` in one short line however many there are: the first `shown`, then how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


UNION_TAGS = ("adam", "sgd")  # the tags of lmpipe.model_params.OptimParams, which pydantic puts in an error's
# location: describe_error leaves them out of the key


def meant(unknown: dict, errors: list[dict]) -> dict | None:
    """The error of the missing key beside an unknown one that the unknown one most likely misspells ('lrr' for a
    missing 'lr'), or None: a typo is one mistake, said as one."""
    import difflib

    if unknown["type"] != "extra_forbidden":
        return None
    missing = {str(e["loc"][-1]): e for e in errors if e["type"] == "missing" and e["loc"][:-1] == unknown["loc"][:-1]}
    close = difflib.get_close_matches(str(unknown["loc"][-1]), list(missing), n=1, cutoff=0.6)
    return missing[close[0]] if close else None


def describe_error(error: dict, within: str = "", instead: str | None = None) -> str:
    """One pydantic error as `key: message (got value)`, the key inside `within` (a section's name); `instead`: the
    key an unknown one misspells (`meant`)."""
    parts = [str(p) for p in error["loc"]
             if p not in UNION_TAGS and not str(p).startswith(("function-after", "function-before"))]
    key = ".".join(filter(None, [within, *parts])) or "(top level)"
    key = key.replace("validate_", "validate")
    fix = f"did you mean '{instead}'?" if instead else "remove it or fix its spelling"
    if error["type"] == "extra_forbidden" and set(error["loc"]) & set(UNION_TAGS):
        if "sgd" in error["loc"]:
            return f"'{key}' is not a setting of SGD ({fix})"
        return (f"'{key}' is not a setting of adam, adamw and muon ("
                + (fix if instead else "remove it or fix its spelling; momentum and nt_asgd are SGD's") + ")")
    if error["type"] == "extra_forbidden":
        return f"unknown key '{key}' ({fix})"
    if error["type"] == "missing":
        return f"'{key}' is missing: params.yaml states every setting, so that DVC sees it (add it)"
    message = error["msg"].removeprefix("Value error, ")
    got = error.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    return f"{key}: {message}{shown}"




class LmpipeError(Exception):
    """A mistake in the user's input or environment; printed as one line, never as a traceback."""


class ConfigError(LmpipeError):
    """params.yaml is malformed or holds an impossible value."""


class CorpusError(LmpipeError):
    """A corpus file is missing, empty, not UTF-8, or not what its source promises."""


class DownloadError(LmpipeError):
    """A download failed for good (HTTP error, checksum mismatch, retries exhausted)."""


class ValidationFailed(LmpipeError):
    """The corpus failed a Great Expectations expectation."""


class TrackingError(LmpipeError):
    """The MLflow tracking store cannot be reached or created where MLFLOW_TRACKING_URI points."""


class ModelFileError(LmpipeError):
    """A model file is missing, torn, corrupt, or holds more than tensors and plain values."""


class DiskFull(LmpipeError):
    """A write ran out of space; the message names the path."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a stage; the message says what was kept (e.g. the checkpoint of step N)."""
