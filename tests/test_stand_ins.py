"""Checks that the tiny family stand-ins load through remote code and behave like their families."""

from __future__ import annotations

import dataclasses
import operator

import pytest
import torch
import transformers
from transformers.cache_utils import DynamicCache

try:
    from stand_ins import FAMILIES, accept_new_validate_keywords, load_stand_in, save_stand_in
except ImportError:  # tests/ imported as a package
    from tests.stand_ins import FAMILIES, accept_new_validate_keywords, load_stand_in, save_stand_in

TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5

BLOCK = 4
VOCAB = 128
BLOCK_CAUSAL = ("sdar", "fast_dllm_v2", "llada2")
PATHS = {  # family -> (input embedding, final norm, lm_head) attribute paths on the LM class
    "llada": ("model.transformer.wte", "model.transformer.ln_f", "model.transformer.ff_out"),
    "dream": ("model.embed_tokens", "model.norm", "lm_head"),
    "sdar": ("model.embed_tokens", "model.norm", "lm_head"),
    "fast_dllm_v2": ("model.embed_tokens", "model.norm", "lm_head"),
    "llada2": ("model.word_embeddings", "model.norm", "lm_head"),
}


@pytest.fixture(scope="module")
def model_of(tmp_path_factory):
    loaded = {}

    def get(family):
        if family not in loaded:
            loaded[family] = load_stand_in(family, tmp_path_factory.mktemp(family))
        return loaded[family]

    return get


def _ids(batch=2, length=12, seed=1):
    return torch.randint(1, 120, (batch, length), generator=torch.Generator().manual_seed(seed))


def _block_allowed(q_start, q_len, kv_len, block=BLOCK):
    """Bool [q_len, kv_len]: query at absolute index q_start + i sees key j iff block(q) >= block(j)."""
    q = torch.arange(q_start, q_start + q_len)[:, None] // block
    return q >= torch.arange(kv_len)[None, :] // block


def _cache(out):
    """The cache field of a model output ('past_key_values' on transformers 4, 'cache' on 5)."""
    names = {f.name for f in dataclasses.fields(out)}
    return getattr(out, "cache" if "cache" in names else "past_key_values")


