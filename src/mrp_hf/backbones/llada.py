"""LLaDA / LLaDA-1.5 (GSAI-ML, remote code): bidirectional, aligned logits, mask id 126336.

The Hub forward asserts that no KV cache is used, takes no `position_ids`, and its attention calls SDPA
without a mask: padded keys ARE attended to. Left-padded batches therefore differ slightly from decoding
each prompt alone on the real model (the engine warns); decode equal-length prompts together for exactness.
"""

from transformers.utils import logging

from .base import BackboneAdapter
from .registry import register_adapter

logger = logging.get_logger(__name__)


@register_adapter
class LLaDAAdapter(BackboneAdapter):
    family = "llada"
    model_types = ("llada",)
    architectures = ("LLaDAModelLM",)
    default_mask_token_id = 126336

    @property
    def accepts_cache(self) -> bool:
        return False  # the Hub forward asserts past_key_values is None

    def attention_inputs(self, attention_mask, query_length, grid):
        if not bool(attention_mask.all()):
            logger.warning_once(
                "LLaDA's Hub attention ignores attention_mask: padded prompts in a batch attend to the pads. "
                "Batch prompts of equal length for output identical to unbatched decoding."
            )
        return attention_mask
