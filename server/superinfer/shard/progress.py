"""Progress of the shard's long start-up steps (downloads, weights) as log lines: a tqdm bar
whose refreshes become INFO lines, at most one per bar every few seconds, so progress reaches
the launcher's log (and a container's), where a terminal's redrawn bar would not."""
import io
import logging

from tqdm import tqdm

log = logging.getLogger(__name__)

# Seconds between two progress lines of one bar.
PROGRESS_INTERVAL_S = 5.0


class _LogLines(io.TextIOBase):
    """A file for tqdm that turns each refresh into a log line."""

    def write(self, text: str) -> int:
        line = text.replace("\x1b[A", "").strip("\r\n ")  # tqdm's carriage returns and cursor moves
        if line:
            log.info("%s", line)
        return len(text)


class ProgressLog(tqdm):
    """A tqdm bar logged as lines (huggingface_hub's bars take it as their `tqdm_class`)."""

    def __init__(self, *args, **kwargs):
        kwargs.pop("name", None)  # huggingface_hub's bar group; plain tqdm rejects it
        kwargs.update(file=_LogLines(), mininterval=PROGRESS_INTERVAL_S, maxinterval=PROGRESS_INTERVAL_S,
                      ascii=True, ncols=100, dynamic_ncols=False)
        super().__init__(*args, **kwargs)
