"""Fast-dLLM v2 (NVIDIA, remote code): block-causal with shifted logits, exact prefix KV cache.

The forward builds its block-causal mask itself from the absolute index and its `block_size` argument
(default 32, which we always pass explicitly from `config.bd_size`) and ignores `attention_mask`: padded
batches are impossible, so the engine decodes rows of equal prompt length together. KV is appended only
with `update_past_key_values=True`; we always append and crop. Mask id 151665 lives in the tokenizer.
"""

from .base import BackboneAdapter
from .registry import register_adapter


@register_adapter
class FastDLLMv2Adapter(BackboneAdapter):
    family = "fast_dllm_v2"
    model_types = ("fast_dllm_qwen",)
    architectures = ("Fast_dLLM_QwenForCausalLM",)
    shifted_logits = True
    block_causal = True
    block_size_fields = ("bd_size",)
    default_mask_token_id = 151665
    supports_padding = False
    block_alignment = "sequence"  # absolute grid from token 0 (generate, batch_sample, training)
    autoregressive_block_start = True  # a block's first token is the previous block's last-logit argmax

    def attention_inputs(self, attention_mask, query_length, grid):
        return None

    def model_inputs(self, input_ids, attention_mask, position_ids, past_key_values, grid=None):
        inputs = super().model_inputs(input_ids, attention_mask, position_ids, past_key_values, grid)
        inputs["block_size"] = grid or self.block_size
        inputs["mask_id"] = self.mask_token_id
        if past_key_values is not None:
            inputs["update_past_key_values"] = True
        return inputs
