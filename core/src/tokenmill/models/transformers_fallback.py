"""TransformersCausalLM: any decoder transformers implements, on tokenmill's paged KV cache and batching.

The model runs its own transformers modeling code.

The Hugging Face model is built from its config with ``attn_implementation`` set to tokenmill's
registered attention function (``transformers_attention``), its own KV cache disabled, and fed the
step's flat batch as ``input_ids`` [1, T] with each token's real ``position_ids``: every token
attends only to its own request through the paged backend, so prefill chunks and decodes of many
requests share one forward. The HF model's modules become this module's children, so parameter
names equal the checkpoint's.

Limits: unquantized checkpoints only; the checkpoint's tensor names must match the model's
(transformers' load-time renames, e.g. of fused MoE experts, are not applied); logits get the
output embedding plus the common post-processing (``final_logit_softcapping``, ``logit_scale``,
``logits_scaling``), not any other model-specific logits code.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from tokenmill.layers.context import AttentionContext, ModelBuildContext
from tokenmill.layers.pooling import DEFAULT_DECODER_POOLING, PoolingConfig
from tokenmill.models.transformers_attention import (
    ROUTE_ATTRIBUTE,
    LayerRoute,
    SpecProbe,
    StepBinding,
    register_attention_function,
)
from tokenmill.plugin_api import AttentionSpec
from tokenmill.reference.unquantized import Unquantized

logger = logging.getLogger("tokenmill")


def causal_lm_class_name(hf_config: Any) -> str | None:
    """The transformers causal-LM class for the config's model type, or None when there is none."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return None
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(hf_config, "model_type", None))


class TransformersCausalLM(nn.Module):
    """The tokenmill model contract over a transformers ``AutoModelForCausalLM``."""

    is_encoder: ClassVar[bool] = False
    default_pooling: ClassVar[PoolingConfig] = DEFAULT_DECODER_POOLING

    def __init__(self, hf_config: Any, build: ModelBuildContext):
        super().__init__()
        if build.quantizer is not None and not isinstance(build.quantizer, Unquantized):
            raise ValueError(f"the transformers fallback runs unquantized checkpoints only; this one is "
                             f"{build.quantizer.name}")
        from transformers import AutoModelForCausalLM
        from transformers.initialization import no_init_weights

        self.config = hf_config
        self._build = build
        attn = register_attention_function()
        with no_init_weights():
            hf = AutoModelForCausalLM.from_config(hf_config, dtype=build.dtype, attn_implementation=attn)
        hf.tie_weights()  # no_init_weights skips init_weights, which ties them
        hf.eval().requires_grad_(False)
        self.__dict__["hf"] = hf  # not a child: its children are ours, so names match the checkpoint
        for name, child in hf.named_children():
            self.add_module(name, child)
        for name, param in hf.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in hf.named_buffers(recurse=False):
            self.register_buffer(name, buffer, persistent=name not in hf._non_persistent_buffers_set)
        self._binding = StepBinding()
        self._specs: list[AttentionSpec] | None = None

    @property
    def backbone(self) -> nn.Module:
        return self.hf.base_model

    def _wire_attention(self) -> list[AttentionSpec]:
        """Probe one tiny forward for the attention modules and what they ask for, then give each
        its LayerRoute (layer index = call order)."""
        device = next(self.parameters()).device
        with SpecProbe.active() as probe, torch.inference_mode():
            self.backbone(input_ids=torch.zeros(1, 2, dtype=torch.long, device=device),
                          position_ids=torch.arange(2, device=device)[None], use_cache=False)
        name = type(self.hf).__name__
        if not probe.calls:
            raise ValueError(f"{name} never called the attention interface; it cannot run on paged attention")
        if probe.repeated:
            raise ValueError(f"{name} calls one attention module more than once per forward ({probe.repeated[0]}); "
                             f"the transformers fallback needs one KV cache per attention call")
        specs = []
        for index, (module, call) in enumerate(probe.calls.items()):
            if not call.causal:
                raise ValueError(f"{name} has non-causal attention ({type(module).__name__}); the transformers "
                                 f"fallback serves decoder-only models")
            if call.value_head_size != call.head_size:
                raise ValueError(f"{name}: value head size {call.value_head_size} differs from the key head size "
                                 f"{call.head_size}, which the paged KV cache cannot hold")
            spec = self._build.attention_spec(call.num_heads, call.num_kv_heads, call.head_size, scale=call.scaling,
                                              sliding_window=call.sliding_window, logits_soft_cap=call.softcap)
            module.__dict__[ROUTE_ATTRIBUTE] = LayerRoute(self._binding, index, spec)
            specs.append(spec)
        return specs

    def attention_specs(self) -> list[AttentionSpec]:
        """One AttentionSpec per attention module, in call order (the order of ``ctx.kv_caches``).
        The first call runs the probe forward, so call it after the weights are loaded."""
        if self._specs is None:
            self._specs = self._wire_attention()
        return self._specs

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Hidden states [T, hidden] of a flat step batch."""
        self.attention_specs()
        with self._binding.bind(ctx):
            out = self.backbone(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out.last_hidden_state[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab] from the output embedding and the config's logits scaling."""
        logits = self.hf.get_output_embeddings()(hidden)
        config = self.hf.config
        if getattr(config, "logit_scale", None):
            logits = logits * config.logit_scale
        if getattr(config, "logits_scaling", None):
            logits = logits / config.logits_scaling
        cap = getattr(config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def greedy_token_ids(self, hidden: torch.Tensor) -> None:
        """None: the logits are computed in full through the transformers model's output embedding."""
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the parameters of the same name (a checkpoint of the bare
        base model, without its ``base_model_prefix``, maps too; a tied copy loads the shared
        tensor). Returns the canonical names of the parameters loaded."""
        canonical = {id(p): name for name, p in self.named_parameters()}
        params = dict(self.named_parameters(remove_duplicate=False))
        buffers = {name for name, _ in self.named_buffers()}
        prefix = f"{self.hf.base_model_prefix}."
        loaded, unexpected = set(), []
        for name, tensor in weights:
            target = name if name in params else prefix + name
            param = params.get(target)
            if param is None:
                if name not in buffers and prefix + name not in buffers:
                    unexpected.append(name)
                continue
            if param.shape != tensor.shape:
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; the model's "
                                 f"{target} is {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(canonical[id(param)])
        if unexpected:
            shown = ", ".join(unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
            logger.warning("ignored %d checkpoint tensors that match no parameter: %s", len(unexpected), shown)
        return loaded
