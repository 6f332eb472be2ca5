"""mrp_mode="remask" and "direct": behaviour that holds for any head, and their errors."""

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from test_speculative import batch, make_head

from mrp_hf import MRPModel


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_remask_with_untrained_head_is_plain_dynamic_decoding(stand_in_models, family, temperature):
    backbone = stand_in_models[family]
    plain = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    remask = MRPModel.from_backbone(backbone, head=make_head(backbone, "untrained"), mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch([[5, 17, 33, 9], [9, 60, 2, 71, 40, 11]])
    for threshold in (0.05, 0.2):
        kwargs = dict(max_new_tokens=8, block_length=4, threshold=threshold, temperature=temperature, seed=2,
                      return_dict_in_generate=True)
        dynamic = plain.generate(ids, attention_mask=mask, **kwargs)
        out = remask.generate(ids, attention_mask=mask, mrp_mode="remask", **kwargs)
        assert torch.equal(out.sequences, dynamic.sequences)
        assert out.stats.backbone_forwards == dynamic.stats.backbone_forwards
        assert out.stats.head_forwards == out.stats.backbone_forwards  # one head forward per step
        assert out.stats.revoked_reveals == 0 or threshold > 0  # C = 0 never revokes an above-threshold proposal


@pytest.mark.parametrize("rule", ["confidence", "residual"])
def test_remask_with_an_opinionated_head_revokes_and_still_finishes(stand_in_models, rule):
    backbone = stand_in_models["sdar"]
    model = MRPModel.from_backbone(backbone, head=make_head(backbone, "random"), mask_token_id=STAND_IN_MASK_ID)
    ids = torch.tensor([[5, 17, 33, 9]])
    out = model.generate(ids, max_new_tokens=16, block_length=4, threshold=0.02, mrp_mode="remask", remask_rule=rule,
                         remask_delta=0.05, return_dict_in_generate=True)
    assert STAND_IN_MASK_ID not in out.sequences[0, 4:].tolist()
    assert out.stats.proposals >= 16 and out.stats.revoked_reveals > 0
    assert out.stats.proposals - out.stats.revoked_reveals == 16  # every kept proposal is a committed token


def test_direct_reveals_one_plus_k_tokens_per_forward(stand_in_models):
    backbone = stand_in_models["llada"]
    model = MRPModel.from_backbone(backbone, head=make_head(backbone, "random"), mask_token_id=STAND_IN_MASK_ID)
    out = model.generate(torch.tensor([[5, 17, 33, 9]]), max_new_tokens=16, block_length=8, mrp_mode="direct",
                         mrp_draft_tokens=3, return_dict_in_generate=True)
    assert STAND_IN_MASK_ID not in out.sequences[0, 4:].tolist()
    assert out.stats.backbone_forwards == 4  # 2 blocks of 8, 4 tokens per forward
    assert out.stats.head_forwards == 12
    assert out.stats.mean_tokens_per_forward == 4.0


def test_mode_errors(stand_in_models):
    backbone = stand_in_models["sdar"]
    model = MRPModel.from_backbone(backbone, head=make_head(backbone, "untrained"), mask_token_id=STAND_IN_MASK_ID)
    ids = torch.tensor([[5, 17, 33, 9]])
    with pytest.raises(ValueError, match="pass a threshold"):
        model.generate(ids, max_new_tokens=8, block_length=4, mrp_mode="remask")
    with pytest.raises(ValueError, match="static regime"):
        model.generate(ids, max_new_tokens=8, block_length=4, mrp_mode="direct", threshold=0.5)
    with pytest.raises(ValueError, match="Unknown remask_rule"):
        model.generate(ids, max_new_tokens=8, block_length=4, mrp_mode="remask", threshold=0.5, remask_rule="x")
