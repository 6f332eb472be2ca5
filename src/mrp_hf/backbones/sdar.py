"""SDAR (JetLM, remote code): block-causal, aligned logits, exact prefix KV cache.

SDAR's forward builds no attention mask: the caller passes the block-causal pattern (4-D boolean). Its
block size is a decoding choice (4 for the -Chat models, N for -bN ones), so the engine's `block_length`
sets the grid. KV is written only with `store_kv=True`; we always write and crop, which keeps one code
path for every cached family. The mask id (151669) lives in the tokenizer (`<|MASK|>`).
"""

from .base import BackboneAdapter, allowed_keys
from .registry import register_adapter


@register_adapter
class SDARAdapter(BackboneAdapter):
    family = "sdar"
    model_types = ("sdar",)
    architectures = ("SDARForCausalLM",)
    block_causal = True
    block_size_fields = ("block_size", "block_length")
    default_mask_token_id = 151669
    default_block_length = 4
    block_alignment = "sequence"  # generate.py and the training mask count blocks from token 0
    packed_verify = True
    preferred_verify_layout = "packed"

    def attention_inputs(self, attention_mask, query_length, grid):
        return allowed_keys(attention_mask, query_length, grid)

    def packed_attention_mask(self, allowed):
        return allowed  # SDAR reads a 4-D boolean pattern as is

    def model_inputs(self, input_ids, attention_mask, position_ids, past_key_values, grid=None):
        inputs = super().model_inputs(input_ids, attention_mask, position_ids, past_key_values, grid)
        if past_key_values is not None:
            inputs["store_kv"] = True
        return inputs
