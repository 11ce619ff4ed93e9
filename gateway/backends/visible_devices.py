"""Which of a node's GPUs one engine process sees, in CUDA's own variables: what every engine built on
CUDA reads (vLLM; llama.cpp's CUDA build), so a replica on part of a node's GPUs runs on those alone.

The gateway numbers a GPU as NVML does (``Device.index``), in PCI bus order; CUDA numbers them fastest
first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so both are set: on a node of mixed cards the indices would
name other GPUs otherwise. Inside the process the visible GPUs are numbered from 0 again, which is what
the engine's own device flags (``--tensor-parallel-size``, ``-ts``) then count.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.devices import Device


def cuda_visible(devices: Sequence[Device]) -> dict[str, str]:
    """The environment that shows a process ``devices`` (GPUs of one node) and no other GPU."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(d.index) for d in devices)}