def _forward(family, model, ids, q_start=0, positions=None, **kwargs):
    """One forward the way the family's own generate code calls it (no cache)."""
    length = ids.shape[1]
    if positions is None:
        positions = torch.arange(q_start, q_start + length)[None]
    if family == "sdar":
        mask = _block_allowed(q_start, length, q_start + length)[None].float()  # [1, q, kv] 0/1 as in generate
        return model(ids, attention_mask=mask, position_ids=positions, **kwargs)
    if family == "llada2":
        allowed = _block_allowed(q_start, length, q_start + length)[None, None]
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))  # additive, as in generate
        return model(ids, attention_mask=mask, position_ids=positions, **kwargs)
    if family == "fast_dllm_v2":
        return model(ids, block_size=BLOCK, position_ids=positions, **kwargs)
    if family == "dream":
        return model(ids, position_ids=positions, **kwargs)
    return model(ids, **kwargs)  # LLaDA: no position_ids argument, positions are 0..L-1


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_loads_through_remote_code_with_hub_names(family, tmp_path):
    spec = FAMILIES[family]
    path = save_stand_in(family, tmp_path / family)
    for name in (spec.config_file, spec.modeling_file, "config.json", "model.safetensors"):
        assert (path / name).is_file()
    config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=True)
    assert config.model_type == spec.model_type
    assert list(config.architectures) == list(spec.architectures)
    assert config.auto_map == spec.auto_map
    assert (getattr(config, "mask_token_id", None) == 126) is spec.mask_in_config
    if spec.block_size_field is not None:  # the trained block size is in config.json (SDAR: 4, Fast-dLLM v2: 4)
        assert getattr(config, spec.block_size_field) == 4
    if spec.generation_config is not None:  # Dream on transformers 5: see test_dream_generation_config_*
        path = save_stand_in(family, tmp_path / f"{family}_validate_widened")
        accept_new_validate_keywords(path)
    for auto_name, target in spec.auto_map.items():
        if auto_name == "AutoConfig":
            continue
        model = getattr(transformers, auto_name).from_pretrained(str(path), trust_remote_code=True)
        assert type(model).__name__ == target.split(".")[-1]
        if spec.generation_config is not None:  # the model read generation_config.json with its own class
            assert type(model.generation_config).__name__ == "DreamGenerationConfig"
            assert model.generation_config.alg == "entropy" and model.generation_config.mask_token_id == 126
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), trust_remote_code=True)
    assert tokenizer.mask_token == spec.mask_token
    assert tokenizer.mask_token_id == 126
    assert tokenizer.convert_tokens_to_ids(spec.mask_token) == 126


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_shape_and_spread(family, model_of):
    with torch.no_grad():
        logits = _forward(family, model_of(family), _ids()).logits
    assert logits.shape == (2, 12, VOCAB)
    assert torch.isfinite(logits).all()
    top = logits.softmax(-1).max(-1)
    assert top.indices.unique().numel() > 6  # argmaxes differ across positions
    assert 0.1 < top.values.mean() < 0.9 and top.values.std() > 0.05  # confidences are spread


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_module_paths(family, model_of):
    model = model_of(family)
    emb_path, norm_path, head_path = PATHS[family]
    emb, norm, head = (operator.attrgetter(p)(model) for p in (emb_path, norm_path, head_path))
    assert emb is model.get_input_embeddings()
    assert head is model.get_output_embeddings()
    captured = {}
    handle = norm.register_forward_hook(lambda module, args, output: captured.setdefault("h", output))
    try:
        with torch.no_grad():
            logits = _forward(family, model, _ids()).logits
    finally:
        handle.remove()
    torch.testing.assert_close(head(captured["h"]).float(), logits)


@pytest.mark.parametrize("family", ["dream", "sdar", "fast_dllm_v2", "llada2"])
def test_position_ids_are_used(family, model_of):
    model, ids = model_of(family), _ids()
    with torch.no_grad():
        default = model(ids, block_size=BLOCK) if family == "fast_dllm_v2" else None
        base = _forward(family, model, ids).logits
        gapped = torch.cat([torch.arange(6), torch.arange(11, 17)])[None]  # relative distances change
        shifted = _forward(family, model, ids, positions=gapped).logits
    if default is not None:  # without position_ids the cache position (0..L-1) is used
        torch.testing.assert_close(default.logits, base)
    assert (base - shifted).abs().max() > 1e-2


def test_same_seed_same_weights(tmp_path):
    a = load_stand_in("dream", tmp_path / "a")
    b = load_stand_in("dream", tmp_path / "b")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_bidirectional(family, model_of):
    model, ids = model_of(family), _ids()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 7) % 120
    with torch.no_grad():
        a, b = _forward(family, model, ids).logits, _forward(family, model, changed).logits
    assert not torch.allclose(a[:, 0], b[:, 0])


@pytest.mark.parametrize("family", BLOCK_CAUSAL)
def test_block_causal(family, model_of):
    model, ids = model_of(family), _ids()  # 12 tokens = 3 blocks of 4
    later, same = ids.clone(), ids.clone()
    later[:, 9] = (later[:, 9] + 7) % 120  # block 2
    same[:, 5] = (same[:, 5] + 7) % 120  # block 1
    with torch.no_grad():
        base = _forward(family, model, ids).logits
        out_later = _forward(family, model, later).logits
        out_same = _forward(family, model, same).logits
    torch.testing.assert_close(out_later[:, :8], base[:, :8])  # earlier blocks unaffected
    assert not torch.allclose(out_later[:, 8], base[:, 8])
    torch.testing.assert_close(out_same[:, :4], base[:, :4])
    assert not torch.allclose(out_same[:, 4], base[:, 4])  # same block: position 4 sees position 5
    assert not torch.allclose(out_same[:, 8:], base[:, 8:])


