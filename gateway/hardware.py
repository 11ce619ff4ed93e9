"""What GPUs this machine has, as NVML reports them. No driver means no GPUs, said plainly."""

from __future__ import annotations

import logging

log = logging.getLogger("gateway.hardware")


def nvidia_gpu_count() -> int:
    """Number of NVIDIA GPUs NVML sees; 0 when there is no driver or NVML fails to start."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no NVIDIA GPU found (%s): running on CPU", exc)
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
