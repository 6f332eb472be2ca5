"""MRPConfig / MRPHead: architecture, head-only artifact, Auto classes, and refusing a wrong backbone."""

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from stand_ins import load_stand_in, save_stand_in
from transformers import AutoConfig, AutoModel

import mrp_hf
from mrp_hf import MRPConfig, MRPHead, MRPModel


@pytest.fixture(scope="module")
def sdar(tmp_path_factory):
    path = save_stand_in("sdar", tmp_path_factory.mktemp("sdar") / "sdar")
    return path, mrp_hf.load_backbone(str(path), trust_remote_code=True)


def head_for(model, **overrides):
    adapter = mrp_hf.get_adapter(model, mask_token_id=STAND_IN_MASK_ID)
    config = MRPConfig.for_backbone(adapter, num_hidden_layers=2, **overrides)
    return MRPHead(config), adapter


def test_untrained_head_outputs_zero_residual(sdar):
    head, adapter = head_for(sdar[1])
    h_a = torch.randn(2, 6, adapter.hidden_size)
    e = adapter.get_input_embeddings()(torch.randint(0, 100, (2, 6)))
    assert torch.equal(head(e, h_a), torch.zeros_like(h_a))
    narrow, _ = head_for(sdar[1], head_hidden_size=16, num_attention_heads=4)
    assert torch.equal(narrow(e, h_a), torch.zeros_like(h_a))


