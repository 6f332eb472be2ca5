"""Dream / DiffuCoder (remote code): bidirectional, shifted logits (position i-1 predicts token i).

Dream's attention passes `attention_mask` to SDPA unchanged: it wants a 4-D boolean mask, or the string
"full" when nothing is padded. Its mask id is `config.mask_token_id` (151666 on the Hub models).
"""

from .base import BackboneAdapter, allowed_keys
from .registry import register_adapter


@register_adapter
class DreamAdapter(BackboneAdapter):
    family = "dream"
    model_types = ("dream",)
    architectures = ("DreamModel",)
    shifted_logits = True
    packed_verify = True
    preferred_verify_layout = "packed"  # with the approximate cache; without one "auto" stacks (nothing shared)

    def attention_inputs(self, attention_mask, query_length, grid):
        if bool(attention_mask.all()):
            return "full"
        # padded keys only: a fully masked query row would become NaN and leak through the values
        return allowed_keys(attention_mask, query_length, None)

    def packed_attention_mask(self, allowed):
        return allowed  # handed to SDPA unchanged: a 4-D boolean pattern
