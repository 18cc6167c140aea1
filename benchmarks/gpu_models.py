"""Real models for `benchmarks/gpu_check.sh`, built from the configs of packages the GPU image
already has (timm, transformers): random weights, nothing downloaded. Workload entries:
`benchmarks.gpu_models:resnet18` and `benchmarks.gpu_models:gpt2_small`."""

from __future__ import annotations

from typing import Any

import torch


def resnet18(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """timm's resnet18 (11.7 M parameters), eval mode, on 224x224 images: batch 8, then 4."""
    import timm

    model = timm.create_model("resnet18", pretrained=False).eval().to(device=device, dtype=dtype)
    return {
        "model": model,
        "inputs": (torch.randn(8, 3, 224, 224, dtype=dtype, device=device),),
        "dynamic_inputs": (torch.randn(4, 3, 224, 224, dtype=dtype, device=device),),
    }


class _Logits(torch.nn.Module):
    """A causal language model's logits alone (its output object is not a tensor)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def gpt2_small(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """transformers' GPT-2 small from its default config (124 M parameters, 12 layers), eval
    mode, dropout off, on 128 tokens: batch 2, then 1."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = _Logits(GPT2LMHeadModel(config)).eval().to(device=device, dtype=dtype)
    ids = torch.randint(0, config.vocab_size, (2, 128), device=device)
    return {"model": model, "inputs": (ids,), "dynamic_inputs": (ids[:1].clone(),)}
