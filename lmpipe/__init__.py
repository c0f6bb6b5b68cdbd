"""lmpipe: a reproducible language-modelling study (library side: no orchestration here).

Importing it changes nothing in the process: the entry points switch telemetry off (lmpipe.telemetry)."""

__version__ = "0.1.0"
