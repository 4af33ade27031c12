"""How a post-training run's time was spent: loading, the held-out measures (before, after the warm start, during
training and after), the warm start, the method's own steps, and writing the folder; printed in one line and saved
in `run_summary.json` (`time_split`)."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PARTS = ("loading", "measures", "warm start", "method", "writing")


class TimeSplit:
    """Wall-clock seconds by part (`PARTS`), from `time.perf_counter`; `total` runs from construction."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds = dict.fromkeys(PARTS, 0.0)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count the time of the `with` block to `name`; inside the method's steps, a measure's time moves from
        "method" to "measures" (`timed`)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def timed(self, measure: Callable) -> Callable:
        """`measure`, its calls counted to "measures" and taken out of the "method" block that runs them."""

        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return measure(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.seconds["measures"] += spent
                self.seconds["method"] -= spent

        return call

    def as_dict(self) -> dict[str, float]:
        """`{part: seconds}` (one decimal) and `total`."""
        return {**{name: round(value, 1) for name, value in self.seconds.items()},
                "total": round(time.perf_counter() - self.started, 1)}  # fmt: skip

    def line(self) -> str:
        """`time: 412 s; loading 9 s (2%), measures 96 s (23%), ...` (parts that took no time left out)."""
        split = self.as_dict()
        total = max(split.pop("total"), 1e-9)
        parts = ", ".join(f"{name} {value:.0f} s ({value / total:.0%})" for name, value in split.items() if value)
        return f"time: {total:.0f} s; {parts}"
