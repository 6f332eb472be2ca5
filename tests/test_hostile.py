"""Hostile and careless input (issue 10): concurrent generate calls, heads that lie about their backbone,
arguments that would give garbage, non-finite logits."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from stand_ins import load_stand_in, save_stand_in
from test_speculative import batch, make_head
from transformers import AutoModel

import mrp_hf
from mrp_hf import MRPConfig, MRPHead, MRPModel
from mrp_hf.generation.guard import NonFiniteOutputError


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


# ------------------------------------------------------------------------------- heads that lie about their backbone
@pytest.fixture(scope="module")
def saved_backbones(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_backbones")
    overrides = {"sdar": {"mask_token_id": None}}  # an SDAR config.json without the field: the tokenizer's mask id
    return {family: save_stand_in(family, root / family, **overrides.get(family, {})) for family in ("sdar", "llada", "dream")}


def _saved_head(backbone_dir, folder, **config_overrides):
    """A real head for the backbone saved at `backbone_dir`, saved to `folder` with edited config fields."""
    backbone = mrp_hf.load_backbone(str(backbone_dir), trust_remote_code=True)
    adapter = mrp_hf.get_adapter(backbone, mask_token_id=STAND_IN_MASK_ID)
    head = MRPHead(MRPConfig.for_backbone(adapter, base_model_name_or_path=str(backbone_dir), num_hidden_layers=1))
    head.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(config_overrides)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("family", ["sdar", "llada"])  # mask id in the tokenizer (sdar) or in the config (llada)
def test_a_head_cannot_change_the_backbones_mask_id(saved_backbones, tmp_path, family):
    head_dir = _saved_head(saved_backbones[family], tmp_path / "head", mask_token_id=3)
    with pytest.raises(ValueError, match=r"mask token id 3, but the backbone has 126"):
        MRPModel.from_pretrained(str(head_dir), trust_remote_code=True)
    backbone = mrp_hf.load_backbone(str(saved_backbones[family]), trust_remote_code=True)
    head = MRPHead.from_pretrained(head_dir)
    with pytest.raises(ValueError, match=r"mask token id 3, but the backbone has 126"):
        MRPModel.from_backbone(backbone, head=head, mask_token_id=STAND_IN_MASK_ID)
    if family == "llada":  # the config declares the mask id: the head's claim is compared with it
        with pytest.raises(ValueError, match=r"mask token id 3, but the backbone has 126"):
            MRPModel.from_backbone(backbone, head=head)


def test_a_head_cannot_choose_the_backbones_family(saved_backbones, tmp_path):
    head_dir = _saved_head(saved_backbones["sdar"], tmp_path / "head", backbone_family="llada")
    with pytest.raises(ValueError, match=r"trained on a 'llada' backbone.*detected as 'sdar'"):
        MRPModel.from_pretrained(str(head_dir), trust_remote_code=True)
    # a Dream head on LLaDA: refused at load time (it used to get the Dream adapter and crash inside generate)
    dream_head = _saved_head(saved_backbones["dream"], tmp_path / "dream_head")
    llada = mrp_hf.load_backbone(str(saved_backbones["llada"]), trust_remote_code=True)
    with pytest.raises(ValueError, match=r"trained on a 'dream' backbone.*detected as 'llada'"):
        MRPModel.from_backbone(llada, head=MRPHead.from_pretrained(dream_head))


def test_a_head_without_fingerprint_is_refused_when_strict(saved_backbones, tmp_path):
    head_dir = _saved_head(saved_backbones["sdar"], tmp_path / "head", backbone_fingerprint=None)
    with pytest.raises(ValueError, match="no fingerprint"):
        MRPModel.from_pretrained(str(head_dir), trust_remote_code=True)
    model = MRPModel.from_pretrained(str(head_dir), trust_remote_code=True, strict=False)
    assert model.head is not None


def test_a_relative_base_path_must_stay_beside_the_head(saved_backbones, tmp_path):
    elsewhere = tmp_path / "elsewhere" / "x"
    shutil.copytree(saved_backbones["sdar"], elsewhere)
    nested = tmp_path / "a" / "b" / "head"
    _saved_head(saved_backbones["sdar"], nested, base_model_name_or_path="../../../elsewhere/x")
    with pytest.raises(ValueError, match="outside"):
        MRPModel.from_pretrained(str(nested), trust_remote_code=True)
    # beside the head (inside the folder holding it) is fine: the bundled layout checkpoints/{head,backbone}
    beside = tmp_path / "a" / "b" / "backbone"
    shutil.copytree(saved_backbones["sdar"], beside)
    _saved_head(saved_backbones["sdar"], nested, base_model_name_or_path="../backbone")
    assert MRPModel.from_pretrained(str(nested), trust_remote_code=True).head is not None
    # a head from the Hub must name a Hub id
    with pytest.raises(ValueError, match="comes from the Hub"):
        mrp_hf.modeling_mrp._base_model_location("../backbone", "someone/some-head")
    with pytest.raises(ValueError, match="comes from the Hub"):
        mrp_hf.modeling_mrp._base_model_location("/etc", "someone/some-head")
    assert mrp_hf.modeling_mrp._base_model_location("GSAI-ML/LLaDA-8B-Instruct", "someone/some-head") == "GSAI-ML/LLaDA-8B-Instruct"


def test_absurd_head_sizes_are_refused_before_building(saved_backbones, tmp_path):
    head_dir = _saved_head(saved_backbones["sdar"], tmp_path / "head", num_hidden_layers=10**6)
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"num_hidden_layers=1000000 is outside"):
        MRPHead.from_pretrained(head_dir)
    with pytest.raises(ValueError, match=r"num_hidden_layers=1000000 is outside"):
        AutoModel.from_pretrained(head_dir)
    assert time.perf_counter() - started < 30


def test_head_weights_must_match_the_config(saved_backbones, tmp_path):
    from safetensors.torch import load_file, save_file

    head_dir = _saved_head(saved_backbones["sdar"], tmp_path / "head")
    weights = load_file(head_dir / "model.safetensors")
    dropped = sorted(weights)[0]
    save_file({k: v for k, v in weights.items() if k != dropped}, head_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"missing \['{re.escape(dropped)}'\]"):
        MRPHead.from_pretrained(head_dir)
    with pytest.raises(ValueError, match="missing"):
        MRPModel.from_pretrained(str(head_dir), trust_remote_code=True)
    # a config asking for two layers over a file holding one: the second layer's tensors are missing
    two = _saved_head(saved_backbones["sdar"], tmp_path / "two", num_hidden_layers=2)
    with pytest.raises(ValueError, match=r"missing \['layers\.1\."):
        MRPHead.from_pretrained(two)
    # same names, other shapes
    wide = _saved_head(saved_backbones["sdar"], tmp_path / "wide", intermediate_size=7)
    with pytest.raises(ValueError, match="the config builds"):
        MRPHead.from_pretrained(wide)


# ------------------------------------------------------------------------- arguments that would give garbage
@pytest.fixture(scope="module")
def plain(models):
    return MRPModel.from_backbone(models["sdar"], mask_token_id=STAND_IN_MASK_ID)


PROMPT = torch.tensor([[5, 6, 7, 8]])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(temperature=float("inf")), ValueError, r"temperature=inf is not a finite number"),
        (dict(temperature=float("nan")), ValueError, r"temperature=nan is not a finite number"),
        (dict(temperature=1e300), ValueError, r"temperature=1e\+300 is outside \[0.0001, 100.0\]"),
        (dict(temperature=1e-300), ValueError, r"temperature=1e-300 is outside"),
        (dict(temperature="0.7"), TypeError, r"temperature='0.7' must be a number"),
        (dict(threshold="0.5"), TypeError, r"threshold='0.5' must be a number"),
        (dict(threshold=float("nan")), ValueError, r"threshold=nan is not a finite number"),
        (dict(top_p=float("nan")), ValueError, r"top_p=nan"),
        (dict(remask_delta=float("nan")), ValueError, r"remask_delta=nan is not a finite number"),
        (dict(remask_delta=-1.0), ValueError, r"remask_delta=-1.0 is negative"),
        (dict(temperature=0.7, seed=None), ValueError, r"seed=None with temperature > 0"),
        (dict(temperature=0.7, seed=1.5), TypeError, r"seed=1.5 must be an int"),
        (dict(top_k=True), ValueError, r"top_k=True must be a positive int"),
        (dict(pad_token_id=128), ValueError, r"pad_token_id=128 is not a token id of this model \(ids run from 0 to 127\)"),
        (dict(pad_token_id=-1), ValueError, r"pad_token_id=-1 must be a token id"),
        (dict(generation_config={"max_new_tokens": 8}), TypeError, r"generation_config must be a transformers GenerationConfig"),
    ],
)
def test_bad_generate_arguments_are_refused(plain, kwargs, error, message):
    with pytest.raises(error, match=message):
        plain.generate(PROMPT, **{"max_new_tokens": 8, "block_length": 4, **kwargs})


def test_eos_outside_the_vocabulary_only_warns(plain):
    out = plain.generate(PROMPT, max_new_tokens=8, block_length=4, eos_token_id=[4000])
    assert out.shape == (1, 12)


def test_huge_max_new_tokens_is_refused_before_allocating(plain):
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"max_new_tokens \(1000000000\) needs position"):
        plain.generate(PROMPT, max_new_tokens=10**9, block_length=4)
    assert time.perf_counter() - started < 5  # a canvas of 10**9 ids would take seconds and 8 GB


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.zeros(0, 4, dtype=torch.long), r"empty batch"),
        (torch.tensor([[5, 6, 128, 8]]), r"input_ids\[0, 2\] = 128 is not a token id of this model \(ids run from 0 to 127\)"),
        (torch.tensor([[5, -3, 7, 8]]), r"input_ids\[0, 1\] = -3 is not a token id"),
        (torch.tensor([[5, 6, STAND_IN_MASK_ID, 8]]), r"input_ids\[0, 2\] is the mask token \(126\)"),
    ],
)
def test_bad_prompt_ids_are_refused(plain, ids, message):
    with pytest.raises(ValueError, match=message):
        plain.generate(ids, max_new_tokens=8, block_length=4)


def test_mask_token_as_left_padding_is_fine(plain):
    ids = torch.tensor([[STAND_IN_MASK_ID, 5, 6, 7], [4, 5, 6, 7]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    out = plain.generate(ids, attention_mask=mask, max_new_tokens=8, block_length=4)
    alone = plain.generate(ids[:1, 1:], max_new_tokens=8, block_length=4)
    assert torch.equal(out[0, 1:], alone[0])


# --------------------------------------------------------------------------------------------- non-finite logits
@pytest.mark.parametrize("mode", ["speculative", "direct", "remask"])
def test_nan_in_the_head_raises_naming_the_head(models, mode):
    backbone = models["sdar"]
    head = make_head(backbone, "random")
    with torch.no_grad():
        head.fuse.weight[0, 0] = float("nan")
    model = MRPModel.from_backbone(backbone, head=head, mask_token_id=STAND_IN_MASK_ID)
    kwargs = dict(max_new_tokens=8, block_length=4, mrp_mode=mode)
    if mode == "remask":
        kwargs["threshold"] = 0.05  # several proposals per step: the head judges them
    with pytest.raises(NonFiniteOutputError, match="the MRP head produced NaN"):
        model.generate(torch.tensor([[5, 17, 33, 9, 60]]), **kwargs)


@pytest.mark.parametrize("threshold", [None, 0.9])
def test_nan_in_the_backbone_raises_naming_the_backbone(tmp_path, threshold):
    backbone = load_stand_in("sdar", tmp_path / "sdar")
    with torch.no_grad():
        backbone.get_output_embeddings().weight[7, 3] = float("nan")
    model = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    with pytest.raises(NonFiniteOutputError, match="the backbone produced NaN"):
        model.generate(PROMPT, max_new_tokens=8, block_length=4, threshold=threshold)
