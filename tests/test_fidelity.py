"""Fidelity (issue 11): the library's static and threshold decoding reproduce each family's own generate function,
token for token, greedy, on the stand-ins (which reproduce each family's real interface; tests/stand_ins).

The expected tokens come from tests/reference_decoders.py: each official generate rewritten readably (checked
against the real official code on tiny models of the real modeling files). For every prompt length 1..2B+1 (B the
family's block), single prompts and one left-padded batch of all lengths (each row must get its answer alone),
static and threshold decoding, without EOS and with an EOS that rows hit, prefix cache on and off where the
family has one. Then: prompts shorter than a block in every decoding mode for every family with a cache (the
Fast-dLLM v2 empty-cache crash), Dream on transformers 5 through `mrp_hf.load_backbone`, and Fast-dLLM's Dream
file with `prefix_cache=True`.

Library settings used (`generate` keyword arguments): `block_length` = the decoding block (Fast-dLLM v2: its
sub-block; the model block is config `bd_size`), `tokens_per_step=1` (static), `threshold` (dynamic),
`prefix_cache`; Dream's own timestep schedule is asked for with DREAM_SCHEDULE below.
"""

from __future__ import annotations

import collections

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from reference_decoders import (
    dream_generate,
    dream_threshold_generate,
    fast_dllm_v2_generate,
    llada2_generate,
    llada_generate,
    sdar_generate,
)
from stand_ins import load_stand_in, save_stand_in
from test_speculative import make_head
from transformers import GenerationConfig

import mrp_hf
from mrp_hf import MRPModel

MASK = STAND_IN_MASK_ID
PAD = 0  # what the library writes after EOS and left of short prompts (never a prompt token here)
THRESHOLD = 0.3  # the stand-ins' confidences spread over (0.1, 0.9): several reveals per step, not all
BLOCK = 4  # SDAR's config block_size, Fast-dLLM v2's bd_size, and the decoding block of the others
NEW = 2 * BLOCK  # max_new_tokens
# the library option that selects Dream's own timestep schedule for static decoding (steps = max_new_tokens,
# whole answer one block: 0 tokens at the first step, 2 at the last); the default static keeps one token a step
DREAM_SCHEDULE = {"step_schedule": "dream"}


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    """Each family's stand-in (fp32), without a default EOS (every test says which EOS it wants)."""
    root = tmp_path_factory.mktemp("fidelity")
    loaded = {}
    for family in ("sdar", "fast_dllm_v2", "llada2", "llada", "dream", "dream_fast_dllm"):
        model = load_stand_in(family, root)
        model.generation_config = GenerationConfig()
        loaded[family] = model
    return loaded


def prompts(max_length: int = 2 * BLOCK + 1) -> dict[int, list[int]]:
    """One seeded prompt of every length 1..max_length, from ids 1..120 (no mask, pad or EOS id)."""
    rng = torch.Generator().manual_seed(11)
    return {n: torch.randint(1, 121, (n,), generator=rng).tolist() for n in range(1, max_length + 1)}


def regime(mode: str) -> dict:
    """The library's keyword arguments of static (one token per step) and threshold decoding."""
    return {"threshold": THRESHOLD} if mode == "dynamic" else {"tokens_per_step": 1}


def library(model: MRPModel, prompt_list: list[list[int]], **kwargs) -> list[list[int]]:
    """The answers (max_new_tokens tokens each) of one generate call: one prompt alone, or a left-padded batch."""
    width = max(map(len, prompt_list))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompt_list])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_list])
    out = model.generate(ids, attention_mask=mask if len(prompt_list) > 1 else None, max_new_tokens=NEW,
                         pad_token_id=PAD, temperature=0.0, **kwargs)
    assert out.shape == (len(prompt_list), width + NEW), "output = the prompt + exactly max_new_tokens tokens"
    assert torch.equal(out[:, :width], ids), "the prompt columns come back unchanged"
    return [row[width:].tolist() for row in out]


def first_difference(expected: list[int], got: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b), None)


def check(expected: dict[int, list[int]], got: dict[int, list[int]], what: str) -> None:
    """Every prompt length's answer equals the reference's; the message lists each differing length with its
    first differing answer position."""
    differing = {n: first_difference(expected[n], got[n]) for n in expected if expected[n] != got[n]}
    assert not differing, (
        f"{what}: the answers of {len(differing)}/{len(expected)} prompt lengths differ from the official "
        f"algorithm; {{prompt length: first differing answer position}} = {differing}; "
        f"expected {[expected[n] for n in differing]}, got {[got[n] for n in differing]}"
    )


