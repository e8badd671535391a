"""GPTQ's error-feedback solver (any rounding grid), Hessian accumulation, and the layer-by-layer
runner on a tiny Llama: each layer sees the outputs of the layers before it as ``visit`` left them,
and linears fed the same input share one Hessian."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tokenmill.plugin_api.quantize_tools import (
    FloatCheckpoint,
    HessianAccumulator,
    LayerwiseRunner,
    column_order,
    quantize_layer_by_layer,
    quantize_with_error_feedback,
)

STEP = 0.1


def _round(position, values, pending):
    return torch.round(values / STEP) * STEP


def _correlated_inputs(rows: int, columns: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    mix = torch.randn(columns, columns, generator=generator) / columns**0.5 + torch.eye(columns)
    return torch.randn(rows, columns, generator=generator) @ mix


def _hessian(x: torch.Tensor) -> torch.Tensor:
    accumulator = HessianAccumulator(x.shape[1])
    accumulator.add(x)
    return accumulator.matrix


def test_hessian_accumulator_is_a_running_mean():
    x = torch.randn(300, 16)
    accumulator = HessianAccumulator(16)
    for chunk in x.split(70):
        accumulator.add(chunk)
    torch.testing.assert_close(accumulator.matrix, 2 * x.T @ x / 300, rtol=1e-5, atol=1e-5)
    shared = HessianAccumulator(16)
    shared.add_product(x[:100].T @ x[:100], 100)
    shared.add_product(x[100:].T @ x[100:], 200)
    torch.testing.assert_close(shared.matrix, accumulator.matrix, rtol=1e-5, atol=1e-5)
    assert accumulator.rows == shared.rows == 300


def test_uncorrelated_inputs_give_plain_rounding():
    weight = torch.randn(24, 40)
    result = quantize_with_error_feedback(weight, torch.eye(40) * 3, _round, torch.arange(40))
    torch.testing.assert_close(result, torch.round(weight / STEP) * STEP)


def test_error_feedback_lowers_the_output_error():
    x = _correlated_inputs(2000, 64)
    weight = torch.randn(32, 64)
    hessian = _hessian(x)
    rounded = torch.round(weight / STEP) * STEP
    for order in (torch.arange(64), column_order(hessian, act_order=True)):
        result = quantize_with_error_feedback(weight, hessian, _round, order)
        assert torch.allclose(torch.round(result / STEP) * STEP, result)  # still on the grid
        assert ((x @ (result - weight).T) ** 2).mean() < 0.7 * ((x @ (rounded - weight).T) ** 2).mean()


def test_act_order_visits_columns_by_decreasing_hessian_diagonal():
    hessian = torch.diag(torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0]))
    weight = torch.arange(5.0).expand(2, 5) * STEP  # column c holds c * STEP
    seen = []

    def record(position, values, pending):
        seen.append((position, round(float(values[0]) / STEP), pending(2)[0].div(STEP).round().tolist()))
        return values

    order = column_order(hessian, act_order=True)
    assert order.tolist() == [1, 3, 2, 4, 0]
    result = quantize_with_error_feedback(weight, hessian, record, order)
    assert [s[:2] for s in seen] == [(0, 1), (1, 3), (2, 2), (3, 4), (4, 0)]
    assert seen[1][2] == [3, 2] and seen[4][2] == [0]  # the pending columns in processing order
    torch.testing.assert_close(result, weight)  # lossless rounding leaves the weight as it was


def test_dead_inputs_are_rounded_from_zero_and_bad_arguments():
    hessian = torch.eye(4)
    hessian[2, 2] = 0
    result = quantize_with_error_feedback(torch.ones(3, 4), hessian, _round, torch.arange(4))
    assert result[:, 2].eq(0).all() and result[:, [0, 1, 3]].eq(1).all()
    with pytest.raises(ValueError, match="does not match a weight with 4 inputs"):
        quantize_with_error_feedback(torch.ones(3, 4), torch.eye(5), _round, torch.arange(4))
    with pytest.raises(ValueError, match="damping 1.5"):
        quantize_with_error_feedback(torch.ones(3, 4), torch.eye(4), _round, torch.arange(4), damp=1.5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    return directory, model


WINDOWS = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(1))


def test_runner_feeds_each_layer_its_real_inputs(tiny):
    directory, model = tiny
    with torch.inference_mode():
        expected = model(WINDOWS, output_hidden_states=True).hidden_states
    seen = []

    def visit(prefix, layer, feed):
        inputs = []
        handle = layer.register_forward_pre_hook(lambda _m, args, kwargs: inputs.append(args[0] if args else
                                                                                        kwargs["hidden_states"]),
                                                 with_kwargs=True)
        feed()
        handle.remove()
        seen.append((prefix, torch.cat(inputs)))

    LayerwiseRunner(directory, WINDOWS, batch_size=2).run(visit)
    assert [p for p, _ in seen] == ["model.layers.0", "model.layers.1", "model.layers.2"]
    for index, (_, inputs) in enumerate(seen):
        torch.testing.assert_close(inputs, expected[index], rtol=1e-5, atol=1e-5)


def test_later_layers_see_the_changes_of_earlier_ones(tiny):
    directory, _ = tiny

    def layer_inputs(zero_mlp: bool) -> list[torch.Tensor]:
        seen = []

        def visit(prefix, layer, feed):
            inputs = []
            handle = layer.mlp.register_forward_hook(lambda _m, args, _out: inputs.append(args[0]))
            feed()
            handle.remove()
            seen.append(torch.cat(inputs))
            if zero_mlp:
                layer.mlp.down_proj.weight.zero_()  # the MLP now adds nothing to the residual stream

        LayerwiseRunner(directory, WINDOWS).run(visit)
        return seen

    unchanged, changed = layer_inputs(False), layer_inputs(True)
    assert torch.equal(unchanged[0], changed[0])
    assert not torch.allclose(unchanged[1], changed[1], atol=1e-3)


def test_layer_by_layer_quantization_shares_hessians_between_q_k_v(tiny):
    directory, model = tiny
    source = FloatCheckpoint(directory)
    names = source.linear_weights()
    hessians = {}

    def quantize_linear(name, weight, hessian):
        hessians[name] = hessian.clone()
        rounded = torch.round(weight / STEP) * STEP
        return rounded.to(torch.float16), rounded

    results = quantize_layer_by_layer(source, names, WINDOWS, quantize_linear)
    assert sorted(results) == sorted(names) and results[names[0]].dtype == torch.float16
    prefix = "model.layers.0.self_attn"
    assert torch.equal(hessians[f"{prefix}.q_proj.weight"], hessians[f"{prefix}.v_proj.weight"])
    with torch.inference_mode():
        normed = model.model.layers[0].input_layernorm(model.model.embed_tokens(WINDOWS)).reshape(-1, 32)
    torch.testing.assert_close(hessians[f"{prefix}.k_proj.weight"], 2 * normed.T @ normed / normed.shape[0],
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="did not reach 1 linear weights, e.g. model.extra.weight"):
        quantize_layer_by_layer(source, [*names, "model.extra.weight"], WINDOWS, quantize_linear)