def test_llada_attends_to_padding_and_has_no_cache(model_of):
    """The real attention calls SDPA with attn_mask=None: attention_mask and attention_bias change nothing."""
    model, ids = model_of("llada"), _ids()
    mask = torch.ones_like(ids)
    mask[:, :3] = 0  # three left pads
    changed = ids.clone()
    changed[:, 1] = (changed[:, 1] + 7) % 120  # a different pad token
    hidden = torch.zeros(1, 1, 12, 12, dtype=torch.bool)
    with torch.no_grad():
        plain = model(ids).logits
        padded = model(ids, attention_mask=mask).logits
        other_pad = model(changed, attention_mask=mask).logits
        biased = model(ids, attention_bias=hidden).logits
    torch.testing.assert_close(padded, plain)  # the padding mask is ignored ...
    torch.testing.assert_close(biased, plain)  # ... and so is an attention bias
    assert not torch.allclose(other_pad[:, 3:], padded[:, 3:])  # real tokens attend to the pads
    with pytest.raises(AssertionError):
        model(ids, use_cache=True)
    out = model(ids, output_hidden_states=True)
    assert len(out.hidden_states) == model.config.n_layers + 1


def test_dream_mask_is_passed_to_sdpa_and_cache_grows_in_place(model_of):
    model, ids = model_of("dream"), _ids()
    allowed = _block_allowed(0, 12, 12)[None, None]  # bool [1, 1, q, kv], like Dream's generate builds
    with torch.no_grad():
        full = model(ids, attention_mask=allowed).logits
        cache = DynamicCache()
        out = model(ids[:, :8], attention_mask=allowed[..., :8, :8], past_key_values=cache)
        assert cache.get_seq_length() == 8  # appended in place ...
        assert "past_key_values" not in out and "cache" not in out  # ... and not returned (MaskedLMOutput)
        step = model(ids[:, 8:], attention_mask=allowed[..., 8:, :], past_key_values=cache).logits
    torch.testing.assert_close(step, full[:, 8:], rtol=1e-4, atol=1e-4)
    assert cache.get_seq_length() == 12


def test_sdar_store_kv_protocol(model_of):
    model, ids = model_of("sdar"), _ids()
    with torch.no_grad():
        full = _forward("sdar", model, ids).logits
        cache = DynamicCache()
        _forward("sdar", model, ids[:, :8], past_key_values=cache, use_cache=True, store_kv=True)
        assert cache.get_seq_length() == 8
        mask = torch.ones(1, BLOCK, 12)  # the current block sees the cached prefix and itself
        kwargs = dict(attention_mask=mask, position_ids=torch.arange(8, 12)[None], past_key_values=cache)
        for _ in range(2):  # denoising steps: read the cache, never write it
            step = model(ids[:, 8:], use_cache=True, store_kv=False, **kwargs)
            torch.testing.assert_close(step.logits, full[:, 8:], rtol=1e-4, atol=1e-4)
            assert cache.get_seq_length() == 8
        model(ids[:, 8:], use_cache=True, store_kv=True, **kwargs)  # commit the finished block
        assert cache.get_seq_length() == 12
        with pytest.raises(ValueError):
            model(ids, attention_mask=None)