def eos_that_rows_hit(answers: dict[int, list[int]]) -> int:
    """The token the reference emits most often (its first position aside): several rows stop early on it."""
    counts = collections.Counter(t for answer in answers.values() for t in answer[1:])
    return counts.most_common(1)[0][0]


def run_fidelity(backbone, reference, library_kwargs: dict, eos_mode: str) -> None:
    """Reference vs library on every prompt length, alone and in one batch, without EOS or with one rows hit."""
    model = MRPModel.from_backbone(backbone, mask_token_id=MASK)
    cases = prompts()
    eos = None
    if eos_mode == "hit":
        eos = eos_that_rows_hit({n: reference(p, None) for n, p in cases.items()})
    expected = {n: reference(p, eos) for n, p in cases.items()}
    if eos is not None:
        hitting = [n for n, answer in expected.items() if eos in answer[:-1]]
        assert len(hitting) >= 2, f"EOS {eos} should stop several rows early, stops {hitting}"  # test self-check
    kwargs = dict(library_kwargs, eos_token_id=eos)
    singles = {n: library(model, [p], **kwargs)[0] for n, p in cases.items()}
    check(expected, singles, f"single prompts, eos={eos}")
    batch = dict(zip(cases, library(model, list(cases.values()), **kwargs), strict=True))
    check(expected, batch, f"one left-padded batch of prompt lengths 1..{max(cases)}, eos={eos}")


# ------------------------------------------------------------------------------------------- block-causal families
@pytest.mark.parametrize("eos_mode", ["none", "hit"])
@pytest.mark.parametrize("prefix_cache", [None, False])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_sdar_matches_block_diffusion_generate(backbones, mode, prefix_cache, eos_mode):
    threshold = THRESHOLD if mode == "dynamic" else None

    def reference(prompt, eos):
        return sdar_generate(backbones["sdar"], prompt, mask_id=MASK, max_new_tokens=NEW, block_length=BLOCK,
                             threshold=threshold, eos_token_id=eos, pad_token_id=PAD)

    run_fidelity(backbones["sdar"], reference, dict(block_length=BLOCK, prefix_cache=prefix_cache, **regime(mode)),
                 eos_mode)


