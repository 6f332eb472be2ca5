"""LLaDA2 (inclusionAI, remote code, MoE): block-causal via a caller-built 4-D additive mask.

A 2-D mask or None would give causal attention, so the block pattern is always passed as a 4-D float mask.
The Hub cache path is broken on current transformers (4.57 and 5.x), and its own generate recomputes the
window each step, so no cache is used (`use_cache=False` is passed: the config defaults it to True).
The mask id (156895) is a generate() default and a tokenizer token; logits come back in float32.
"""

import torch

from .base import BackboneAdapter, allowed_keys
from .registry import register_adapter


@register_adapter
class LLaDA2Adapter(BackboneAdapter):
    family = "llada2"
    model_types = ("llada2_moe",)
    architectures = ("LLaDA2MoeModelLM",)
    block_causal = True
    block_size_fields = ("block_size", "block_length")
    default_mask_token_id = 156895
    default_block_length = 32  # its own generate()'s default block
    block_alignment = "sequence"  # its generate() puts the prompt at 0..P-1 on the model's grid
    packed_verify = True
    preferred_verify_layout = "packed"

    @property
    def accepts_cache(self) -> bool:
        return False

    def attention_inputs(self, attention_mask, query_length, grid):
        return self.packed_attention_mask(allowed_keys(attention_mask, query_length, grid))

    def packed_attention_mask(self, allowed):
        """The 4-D additive float mask (0 where allowed, the dtype's minimum elsewhere) the Hub code expects."""
        dtype = self.get_input_embeddings().weight.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)