def test_fast_dllm_v2_update_flag_and_block_cache(model_of):
    model, ids = model_of("fast_dllm_v2"), _ids()
    with torch.no_grad():
        full = model(ids, block_size=BLOCK).logits
        ignored = model(ids, block_size=BLOCK, attention_mask=torch.zeros_like(ids)).logits
        torch.testing.assert_close(ignored, full)  # attention_mask is ignored at inference
        out = model(ids[:, :8], use_cache=True, update_past_key_values=True, block_size=BLOCK)
        cache = _cache(out)
        assert cache.get_seq_length() == 8
        step = model(ids[:, 8:], use_cache=True, past_key_values=cache, update_past_key_values=False, block_size=BLOCK)
        torch.testing.assert_close(step.logits, full[:, 8:], rtol=1e-4, atol=1e-4)
        assert cache.get_seq_length() == 8
        # Block cache: the whole block once, then only a sub-block written at replace_position.
        first = model(ids[:, 8:], use_cache=True, past_key_values=cache, use_block_cache=True, block_size=BLOCK)
        block_cache = first.block_past_key_values
        assert block_cache.get_seq_length() == BLOCK
        sub = model(
            ids[:, 10:],
            use_cache=True,
            past_key_values=cache,
            use_block_cache=True,
            block_past_key_values=block_cache,
            replace_position=2,
        )
        torch.testing.assert_close(sub.logits, full[:, 10:], rtol=1e-4, atol=1e-4)
        assert cache.get_seq_length() == 8 and block_cache.get_seq_length() == BLOCK
        model(ids[:, 8:], use_cache=True, past_key_values=cache, update_past_key_values=True, block_size=BLOCK)
        assert cache.get_seq_length() == 12
        # hidden_states is the final normalised state as one tensor (the Hub forward's), never a layer tuple
        out = model(ids, block_size=BLOCK, output_hidden_states=True)
        assert isinstance(out.hidden_states, torch.Tensor) and out.hidden_states.shape == (2, 12, 32)
        torch.testing.assert_close(model.lm_head(out.hidden_states), out.logits)


def test_llada2_append_only_cache_and_mask_rules(model_of):
    model, ids = model_of("llada2"), _ids()
    with torch.no_grad():
        full = _forward("llada2", model, ids).logits
        prefix = _forward("llada2", model, ids[:, :8], use_cache=True)
        cache = _cache(prefix)
        assert cache.get_seq_length() == 8
        allowed = _block_allowed(8, BLOCK, 12)[None, None]
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        kwargs = dict(attention_mask=mask, position_ids=torch.arange(8, 12)[None], use_cache=True)
        for _ in range(2):  # each in-block forward appends; crop it away again
            step = model(ids[:, 8:], past_key_values=cache, **kwargs)
            torch.testing.assert_close(step.logits, full[:, 8:], rtol=1e-4, atol=1e-4)
            assert step.logits.dtype == torch.float32
            assert cache.get_seq_length() == 12
            cache.crop(-BLOCK)  # negative crop works on transformers 4 and 5
            assert cache.get_seq_length() == 8
        # Without a 4-D mask (transformers 4.x's _prepare_4d_causal_attention_mask_for_sdpa + is_causal=False):
        # None or an all-ones 2-D mask gives NO mask, so a later token changes earlier logits ...
        changed = ids.clone()
        changed[:, 5] = (changed[:, 5] + 7) % 120
        a, b = model(ids).logits, model(changed).logits
        assert not torch.allclose(a[:, :5], b[:, :5])
        ones = torch.ones_like(ids)
        torch.testing.assert_close(model(ids, attention_mask=ones).logits, a)
        # ... while a 2-D mask with padding gives causal attention over the unpadded keys
        padded = ones.clone()
        padded[:, :2] = 0
        a, b = model(ids, attention_mask=padded).logits, model(changed, attention_mask=padded).logits
        torch.testing.assert_close(a[:, 2:5], b[:, 2:5])
        assert not torch.allclose(a[:, 5], b[:, 5])


