"""Non-finite logits: flagged on the device while decoding, raised once per block with the model part named."""

from __future__ import annotations

import torch


class NonFiniteOutputError(RuntimeError):
    """A model part produced NaN or +inf logits: decoding them would return garbage (e.g. all padding)."""


class NonFiniteGuard:
    """Remembers, on the device and without a host sync, whether a model part's logits held NaN or +inf;
    `check` raises once per block, naming the part, before anything decoded from them is returned.
    (-inf is a legitimate logit: some models rule tokens out with it.)"""

    def __init__(self) -> None:
        self._flags: dict[str, torch.Tensor] = {}

    def watch(self, part: str, logits: torch.Tensor) -> None:
        bad = ~(logits.amax() < float("inf"))  # amax propagates NaN, and NaN < inf is False
        self._flags[part] = bad if part not in self._flags else self._flags[part] | bad

    def flag(self) -> torch.Tensor | None:
        """A device bool: whether any watched part produced NaN/+inf (None when nothing was watched)."""
        flags = list(self._flags.values())
        if not flags:
            return None
        combined = flags[0]
        for flag in flags[1:]:
            combined = combined | flag
        return combined

    def check(self) -> None:
        for part, bad in self._flags.items():
            if bool(bad):
                raise NonFiniteOutputError(
                    f"{part} produced NaN or +inf logits, so decoding would return garbage; check its weights and "
                    f"dtype (e.g. fp16 overflow: load it in bfloat16 or float32)."
                )


BACKBONE_PART = "the backbone"
HEAD_PART = "the MRP head"
