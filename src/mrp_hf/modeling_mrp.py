"""`MRPModel`: a DLM backbone (plus, later, an MRP head) with one `generate()` for every family."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig

from .backbones import BackboneAdapter, get_adapter, load_backbone
from .generation.config import MRPGenerationConfig, build_generation_config
from .generation.engine import DecodingEngine, MRPGenerateOutput

_HEAD_MODES = ("speculative", "remask", "direct")


class MRPModel(nn.Module):
    """A diffusion LM backbone wrapped with the project's decoding engine.

    Build it with `MRPModel.from_backbone(model)` for a model already in memory, or
    `MRPModel.from_backbone_pretrained(repo_or_path, ...)` to load one. Without a head only
    `mrp_mode="off"` (the backbone's own static / dynamic decoding) is available.
    """

    def __init__(self, backbone: nn.Module, adapter: BackboneAdapter, head: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.adapter = adapter
        self.head = head

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_backbone(
        cls,
        backbone: nn.Module,
        head: nn.Module | None = None,
        backbone_family: str | None = None,
        mask_token_id: int | None = None,
    ) -> MRPModel:
        """Wrap a loaded backbone (`PreTrainedModel`); the family is detected from its config unless forced."""
        adapter = get_adapter(backbone, backbone_family=backbone_family, mask_token_id=mask_token_id)
        backbone.eval()
        return cls(backbone, adapter, head)

    @classmethod
    def from_backbone_pretrained(
        cls,
        pretrained_model_name_or_path: str,
        backbone_family: str | None = None,
        mask_token_id: int | None = None,
        **load_kwargs: Any,
    ) -> MRPModel:
        """Load a backbone by Hub id or local path (see `mrp_hf.load_backbone`) and wrap it."""
        backbone, found_mask_id = load_backbone(
            pretrained_model_name_or_path, backbone_family=backbone_family, return_mask_token_id=True, **load_kwargs
        )
        return cls.from_backbone(
            backbone, backbone_family=backbone_family, mask_token_id=mask_token_id if mask_token_id is not None else found_mask_id
        )

    @property
    def device(self) -> torch.device:
        return self.adapter.get_input_embeddings().weight.device

    @property
    def generation_config(self) -> GenerationConfig | None:
        return getattr(self.backbone, "generation_config", None)

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        streamer=None,
        return_dict_in_generate: bool = False,
        **kwargs: Any,
    ) -> torch.LongTensor | MRPGenerateOutput:
        """Decode the answer after each (left-padded) prompt.

        Steps:
            1. Build the `MRPGenerationConfig`: the backbone's generation config (its token ids; all of it
               if it is an `MRPGenerationConfig`), then `generation_config`, then keyword arguments; validate.
            2. Choose the strategy for `mrp_mode` (`"off"`: static, or dynamic when `threshold` is set);
               modes that need a head refuse to run without one.
            3. Run the block loop (`DecodingEngine.run`): canvas and positions; per block, backbone
               forward, proposals, reveals; per-row EOS stop; streamer.
            4. Return `sequences` ([batch, prompt_len + max_new_tokens]), or with
               `return_dict_in_generate=True` an `MRPGenerateOutput` with `sequences` and `stats`.

        Keyword arguments are `MRPGenerationConfig` fields: `max_new_tokens`, `block_length`, `steps`,
        `tokens_per_step`, `threshold`, `confidence`, `temperature`, `top_k`, `top_p`, `seed`,
        `prefix_cache`, `mrp_mode`, `mrp_draft_tokens`, `eos_token_id`, `pad_token_id`.
        """
        # 1. configuration
        unknown = set(kwargs) - set(MRPGenerationConfig().to_dict()) - {"mask_token_id"}
        if unknown:
            raise TypeError(f"generate() got unknown arguments {sorted(unknown)}; see MRPGenerationConfig for the fields.")
        config = build_generation_config(self.generation_config)
        if generation_config is not None:
            config = build_generation_config(config, **_explicit_fields(generation_config))
        if kwargs:
            config = build_generation_config(config, **kwargs)
        # 2. strategy
        if config.mrp_mode in _HEAD_MODES:
            if self.head is None:
                raise ValueError(
                    f"mrp_mode={config.mrp_mode!r} needs an MRP head, and this model has none; load one with "
                    f"MRPModel.from_pretrained(head_repo_or_path) or use mrp_mode='off'."
                )
            raise NotImplementedError(f"mrp_mode={config.mrp_mode!r} is not implemented yet.")
        # 3. block loop
        if input_ids.device != self.device:
            input_ids = input_ids.to(self.device)
            attention_mask = attention_mask.to(self.device) if attention_mask is not None else None
        output = DecodingEngine(self.adapter, config).run(input_ids, attention_mask, streamer=streamer)
        # 4. output
        return output if return_dict_in_generate else output.sequences


def _explicit_fields(config: GenerationConfig) -> dict[str, Any]:
    if isinstance(config, MRPGenerationConfig):
        return {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    return config.to_diff_dict() if hasattr(config, "to_diff_dict") else config.to_dict()
