"""Plain `transformers` masked LMs used as DLMs (BERT, RoBERTa, ModernBERT, ...): bidirectional, no cache.

Their configs carry no mask token id (it lives in the tokenizer): pass `mask_token_id=tokenizer.mask_token_id`,
or load through `mrp_hf.load_backbone`, which reads it from the tokenizer saved beside the model.
"""

from .base import BackboneAdapter
from .registry import register_adapter


@register_adapter
class MaskedLMAdapter(BackboneAdapter):
    family = "masked_lm"
    model_types = ("bert", "roberta", "xlm-roberta", "modernbert", "distilbert", "electra", "deberta-v2")
    architectures = ("BertForMaskedLM", "RobertaForMaskedLM", "ModernBertForMaskedLM", "DistilBertForMaskedLM")

    @property
    def accepts_cache(self) -> bool:
        # encoder-only: no KV cache, so neither an exact nor an approximate prefix cache
        return False
