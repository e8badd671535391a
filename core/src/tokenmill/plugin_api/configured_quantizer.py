"""ConfiguredQuantizer: the base of formats a checkpoint declares in its quantization config.

A checkpoint is in the format when its ``quant_method`` says so (in ``config.json``, or in the side
file some quantizers write next to the weights), or when it is a compressed-tensors checkpoint of
one of the format's ``compressed_tensors_formats``. ``detect`` and ``from_config`` follow from those
class attributes and ``parse_settings``; the subclass still implements the rest of ``Quantizer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tokenmill.plugin_api.compressed_tensors import compressed_tensors_format
from tokenmill.plugin_api.quantization import Quantizer
from tokenmill.plugin_api.quantization_config import declares, read_quantization_config


class ConfiguredQuantizer(Quantizer):
    """A quantization format recognised by its declared ``quant_method``. Subclasses set
    ``quant_method`` (and ``side_file``, ``compressed_tensors_formats`` where they apply), take the
    parsed settings as their constructor's one argument, and either set ``settings_cls`` (a class
    with ``from_dict(quantization_config)``) or override ``parse_settings``."""

    quant_method: ClassVar[str]
    """The lower-case ``quant_method`` checkpoints of this format declare ("awq", "fp8"). Required."""

    side_file: ClassVar[str | None] = None
    """A JSON file next to the weights that holds the settings when ``config.json`` has no
    ``quantization_config`` (AutoGPTQ's ``quantize_config.json``), or None."""

    compressed_tensors_formats: ClassVar[tuple[str, ...]] = ()
    """compressed-tensors formats ("float-quantized", ...) this format also reads."""

    settings_cls: ClassVar[Any] = None
    """The settings class whose ``from_dict`` the default ``parse_settings`` calls."""

    @classmethod
    def detect(cls, hf_config: Mapping[str, Any], model_path: str) -> float:
        """1.0 when the checkpoint declares ``quant_method`` (an unreadable side file counts as no)
        or is a compressed-tensors checkpoint of one of ``compressed_tensors_formats``; else 0.0."""
        if declares(hf_config, model_path, cls.quant_method, cls.side_file):
            return 1.0
        return 1.0 if compressed_tensors_format(hf_config) in cls.compressed_tensors_formats else 0.0

    @classmethod
    def from_config(cls, hf_config: Mapping[str, Any], model_path: str) -> Quantizer:
        """An instance configured with ``parse_settings``; ``ValueError`` says what is unsupported."""
        return cls(cls.parse_settings(hf_config, model_path))

    @classmethod
    def parse_settings(cls, hf_config: Mapping[str, Any], model_path: str) -> Any:
        """The format's settings: ``settings_cls.from_dict`` of the ``declared_config``. Override for
        formats parsed another way."""
        return cls.settings_cls.from_dict(cls.declared_config(hf_config, model_path))

    @classmethod
    def declared_config(cls, hf_config: Mapping[str, Any], model_path: str) -> Mapping[str, Any]:
        """The checkpoint's quantization config (``config.json``'s, else ``side_file``'s);
        ``ValueError`` when it has neither."""
        config = read_quantization_config(hf_config, model_path, cls.side_file, cls.quant_method)
        if config is None:
            side = f" nor a {cls.side_file}" if cls.side_file else ""
            raise ValueError(f"{model_path}: no {cls.name.upper()} quantization_config in config.json{side}")
        return config
