"""ReferenceAttentionBackend against dense per-sequence attention: prefill, decode, mixed steps,
chunked prefill and shared prefixes, GQA/MQA, sliding windows, soft-capping, dtypes, fp8 caches."""


import pytest
import torch

from tokenmill.plugin_api import AttentionSpec
from tokenmill.plugin_api.reference_attention import ReferenceAttentionBackend
from tokenmill.reference.paged_harness import PagedHarness


def dense_attention(q, k, v, scale, window=None, softcap=None):
    """Float64 attention of every position of one sequence: q [L, H, D], k/v [L, KVH, D]."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    i = torch.arange(q.shape[0])[:, None]
    j = torch.arange(q.shape[0])[None, :]
    allowed = j <= i
    if window:
        allowed &= j > i - window
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


class Scenario:
    """Random q/k/v for whole sequences, fed to the backend step by step."""

    def __init__(self, lengths, heads=8, kv_heads=2, head_size=32, block_size=16, dtype=torch.float32,
                 kv_cache_dtype="auto", window=None, softcap=None, q_scale=1.0, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.spec = AttentionSpec(num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
                                  scale=head_size**-0.5, dtype=str(dtype).removeprefix("torch."),
                                  kv_cache_dtype=kv_cache_dtype, block_size=block_size, sliding_window=window,
                                  logits_soft_cap=softcap)
        assert ReferenceAttentionBackend.validate(self.spec, "cpu") == []
        self.dtype = dtype
        self.qkv = {}
        for seq, length in lengths.items():
            self.qkv[seq] = (torch.randn(length, heads, head_size, generator=gen) * q_scale,
                             torch.randn(length, kv_heads, head_size, generator=gen),
                             torch.randn(length, kv_heads, head_size, generator=gen))
        self.backend = ReferenceAttentionBackend()
        self.harness = PagedHarness(block_size=block_size, num_blocks=64, seed=seed)
        self.caches = self.harness.allocate_caches(self.backend, [self.spec])
        self.fed = {seq: 0 for seq in lengths}

    def share_prefix(self, seq, source, num_tokens):
        """``seq`` starts with ``source``'s first tokens (same keys and values) already cached."""
        for tensors, shared in zip(self.qkv[seq], self.qkv[source], strict=True):
            tensors[:num_tokens] = shared[:num_tokens]
        self.harness.share_prefix(seq, source, num_tokens)
        self.fed[seq] = num_tokens

    def expected(self, seq):
        q, k, v = self.qkv[seq]
        if self.spec.kv_cache_dtype != "auto":
            fp8 = self.backend.kv_cache_torch_dtype(self.spec)
            k, v = k.to(fp8).float(), v.to(fp8).float()
        return dense_attention(q, k, v, self.spec.scale, self.spec.sliding_window, self.spec.logits_soft_cap)

    def run_step(self, chunks, atol):
        """Feed ``{seq: n}`` tokens, compare the backend's output with dense attention."""
        pieces = {part: [] for part in "qkv"}
        spans = []
        for seq, n in chunks:
            start = self.fed[seq]
            assert start + n <= self.qkv[seq][0].shape[0], f"scenario feeds {seq} past its length"
            for part, tensor in zip("qkv", self.qkv[seq], strict=True):
                pieces[part].append(tensor[start : start + n])
            spans.append((seq, start, start + n))
            self.fed[seq] += n
        step = self.harness.step([(seq, [0] * n) for seq, n in chunks])
        q, k, v = (torch.cat(pieces[p]).to(self.dtype) for p in "qkv")
        metadata = self.backend.plan(step.batch)
        out = self.backend.forward(self.spec, q, k, v, self.caches[0], metadata)
        assert out.shape == q.shape and out.dtype == self.dtype
        row = 0
        for seq, start, end in spans:
            want = self.expected(seq)[start:end]
            got = out[row : row + end - start].double()
            torch.testing.assert_close(got, want, atol=atol, rtol=0, msg=lambda m, s=seq: f"sequence {s}: {m}")
            row += end - start


