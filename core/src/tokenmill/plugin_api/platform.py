"""The Platform contract: one installed hardware target (a GPU family, the CPU, a made-up device).

Lifecycle, all in the engine process unless noted:

1. discovery loads the entry point, which names a ``Platform`` subclass (import must be cheap);
2. ``probe()`` is called on the class, in every process that selects a platform (the CLI, the
   API server, the engine) -- it must not initialise a device runtime, import vendor libraries
   eagerly, or change ``os.environ`` / ``sys.modules``;
3. the highest-scoring class (or the pinned one) is instantiated with the chosen device index and
   ``activate()`` is called once: from here on the runtime may be initialised;
4. the engine asks the instance for capabilities, memory, seeds, synchronisation and defaults.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tokenmill.plugin_api.communicator import Communicator
from tokenmill.plugin_api.layer_kernels import LayerKernels

if TYPE_CHECKING:
    from tokenmill.plugin_api.quantization import QuantKernel


class Fp8Format(enum.StrEnum):
    """Which 8-bit float encoding the hardware computes in, if any."""

    NONE = "none"
    OCP = "e4m3fn"  # NVIDIA Hopper/Ada, Intel; the OCP standard
    FNUZ = "e4m3fnuz"  # AMD MI300: no negative zero, different bias


@dataclass(frozen=True)
class DeviceInfo:
    """One device a probe found."""

    index: int
    name: str
    total_memory: int | None = None  # bytes
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeResult:
    """The answer of ``Platform.probe``: 0 means this platform cannot run here.

    ``reasons`` explains the score in a few short sentences ("CUDA 12.8 with 2 devices",
    "torch is a CPU build"); they are printed by ``tokenmill plugins``.
    """

    score: int
    reasons: tuple[str, ...] = ()
    devices: tuple[DeviceInfo, ...] = ()

    @property
    def available(self) -> bool:
        """Whether the platform can run here at all (score above 0)."""
        return self.score > 0


@dataclass(frozen=True)
class PlatformCapabilities:
    """What the platform can compute, as features rather than vendor version numbers.

    ``dtypes`` are torch dtype names ("float32", "float16", "bfloat16") the platform computes
    efficiently, best first; the first is the default compute dtype.
    """

    dtypes: tuple[str, ...] = ("float32",)
    fp8_format: Fp8Format = Fp8Format.NONE
    fp8_compute: bool = False  # native fp8 matmul (W8A8); otherwise fp8 is weight-only
    int8_dot: bool = False
    int4_dot: bool = False
    graph_capture: bool = False
    graph_max_batch: int | None = None  # decode graphs only up to this batch size (None: max_num_seqs)
    prefill_graph_max_tokens: int = 0  # graphs for one request's prefill chunks up to this many tokens (0: none)
    pinned_memory: bool = False
    unified_memory: bool = False
    collectives: tuple[str, ...] = ("gloo",)  # torch.distributed backends, the first the one communicators use
    families: tuple[str, ...] = ()  # tags kernels can target, e.g. "cuda-compatible", "triton"
    isa: tuple[str, ...] = ()  # CPU instruction-set features, e.g. "avx2", "avx512f", "amx"


@dataclass(frozen=True)
class MemoryInfo:
    """Bytes of device memory; ``free`` is what a new allocation can still get."""

    total: int
    free: int


class Platform(ABC):
    """Base class for a hardware platform plugin.

    Subclasses set the class attributes, implement ``probe`` and ``capabilities``; every other
    member has a working default.
    """

    name: ClassVar[str]
    """Short unique name, also what ``--device`` accepts ("cuda", "cpu"). Required."""

    device_type: ClassVar[str]
    """The torch device type tensors live on ("cuda", "cpu", "xpu", "mps"). Required."""

    api_version: ClassVar[tuple[int, int]]
    """The plugin API version the plugin was built against, e.g. ``(2, 0)``. Required, in the body of
    the class the entry point names (an inherited value does not count); checked at discovery."""

    priority: ClassVar[int] = 0
    """Breaks ties between equal probe scores only when the user pinned nothing; higher wins."""

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index

    @classmethod
    @abstractmethod
    def probe(cls) -> ProbeResult:
        """Score this machine. Required.

        Called at selection time in any process, before ``activate``. Must be cheap and free of
        side effects: no runtime initialisation, no env changes, no lasting imports of vendor
        libraries. Raise only for a genuinely broken install; an absent device is score 0.
        """

    @property
    @abstractmethod
    def capabilities(self) -> PlatformCapabilities:
        """What this platform computes well. Required; called after ``activate``."""

    def activate(self) -> None:
        """Initialise the device runtime for ``self.device_index``. Optional (default: nothing).

        Called once in the engine process after selection, before any tensor is created.
        """

    def torch_device(self) -> Any:
        """The ``torch.device`` the engine puts tensors on. Optional; default
        ``device_type:device_index`` (plain ``cpu`` for the CPU)."""
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, self.device_index)

    def memory_info(self) -> MemoryInfo:
        """Total and free memory of the active device. Optional; default reads host RAM."""
        import os

        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        free = os.sysconf("SC_AVPHYS_PAGES") * page
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        free = int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
        return MemoryInfo(total=total, free=free)

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """One layer's KV cache: a zero-filled tensor of ``shape`` and torch ``dtype`` on this platform's
        device. Optional; default ``torch.zeros`` on ``torch_device()``. Called once per attention layer
        while the engine starts, after ``activate``; a platform may hand out memory that reads as zeros
        without being written (the CPU's fresh anonymous mappings)."""
        import torch

        return torch.zeros(shape, dtype=dtype, device=self.torch_device())

    def back_kv_cache(self, cache: Any, block_dim: int, start: int, stop: int) -> bool:
        """Make the memory of blocks ``[start, stop)`` of one layer's ``cache`` (from ``allocate_kv_cache``;
        blocks counted along ``block_dim``) resident now, so that the first writes to them do not take
        page faults in the middle of a step. Must not change what the blocks hold. Returns whether it did;
        False means it cannot here, and core stops asking (pages are then backed on first write, or the
        device has no such notion). Optional; default False. Core asks in block order: blocks the
        engine will use first, once when the engine is built and then a chunk at a time while it idles."""
        return False

    def synchronize(self) -> None:
        """Wait for queued device work to finish. Optional (default: nothing, for eager CPUs).

        Called by benchmarks and the model runner before reading timings.
        """

    def seed(self, seed: int) -> None:
        """Seed every random generator the platform uses. Optional; default seeds torch."""
        import torch

        torch.manual_seed(seed)

    @property
    def distributed_backend(self) -> str:
        """The torch.distributed backend for collectives, as torch names it ("nccl", which is RCCL
        under ROCm; "xccl"; "gloo"). Optional; default the first entry of ``capabilities.collectives``."""
        return self.capabilities.collectives[0]

    def create_communicator(self, ranks: Sequence[int] | None = None) -> Communicator | None:
        """A ``Communicator`` among the global ``ranks`` (None: every process), on ``torch_device()``,
        or None in a process outside ``ranks``. Optional (plugin API 2.0); the default is
        ``TorchDistributedCommunicator`` over a new group of ``distributed_backend``. A platform with a
        faster transport returns its own, passing what it does not accelerate to that default.

        Called in each worker process after ``activate`` and ``torch.distributed.init_process_group``,
        once per group the engine forms (tensor-parallel, pipeline, expert groups). Collective over
        the default group, as ``torch.distributed.new_group`` is: every process calls it for every
        group, with the same ``ranks``, in the same order."""
        from tokenmill.plugin_api.torch_communicator import TorchDistributedCommunicator

        return TorchDistributedCommunicator.create(self.distributed_backend, ranks, self.torch_device())

    def attention_preference(self) -> tuple[str, ...]:
        """Attention backend names to try, best first. Optional; default the plain-PyTorch
        reference backend. Each is checked against the model; rejections carry reasons."""
        return ("reference",)

    def quant_kernel_preference(self) -> tuple[str, ...]:
        """Quantized-linear kernel names to try first, best first. Optional (default none:
        every kernel a quantizer offers is tried in the quantizer's own order)."""
        return ()

    def linear_kernels(self) -> tuple[type[QuantKernel], ...]:
        """This platform's own ``QuantKernel`` classes for layers holding a plain float ``weight``
        [out, in] (and an optional bias). Optional (since plugin API 2.0; default none).

        Core offers each for every full-precision layer beside the unquantized format's kernels, and for a
        quantized layer in place of each of the format's plain-weight kernels (``QuantKernel.plain_weight``,
        e.g. GGUF dequantized at load), as ``<format kernel>+<platform kernel>``: that variant runs where
        both accept the layer, and the format creates the layer's weights as for its own kernel. Like
        every kernel they are tried in ``quant_kernel_preference`` order (a variant under its platform
        kernel's name), otherwise after the format's own. Results must match ``F.linear`` up to rounding;
        float32 products may run at a bounded, documented lower precision (the CPU's bf16x3 on AMX) only
        if the platform logs that at startup and offers a switch back to float32. Called once per model
        build and by ``tokenmill plugins explain``: return the classes without building anything."""
        return ()

    def create_graph(self) -> Any:
        """A new, empty decode graph for this device: an object with ``capture(fn)`` that records one
        call of ``fn`` and ``replay()`` that re-runs it (``tokenmill.plugin_api.graphs.DecodeGraph``).
        Optional: only platforms whose ``capabilities.graph_capture`` is true implement it; the
        default raises NotImplementedError. Called in the engine process, once per captured decode
        batch size and, with ``capabilities.prefill_graph_max_tokens``, once per prefill length bucket,
        all while the engine starts. Graphs are
        replayed one at a time, never concurrently, and each replay's output is read before the
        next replay, so a platform may let all of its graphs share activation memory."""
        raise NotImplementedError(f"platform {self.name} does not record graphs")

    def layer_kernels(self) -> LayerKernels | None:
        """A ``LayerKernels`` with this device's fused RMSNorm / rotary / gated-activation kernels, or
        None to run core's PyTorch code. Optional (since plugin API 1.2; default None). Called once per
        model build, in the engine process, after ``activate``."""
        return None

    def config_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults this platform wants for fields the user left unset. Optional (default {}).

        Called once while the engine configuration is resolved, in the process that resolves it.
        ``config`` is a read-only view of the fields; return overrides, never mutate. Each
        override is printed in the startup report with the platform's name.
        """
        return {}

    @staticmethod
    def left_unset(config: Mapping[str, Any], key: str) -> bool:
        """Whether the user left ``key`` to its automatic value (None or ``"auto"``) in the ``config``
        that ``config_defaults`` receives: the fields a platform may fill."""
        return config.get(key) in (None, "auto")

    def describe(self) -> str:
        """One line for logs: the platform and its active device. Optional."""
        return f"{self.name} ({self.device_type}:{self.device_index})"
