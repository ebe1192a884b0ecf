"""Progress bars: a line every LOG_INTERVAL_S seconds into a log file, tqdm's own in a terminal."""

import io

from qkvlab import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[str]:
    return [s for s in stream.getvalue().replace("\r", "\n").split("\n") if s.strip()]


def test_a_bar_into_a_log_file_draws_at_the_log_interval():
    log = io.StringIO()
    with progress.bar(total=1000, file=log, desc="log") as bar:
        assert bar.mininterval == progress.LOG_INTERVAL_S
        for _ in range(1000):
            bar.update()
    assert len(lines(log)) == 2  # the start and the end, none in between


def test_a_bar_in_a_terminal_keeps_tqdms_interval_and_an_explicit_one_wins():
    assert progress.bar(total=1, file=Terminal()).mininterval == 0.1
    assert progress.bar(total=1, file=io.StringIO(), mininterval=2.0).mininterval == 2.0


def test_a_disabled_bar_still_counts():
    bar = progress.bar(range(3), disable=True)
    assert list(bar) == [0, 1, 2]


def test_a_sweep_polling_its_runs_keeps_the_log_interval():
    """The sweep polls the store twice a second; each poll used to redraw the bar (a log line
    each, 600 lines in a 5-minute quick sweep). Polls now only advance it."""
    from qkvlab.experiments import pool

    class Store:
        finished = 0

        def status(self, i):
            return "done" if i < self.finished else "pending"

    log, store, ids = io.StringIO(), Store(), list(range(50))
    with progress.bar(total=len(ids), file=log, desc="sweep") as bar:
        for k in range(500):  # polls, a run finishing every tenth
            store.finished = k // 10
            pool.show_finished(bar, store, ids)
        assert bar.n == 49
    assert len(lines(log)) == 2  # the start and the end
