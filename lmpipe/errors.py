"""User-facing errors: each carries one line that names the file, the field and the fix."""


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
