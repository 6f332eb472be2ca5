"""mrp_mode="speculative" is lossless: token for token the static one-token-per-step output."""

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from test_engine_families import ALL_FAMILIES

import mrp_hf
from mrp_hf import MRPConfig, MRPHead, MRPModel


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


def test_speculative_with_a_trained_head_is_still_exact_and_accepts_more(tmp_path):
    """A head trained by the project's own pipeline: exactness holds, and it drafts better than C = 0."""
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
    accepted = {}
    for name, head in (("trained", trained), ("untrained", make_head(backbone, "untrained"))):
        spec = MRPModel.from_backbone(backbone, head=head, mask_token_id=STAND_IN_MASK_ID)
        for temperature in (0.0, 0.8):
            out = spec.generate(ids, attention_mask=mask, mrp_mode="speculative", temperature=temperature, seed=4, **kwargs)
            reference = static if temperature == 0 else plain.generate(ids, attention_mask=mask, temperature=0.8, seed=4, **kwargs)
            assert torch.equal(out.sequences, reference.sequences), (name, temperature)
            if temperature == 0:
                accepted[name] = out.stats.accepted_drafts
    assert accepted["trained"] >= accepted["untrained"], accepted