@pytest.mark.parametrize("eos_mode", ["none", "hit"])
@pytest.mark.parametrize("prefix_cache", [None, False])
@pytest.mark.parametrize("small_block", [BLOCK, BLOCK // 2])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_fast_dllm_v2_matches_its_generate(backbones, mode, small_block, prefix_cache, eos_mode):
    backbone = backbones["fast_dllm_v2"]
    assert backbone.config.bd_size == BLOCK
    threshold = THRESHOLD if mode == "dynamic" else None

    def reference(prompt, eos):
        return fast_dllm_v2_generate(backbone, prompt, mask_id=MASK, max_new_tokens=NEW, block_size=BLOCK,
                                     small_block_size=small_block, threshold=threshold, eos_token_id=eos,
                                     pad_token_id=PAD)

    kwargs = dict(block_length=small_block, prefix_cache=prefix_cache, **regime(mode))  # the sub-block
    run_fidelity(backbone, reference, kwargs, eos_mode)


@pytest.mark.parametrize("eos_mode", ["none", "hit"])
@pytest.mark.parametrize("prefix_cache", [None, False])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_llada2_matches_its_generate(backbones, mode, prefix_cache, eos_mode):
    threshold = THRESHOLD if mode == "dynamic" else None

    def reference(prompt, eos):
        return llada2_generate(backbones["llada2"], prompt, mask_id=MASK, max_new_tokens=NEW, block_length=BLOCK,
                               threshold=threshold, eos_token_id=eos, pad_token_id=PAD)

    run_fidelity(backbones["llada2"], reference, dict(block_length=BLOCK, prefix_cache=prefix_cache, **regime(mode)),
                 eos_mode)


# ------------------------------------------------------------------------------------------- bidirectional families
@pytest.mark.parametrize("eos_mode", ["none", "hit"])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_llada_matches_fast_dllm_generate(backbones, mode, eos_mode):
    threshold = THRESHOLD if mode == "dynamic" else None

    def reference(prompt, eos):
        return llada_generate(backbones["llada"], prompt, mask_id=MASK, max_new_tokens=NEW, block_length=BLOCK,
                              threshold=threshold, eos_token_id=eos, pad_token_id=PAD)

    run_fidelity(backbones["llada"], reference, dict(block_length=BLOCK, **regime(mode)), eos_mode)


@pytest.mark.parametrize("eos_mode", ["none", "hit"])
@pytest.mark.parametrize("steps", [NEW, NEW // 2])
def test_dream_schedule_matches_diffusion_generate(backbones, steps, eos_mode):
    def reference(prompt, eos):
        return dream_generate(backbones["dream"], prompt, mask_id=MASK, max_new_tokens=NEW, steps=steps,
                              eos_token_id=eos, pad_token_id=PAD)

    run_fidelity(backbones["dream"], reference, dict(block_length=NEW, steps=steps, **DREAM_SCHEDULE), eos_mode)


@pytest.mark.parametrize("eos_mode", ["none", "hit"])
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_dream_threshold_matches_fast_dllm_block_decoding(backbones, prefix_cache, eos_mode):
    """prefix_cache=True: Fast-dLLM's Dream block decoding with its approximate prefix cache; False: the same
    reveal rule (best + confidence >= threshold) with a full forward per step."""

    def reference(prompt, eos):
        return dream_threshold_generate(backbones["dream"], prompt, mask_id=MASK, max_new_tokens=NEW,
                                        block_length=BLOCK, threshold=THRESHOLD, prefix_cache=prefix_cache,
                                        eos_token_id=eos, pad_token_id=PAD)

    kwargs = dict(block_length=BLOCK, threshold=THRESHOLD, prefix_cache=prefix_cache)
    run_fidelity(backbones["dream"], reference, kwargs, eos_mode)


# ------------------------------------------------------------------------------------------- prompts shorter than a block
CACHED = [("sdar", None), ("fast_dllm_v2", None), ("llada2", None), ("dream", True)]


@pytest.mark.parametrize(("family", "prefix_cache"), CACHED)
def test_prompts_shorter_than_a_block_in_every_mode(backbones, family, prefix_cache):
    """Prompts of 1..B-1 tokens, alone and batched (with two prompts of equal length, one of which stops at EOS
    in its first block): every mode runs, fills every answer position, gives each batch row its answer alone;
    speculative equals static and remask with an untrained head equals dynamic (greedy)."""
    backbone = backbones[family]
    short = [p for n, p in prompts(BLOCK - 1).items()]
    twin = [p + 1 for p in short[-1]]  # the same length as the longest short prompt
    plain = MRPModel.from_backbone(backbone, mask_token_id=MASK)
    eos = library(plain, [twin], block_length=BLOCK, prefix_cache=prefix_cache)[0][0]  # twin stops in block 1
    batch_prompts = [*short, twin]
    heads = {kind: MRPModel.from_backbone(backbone, head=make_head(backbone, kind), mask_token_id=MASK)
             for kind in ("untrained", "random")}
    base = dict(block_length=BLOCK, prefix_cache=prefix_cache, eos_token_id=eos)
    runs = {
        "static": (plain, dict(base, tokens_per_step=1)),
        "dynamic": (plain, dict(base, threshold=THRESHOLD)),
        "speculative/untrained": (heads["untrained"], dict(base, mrp_mode="speculative")),
        "speculative/random": (heads["random"], dict(base, mrp_mode="speculative")),
        "remask/untrained": (heads["untrained"], dict(base, mrp_mode="remask", threshold=THRESHOLD)),
        "direct/random": (heads["random"], dict(base, mrp_mode="direct")),
    }
    answers = {}
    for name, (model, kwargs) in runs.items():
        singles = [library(model, [p], **kwargs)[0] for p in batch_prompts]
        batched = library(model, batch_prompts, **kwargs)
        for prompt, alone, in_batch in zip(batch_prompts, singles, batched, strict=True):
            assert MASK not in alone, (name, len(prompt), alone)
            assert in_batch == alone, f"{name}: prompt of {len(prompt)} tokens, batched {in_batch} != alone {alone}"
        answers[name] = singles
    assert eos in answers["static"][-1][:BLOCK]  # the EOS row really stops in its first block
    for name in ("speculative/untrained", "speculative/random"):
        assert answers[name] == answers["static"], f"{name} is not lossless against static decoding"
    assert answers["remask/untrained"] == answers["dynamic"]


# ------------------------------------------------------------------------------------------- Dream's two files
@pytest.mark.parametrize("family", ["dream", "dream_fast_dllm"])
def test_dream_loads_through_load_backbone_on_every_transformers(tmp_path, family):
    """Dream's from_pretrained reads generation_config.json with DreamGenerationConfig, whose validate(self,
    is_init=False) transformers 5 calls with user_set_attributes= (TypeError): load_backbone must load it."""
    path = save_stand_in(family, tmp_path / f"{family}_through_load_backbone")  # a fresh remote-code module
    backbone = mrp_hf.load_backbone(str(path), trust_remote_code=True)
    assert type(backbone).__name__ == "DreamModel"
    model = MRPModel.from_backbone(backbone)  # the mask id from the config
    assert model.adapter.family == "dream" and model.adapter.mask_token_id == MASK
    out = model.generate(torch.tensor([[5, 17, 33, 9]]), max_new_tokens=NEW, block_length=BLOCK, pad_token_id=PAD,
                         eos_token_id=None)
    assert out.shape == (1, 4 + NEW) and MASK not in out[0].tolist()


def test_dream_fast_dllm_file_refuses_prefix_cache_clearly(backbones):
    """Fast-dLLM's Dream file takes legacy (k, v) lists, not a transformers Cache: prefix_cache=True must be
    refused with a ValueError that says so (it crashed inside the model with KeyError / TypeError)."""
    model = MRPModel.from_backbone(backbones["dream_fast_dllm"], mask_token_id=MASK)
    with pytest.raises(ValueError, match="prefix_cache"):
        model.generate(torch.tensor([[5, 17, 33, 9]]), max_new_tokens=NEW, block_length=BLOCK, threshold=THRESHOLD,
                       prefix_cache=True)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_dream_fast_dllm_file_decodes_like_the_hub_file_without_a_cache(backbones, mode):
    """Same weights, no cache: both Dream files give the same answers (Fast-dLLM's ignores position_ids, which
    only shifts RoPE positions of a single prompt by nothing)."""
    kwargs = dict(block_length=BLOCK, **regime(mode))
    hub = MRPModel.from_backbone(backbones["dream"], mask_token_id=MASK)
    fast = MRPModel.from_backbone(backbones["dream_fast_dllm"], mask_token_id=MASK)
    for prompt in prompts().values():
        assert library(fast, [prompt], **kwargs) == library(hub, [prompt], **kwargs), len(prompt)


# ------------------------------------------------------------------------------------------------ the options
def test_llada_rows_are_grouped_by_length_unless_asked_not_to(backbones):
    """LLaDA's attention ignores the padding mask: by default rows of equal prompt length are decoded together
    (each row equals its answer alone); group_by_prompt_length=False spends one forward per step on the padded
    batch instead, and its padded rows then see their pads (as LLaDA's own batched decoding)."""
    model = MRPModel.from_backbone(backbones["llada"], mask_token_id=MASK)
    batch = [prompts()[length] for length in (3, 5, 5, 9)]
    alone = [library(model, [prompt], block_length=BLOCK)[0] for prompt in batch]
    grouped, grouped_stats = _batch_with_stats(model, batch)
    padded, padded_stats = _batch_with_stats(model, batch, group_by_prompt_length=False)
    assert grouped == alone
    assert padded_stats.backbone_forwards < grouped_stats.backbone_forwards
    assert padded[3] == alone[3]  # the longest prompt has no pads
    assert padded != alone


def _batch_with_stats(model, prompt_list, **kwargs):
    width = max(map(len, prompt_list))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompt_list])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_list])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, block_length=BLOCK, return_dict_in_generate=True,
                         **kwargs)
    return out.sequences[:, width:].tolist(), out.stats


