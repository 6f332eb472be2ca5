"""The decoding modes (`mrp_mode`): one registry that names each, validates its arguments and builds its decoder.

`MRPGenerationConfig.validate` checks a mode's arguments here (`check_mode_arguments`), the engine builds the
block decoder here (`build_decoder`), and the evaluation runner reads each mode's regime here: there is no other
list of modes. Adding a mode = one `DecodingMode` entry and one decoder in `strategies/`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .draft_graph import DraftGraph, parse_draft_graph
from .strategies import (
    BlockDecoder,
    DirectDecoder,
    GraphSpeculativeDecoder,
    RemaskDecoder,
    RevealStrategy,
    SpeculativeDecoder,
    StepwiseDecoder,
)


@dataclass(frozen=True)
class DecodingMode:
    """`regime`: "any" (static or dynamic, as the other arguments say), "static" (one exact pick per step: no
    threshold, steps or tokens_per_step), or "dynamic" (a threshold is required). `backbone_drafts`: with
    `mrp_drafter="backbone"` the mode drafts from the backbone's own logits and needs no head; `graph_over_dynamic`:
    with `mrp_draft_graph` set, a threshold is allowed (the graph then speculates over dynamic decoding)."""

    name: str
    needs_head: bool
    regime: str
    summary: str
    build: Callable[[Any, Any, Callable[[], RevealStrategy]], BlockDecoder]
    backbone_drafts: bool = False
    graph_over_dynamic: bool = False


def _speculative(config, head, strategy) -> BlockDecoder:
    graph = parse_draft_graph(config.mrp_draft_graph, config.mrp_draft_tokens)
    drafter = None if config.mrp_drafter == "backbone" else head
    if graph is None and drafter is not None:
        return SpeculativeDecoder(head, config.mrp_draft_tokens)  # the chain of the MRP paper
    graph = graph or DraftGraph((1,) * config.mrp_draft_tokens)
    reveal = strategy() if config.threshold is not None else None  # over dynamic decoding: its threshold rule
    return GraphSpeculativeDecoder(drafter, graph, reveal, token_alternatives=config.confidence == "top_prob")


def _remask(config, head, strategy) -> BlockDecoder:
    return RemaskDecoder(head, strategy(), rule=config.remask_rule, delta=config.remask_delta)


def _direct(config, head, strategy) -> BlockDecoder:
    return DirectDecoder(head, config.mrp_draft_tokens)


MODES: dict[str, DecodingMode] = {
    mode.name: mode
    for mode in (
        DecodingMode("off", False, "any", "the backbone's own static or dynamic decoding",
                     lambda config, head, strategy: StepwiseDecoder(strategy())),
        DecodingMode("speculative", True, "static", "lossless: head drafts, one backbone forward verifies", _speculative,
                     backbone_drafts=True, graph_over_dynamic=True),
        DecodingMode("remask", True, "dynamic", "dynamic decoding whose collapsing proposals the head revokes", _remask),
        DecodingMode("direct", True, "static", "lossy: head steps reveal tokens themselves", _direct),
    )
}
MODE_NAMES = tuple(MODES)
#: who drafts in the speculative mode: the MRP head (h_A + C), or the backbone's own last logits (C = 0)
DRAFTERS = ("head", "backbone")


def check_mode_arguments(config) -> None:
    """The mode exists and the regime arguments fit it (`ValueError` naming the fix). No head needed."""
    mode = MODES.get(config.mrp_mode)
    if mode is None:
        raise ValueError(f"Unknown mrp_mode {config.mrp_mode!r}; choose one of {list(MODE_NAMES)}.")
    if mode.regime == "dynamic" and config.threshold is None:
        raise ValueError(f"mrp_mode={mode.name!r} works in the dynamic regime: pass a threshold (e.g. threshold=0.5).")
    _check_draft_arguments(config, mode)
    over_dynamic = mode.graph_over_dynamic and config.mrp_draft_graph is not None and config.threshold is not None
    if mode.regime == "static" and ((config.threshold is not None and not over_dynamic) or config.steps is not None
                                    or config.tokens_per_step != 1):
        why = "is lossless against static decoding with" if mode.name == "speculative" else "works in the static regime,"
        dynamic = " (or set mrp_draft_graph, e.g. 'chain', to speculate over dynamic decoding at that threshold)"
        raise ValueError(
            f"mrp_mode={mode.name!r} {why} one token per step: drop threshold, steps and tokens_per_step (got "
            f"threshold={config.threshold}, steps={config.steps}, tokens_per_step={config.tokens_per_step})"
            f"{dynamic if mode.graph_over_dynamic and config.steps is None and config.tokens_per_step == 1 else ''}."
        )


def _check_draft_arguments(config, mode: DecodingMode) -> None:
    """`mrp_draft_graph` is a valid shape (whatever the mode: a stored default must not break other modes) and
    `mrp_drafter` is "head" or, for a mode that can draft from the backbone, "backbone"."""
    parse_draft_graph(config.mrp_draft_graph, config.mrp_draft_tokens)
    if config.mrp_drafter not in DRAFTERS:
        raise ValueError(f"Unknown mrp_drafter {config.mrp_drafter!r}; choose one of {list(DRAFTERS)}.")
    if config.mrp_drafter == "backbone" and not mode.backbone_drafts:
        able = [m.name for m in MODES.values() if m.backbone_drafts]
        raise ValueError(f"mrp_drafter='backbone' drafts from the backbone's own logits in mrp_mode {able} only; "
                         f"drop it for mrp_mode={mode.name!r}.")


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
    head_free = mode.backbone_drafts and config.mrp_drafter == "backbone"
    if mode.needs_head and not head_free:
        if head is None:
            also = " (or mrp_drafter='backbone' to draft from the backbone itself)" if mode.backbone_drafts else ""
            raise ValueError(
                f"mrp_mode={mode.name!r} needs an MRP head, and this model has none; load one with "
                f"MRPModel.from_pretrained(head_repo_or_path) or use mrp_mode='off'{also}."
            )
        trained = getattr(head.config, "block_length", None)
        if trained is not None and config.block_length is not None and config.block_length != trained:
            raise ValueError(
                f"This MRP head was trained with block_length={trained}, but generate() got block_length="
                f"{config.block_length}; decode with block_length={trained} or train a head for {config.block_length}."
            )
    return mode.build(config, head, strategy)
