"""LLaDA / LLaDA-1.5 (GSAI-ML, remote code): bidirectional, aligned logits, mask id 126336.

The Hub forward asserts that no KV cache is used, takes no `position_ids`, and its attention calls SDPA
without a mask: padded keys ARE attended to. So the engine decodes rows of equal prompt length together by
default (`group_by_prompt_length`), which keeps every row's answer equal to decoding it alone; with
`group_by_prompt_length=False` a padded batch is one forward per step, and its rows attend to their pads.
Blocks start at the answer and the threshold test is `>=`, as in Fast-dLLM's LLaDA `generate`.
"""

from .base import BackboneAdapter
from .registry import register_adapter


@register_adapter
class LLaDAAdapter(BackboneAdapter):
    family = "llada"
    model_types = ("llada",)
    architectures = ("LLaDAModelLM",)
    default_mask_token_id = 126336
    supports_padding = False  # its attention ignores attention_mask: rows are grouped by prompt length
    threshold_inclusive = True  # Fast-dLLM's LLaDA generate reveals confidence >= threshold

    @property
    def accepts_cache(self) -> bool:
        return False  # the Hub forward asserts past_key_values is None