def test_answer_alignment_starts_the_answer_on_a_fresh_block(backbones):
    """block_alignment="answer" (the layout before the family's own): a prompt of any length decodes exactly as if
    it were left-padded to a block multiple; the family's default shares the prompt's tail block instead."""
    model = MRPModel.from_backbone(backbones["sdar"], mask_token_id=MASK)
    prompt = prompts()[BLOCK + 1]
    aligned = library(model, [prompt], block_length=BLOCK, block_alignment="answer")[0]
    width = 2 * BLOCK
    ids = torch.tensor([[PAD] * (width - len(prompt)) + prompt])
    mask = torch.tensor([[0] * (width - len(prompt)) + [1] * len(prompt)])
    padded = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, block_length=BLOCK, block_alignment="answer")
    assert aligned == padded[0, width:].tolist()
    whole = prompts()[2 * BLOCK]  # a prompt of whole blocks: both layouts are the same
    assert library(model, [whole], block_length=BLOCK, block_alignment="answer") == library(model, [whole], block_length=BLOCK)
    own = library(model, [prompt], block_length=BLOCK)[0]
    assert own == sdar_generate(backbones["sdar"], prompt, mask_id=MASK, max_new_tokens=NEW, block_length=BLOCK)
    with pytest.raises(ValueError, match="block_alignment='sequence'.*bidirectional"):
        MRPModel.from_backbone(backbones["llada"], mask_token_id=MASK).generate(
            torch.tensor([prompt]), max_new_tokens=NEW, block_length=BLOCK, block_alignment="sequence")
