"""Host RAM as ``/proc/meminfo`` reports it (with a sysconf fallback elsewhere)."""

from __future__ import annotations

import os

from tokenmill.plugin_api import MemoryInfo


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """``/proc/meminfo`` as {field: bytes}; empty when the file does not exist."""
    sizes: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if parts and parts[0].isdigit():
                    sizes[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except FileNotFoundError:
        pass
    return sizes


def host_memory(path: str = "/proc/meminfo") -> MemoryInfo:
    """Total RAM and what a new allocation can get (``MemAvailable``, which counts reclaimable
    page cache, unlike ``MemFree``)."""
    sizes = read_meminfo(path)
    if "MemTotal" in sizes:
        return MemoryInfo(total=sizes["MemTotal"], free=sizes.get("MemAvailable", sizes.get("MemFree", 0)))
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError):  # macOS has no available-pages counter
        free = total
    return MemoryInfo(total=total, free=free)
