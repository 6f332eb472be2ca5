"""mrp_mode="remask" and "direct": behaviour that holds for any head, and their errors."""

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from test_speculative import batch, make_head

import mrp_hf
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
        # at most one head forward per step, none on steps with a single proposal (nothing to revoke)
        assert out.stats.head_forwards <= out.stats.backbone_forwards
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


def _naive_remask(backbone, head, prompt, max_new, block, tau, rule, delta):
    """remask decoding written out one proposal at a time (one row, greedy, no cache): each proposal below
    the row's most confident one is judged by a head call on the state with the surer proposals revealed."""
    adapter = mrp_hf.get_adapter(backbone, mask_token_id=STAND_IN_MASK_ID)
    embed, lm_head = adapter.get_input_embeddings(), adapter.get_output_embeddings()
    canvas = torch.tensor([prompt + [STAND_IN_MASK_ID] * max_new])
    width = len(prompt)
    for start in range(width, width + max_new, block):
        end = start + block
        while (canvas[0, start:end] == STAND_IN_MASK_ID).any():
            out = adapter.forward(canvas[:, :end], attention_mask=torch.ones_like(canvas[:, :end]),
                                  position_ids=torch.arange(end)[None], return_lm_head_input=True, grid=block)
            logits = out.logits[0, start:end].float()
            logits[:, STAND_IN_MASK_ID] = float("-inf")
            confidence, tokens = logits.softmax(-1).max(-1)
            masked = canvas[0, start:end] == STAND_IN_MASK_ID
            confidence = confidence.masked_fill(~masked, float("-inf"))
            proposals = [p for p in range(block) if masked[p] and confidence[p] > tau] or [int(confidence.argmax())]
            proposals.sort(key=lambda p: -float(confidence[p]))
            keep = [proposals[0]]
            for j, p in enumerate(proposals[1:], 1):
                ids = canvas[0, start:end].clone()
                for q in proposals[:j]:
                    ids[q] = tokens[q]
                h = out.lm_head_input[:, start:end]
                h_c = head(embed(ids[None]), h, position_ids=torch.arange(start, end)[None])
                if rule == "confidence":
                    corrected = lm_head(h + h_c)[0, p].float()
                    corrected[STAND_IN_MASK_ID] = float("-inf")
                    revoked = corrected.softmax(-1)[tokens[p]] < tau
                else:
                    revoked = lm_head(h_c)[0, p, tokens[p]].abs() > delta
                if not revoked:
                    keep.append(p)
            for p in keep:
                canvas[0, start + p] = tokens[p]
    return canvas


@pytest.mark.parametrize("rule,delta", [("confidence", 1.5), ("residual", 0.05)])
def test_remask_matches_a_proposal_by_proposal_loop(stand_in_models, rule, delta):
    backbone = stand_in_models["sdar"]
    head = make_head(backbone, "random")
    model = MRPModel.from_backbone(backbone, head=head, mask_token_id=STAND_IN_MASK_ID)
    prompt = [5, 17, 33, 9]
    out = model.generate(torch.tensor([prompt]), max_new_tokens=16, block_length=4, threshold=0.03, mrp_mode="remask",
                         remask_rule=rule, remask_delta=delta, prefix_cache=False, return_dict_in_generate=True)
    with torch.no_grad():
        expected = _naive_remask(backbone, head, prompt, 16, 4, 0.03, rule, delta)
    assert out.stats.revoked_reveals > 0
    assert torch.equal(out.sequences, expected)
