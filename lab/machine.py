"""The machine a figure was measured on, as the benchmarks and studies print and store it."""

from __future__ import annotations

import platform
import subprocess

import torch


def cpu_name() -> str:
    """lscpu's model name, family and model (the CPU changes between sessions here)."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return f"{fields.get('Model name')}, family {fields.get('CPU family')}, model {fields.get('Model')}"


def hardware(device: torch.device) -> str:
    """The device (the GPU's name, or the CPU's), the threads torch uses and torch's version."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return f"{name}; {torch.get_num_threads()} threads; torch {torch.__version__}; device {device.type}"
