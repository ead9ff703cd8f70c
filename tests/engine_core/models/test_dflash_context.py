"""The fused context write (`ContextProjection`: all draft layers' keys and values in one matmul, one write)
against each layer's own `context_kv` written layer by layer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer.engine_core.models.dflash import DFlashDraftModel
from openinfer.engine_core.models.dflash_config import DFlashConfig
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint
from openinfer.kernels.attention_backend import write_kv_cache
from openinfer.kernels.cpu_matmul import cpu_packing_available

PAGES, PAGE = 6, 4


@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
def test_fused_context_write_equals_layer_by_layer(tmp_path: Path, pack: bool) -> None:
    """Three draft layers with distinct k_norm weights and biases: positions written at scattered slots hold
    what each layer's k_proj/k_norm/RoPE and v_proj give (to float32 rounding), every other slot is
    untouched (NaN stays NaN)."""
    if pack and not cpu_packing_available(torch.float32):
        pytest.skip("this torch build has no oneDNN")
    target = make_tiny_checkpoint(tmp_path / "target")
    draft = make_tiny_dflash_checkpoint(tmp_path / "draft", target, num_layers=3)
    model = DFlashDraftModel(DFlashConfig.from_folder(draft)).eval()
    model.load_weights(draft)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.layers:
            attn = layer.self_attn  # type: ignore[union-attr]
            attn.k_norm.weight.uniform_(0.5, 1.5, generator=g)
            for proj in (attn.k_proj, attn.v_proj):  # biases, as a checkpoint with attention_bias has
                proj.bias = torch.nn.Parameter(torch.randn(proj.out_features, generator=g))
    model.fuse_context(pack)
    attn0 = model.layers[0].self_attn  # type: ignore[union-attr]
    shape = (3, 2, PAGES, PAGE, attn0.num_kv_heads, attn0.head_dim)
    fused = torch.full(shape, float("nan"))
    expected = fused.clone()
    n = 5
    aux = torch.randn(n, model.fc.in_features, generator=g)
    positions = torch.tensor([0, 1, 2, 9, 17])
    slots = torch.tensor([13, 14, 15, 2, 21])  # scattered over pages 3, 0 and 5
    with torch.inference_mode():
        model.write_context(aux, positions, slots, fused)
        features = model.hidden_norm(model.fc(aux))
        cos, sin = model.rotary.cos_sin(positions, features.dtype)
        for layer, cache in zip(model.layers, expected, strict=True):
            k, v = layer.self_attn.context_kv(features, cos, sin)  # type: ignore[union-attr,operator]
            write_kv_cache(cache, k, v, slots)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=1e-5, equal_nan=True)
    unwritten = fused.view(3, 2, PAGES * PAGE, -1).isnan().all(-1)  # (layers, k|v, slots)
    assert int(unwritten.sum()) == 3 * 2 * (PAGES * PAGE - n)