def test_dream_generation_config_fails_on_transformers_5_like_the_hub_files(tmp_path):
    """Dream's own from_pretrained reads generation_config.json with DreamGenerationConfig, whose
    validate(self, is_init=False) rejects the keyword transformers 5 passes (the Hub files fail the same way)."""
    import inspect

    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    path = save_stand_in("dream", tmp_path / "dream_validate_check")  # a module name no other test loads
    config_cls = get_class_from_dynamic_module("generation_utils.DreamGenerationConfig", str(path))
    assert list(inspect.signature(config_cls.validate).parameters) == ["self", "is_init"]
    if TRANSFORMERS_5:
        with pytest.raises(TypeError, match=r"validate\(\) got an unexpected keyword argument 'user_set_attributes'"):
            transformers.AutoModel.from_pretrained(str(path), trust_remote_code=True)
    else:
        model = transformers.AutoModel.from_pretrained(str(path), trust_remote_code=True)
        assert type(model.generation_config).__name__ == "DreamGenerationConfig"
        assert (model.generation_config.steps, model.generation_config.eps) == (512, 1e-3)


@pytest.fixture(scope="module")
def dream_pair(tmp_path_factory):
    """The Hub Dream stand-in and Fast-dLLM's variant, saved with the same seed: the same weights."""
    root = tmp_path_factory.mktemp("dream_pair")
    return load_stand_in("dream", root), load_stand_in("dream_fast_dllm", root)


def test_dream_fast_dllm_variant_has_the_same_weights_and_ignores_position_ids(dream_pair):
    hub, variant = dream_pair
    for (name, x), (other, y) in zip(hub.state_dict().items(), variant.state_dict().items(), strict=True):
        assert name == other and torch.equal(x, y), name
    ids = _ids()
    with torch.no_grad():
        reference = hub(ids, attention_mask="full").logits
        torch.testing.assert_close(variant(ids, attention_mask="full").logits, reference, rtol=1e-5, atol=1e-5)
        gapped = torch.cat([torch.arange(6), torch.arange(11, 17)])[None]  # the Hub file uses it; Fast-dLLM's not
        torch.testing.assert_close(variant(ids, attention_mask="full", position_ids=gapped).logits, reference,
                                   rtol=1e-5, atol=1e-5)
        assert not torch.allclose(hub(ids, attention_mask="full", position_ids=gapped).logits, reference)


def test_dream_fast_dllm_variant_legacy_cache_protocol(dream_pair):
    _, model = dream_pair
    ids = _ids()
    with torch.no_grad():
        full = model(ids, "full", use_cache=True)
        cache = full.past_key_values  # a list of (k, v) per layer, k/v before RoPE: [B, S, kv_heads * head_dim]
        assert isinstance(cache, list) and len(cache) == 2 and len(cache[0]) == 2
        assert cache[0][0].shape == (2, 12, 2 * 8)
        prefix = [tuple(t[:, :8] for t in layer) for layer in cache]
        step = model(ids[:, 8:], "full", past_key_values=prefix, use_cache=True)
        torch.testing.assert_close(step.logits, full.logits[:, 8:], rtol=1e-4, atol=1e-4)
        assert prefix[0][0].shape[1] == 8 and step.past_key_values[0][0].shape[1] == 12  # returned, not appended
        assert model(ids, "full").past_key_values is None  # use_cache defaults to False
        # dual cache (one row, as Fast-dLLM uses it): the whole sequence cached; a block's k/v replaced in place,
        # its queries at its own positions
        whole = [tuple(t[:1].clone() for t in layer) for layer in cache]
        replace = torch.zeros(1, 12, dtype=torch.bool)
        replace[:, 4:8] = True
        block = model(ids[:1, 4:8], "full", past_key_values=whole, use_cache=True, dual_cache=True,
                      replace_position=replace)
        torch.testing.assert_close(block.logits, full.logits[:1, 4:8], rtol=1e-4, atol=1e-4)
        # a transformers Cache fails at the legacy read past_key_values[0][0], as with the real file
        error = TypeError if TRANSFORMERS_5 else KeyError
        with pytest.raises(error):
            model(ids, "full", past_key_values=DynamicCache(), use_cache=True)
