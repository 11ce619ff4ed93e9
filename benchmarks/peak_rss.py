"""A process's resident memory, now and at its highest while a block runs: what the hardening benchmarks
report beside each attack (shared by benchmarks/hardening.py and the cases in files of their own)."""

from __future__ import annotations

import contextlib
import threading

import psutil

MB = 1024 * 1024


def rss_mb(process: psutil.Process) -> float:
    return float(process.memory_info().rss) / MB


class PeakRss:
    """The highest RSS of a process while the block runs."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self.peak, self._stop = process, rss_mb(process), threading.Event()

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, rss_mb(self.process))

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
