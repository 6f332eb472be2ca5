"""Choosing the adapter for a loaded model: by `backbone_family=`, else by model_type / architectures."""

from __future__ import annotations

from torch import nn

from .base import BackboneAdapter

_ADAPTERS: dict[str, type[BackboneAdapter]] = {}

#: families that look like DLMs but cannot be decoded as masked diffusion, with the reason
_REFUSED: dict[str, str] = {
    "diffusion_gemma": (
        "DiffusionGemma is a uniform-noise diffusion model: it has no mask token and denoises by replacing "
        "tokens with other tokens, so masked-diffusion decoding (and MRP) does not apply to it. Use its own "
        "`generate()` from transformers."
    ),
}


def register_adapter(cls: type[BackboneAdapter]) -> type[BackboneAdapter]:
    """Class decorator: make an adapter available by its `family` name and for automatic detection."""
    _ADAPTERS[cls.family] = cls
    return cls


def available_families() -> list[str]:
    return sorted(_ADAPTERS)


def _refusal(config) -> str | None:
    model_type = str(getattr(config, "model_type", "") or "").lower()
    for key, reason in _REFUSED.items():
        if model_type.startswith(key) or any(a.lower().startswith(key.replace("_", "")) for a in _archs(config)):
            return reason
    return None


def _archs(config) -> list[str]:
    return list(getattr(config, "architectures", None) or ())


def resolve_adapter_class(config, backbone_family: str | None = None) -> type[BackboneAdapter]:
    reason = _refusal(config)
    if reason is not None:
        raise ValueError(reason)
    if backbone_family is not None:
        if backbone_family not in _ADAPTERS:
            raise ValueError(
                f"Unknown backbone_family {backbone_family!r}; supported: {available_families()}."
            )
        return _ADAPTERS[backbone_family]
    for family, cls in _ADAPTERS.items():
        if family != "generic" and cls.matches(config):
            return cls
    return _ADAPTERS["generic"]


def get_adapter(
    model: nn.Module, backbone_family: str | None = None, mask_token_id: int | None = None
) -> BackboneAdapter:
    """The adapter for `model` (a loaded `PreTrainedModel`), detected or forced by `backbone_family`."""
    if isinstance(model, BackboneAdapter):
        return model
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"Expected a transformers PreTrainedModel with a .config, got {type(model).__name__}.")
    return resolve_adapter_class(config, backbone_family)(model, mask_token_id=mask_token_id)
