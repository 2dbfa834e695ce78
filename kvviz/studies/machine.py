"""What a measurement ran on, and how much memory it took: the machine's facts a report names
(``machine_facts``) and the peak memory growth of a block (``PeakMemory``: the CUDA allocator on a
GPU, the sampled resident set on a CPU)."""

from __future__ import annotations

import os
import platform
import threading
import time

import torch

from kvviz.core import paths
from kvviz.runtime.measure import synchronize


class PeakMemory:
    """Peak memory growth during a block: CUDA allocator on GPU, sampled resident set on CPU."""

    def __init__(self, device):
        self.device = device
        self.cuda = str(device).startswith("cuda")
        self.peak_bytes = 0
        self.method = (
            "torch.cuda.max_memory_allocated above the allocation before"
            if self.cuda
            else "CPU: resident-set growth above the level after gc + malloc_trim, sampled every 1 ms from "
            "/proc/self/statm; a lower bound (memory the allocator still holds is reused unseen)"
        )

    @staticmethod
    def _trim() -> None:
        """Hand freed heap memory back to the OS so that growth during the block shows in the RSS."""
        import ctypes
        import gc

        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass

    @staticmethod
    def _rss() -> int:
        try:
            with open("/proc/self/statm", encoding="ascii") as handle:
                return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def __enter__(self):
        if self.cuda:
            synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
        else:
            self._trim()
            self._before = self._rss()
            self._max = self._before
            self._stop = threading.Event()

            def sample():
                while not self._stop.is_set():
                    self._max = max(self._max, self._rss())
                    time.sleep(0.001)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._before
        else:
            self._stop.set()
            self._thread.join()
            self._max = max(self._max, self._rss())
            self.peak_bytes = self._max - self._before
        return False


def machine_facts(device) -> dict:
    facts = {
        "uname": " ".join(platform.uname()),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import transformers

        facts["transformers"] = transformers.__version__
    except ImportError:
        pass
    if str(device).startswith("cuda"):
        facts["gpu"] = torch.cuda.get_device_name(device)
    facts["git_commit"] = (paths.git("rev-parse", "--short", "HEAD") or "unknown").strip()
    return facts