def test_head_is_trainable_and_attention_follows_the_mask(sdar):
    head, adapter = head_for(sdar[1])
    torch.nn.init.ones_(head.norm.weight)  # as after some training
    h_a = torch.randn(1, 8, adapter.hidden_size)
    e = torch.randn(1, 8, adapter.hidden_size)
    out = head(e, h_a)
    out.sum().backward()
    assert head.fuse.weight.grad is not None and head.fuse.weight.grad.abs().sum() > 0
    # block-diagonal mask: changing the second half does not move the first half
    block = torch.arange(8) // 4
    mask = (block[None, :] == block[:, None])[None, None]
    e2 = e.clone()
    e2[:, 4:] += 1.0
    with torch.no_grad():
        a, b = head(e, h_a, attention_mask=mask), head(e2, h_a, attention_mask=mask)
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_save_writes_only_head_weights_and_auto_classes_load_it(sdar, tmp_path):
    head, adapter = head_for(sdar[1], base_model_name_or_path=str(sdar[0]))
    head.save_pretrained(tmp_path / "head")
    files = sorted(str(p.relative_to(tmp_path / "head")) for p in (tmp_path / "head").rglob("*") if p.is_file())
    # weights, config, and the small code files its auto_map and custom_generate need (mrp_hf/hub.py)
    assert files == ["config.json", "configuration_mrp.py", "custom_generate/generate.py",
                     "custom_generate/requirements.txt", "model.safetensors", "modeling_mrp.py"]
    from safetensors import safe_open

    with safe_open(str(tmp_path / "head" / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert all(not n.startswith(("embed_tokens", "lm_head", "model.")) for n in names)
    n_params = sum(p.numel() for p in head.parameters())
    assert n_params < sum(p.numel() for p in sdar[1].parameters()) * 3
    config = AutoConfig.from_pretrained(tmp_path / "head")
    assert isinstance(config, MRPConfig) and config.backbone_family == "sdar"
    assert config.vocab_size == adapter.vocab_size and config.mask_token_id == STAND_IN_MASK_ID
    loaded = AutoModel.from_pretrained(tmp_path / "head")
    assert isinstance(loaded, MRPHead)
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)


def test_from_pretrained_loads_the_named_backbone_and_generates(sdar, tmp_path):
    head, _ = head_for(sdar[1], base_model_name_or_path=str(sdar[0]))
    head.save_pretrained(tmp_path / "head")
    model = MRPModel.from_pretrained(str(tmp_path / "head"), trust_remote_code=True)
    assert model.head is not None and model.adapter.family == "sdar"
    ids = torch.tensor([[5, 17, 33, 9]])
    out = model.generate(ids, max_new_tokens=8, block_length=4)
    plain = MRPModel.from_backbone(sdar[1], mask_token_id=STAND_IN_MASK_ID).generate(ids, max_new_tokens=8, block_length=4)
    assert torch.equal(out, plain)
    # attach onto a backbone already in memory, PEFT-style
    model2 = MRPModel.from_pretrained(str(tmp_path / "head"), backbone=sdar[1])
    assert model2.backbone is sdar[1]
    backbone = mrp_hf.attach(sdar[1], MRPHead.from_pretrained(tmp_path / "head"), mask_token_id=STAND_IN_MASK_ID)
    assert torch.equal(backbone.generate(ids, max_new_tokens=8, block_length=4), plain)


def test_wrong_backbone_is_refused(sdar, tmp_path):
    head, _ = head_for(sdar[1], base_model_name_or_path=str(sdar[0]))
    cases = {"vocab size 999": dict(vocab_size=999), "mask token id 7": dict(mask_token_id=7)}
    for message, override in cases.items():
        config = MRPConfig(**{**head.config.to_dict(), **override})
        with pytest.raises(ValueError, match=message):
            mrp_hf.modeling_mrp.check_head_matches_backbone(config, mrp_hf.get_adapter(sdar[1], mask_token_id=STAND_IN_MASK_ID))
    wide = load_stand_in("sdar", tmp_path / "wide", hidden_size=64)
    with pytest.raises(ValueError, match=r"hidden size 32, but the backbone has 64"):
        mrp_hf.modeling_mrp.check_head_matches_backbone(head.config, mrp_hf.get_adapter(wide, mask_token_id=STAND_IN_MASK_ID))
    # same shapes, other weights: only the fingerprint tells them apart
    other = load_stand_in("sdar", tmp_path / "other")
    with torch.no_grad():
        other.get_input_embeddings().weight.mul_(1.5)
    with pytest.raises(ValueError, match="fingerprint"):
        mrp_hf.modeling_mrp.check_head_matches_backbone(head.config, mrp_hf.get_adapter(other, mask_token_id=STAND_IN_MASK_ID))
    mrp_hf.modeling_mrp.check_head_matches_backbone(
        head.config, mrp_hf.get_adapter(other, mask_token_id=STAND_IN_MASK_ID), strict=False
    )
    # a bf16 load of the same backbone still matches
    bf16 = mrp_hf.load_backbone(str(sdar[0]), trust_remote_code=True, torch_dtype=torch.bfloat16)
    mrp_hf.modeling_mrp.check_head_matches_backbone(head.config, mrp_hf.get_adapter(bf16, mask_token_id=STAND_IN_MASK_ID))


def test_pickle_head_is_refused(sdar, tmp_path):
    head, _ = head_for(sdar[1], base_model_name_or_path=str(sdar[0]))
    folder = tmp_path / "pickled"
    head.save_pretrained(folder, safe_serialization=False) if "safe_serialization" in head.save_pretrained.__code__.co_varnames else None
    if not (folder / "pytorch_model.bin").exists():  # transformers 5 always writes safetensors: write the pickle by hand
        folder.mkdir(exist_ok=True)
        head.config.save_pretrained(folder)
        torch.save(head.state_dict(), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink(missing_ok=True)
    with pytest.raises((OSError, ValueError), match=r"(?i)safetensors"):
        MRPModel.from_pretrained(str(folder), backbone=sdar[1])


def test_head_modes_need_a_head_and_are_not_silently_run(sdar):
    model = MRPModel.from_backbone(sdar[1], mask_token_id=STAND_IN_MASK_ID)
    with pytest.raises(ValueError, match="needs an MRP head"):
        model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=4, block_length=4, mrp_mode="speculative")


def _mock_hub(monkeypatch):
    """HfApi's calls recorded, nothing sent (no network)."""
    from huggingface_hub import CommitOperationAdd, HfApi, RepoUrl

    calls = {}

    def create_repo(self, repo_id, **kwargs):
        calls["create_repo"] = dict(kwargs, repo_id=repo_id, token=self.token)
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_branch(self, repo_id, **kwargs):
        calls["create_branch"] = dict(kwargs, repo_id=repo_id)

    def create_commit(self, repo_id, operations, **kwargs):
        assert all(isinstance(op, CommitOperationAdd) for op in operations)
        calls["create_commit"] = dict(kwargs, repo_id=repo_id, token=self.token)
        calls["files"] = {op.path_in_repo: op for op in operations}
        calls["card"] = dict(calls["files"])["README.md"].path_or_fileobj
        calls["card_text"] = open(calls["card"], encoding="utf-8").read()
        return "commit-info"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_branch", create_branch)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    return calls


def test_push_to_hub_sends_exactly_the_head_files_and_a_model_card(sdar, monkeypatch):
    head, _ = head_for(sdar[1], base_model_name_or_path="org/sdar-tiny")
    head.config.training = {"data": "chat.jsonl (1000 samples)", "steps": 300,
                            "metrics": {"agreement": 0.61, "baseline_agreement": 0.42, "kl": 0.8, "baseline_kl": 1.3}}
    sent = _mock_hub(monkeypatch)
    assert head.push_to_hub("me/sdar-tiny-mrp") == "commit-info"
    assert sent["create_repo"]["repo_id"] == sent["create_commit"]["repo_id"] == "me/sdar-tiny-mrp"
    assert sorted(sent["files"]) == ["README.md", "config.json", "configuration_mrp.py", "custom_generate/generate.py",
                                     "custom_generate/requirements.txt", "model.safetensors", "modeling_mrp.py"]
    assert "create_branch" not in sent
    commit = sent["create_commit"]
    assert (commit["commit_message"], commit["revision"], commit["create_pr"]) == ("Upload MRP head", None, False)
    card = head.model_card("me/sdar-tiny-mrp")
    assert card == sent["card_text"]
    for text in ("library_name: mrp-hf", "base_model: org/sdar-tiny", "chat.jsonl (1000 samples)",
                 "| training steps | 300 |", "0.6100", "0.4200"):
        assert text in card


def test_push_to_hub_passes_on_private_revision_create_pr_message_and_token(sdar, monkeypatch):
    from huggingface_hub import ModelCard

    head, _ = head_for(sdar[1], base_model_name_or_path="org/sdar-tiny")
    sent = _mock_hub(monkeypatch)
    head.push_to_hub("me/x", commit_message="v2 head", private=True, token="hf_test", revision="v2", create_pr=True,
                     commit_description="longer run", tags=["gsm8k"])
    assert sent["create_repo"]["private"] is True and sent["create_repo"]["token"] == "hf_test"
    assert sent["create_branch"] == {"repo_id": "me/x", "branch": "v2", "exist_ok": True}
    commit = sent["create_commit"]
    assert (commit["commit_message"], commit["commit_description"], commit["revision"], commit["create_pr"]) == (
        "v2 head", "longer run", "v2", True
    )
    assert commit["token"] == "hf_test"
    card = ModelCard(sent["card_text"])  # the metadata parses back as a model card
    assert card.data.library_name == "mrp-hf" and card.data.base_model == "org/sdar-tiny"
    assert {"mrp", "sdar", "gsm8k"} <= set(card.data.tags)
    assert 'MRPModel.from_pretrained("me/x"' in card.text


def test_head_by_repo_id_from_a_hub_cache_offline(tmp_path, monkeypatch):
    from test_loading import _hub_cache, _offline_in_process

    _offline_in_process(monkeypatch)
    backbone_dir = save_stand_in("sdar", tmp_path / "backbone")
    backbone = mrp_hf.load_backbone(str(backbone_dir), trust_remote_code=True)
    head, _ = head_for(backbone, base_model_name_or_path="tiny-org/tiny-sdar")
    head.save_pretrained(tmp_path / "head")
    cache = tmp_path / "cache"
    _hub_cache(backbone_dir, cache, repo_id="tiny-org/tiny-sdar")
    _hub_cache(tmp_path / "head", cache, repo_id="tiny-org/tiny-sdar-mrp")
    model = MRPModel.from_pretrained(
        "tiny-org/tiny-sdar-mrp", trust_remote_code=True, cache_dir=str(cache), local_files_only=True
    )
    assert model.adapter.family == "sdar" and model.adapter.mask_token_id == STAND_IN_MASK_ID
    ids = torch.tensor([[5, 17, 33, 9]])
    expected = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID).generate(ids, max_new_tokens=8, block_length=4)
    assert torch.equal(model.generate(ids, max_new_tokens=8, block_length=4), expected)


