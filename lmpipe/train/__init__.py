"""One training loop for every neural model (lmpipe.train.trainer); what each entry point does around it, `prepare`
and `publish` (lmpipe.train.job); `python -m lmpipe.train` runs it from the command line (lmpipe/train/__main__.py)."""

from lmpipe.train.job import configure_run
from lmpipe.train.trainer import (Trainer, TrainResult, autocast_dtype, configure_device, native_bf16, pick_device,
                                  setup_process, stream_plan, window_plan)

__all__ = ["Trainer", "TrainResult", "autocast_dtype", "configure_device", "configure_run", "native_bf16",
           "pick_device", "setup_process", "stream_plan", "window_plan"]
