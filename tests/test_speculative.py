"""mrp_mode="speculative" is lossless: token for token the static one-token-per-step output."""

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from test_engine_families import ALL_FAMILIES

import mrp_hf
from mrp_hf import MRPConfig, MRPHead, MRPModel
from mrp_hf.generation.strategies import BlockDecoder


def make_head(model, kind):
    adapter = mrp_hf.get_adapter(model, mask_token_id=STAND_IN_MASK_ID)
    torch.manual_seed(1)
    head = MRPHead(MRPConfig.for_backbone(adapter, num_hidden_layers=1))
    if kind == "random":  # a head that predicts something (often wrong): exercises rejections
        with torch.no_grad():
            head.norm.weight.fill_(1.0)
            for p in head.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    return head.eval()


def batch(prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("head_kind", ["untrained", "random"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculative_equals_static(models, family, head_kind, temperature):
    backbone = models[family]
    head = make_head(backbone, head_kind)
    plain = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    spec = MRPModel.from_backbone(backbone, head=head, mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch([[5, 17, 33, 9, 60, 2, 71, 40], [9, 60, 2], [44, 45, 46, 47, 48]])
    kwargs = dict(max_new_tokens=8, block_length=4, temperature=temperature, seed=7, return_dict_in_generate=True)
    static = plain.generate(ids, attention_mask=mask, **kwargs)
    out = spec.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_draft_tokens=3, **kwargs)
    assert torch.equal(out.sequences, static.sequences)
    stats = out.stats
    # counted exactly: a head forward per draft step, each row's tokens = forwards + accepted drafts
    assert stats.head_forwards >= 1
    assert sum(stats.acceptance_histogram) >= 1
    assert stats.backbone_forwards <= static.stats.backbone_forwards
    assert stats.row_new_tokens == static.stats.row_new_tokens
    assert all(a <= b for a, b in zip(stats.row_backbone_forwards, static.stats.row_backbone_forwards, strict=True))


def test_counts_of_one_row(models):
    backbone = models["sdar"]
    spec = MRPModel.from_backbone(backbone, head=make_head(backbone, "untrained"), mask_token_id=STAND_IN_MASK_ID)
    out = spec.generate(torch.tensor([[5, 17, 33, 9]]), max_new_tokens=8, block_length=4, mrp_mode="speculative",
                        mrp_draft_tokens=2, return_dict_in_generate=True)
    s = out.stats
    # per block: one seed forward, then rounds; each round commits 1 exact pick + accepted drafts, and
    # needs a verify forward unless the pick finished the block
    rounds = sum(s.acceptance_histogram)  # verify rounds
    assert s.row_new_tokens == [8]
    assert s.backbone_forwards == 2 + rounds  # 2 blocks: one seed forward each
    # tokens = exact picks + accepted drafts; every verify round follows one pick, plus at most one
    # block-finishing pick per block that needs no verify
    assert 0 <= 8 - s.accepted_drafts - rounds <= 2
    assert s.head_forwards >= rounds
    assert s.row_backbone_forwards == [s.backbone_forwards]


def test_speculative_refuses_lossy_settings(models):
    backbone = models["sdar"]
    spec = MRPModel.from_backbone(backbone, head=make_head(backbone, "untrained"), mask_token_id=STAND_IN_MASK_ID)
    ids = torch.tensor([[5, 17, 33, 9]])
    with pytest.raises(ValueError, match="lossless"):
        spec.generate(ids, max_new_tokens=8, block_length=4, mrp_mode="speculative", threshold=0.5)
    with pytest.raises(ValueError, match="mrp_draft_tokens"):
        spec.generate(ids, max_new_tokens=8, block_length=4, mrp_mode="speculative", mrp_draft_tokens=0)
    spec.head.config.block_length = 4
    with pytest.raises(ValueError, match="trained with block_length=4"):
        spec.generate(ids, max_new_tokens=8, block_length=2, mrp_mode="speculative")


def test_speculative_with_a_trained_head_is_still_exact(tmp_path):
    """A head trained by the project's own pipeline: exactness holds whatever it drafts, and on held-out data it
    predicts the next state's argmax better than C = 0. (How many drafts it gets accepted on this random stand-in
    backbone is noise: the bundled reference model's tests measure acceptance on a real task.)"""
    from stand_ins import save_stand_in
    from test_training import fast_config, synthetic_records

    from mrp_hf.training import train_head

    path = save_stand_in("sdar", tmp_path / "sdar")
    config = fast_config(max_steps=120, batch_size=16, num_hidden_layers=2, lr=3e-3, block_length=4, eval_fraction=0.1)
    trained = train_head(str(path), synthetic_records(400), tmp_path / "head", config=config).eval()
    backbone = mrp_hf.load_backbone(str(path), trust_remote_code=True)
    plain = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch([[5, 17, 33, 9, 60, 2, 71, 40], [9, 60, 2], [44, 45, 46, 47, 48]])
    kwargs = dict(max_new_tokens=16, block_length=4, return_dict_in_generate=True)
    static = plain.generate(ids, attention_mask=mask, **kwargs)
    metrics = trained.config.training["metrics"]
    assert metrics["agreement"] > metrics["baseline_agreement"], metrics
    for name, head in (("trained", trained), ("untrained", make_head(backbone, "untrained"))):
        spec = MRPModel.from_backbone(backbone, head=head, mask_token_id=STAND_IN_MASK_ID)
        for temperature in (0.0, 0.8):
            out = spec.generate(ids, attention_mask=mask, mrp_mode="speculative", temperature=temperature, seed=4, **kwargs)
            reference = static if temperature == 0 else plain.generate(ids, attention_mask=mask, temperature=0.8, seed=4, **kwargs)
            assert torch.equal(out.sequences, reference.sequences), (name, temperature)
            assert out.stats.accepted_drafts > 0


# ---------------------------------------------------------------- verify layouts: stacked vs packed
# (model, prefix_cache) settings of every family whose forward takes an explicit pattern: block-causal with
# and without the exact cache, bidirectional without a cache and with the approximate one; the reference DLM
# decodes blocks of 4 inside its model blocks of 8 (the verify input then starts mid model block)
PACKING = [("sdar", None), ("sdar", False), ("llada2", None), ("dream", None), ("dream", True),
           ("reference", None), ("reference", False), ("reference_bidirectional", None), ("reference_bidirectional", True)]


def tiny_reference(attention):
    from mrp_hf.reference import ReferenceDLM, ReferenceDLMConfig

    torch.manual_seed(0)
    config = ReferenceDLMConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, block_size=8, attention=attention, max_position_embeddings=256,
                                mask_token_id=STAND_IN_MASK_ID, pad_token_id=0, eos_token_id=125)
    model = ReferenceDLM(config)
    with torch.no_grad():
        for p in model.parameters():  # large weights: logits far from uniform, so no near-ties
            p.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def packing_models(models):
    out = {name: models[name] for name in ("sdar", "llada2", "dream")}
    out["reference"] = tiny_reference("block_causal")
    out["reference_bidirectional"] = tiny_reference("bidirectional")
    return out


@pytest.mark.parametrize(("family", "prefix_cache"), PACKING)
@pytest.mark.parametrize("layout", ["stacked", "packed"])
@pytest.mark.parametrize("head_kind", ["untrained", "random"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_speculative_equals_static_in_both_layouts(packing_models, family, prefix_cache, layout, head_kind, temperature):
    backbone = packing_models[family]
    plain = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    spec = MRPModel.from_backbone(backbone, head=make_head(backbone, head_kind), mask_token_id=STAND_IN_MASK_ID)
    assert spec.adapter.can_pack
    ids, mask = batch([[5, 17, 33, 9, 60, 2, 71, 40], [9, 60, 2], [44, 45, 46, 47, 48]])
    kwargs = dict(max_new_tokens=8, block_length=4, temperature=temperature, seed=7, prefix_cache=prefix_cache,
                  return_dict_in_generate=True)
    static = plain.generate(ids, attention_mask=mask, **kwargs)
    out = spec.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_draft_tokens=3, verify_layout=layout, **kwargs)
    assert torch.equal(out.sequences, static.sequences)
    assert out.stats.row_new_tokens == static.stats.row_new_tokens
    assert out.stats.backbone_forwards <= static.stats.backbone_forwards


@pytest.mark.parametrize(("family", "prefix_cache"), PACKING)
def test_packed_and_stacked_count_the_same(packing_models, family, prefix_cache):
    backbone = packing_models[family]
    spec = MRPModel.from_backbone(backbone, head=make_head(backbone, "random"), mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch([[5, 17, 33, 9, 60, 2, 71, 40], [9, 60, 2], [44, 45, 46, 47, 48]])
    runs = {
        layout: spec.generate(ids, attention_mask=mask, max_new_tokens=16, block_length=4, prefix_cache=prefix_cache,
                              mrp_mode="speculative", verify_layout=layout, return_dict_in_generate=True)
        for layout in ("stacked", "packed")
    }
    stacked, packed = runs["stacked"], runs["packed"]
    assert torch.equal(packed.sequences, stacked.sequences)
    assert packed.stats.to_dict() == stacked.stats.to_dict()


def _cache_tensors(cache):
    if cache is None:
        return []
    if hasattr(cache, "layers"):
        return [t.clone() for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t.clone() for t in (*cache.key_cache, *cache.value_cache)]


class _CompareVerifyLayouts(BlockDecoder):
    """Per block: a seed forward, then the same verify forward (candidate states made of random reveals) in
    both layouts, from the same cache; records the two outputs and the caches after; then fills the block.
    (A test of the engine's internals: it reads the state behind the block's interface.)"""

    def __init__(self, copies):
        self.copies = copies
        self.records = []

    def decode_block(self, block):
        state = block._state
        seed = block.forward(hidden=True)
        copies = self.copies
        generator = torch.Generator().manual_seed(block.start)
        candidates = block.ids().unsqueeze(1).repeat(1, copies, 1)
        share = torch.arange(copies)[None, :, None] / copies  # copy j reveals about j/copies of the block
        reveal = (torch.rand(candidates.shape, generator=generator) < share) & (candidates == block.mask_id)
        candidates = torch.where(reveal, torch.randint(3, 120, candidates.shape, generator=generator), candidates)
        before = _cache_tensors(state.cache)
        record = {}
        for layout in ("stacked", "packed"):
            if state.cache is not None:  # both layouts start from the same cache
                for mine, saved in zip(_cache_tensors(state.cache), before, strict=True):
                    assert torch.equal(mine, saved)
            counters = state.counters
            forwards = (counters.backbone_forwards, counters.row_backbone_forwards.clone())
            out = block.forward(hidden=True, candidates=candidates, layout=layout)
            counted = (counters.backbone_forwards - forwards[0], (counters.row_backbone_forwards - forwards[1]).tolist())
            flat = type(out)(logits=out.logits.flatten(0, 1), lm_head_input=out.lm_head_input.flatten(0, 1))
            record[layout] = (flat, _cache_tensors(state.cache), counted)
        self.records.append(record)
        masked = block.masked()
        block.commit(torch.where(masked, seed.logits.argmax(-1), block.ids()), masked.sum(dim=1))


@pytest.mark.parametrize(("family", "prefix_cache"), PACKING)
def test_packed_verify_logits_equal_stacked(packing_models, family, prefix_cache):
    from mrp_hf.generation.config import MRPGenerationConfig
    from mrp_hf.generation.engine import DecodingEngine

    backbone = packing_models[family]
    adapter = mrp_hf.get_adapter(backbone, mask_token_id=STAND_IN_MASK_ID)
    config = MRPGenerationConfig(max_new_tokens=12, block_length=4, prefix_cache=prefix_cache)
    decoder = _CompareVerifyLayouts(copies=4)
    ids, mask = batch([[5, 17, 33, 9, 60, 2, 71, 40, 11], [9, 60, 2], [44, 45, 46, 47, 48]])
    DecodingEngine(adapter, config, block_decoder=decoder).run(ids, mask)
    # sdar and llada2 count blocks from each prompt's first token: the prompt tails' block is decoded too
    assert len(decoder.records) == (4 if family in ("sdar", "llada2") else 3)
    for record in decoder.records:
        (stacked, stacked_cache, stacked_count), (packed, packed_cache, packed_count) = record["stacked"], record["packed"]
        assert packed.logits.shape == stacked.logits.shape
        by_copy = stacked.logits.view(-1, decoder.copies, *stacked.logits.shape[1:])
        assert not torch.allclose(by_copy[:, 0], by_copy[:, -1])  # the candidates really differ
        # Dream with its approximate cache: the cache refresh commits the block's first position, whose logit is
        # then never read (and the packed layout does not compute it from the copy's own predecessor)
        first = 1 if (family == "dream" and prefix_cache) else 0
        torch.testing.assert_close(packed.logits[:, first:], stacked.logits[:, first:], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(packed.lm_head_input[:, first:], stacked.lm_head_input[:, first:], rtol=1e-4, atol=1e-4)
        assert len(packed_cache) == len(stacked_cache)
        for mine, theirs in zip(packed_cache, stacked_cache, strict=True):
            assert mine.shape == theirs.shape
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
        assert packed_count == stacked_count and packed_count[0] == 1


def test_verify_layout_choice(models, packing_models):
    from mrp_hf.generation.config import MRPGenerationConfig
    from mrp_hf.generation.engine import DecodingEngine

    def layout(model, **kwargs):
        adapter = mrp_hf.get_adapter(model, mask_token_id=STAND_IN_MASK_ID)
        return DecodingEngine(adapter, MRPGenerationConfig(max_new_tokens=8, block_length=4, **kwargs)).verify_layout()

    with pytest.raises(ValueError, match="verify_layout"):
        MRPGenerationConfig(verify_layout="diagonal")
    for family in ("llada", "fast_dllm_v2", "bert", "modernbert"):
        assert layout(models[family]) == "stacked"
        assert layout(models[family], verify_layout="stacked") == "stacked"
        with pytest.raises(ValueError, match=r"'(llada|fast_dllm_v2|masked_lm)' family .*verify_layout='stacked'"):
            layout(models[family], verify_layout="packed")
    for model in packing_models.values():
        assert layout(model, verify_layout="packed") == "packed"
        adapter = mrp_hf.get_adapter(model, mask_token_id=STAND_IN_MASK_ID)
        assert layout(model, prefix_cache=True if adapter.accepts_cache else None) == adapter.preferred_verify_layout
    # bidirectional without a cache: the copies would share nothing, so "auto" stacks them
    assert layout(packing_models["dream"]) == "stacked"
    assert layout(packing_models["reference_bidirectional"]) == "stacked"
    # the error is raised by generate() too, before any forward
    spec = MRPModel.from_backbone(models["llada"], head=make_head(models["llada"], "untrained"), mask_token_id=STAND_IN_MASK_ID)
    with pytest.raises(ValueError, match="'llada' family"):
        spec.generate(torch.tensor([[5, 17, 33, 9]]), max_new_tokens=8, block_length=4, mrp_mode="speculative",
                      verify_layout="packed")