def test_head_names_a_peft_adapter_that_is_loaded_on_the_backbone(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    backbone_dir = save_stand_in("sdar", tmp_path / "backbone")
    base = mrp_hf.load_backbone(str(backbone_dir), trust_remote_code=True)
    torch.manual_seed(3)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    adapted = PeftModel.from_pretrained(mrp_hf.load_backbone(str(backbone_dir), trust_remote_code=True), tmp_path / "adapter")
    head, _ = head_for(adapted, base_model_name_or_path=str(backbone_dir), peft_adapter_id=str(tmp_path / "adapter"))
    head.save_pretrained(tmp_path / "head")
    model = MRPModel.from_pretrained(str(tmp_path / "head"), trust_remote_code=True)
    assert isinstance(model.backbone, PeftModel)
    ids = torch.tensor([[5, 17, 33, 9]])
    with_adapter = MRPModel.from_backbone(adapted, mask_token_id=STAND_IN_MASK_ID).generate(ids, max_new_tokens=8, block_length=4)
    without = MRPModel.from_backbone(
        mrp_hf.load_backbone(str(backbone_dir), trust_remote_code=True), mask_token_id=STAND_IN_MASK_ID
    ).generate(ids, max_new_tokens=8, block_length=4)
    out = model.generate(ids, max_new_tokens=8, block_length=4)
    assert torch.equal(out, with_adapter)
    assert not torch.equal(with_adapter, without)  # the adapter really changes the backbone


def test_a_loaded_head_has_the_buffers_of_a_built_one(tmp_path):
    """transformers 5 loads on the meta device: non-persistent buffers (the rotary frequencies) must be rebuilt
    from the config, not left as uninitialised memory (which made the head's outputs zeros or NaN at random)."""
    import torch

    from mrp_hf import MRPConfig, MRPHead

    config = MRPConfig(hidden_size=32, vocab_size=50, num_hidden_layers=1, num_attention_heads=4, head_hidden_size=16)
    built = MRPHead(config)
    built.save_pretrained(tmp_path)
    loaded = MRPHead.from_pretrained(tmp_path)
    buffers = dict(built.named_buffers())
    assert buffers, "the head has no buffers: this test checks nothing"
    for name, value in loaded.named_buffers():
        torch.testing.assert_close(value, buffers[name], msg=name)
