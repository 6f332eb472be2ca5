"""The decoding modes (`mrp_mode`): one registry that names each, validates its arguments and builds its decoder.

`MRPGenerationConfig.validate` checks a mode's arguments here (`check_mode_arguments`), the engine builds the
block decoder here (`build_decoder`), and the evaluation runner reads each mode's regime here: there is no other
list of modes. Adding a mode = one `DecodingMode` entry and one decoder in `strategies/`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .strategies import (
    BlockDecoder,
    DirectDecoder,
    RemaskDecoder,
    RevealStrategy,
    SpeculativeDecoder,
    StepwiseDecoder,
)


@dataclass(frozen=True)
class DecodingMode:
    """`regime`: "any" (static or dynamic, as the other arguments say), "static" (one exact pick per step: no
    threshold, steps or tokens_per_step), or "dynamic" (a threshold is required)."""

    name: str
    needs_head: bool
    regime: str
    summary: str
    build: Callable[[Any, Any, Callable[[], RevealStrategy]], BlockDecoder]


def _speculative(config, head, strategy) -> BlockDecoder:
    return SpeculativeDecoder(head, config.mrp_draft_tokens)


def _remask(config, head, strategy) -> BlockDecoder:
    return RemaskDecoder(head, strategy(), rule=config.remask_rule, delta=config.remask_delta)


def _direct(config, head, strategy) -> BlockDecoder:
    return DirectDecoder(head, config.mrp_draft_tokens)


MODES: dict[str, DecodingMode] = {
    mode.name: mode
    for mode in (
        DecodingMode("off", False, "any", "the backbone's own static or dynamic decoding",
                     lambda config, head, strategy: StepwiseDecoder(strategy())),
        DecodingMode("speculative", True, "static", "lossless: head drafts, one backbone forward verifies", _speculative),
        DecodingMode("remask", True, "dynamic", "dynamic decoding whose collapsing proposals the head revokes", _remask),
        DecodingMode("direct", True, "static", "lossy: head steps reveal tokens themselves", _direct),
    )
}
MODE_NAMES = tuple(MODES)


def check_mode_arguments(config) -> None:
    """The mode exists and the regime arguments fit it (`ValueError` naming the fix). No head needed."""
    mode = MODES.get(config.mrp_mode)
    if mode is None:
        raise ValueError(f"Unknown mrp_mode {config.mrp_mode!r}; choose one of {list(MODE_NAMES)}.")
    if mode.regime == "dynamic" and config.threshold is None:
        raise ValueError(f"mrp_mode={mode.name!r} works in the dynamic regime: pass a threshold (e.g. threshold=0.5).")
    if mode.regime == "static" and (config.threshold is not None or config.steps is not None
                                    or config.tokens_per_step != 1):
        why = "is lossless against static decoding with" if mode.name == "speculative" else "works in the static regime,"
        raise ValueError(
            f"mrp_mode={mode.name!r} {why} one token per step: drop threshold, steps and tokens_per_step (got "
            f"threshold={config.threshold}, steps={config.steps}, tokens_per_step={config.tokens_per_step})."
        )


def regime_error(mode_name: str, threshold: float | None) -> str | None:
    """Why `threshold` does not fit the regime of `mode_name` (an MRP mode), or None."""
    regime = MODES[mode_name].regime
    if regime == "dynamic" and threshold is None:
        return f"mode {mode_name!r} needs a threshold, e.g. '{mode_name}:0.5'"
    if regime == "static" and threshold is not None:
        return f"mode {mode_name!r} decodes one token per backbone pick: drop threshold={threshold}"
    return None


def build_decoder(config, head, strategy: Callable[[], RevealStrategy]) -> BlockDecoder:
    """The block decoder of `config.mrp_mode`; `strategy` builds the backbone's own reveal rule when needed."""
    check_mode_arguments(config)
    mode = MODES[config.mrp_mode]
    if mode.needs_head:
        if head is None:
            raise ValueError(
                f"mrp_mode={mode.name!r} needs an MRP head, and this model has none; load one with "
                f"MRPModel.from_pretrained(head_repo_or_path) or use mrp_mode='off'."
            )
        trained = getattr(head.config, "block_length", None)
        if trained is not None and config.block_length is not None and config.block_length != trained:
            raise ValueError(
                f"This MRP head was trained with block_length={trained}, but generate() got block_length="
                f"{config.block_length}; decode with block_length={trained} or train a head for {config.block_length}."
            )
    return mode.build(config, head, strategy)