LENGTHS = {"a": 37, "b": 8, "c": 24, "d": 50}


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
def test_prefill_then_decode(block_size, heads, kv_heads):
    s = Scenario({"a": 37, "b": 5, "c": 20}, heads=heads, kv_heads=kv_heads, block_size=block_size)
    s.run_step([("a", 30), ("b", 3), ("c", 12)], atol=1e-5)
    for _ in range(2):
        s.run_step([("a", 1), ("b", 1), ("c", 1)], atol=1e-5)


def test_single_prefill_and_pure_decode_of_equal_lengths():
    s = Scenario({"a": 24, "b": 24})
    s.run_step([("a", 20)], atol=1e-5)
    s.run_step([("b", 20)], atol=1e-5)
    for _ in range(4):
        s.run_step([("a", 1), ("b", 1)], atol=1e-5)


def test_mixed_prefill_chunks_and_decodes_in_any_order():
    s = Scenario(LENGTHS)
    s.run_step([("a", 10), ("c", 16)], atol=1e-5)
    s.run_step([("c", 1), ("b", 4), ("a", 1), ("d", 17)], atol=1e-5)
    s.run_step([("d", 20), ("c", 1), ("a", 9), ("b", 1)], atol=1e-5)
    s.run_step([("a", 1), ("d", 1), ("c", 1)], atol=1e-5)


def test_shared_prefix_blocks():
    s = Scenario({"a": 40, "b": 45, "c": 40}, block_size=16)
    s.run_step([("a", 40)], atol=1e-5)
    s.share_prefix("b", "a", 32)
    s.share_prefix("c", "a", 16)
    s.run_step([("b", 10), ("c", 17)], atol=1e-5)
    s.run_step([("b", 1), ("c", 1)], atol=1e-5)


@pytest.mark.parametrize("window", [1, 4, 16])
def test_sliding_window(window):
    s = Scenario(LENGTHS, window=window)
    s.run_step([("a", 30), ("b", 5)], atol=1e-5)
    s.run_step([("a", 1), ("c", 20), ("d", 8)], atol=1e-5)
    s.run_step([("a", 1), ("c", 1), ("d", 1)], atol=1e-5)


@pytest.mark.parametrize("window", [None, 6])
def test_logits_soft_cap(window):
    s = Scenario(LENGTHS, softcap=2.0, q_scale=4.0, window=window)
    s.run_step([("a", 30), ("b", 5)], atol=1e-5)
    s.run_step([("a", 1), ("b", 1), ("c", 20)], atol=1e-5)
    s.run_step([("a", 1), ("b", 1), ("c", 1)], atol=1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_half_precision(dtype, atol):
    s = Scenario(LENGTHS, dtype=dtype)
    s.run_step([("a", 30), ("b", 5), ("c", 3)], atol=atol)
    s.run_step([("a", 1), ("b", 1), ("c", 1), ("d", 12)], atol=atol)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cache(kv_cache_dtype):
    s = Scenario(LENGTHS, kv_cache_dtype=kv_cache_dtype)
    assert s.caches[0].element_size() == 1
    s.run_step([("a", 30), ("b", 5)], atol=1e-5)
    s.run_step([("a", 1), ("b", 1), ("c", 20)], atol=1e-5)


def test_keys_and_values_land_at_their_slots():
    s = Scenario({"a": 20}, heads=2, kv_heads=2, head_size=8)
    s.run_step([("a", 20)], atol=1e-5)
    table = s.harness.block_tables["a"]
    flat = s.caches[0].view(2, -1, 2, 8)
    for pos in (0, 15, 16, 19):
        slot = table[pos // 16] * 16 + pos % 16
        assert torch.equal(flat[0, slot], s.qkv["a"][1][pos])
        assert torch.equal(flat[1, slot], s.qkv["a"][2][pos])


def test_capabilities_accept_any_torch_device():
    spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=80, scale=0.1, dtype="bfloat16", block_size=48,
                         kv_cache_dtype="fp8_e4m3", sliding_window=128, logits_soft_cap=30.0)
    for device in ("cpu", "cuda", "xpu", "mps", "made-up-accelerator"):
        assert ReferenceAttentionBackend.validate(spec, device) == []
    bad = AttentionSpec(num_heads=4, num_kv_heads=2, head_size=64, scale=0.1, dtype="float64")
    assert any("float64" in r for r in ReferenceAttentionBackend.validate(bad, "cpu"))
