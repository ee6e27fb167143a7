"""Progress bars and run-time forecasts for the long loops of a fit.

DP-2S-GD's iterations (:mod:`dpivreg.estimation.engine`), the privacy-noise simulation
(:mod:`dpivreg.estimation.simulation`) and the passes over Dask data (:mod:`dpivreg.model`) report their progress
through :class:`ProgressBar` (tqdm, on stderr; a widget in a notebook) and announce a run projected to take more
than :data:`LONG_RUN_SECONDS` with a :class:`~dpivreg.errors.LongRunWarning` (:class:`RunTimeForecast`). They read
only the clock: a fit's numbers are the same, bit for bit, with and without them.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings

import numpy as np

from dpivreg.errors import LongRunWarning

__all__ = ["check_progress", "ProgressBar"]


#: A loop whose remaining time, projected from its first steps, exceeds this many seconds is announced.
LONG_RUN_SECONDS = 60.0


#: With ``progress=None`` (automatic), a loop whose total time, projected from its steps so far, exceeds this many
#: seconds shows a progress bar (on an interactive terminal or in a notebook only).
PROGRESS_SECONDS = 5.0


def check_progress(progress) -> bool | None:
    """``progress`` checked: True (always show a progress bar), False (never) or None (automatic)."""
    if progress is None:
        return None
    if isinstance(progress, (bool, np.bool_)):
        return bool(progress)
    raise TypeError(
        f"progress must be True (always show a progress bar), False (never) or None (automatic: a bar for loops "
        f"projected to take more than {PROGRESS_SECONDS:g} s, on an interactive terminal or in a notebook), got "
        f"{progress!r}."
    )


def _interactive() -> bool:
    """Whether a progress bar would be seen: stderr is a terminal, or we run in a Jupyter notebook (where
    ``tqdm.auto`` draws a widget)."""
    try:
        if sys.stderr is not None and sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        pass
    if "ipykernel" not in sys.modules:  # tqdm.auto's notebook mode needs a Jupyter kernel
        return False
    try:
        from tqdm.auto import tqdm as auto_tqdm
    except ImportError:
        return False

    return any(cls.__module__ == "tqdm.notebook" for cls in auto_tqdm.__mro__)


class ProgressBar:
    """A tqdm progress bar (``tqdm.auto``: text on stderr, a widget in a notebook) over a loop of ``total``
    steps, shown as ``progress`` says: True from the start, False never, None (automatic) once the loop's
    total time, projected from its steps so far, exceeds :data:`PROGRESS_SECONDS` and someone can see it
    (:func:`_interactive`).

    ``update(done)`` reports the number of steps done; ``close()`` closes the bar (a context manager does it,
    on errors too). It reads only the clock: it changes no number of the fit.
    """

    def __init__(self, desc: str, total: int | None, *, unit: str = "step", progress: bool | None = None) -> None:
        self.desc, self.total, self.unit, self.mode = desc, total, unit, progress
        self.bar = None
        self.done = 0
        self.started = time.perf_counter()
        self.after_first: float | None = None
        self._seen: bool | None = None
        if progress:
            self._open()

    def _open(self) -> None:
        # a bar must never cost the fit: a broken tqdm install or no stderr (pythonw, some services) means no bar
        if sys.stderr is None:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            if self.mode:
                warnings.warn("progress=True, but tqdm cannot be imported: no progress bar (pip install tqdm).",
                              UserWarning, stacklevel=4)
            self.mode = False
            return
        self.bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, initial=self.done, file=sys.stderr,
                        dynamic_ncols=True)

    def update(self, done: int) -> None:
        """Call with the number of steps done so far."""
        self.done = done
        if self.bar is not None:
            if done > self.bar.n:
                self.bar.update(done - self.bar.n)
            return
        if self.mode is not None:  # False: never (True opened the bar at the start)
            return
        now = time.perf_counter()
        if done == 1:
            self.after_first = now  # the first step carries one-time costs (kernels compiling): not a rate
        left = None if self.total is None else self.total - done
        if left is not None and left <= 0:
            return
        rate = 0.0 if self.after_first is None or done < 2 else (now - self.after_first) / (done - 1)
        projected = now - self.started + rate * (left or 0)
        if projected > PROGRESS_SECONDS:
            if self._seen is None:
                self._seen = _interactive()
            if self._seen:
                self._open()

    def clear_for_text(self):
        """A context in which text written to stderr (a warning) does not garble an open bar: tqdm clears the
        bars and redraws them after it."""
        if self.bar is None:
            return contextlib.nullcontext()
        return type(self.bar).external_write_mode(file=sys.stderr)

    def set_total(self, total: int) -> None:
        """The loop's number of steps, once known (a Dask fit knows its passes once T is chosen)."""
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def close(self, *, complete: bool = False) -> None:
        """Close the bar; ``complete``: the loop finished, so the bar ends at its last step (and at 100%)."""
        if self.bar is None:
            return
        if complete:
            if self.total is None or self.done > self.total:
                self.bar.total = self.done
            self.update(max(self.done, self.total or 0))
        self.bar.close()
        self.bar = None

    def __enter__(self):  # returns self (typing.Self needs Python 3.11)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)


class RunTimeForecast:
    """Announce, once, a loop of ``total`` steps that will run longer than :data:`LONG_RUN_SECONDS`, and show its
    progress bar (:class:`ProgressBar`, as ``progress`` says, labelled ``desc``).

    After each step, ``step(done)`` projects the remaining time from the mean time of the steps after the
    first (from the fourth step on) and warns with :class:`LongRunWarning`, naming the expected time and
    ``advice``. It reads only the clock. Use it as a context manager, which closes the bar (on errors too)
    and completes it when the loop ends.
    """

    def __init__(self, what: str, total: int, advice: str, *, progress: bool | None = False,
                 desc: str | None = None, unit: str = "step") -> None:
        self.what, self.total, self.advice = what, total, advice
        self.started = time.perf_counter()
        self.after_first: float | None = None
        self.announced = False
        self.bar = ProgressBar(desc or what, total, unit=unit, progress=progress)

    def step(self, done: int) -> None:
        """Call with the number of steps done so far."""
        self.bar.update(done)
        if self.announced:
            return
        now = time.perf_counter()
        if done == 1:
            self.after_first = now  # the first step carries one-time costs (kernels loading): not a rate
        if done < 4 or self.after_first is None:
            return
        rate = (now - self.after_first) / (done - 1)
        remaining = rate * (self.total - done)
        if remaining > LONG_RUN_SECONDS:
            self.announced = True
            with self.bar.clear_for_text():
                warnings.warn(
                    f"{self.what}: {self.total} steps at {rate:.3g} s each will take about "
                    f"{_duration(now - self.started + remaining)} in all ({_duration(remaining)} to go). "
                    f"{self.advice}", LongRunWarning, stacklevel=3)

    def __enter__(self):  # returns self (typing.Self needs Python 3.11)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.bar.update(self.total)
        self.bar.close(complete=exc_type is None)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
