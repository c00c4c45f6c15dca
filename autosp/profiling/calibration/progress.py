"""A progress bar on stderr: a redrawn bar on a terminal, one line per phase otherwise (logs stay short)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, stream=None, enabled: bool = True, prefix: str = "autosp-calibrate"):
        self.total = max(1, total)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.prefix = prefix
        self.done = 0
        self.phase = None
        self.start = time.perf_counter()
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self._width = 0

    def tick(self, label: str) -> None:
        """Item ``label`` starts (the bar shows the items finished before it)."""
        if not self.enabled:
            self.done += 1
            return
        phase = label.split(" ", 1)[0]
        elapsed = time.perf_counter() - self.start
        if self.tty:
            filled = int(24 * self.done / self.total)
            line = (f"\r{self.prefix} [{'#' * filled}{'.' * (24 - filled)}] {self.done:>3}/{self.total} "
                    f"{elapsed:5.1f}s  {label}")
            pad = max(0, self._width - len(line))
            self._width = len(line)
            self.stream.write(line + " " * pad)
            self.stream.flush()
        elif phase != self.phase:
            self.stream.write(f"{self.prefix}: [{self.done:>3}/{self.total}] {elapsed:5.1f}s {label}\n")
            self.stream.flush()
        self.phase = phase
        self.done += 1

    def close(self, message: str = "done") -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        if self.tty:
            line = f"\r{self.prefix} [{'#' * 24}] {self.total:>3}/{self.total} {elapsed:5.1f}s  {message}"
            self.stream.write(line + " " * max(0, self._width - len(line)) + "\n")
        else:
            self.stream.write(f"{self.prefix}: [{self.total:>3}/{self.total}] {elapsed:5.1f}s {message}\n")
        self.stream.flush()


__all__ = ["Progress"]
