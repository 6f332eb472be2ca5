"""The project's own reference DLM (`mrp_hf.reference`): block-causal (or bidirectional), exact prefix cache.

Its forward builds the attention pattern from a 2-D padding mask and its config's `block_size`, so the base
adapter's inputs fit as they are; only the attention pattern depends on the checkpoint's config.
"""

import torch

from .base import BackboneAdapter
from .registry import register_adapter


@register_adapter
class ReferenceDLMAdapter(BackboneAdapter):
    family = "mrp_reference"
    model_types = ("mrp_reference_dlm",)
    architectures = ("ReferenceDLM",)
    block_causal = True
    block_size_fields = ("block_size",)
    packed_verify = True
    preferred_verify_layout = "packed"

    def __init__(self, model, mask_token_id=None):
        # the bidirectional variant of the reference model has no block grid (and no exact cache)
        self.block_causal = getattr(model.config, "attention", "block_causal") == "block_causal"
        super().__init__(model, mask_token_id=mask_token_id)

    def packed_attention_mask(self, allowed):
        """The model reads a 4-D bool pattern as is; its own pattern also lets every query see itself."""
        query_length, key_length = allowed.shape[-2:]
        own = torch.arange(key_length - query_length, key_length, device=allowed.device)[:, None] == torch.arange(
            key_length, device=allowed.device
        )
        return allowed | own
