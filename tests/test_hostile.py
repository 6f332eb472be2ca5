"""Hostile and careless input (issue 10): concurrent generate calls, heads that lie about their backbone,
arguments that would give garbage, non-finite logits."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from test_speculative import batch, make_head

from mrp_hf import MRPModel


# ------------------------------------------------------------------------------------------------- threads
@pytest.mark.parametrize("mode", ["speculative", "direct", "remask"])
def test_generate_from_several_threads_on_one_model(models, mode, monkeypatch):
    """Each call captures its own h_A: a hook shared by threads used to catch the other thread's forward."""
    backbone = models["sdar"]
    lm_head = backbone.get_output_embeddings()
    projection = lm_head.forward

    def slow_projection(hidden):  # a large vocabulary's projection: the window in which the threads overlap
        time.sleep(0.002)
        return projection(hidden)

    monkeypatch.setattr(lm_head, "forward", slow_projection)
    model = MRPModel.from_backbone(backbone, head=make_head(backbone, "random"), mask_token_id=STAND_IN_MASK_ID)
    prompts = [batch([[5, 17, 33, 9, 60, 2, 71, 40], [9, 60, 2]]), batch([[44, 45, 46, 47, 48]]), batch([[7, 8, 9]])]
    kwargs = dict(max_new_tokens=8, block_length=4, mrp_mode=mode)
    if mode == "remask":
        kwargs["threshold"] = 0.3
    expected = [model.generate(ids, attention_mask=mask, **kwargs) for ids, mask in prompts]
    errors: list[BaseException] = []
    mismatches: list[int] = []

    def worker(offset: int) -> None:
        try:
            for i in range(12):
                which = (i + offset) % len(prompts)
                ids, mask = prompts[which]
                if not torch.equal(model.generate(ids, attention_mask=mask, **kwargs), expected[which]):
                    mismatches.append(which)
        except BaseException as exc:  # noqa: BLE001 - reported below with the thread's error
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(offset,)) for offset in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors[0]
    assert not mismatches
    assert not lm_head._forward_pre_hooks, "no hook may stay on the user's lm_head after generate"
