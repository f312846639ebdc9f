"""A progress bar per stage, on a terminal; nothing at all otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30


class Progress:
    """Redraws one line per stage at most 10 times a second (ANSI cursor moves)."""

    def __init__(
        self, stages: list[str], total: int | None, *, enabled: bool, stream: TextIO | None = None
    ) -> None:
        self.stages = stages
        self.total = total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.done = [0] * len(stages)
        self._drawn = False
        self._last = 0.0

    def update(self, stage: int, done: int) -> None:
        if not self.enabled:
            return
        self.done[stage] = done
        now = time.monotonic()
        if now - self._last >= 0.1:
            self._last = now
            self._draw()

    def _draw(self) -> None:
        out = self.stream
        if self._drawn:
            out.write(f"\x1b[{len(self.stages)}F")
        width = max(len(s) for s in self.stages)
        for name, done in zip(self.stages, self.done, strict=True):
            if self.total:
                filled = int(_WIDTH * min(done, self.total) / self.total)
                bar = "#" * filled + "." * (_WIDTH - filled)
                out.write(f"\x1b[2K{name:<{width}} [{bar}] {done}/{self.total}\n")
            else:
                out.write(f"\x1b[2K{name:<{width}} {done} partitions\n")
        out.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled:
            self._draw()
