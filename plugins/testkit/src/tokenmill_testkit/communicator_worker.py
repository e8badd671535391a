"""One rank of a communicator conformance run: ``python -m tokenmill_testkit.communicator_worker``.

Joins the group through the TCP store the test process holds (gloo over loopback), builds the
communicator under test (a platform's ``create_communicator`` or a factory function), runs every case
of ``communicator_cases`` in order, then times a barrier and destroys the communicator. What it saw is
written to ``<out>/rank<R>.pt`` (also after a failure, with the traceback), for the test process to check.
Each case's name goes to stderr before it runs, so a rank that hangs shows where.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

BARRIER_DELAY_S = 0.3  # the last rank enters the barrier this much later than the others


def resolve(spec: str) -> Any:
    """``module:qualname`` or ``module:qualname@file``: the object, imported by module name, else loaded
    from ``file`` (a test module that is not importable by name)."""
    target, _, file = spec.partition("@")
    module_name, _, qualname = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        if not file:
            raise
        loader_spec = importlib.util.spec_from_file_location(f"_communicator_factory_{abs(hash(file))}", file)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[loader_spec.name] = module
        loader_spec.loader.exec_module(module)
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def build_communicator(args: argparse.Namespace) -> Any:
    """The communicator under test, every rank of the default group taking part in its creation."""
    if args.factory:
        return resolve(args.factory)()
    platform_cls = resolve(args.platform)
    devices = platform_cls.probe().devices
    platform = platform_cls(devices[args.rank % len(devices)].index if devices else 0)
    platform.activate()
    return platform.create_communicator()


def run_rank(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Everything one rank does; fills ``report`` as it goes."""
    import torch.distributed as dist

    from tokenmill_testkit.communicator_cases import cases, run

    timeout = timedelta(seconds=args.op_timeout)
    store = dist.TCPStore("127.0.0.1", args.store_port, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world_size, timeout=timeout)
    communicator = build_communicator(args)
    report["meta"] = {"rank": communicator.rank, "world_size": communicator.world_size,
                      "device": str(communicator.device), "describe": communicator.describe()}
    for case in cases(args.world_size):
        print(f"case {case.name}", file=sys.stderr, flush=True)
        report["results"][case.name], report["problems"][case.name] = run(case, communicator)
    print("case barrier", file=sys.stderr, flush=True)
    if communicator.rank == communicator.world_size - 1:
        time.sleep(BARRIER_DELAY_S)
    entered = time.time()
    communicator.barrier()
    report["barrier"] = {"entered": entered, "left": time.time()}
    print("case destroy", file=sys.stderr, flush=True)
    try:
        communicator.destroy()
        communicator.destroy()
        report["destroy_error"] = ""
    except Exception:  # noqa: BLE001 - reported to the test process, which fails test_destroy
        report["destroy_error"] = traceback.format_exc()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run one rank; exit status 1 (with the traceback in the report) if anything raised."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--op-timeout", type=float, default=60.0)
    parser.add_argument("--out", type=Path, required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--platform", help="module:qualname of a Platform class")
    what.add_argument("--factory", help="module:qualname[@file] of a function returning a Communicator")
    args = parser.parse_args(argv)

    import torch

    report: dict[str, Any] = {"results": {}, "problems": {}, "error": ""}
    try:
        run_rank(args, report)
    except BaseException:  # noqa: BLE001 - every failure is written to the report
        report["error"] = traceback.format_exc()
    torch.save(report, args.out / f"rank{args.rank}.pt")
    return 1 if report["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
