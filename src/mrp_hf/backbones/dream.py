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
    threshold_inclusive = True  # Fast-dLLM's Dream threshold decoding keeps confidence >= threshold
    default_block_length = None  # diffusion_generate decodes the whole answer as one block
    commits_block_start_on_cache_refresh = True  # Fast-dLLM's cached Dream decoding (generation_utils_block.py)
    preferred_verify_layout = "packed"  # with the approximate cache; without one "auto" stacks (nothing shared)

    @property
    def legacy_cache_variant(self) -> bool:
        """Fast-dLLM's copy of Dream's modeling file (forward takes `dual_cache` / `replace_position`) keeps its
        cache as a list of per-layer (key, value) pairs and reads `past_key_values[0][0]`: a transformers Cache
        object crashes it ("Cache only has 0 layers" / "not subscriptable")."""
        return "dual_cache" in self._forward_params or "replace_position" in self._forward_params

    @property
    def accepts_cache(self) -> bool:
        return super().accepts_cache and not self.legacy_cache_variant

    def cache_refusal(self) -> str:
        if self.legacy_cache_variant:
            return (
                f"prefix_cache=True: this Dream model ({type(self.model).__name__}) uses Fast-dLLM's variant of Dream's "
                f"modeling file, whose forward keeps legacy list-of-(key, value) caches (it indexes "
                f"past_key_values[0][0]); mrp-hf's approximate cache passes a transformers Cache. Use the Hub's Dream "
                f"modeling files for prefix_cache=True, or decode without it (prefix_cache=False or None)."
            )
        return super().cache_refusal()

    def attention_inputs(self, attention_mask, query_length, grid):
        if bool(attention_mask.all()):
            return "full"
        # padded keys only: a fully masked query row would become NaN and leak through the values
        return allowed_keys(attention_mask, query_length, None)

    def packed_attention_mask(self, allowed):
        return allowed  # handed to SDPA unchanged: a 4-D boolean pattern
