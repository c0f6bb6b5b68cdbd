"""User-facing errors: each carries one line that names the file, the field and the fix."""


def first_line(text: str, limit: int = 300) -> str:
    """The first line of a library's message, whole up to `limit` characters, else cut at a word with an ellipsis."""
    line = (text.strip().splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(" ,;:") + " ..."


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
