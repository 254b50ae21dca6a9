"""One progress line on stderr, rewritten in place: how far, how fast, how long still to go.

Used for encoding texts, downloading files and training steps alike, so all three look the same:

    encoded 1,024/5,183 texts  98.3/s  ETA 0m42s

Checked in tests/common/test_fileio.py (with the other small file and terminal helpers).
"""

import sys
import time


class Progress:
    """Counts `done` up to `total` (in `unit`s) and redraws the line at most once a second.

    show=False makes every call a no-op, so callers need no `if` of their own. `scale` divides
    the counts for display (1e6 with unit "MB" for bytes). `done` is where a resumed job starts;
    the rate counts only what is done from there.
    """

    def __init__(self, total: int, what: str, unit: str = "", show: bool = True, scale: float = 1.0,
                 done: int = 0):
        self.total, self.what, self.unit, self.show, self.scale = total, what, unit, show, scale
        self.done = self.started_at = done
        self.start = self.last = time.perf_counter()

    def update(self, count: int, note: str = "") -> None:
        """Add `count` to what is done; `note` (e.g. "loss 0.41") is shown after the rate."""
        self.done += count
        now = time.perf_counter()
        if self.show and (now - self.last >= 1.0 or self.done >= self.total):
            self.last = now
            sys.stderr.write("\r" + self.line(now, note) + " ")
            sys.stderr.flush()

    def line(self, now: float, note: str = "") -> str:
        rate = (self.done - self.started_at) / max(now - self.start, 1e-9)
        eta = max(self.total - self.done, 0) / max(rate, 1e-9)
        unit = f" {self.unit}" if self.unit else ""
        if self.scale == 1.0:
            counts = f"{self.done:,}/{self.total:,}{unit}"
            speed = f"{rate:,.1f}/s"
        else:
            counts = f"{self.done / self.scale:,.1f}/{self.total / self.scale:,.1f}{unit}"
            speed = f"{rate / self.scale:,.1f}{unit}/s"
        parts = [f"{self.what} {counts}", speed] + ([note] if note else [])
        parts.append(f"ETA {int(eta) // 60}m{int(eta) % 60:02d}s")
        return "  ".join(parts)

    def close(self) -> None:
        if self.show:
            sys.stderr.write("\n")
            sys.stderr.flush()
