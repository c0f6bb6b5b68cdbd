"""Which kind of machine made a result: provenance kept beside a result (metrics/train, seeds/seeds.csv), never part
of its identity. A CPU is named by what decides its kernels and rounding: its vendor, family and widest matrix
instructions (the model name is often only "AMD EPYC" under a hypervisor, and differs between hosts of one kind),
so every machine of one kind writes the same name and a reproduction there stays byte for byte."""

from __future__ import annotations

from pathlib import Path

import torch

# The widest matrix instructions first: what oneDNN and bf16 autocast use on the CPU.
ISA = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"), ("avx2", "AVX2"))
VENDORS = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}


def cpu_kind(cpuinfo: str | None = None) -> str:
    """e.g. "AMD family 26, AVX512-BF16" from /proc/cpuinfo (`cpuinfo`: its text); the platform's processor name
    where there is no /proc."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.exists():
            import platform

            return platform.processor() or platform.machine() or "unknown CPU"
        cpuinfo = path.read_text()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    vendor = VENDORS.get(fields.get("vendor_id", ""), fields.get("vendor_id") or fields.get("CPU implementer", "CPU"))
    isa = next((name for flag, name in ISA if flag in flags), "no AVX2")
    family = f" family {fields['cpu family']}" if "cpu family" in fields else ""
    return f"{vendor}{family}, {isa}"


def machine(device: torch.device) -> str:
    """The kind of device a run computed on: the GPU's name, else the CPU's kind (`cpu_kind`)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    return cpu_kind()
