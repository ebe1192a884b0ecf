"""Progress bars for long work: tqdm, with a line every :data:`LOG_INTERVAL_S` seconds where
stderr is a log file rather than a terminal.

tqdm redraws up to ten times a second; in a terminal that is one line, in ``make report > log``
it is a new line each time (about 100 KB over a 14-minute study). Notebook bars (``tqdm.auto``
picks widgets there) keep tqdm's own interval.
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm
from tqdm.notebook import tqdm_notebook

__all__ = ["LOG_INTERVAL_S", "bar"]

LOG_INTERVAL_S = 30.0


def bar(*args, **kwargs) -> tqdm:
    """``tqdm(*args, **kwargs)``; where the bar is text and its stream (default stderr) is not
    a TTY, ``mininterval`` defaults to :data:`LOG_INTERVAL_S`."""
    stream = kwargs.get("file") or sys.stderr
    is_tty = getattr(stream, "isatty", lambda: False)()
    if not issubclass(tqdm, tqdm_notebook) and not is_tty:
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
    return tqdm(*args, **kwargs)
