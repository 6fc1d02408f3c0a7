"""A one-line progress bar for a load, drawn on a terminal and nowhere else."""
from __future__ import annotations

import time


class ProgressBar:
    WIDTH = 30

    def __init__(self, stream, interval: float = 0.25):
        self.stream = stream
        self.interval = interval
        self._last = 0.0
        self._drawn = False

    def update(self, loading: bool, load: dict[str, int]) -> None:
        if not loading:
            if self._drawn:
                self.stream.write("\n")
                self.stream.flush()
                self._drawn = False
            return
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        self.stream.write("\r" + render(load["done_bytes"], load["total_bytes"], self.WIDTH))
        self.stream.flush()
        self._drawn = True


def render(done: int, total: int, width: int = 30) -> str:
    fraction = done / total if total else 0.0
    filled = int(fraction * width)
    return (f"loading [{'#' * filled}{'.' * (width - filled)}] {fraction * 100:5.1f}% "
            f"{done / 2**30:.2f}/{total / 2**30:.2f} GiB")
