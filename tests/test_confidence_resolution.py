"""`confidence_resolution`: the static regime ranks confidences on a grid (near-ties become ties, leftmost first),
thresholds always see exact confidences, bad values fail with one clear line, and speculative decoding stays
identical to static decoding under it."""

import pytest
import torch

from mrp_hf.generation.config import MRPGenerationConfig
from mrp_hf.generation.sampling import TokenProposer


def _confidences(**config):
    # two positions, vocabulary of 3 (the mask token is id 2): top probabilities 0.91 and 0.93
    probs = torch.tensor([[[0.91, 0.09, 0.0], [0.93, 0.07, 0.0]]])
    proposer = TokenProposer(MRPGenerationConfig(max_new_tokens=8, mask_token_id=2, **config), mask_token_id=2)
    _, confidence = proposer(probs.log(), torch.zeros(1, 1, dtype=torch.long), torch.arange(2)[None],
                             torch.zeros(1, 1, dtype=torch.long))
    return confidence[0]


def test_static_regime_ranks_on_the_grid_and_thresholds_see_exact_values():
    exact = _confidences()
    assert exact.argmax() == 1 and exact[1] > exact[0]
    rounded = _confidences(confidence_resolution=0.1)
    assert torch.allclose(rounded, torch.tensor([0.9, 0.9])) and rounded.argmax() == 0  # a tie: leftmost first
    assert torch.equal(_confidences(confidence_resolution=0.1, threshold=0.92), exact)


@pytest.mark.parametrize("value", [0, 1.0, -0.1, float("nan"), "0.05", True])
def test_bad_resolution_fails_with_one_line(value):
    with pytest.raises((ValueError, TypeError), match="confidence_resolution"):
        MRPGenerationConfig(max_new_tokens=8, confidence_resolution=value)


def test_speculative_stays_identical_to_static_on_the_grid():
    from mrp_hf.reference import held_out_items, load_reference

    model, tokenizer = load_reference()
    tokenizer.padding_side = "left"
    batch = tokenizer([item.prompt for item in held_out_items(per_task=2, seed=3)], return_tensors="pt", padding=True,
                      add_special_tokens=False)
    for resolution in (None, 0.05, 0.2):
        static = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"],
                                confidence_resolution=resolution)
        for k in (2, 4):
            out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], mrp_mode="speculative",
                                 mrp_draft_tokens=k, confidence_resolution=resolution)
            assert torch.equal(out, static), (resolution, k)
