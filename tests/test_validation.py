"""Bad input gets a clear error: refused families, missing mask ids, bad generate() arguments, bad configs.

Every error must be a ValueError or TypeError whose message names the offending value and says what to do.
Also: MRPGenerationConfig save / load, what is kept from a plain transformers generation config, and
transformers' TextStreamer with generate().
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, TextStreamer

from mrp_hf import MRPGenerationConfig, MRPModel, available_families, load_backbone
from mrp_hf._compat import IS_TRANSFORMERS_5
from mrp_hf.backbones import resolve_adapter_class
from mrp_hf.generation.config import build_generation_config

try:
    from stand_ins import save_stand_in
except ImportError:  # tests/ imported as a package
    from tests.stand_ins import save_stand_in

MASK_ID = 126
EOS_ID = 125
PROMPT = torch.tensor([[5, 6, 7, 8]])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("validation")
    return {family: save_stand_in(family, root / family) for family in ("llada", "fast_dllm_v2", "sdar")}


@pytest.fixture(scope="module")
def llada(folders):
    """Bidirectional stand-in, max_sequence_length 256, mask id in its config."""
    return MRPModel.from_backbone_pretrained(str(folders["llada"]), trust_remote_code=True)


@pytest.fixture(scope="module")
def fast_dllm(folders):
    """Block-causal stand-in with bd_size 4."""
    return MRPModel.from_backbone_pretrained(str(folders["fast_dllm_v2"]), trust_remote_code=True)


def _tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=32, n_embd=8, n_layer=1, n_head=2)).eval()


# ---------------------------------------------------------------------------------------------- families
@pytest.mark.skipif(not IS_TRANSFORMERS_5, reason="DiffusionGemma ships with transformers 5.x")
def test_diffusion_gemma_is_refused(tmp_path):
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    text = dict(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        global_head_dim=8,
        max_position_embeddings=64,
        sliding_window=8,
        layer_types=["full_attention"],
        num_experts=2,
        top_k_experts=1,
        moe_intermediate_size=16,
    )
    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
    )
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    for call in (
        lambda: MRPModel.from_backbone(model),
        lambda: MRPModel.from_backbone(model, backbone_family="llada", mask_token_id=3),  # forcing does not help
        lambda: resolve_adapter_class(config),
        lambda: resolve_adapter_class(config.text_config),
    ):
        with pytest.raises(ValueError, match="DiffusionGemma") as info:
            call()
        assert "uniform-noise" in str(info.value) and "generate()" in str(info.value)
    # from a saved folder: refused from the config alone, before any weight file is looked for
    config.save_pretrained(tmp_path / "dg")
    assert not any(p.suffix in (".safetensors", ".bin") for p in (tmp_path / "dg").iterdir())
    with pytest.raises(ValueError, match="DiffusionGemma"):
        load_backbone(str(tmp_path / "dg"))


@pytest.mark.parametrize(
    "config",
    [
        SimpleNamespace(model_type="diffusion_gemma", architectures=["DiffusionGemmaForBlockDiffusion"]),
        SimpleNamespace(model_type="", architectures=["DiffusionGemmaForBlockDiffusion"]),
        SimpleNamespace(model_type="diffusion_gemma_text", architectures=None),
    ],
    ids=["model_type+arch", "arch", "text_model_type"],
)
def test_diffusion_gemma_refused_by_name(config):
    """The refusal works from model_type or architectures alone, on any transformers version."""
    with pytest.raises(ValueError, match="DiffusionGemma.*no mask token"):
        resolve_adapter_class(config)


def test_unknown_family_without_mask_id():
    model = _tiny_gpt2()  # a causal LM: generic adapter, and no mask token id anywhere
    with pytest.raises(ValueError, match="mask_token_id") as info:
        MRPModel.from_backbone(model)
    message = str(info.value)
    assert "GPT2LMHeadModel" in message and "'gpt2'" in message
    assert "mask_token_id=<id of the [MASK] token>" in message and "backbone_family=" in message
    # with the id it wraps (as the generic, bidirectional family) and decodes
    wrapped = MRPModel.from_backbone(model, mask_token_id=31)
    assert wrapped.adapter.family == "generic"
    out = wrapped.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4)
    assert out.shape == (1, 7) and not (out[0, 3:] == 31).any()


def test_unknown_family_without_mask_id_from_a_folder(tmp_path):
    _tiny_gpt2().save_pretrained(tmp_path / "gpt2")  # no tokenizer beside it
    with pytest.raises(ValueError, match="mask_token_id"):
        MRPModel.from_backbone_pretrained(str(tmp_path / "gpt2"))
    assert MRPModel.from_backbone_pretrained(str(tmp_path / "gpt2"), mask_token_id=31).adapter.mask_token_id == 31


def test_unknown_backbone_family(tmp_path):
    model = _tiny_gpt2()
    for call in (
        lambda: MRPModel.from_backbone(model, backbone_family="llada3", mask_token_id=31),
        lambda: resolve_adapter_class(model.config, "llada3"),
    ):
        with pytest.raises(ValueError, match="Unknown backbone_family 'llada3'") as info:
            call()
        for family in available_families():
            assert repr(family) in str(info.value)
    model.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="Unknown backbone_family 'llada3'"):
        load_backbone(str(tmp_path / "gpt2"), backbone_family="llada3")


# ---------------------------------------------------------------------------------------------- generate()
def test_prompt_beyond_the_model_positions(llada):
    assert llada.adapter.max_positions == 256
    prompt = torch.randint(1, 100, (1, 250), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="max_new_tokens") as info:
        llada.generate(prompt, max_new_tokens=8)
    message = str(info.value)
    assert "250 tokens" in message and "(8)" in message and "256 positions" in message
    assert "shorten the prompt or lower max_new_tokens" in message
    assert llada.generate(prompt, max_new_tokens=4, block_length=4).shape == (1, 254)  # 253 is the last position


def test_block_length_must_divide_max_new_tokens(llada, fast_dllm):
    # blocks that start at the answer must tile it
    with pytest.raises(ValueError, match=r"block_length=4 does not divide max_new_tokens=10.*multiple.*12"):
        llada.generate(PROMPT, max_new_tokens=10, block_length=4)
    # blocks counted from the prompt's first token (block-causal families): the last block is decoded whole, then cut
    assert fast_dllm.generate(PROMPT[:, :3], max_new_tokens=10, block_length=4).shape == (1, 13)


def test_block_length_larger_than_a_block_causal_models_block(fast_dllm):
    assert fast_dllm.adapter.block_size == 4
    with pytest.raises(ValueError, match=r"block_length=8 does not fit fast_dllm_v2's attention block of 4") as info:
        fast_dllm.generate(PROMPT, max_new_tokens=16, block_length=8)
    assert "use 4 or a divisor of it" in str(info.value)
    assert fast_dllm.generate(PROMPT, max_new_tokens=16, block_length=2).shape == (1, 20)


@pytest.mark.parametrize("threshold", [0, 0.0, -0.1, 1.5])
def test_threshold_outside_unit_interval(llada, threshold):
    with pytest.raises(ValueError, match=rf"threshold={threshold} is outside \(0, 1\]") as info:
        llada.generate(PROMPT, max_new_tokens=8, threshold=threshold)
    assert "threshold=0.9" in str(info.value) and "None for static decoding" in str(info.value)


def test_threshold_one_is_allowed(llada):
    assert llada.generate(PROMPT, max_new_tokens=8, threshold=1.0).shape == (1, 12)


def test_unknown_mrp_mode(llada):
    with pytest.raises(ValueError, match=r"Unknown mrp_mode 'fast'.*'off', 'speculative', 'remask', 'direct'"):
        llada.generate(PROMPT, max_new_tokens=8, mrp_mode="fast")


@pytest.mark.parametrize("mode", ["speculative", "direct", "remask"])
def test_head_modes_without_a_head(llada, mode):
    extra = {"threshold": 0.5} if mode == "remask" else {}
    with pytest.raises(ValueError, match=rf"mrp_mode='{mode}' needs an MRP head") as info:
        llada.generate(PROMPT, max_new_tokens=8, mrp_mode=mode, **extra)
    assert "mrp_mode='off'" in str(info.value)


def test_attention_mask_shape_mismatch(llada):
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 3\) but input_ids has \(1, 4\)"):
        llada.generate(PROMPT, attention_mask=torch.ones(1, 3, dtype=torch.long), max_new_tokens=8)


def test_right_padding(llada):
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, EOS_ID]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    with pytest.raises(ValueError, match="not left-padded") as info:
        llada.generate(ids, attention_mask=mask, max_new_tokens=8)
    assert "padding_side = 'left'" in str(info.value)
    left = llada.generate(ids.flip(1), attention_mask=mask.flip(1), max_new_tokens=8)  # left padding is fine
    assert left.shape == (2, 12)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (torch.ones(1, 1, 4, dtype=torch.long), r"2-D LongTensor \[batch, prompt_len\], got Tensor\(1, 1, 4\)"),
        (torch.tensor([5, 6, 7]), r"2-D LongTensor \[batch, prompt_len\], got Tensor\(3,\)"),
        (PROMPT.float(), "integer token ids, got dtype torch.float32"),
        (PROMPT.to(torch.bool), "integer token ids, got dtype torch.bool"),
    ],
    ids=["3d", "1d", "float", "bool"],
)
def test_bad_input_ids(llada, bad, message):
    with pytest.raises(TypeError, match=message):
        llada.generate(bad, max_new_tokens=8)


def test_list_input_ids(llada):
    with pytest.raises(TypeError, match="input_ids must be a 2-D"):
        llada.generate([[5, 6, 7, 8]], max_new_tokens=8)


def test_other_bad_prompts(llada):
    with pytest.raises(ValueError, match="no prompt tokens"):
        llada.generate(PROMPT[:, :0], max_new_tokens=8)
    with pytest.raises(ValueError, match="only 0 and 1"):
        llada.generate(PROMPT, attention_mask=torch.tensor([[1, 1, 2, 1]]), max_new_tokens=8)
    with pytest.raises(ValueError, match="all zeros"):
        llada.generate(PROMPT, attention_mask=torch.zeros(1, 4, dtype=torch.long), max_new_tokens=8)


@pytest.mark.parametrize("name", ["max_new_token", "foo", "blocklength"])
def test_unknown_generate_kwarg(llada, name):
    with pytest.raises(TypeError, match=rf"unknown arguments \['{name}'\].*MRPGenerationConfig"):
        llada.generate(PROMPT, max_new_tokens=8, **{name: 1})


@pytest.mark.parametrize(("name", "value"), [("mask_token_id", 3), ("repetition_penalty", 1.3), ("min_new_tokens", 4)])
def test_ignored_generate_kwargs_are_refused(llada, name, value):
    """The engine uses the adapter's mask id and has no repetition penalty or minimum length."""
    with pytest.raises(TypeError, match=name):
        llada.generate(PROMPT, max_new_tokens=8, **{name: value})


@pytest.mark.parametrize("temperature", [-1, -0.01])
def test_negative_temperature(llada, temperature):
    with pytest.raises(ValueError, match=rf"temperature={temperature} is negative; use 0 for greedy"):
        llada.generate(PROMPT, max_new_tokens=8, temperature=temperature)


@pytest.mark.parametrize("top_p", [0, 0.0, -0.2, 1.5])
def test_top_p_out_of_range(llada, top_p):
    with pytest.raises(ValueError, match=rf"top_p={top_p} is outside \(0, 1\]; use None to disable it"):
        llada.generate(PROMPT, max_new_tokens=8, top_p=top_p, temperature=0.7)


@pytest.mark.parametrize("top_k", [0, -3, 2.5])
def test_top_k_out_of_range(llada, top_k):
    with pytest.raises(ValueError, match=rf"top_k={top_k} must be a positive int or None"):
        llada.generate(PROMPT, max_new_tokens=8, top_k=top_k, temperature=0.7)


def test_steps_not_a_multiple_of_the_number_of_blocks(llada):
    with pytest.raises(
        ValueError,
        match=r"steps=6 is not a multiple of the number of blocks \(4 = max_new_tokens 16 / block_length 4\)",
    ):
        llada.generate(PROMPT, max_new_tokens=16, block_length=4, steps=6)
    with pytest.raises(ValueError, match=r"steps=16 gives 8 steps per block of 4 tokens; use at most max_new_tokens=8"):
        llada.generate(PROMPT, max_new_tokens=8, block_length=4, steps=16)
    assert llada.generate(PROMPT, max_new_tokens=16, block_length=4, steps=8).shape == (1, 20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens=0 must be a positive integer"),
        ({"steps": 0}, "steps=0 must be a positive integer"),
        ({"tokens_per_step": True}, "tokens_per_step=True must be a positive integer"),
        ({"confidence": "entropy"}, r"Unknown confidence 'entropy'; choose one of \['top_prob'"),
        ({"prefix_cache": "yes"}, r"prefix_cache='yes' must be None \(auto\), True or False"),
        ({"prefix_cache": True}, "prefix_cache=True, but LLaDAModelLM's forward takes no past_key_values"),
        ({"do_sample": True}, r"do_sample=True disagrees with temperature=0.0.*temperature=<a value > 0>"),
        ({"num_beams": 4}, "num_beams=4 is not supported by masked-diffusion decoding"),
        ({"num_return_sequences": 2}, "num_return_sequences=2 is not supported"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_other_bad_generate_arguments(llada, kwargs, message):
    with pytest.raises(ValueError, match=message):
        llada.generate(PROMPT, **{"max_new_tokens": 8, **kwargs})


def test_text_streamer_refuses_a_batch_itself(llada, folders):
    """Batches go to the streamer as they are (a streamer of your own may take them); transformers' TextStreamer
    refuses them with its own message."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["llada"]), trust_remote_code=True)
    with pytest.raises(ValueError, match="TextStreamer only supports batch size 1"):
        llada.generate(PROMPT.repeat(2, 1), max_new_tokens=8, streamer=TextStreamer(tokenizer))


def test_a_plain_generation_config_is_checked_too(llada):
    """Settings arriving as a transformers GenerationConfig get the same checks as keyword arguments."""
    with pytest.raises(ValueError, match="num_beams=3"):
        llada.generate(PROMPT, generation_config=GenerationConfig(max_new_tokens=8, num_beams=3))
    with pytest.raises(ValueError, match="do_sample=True disagrees with temperature"):
        llada.generate(PROMPT, generation_config=GenerationConfig(max_new_tokens=8, do_sample=True))
    sampled = llada.generate(
        PROMPT, generation_config=GenerationConfig(max_new_tokens=8, do_sample=True, temperature=0.7)
    )
    assert sampled.shape == (1, 12)


# ---------------------------------------------------------------------------------------------- MRPGenerationConfig
OUR_FIELDS = dict(
    max_new_tokens=64,
    block_length=16,
    steps=32,
    tokens_per_step=2,
    threshold=0.9,
    confidence="margin",
    temperature=0.5,
    top_k=20,
    top_p=0.9,
    seed=3,
    prefix_cache=False,
    mrp_mode="remask",
    mrp_draft_tokens=4,
    remask_rule="residual",
    remask_delta=2.0,
    mask_token_id=MASK_ID,
    eos_token_id=EOS_ID,
    pad_token_id=EOS_ID,
)


def test_config_round_trip(tmp_path):
    config = MRPGenerationConfig(**OUR_FIELDS)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    for name, value in OUR_FIELDS.items():
        assert saved[name] == value, name
    assert saved["do_sample"] is True  # derived from temperature > 0

    loaded = MRPGenerationConfig.from_pretrained(tmp_path)
    assert type(loaded) is MRPGenerationConfig
    for name, value in OUR_FIELDS.items():
        assert getattr(loaded, name) == value, name
    assert loaded.is_sampling

    # read back as a plain GenerationConfig (as transformers does for a model folder), every field still counts
    plain = GenerationConfig.from_pretrained(tmp_path)
    built = build_generation_config(plain)
    for name, value in OUR_FIELDS.items():
        assert getattr(built, name) == value, name
    # and call-time overrides win over it
    assert build_generation_config(plain, block_length=8, temperature=0.0).block_length == 8
    assert not build_generation_config(plain, temperature=0.0).is_sampling


def test_default_config_round_trip(tmp_path):
    MRPGenerationConfig().save_pretrained(tmp_path)
    loaded = MRPGenerationConfig.from_pretrained(tmp_path)
    assert loaded.max_new_tokens == 128 and loaded.temperature == 0.0 and not loaded.do_sample
    assert loaded.mrp_mode == "off" and loaded.block_length is None and loaded.threshold is None


def test_plain_generation_config_keeps_only_token_ids(tmp_path):
    """A remote-code DLM's generation_config.json (Dream ships temperature=0.2, top_p=0.95) was written for
    the family's own sampler: only its token ids and max_new_tokens are kept; decoding stays greedy with our
    defaults."""
    shipped = {
        "bos_token_id": EOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": 124,
        "mask_token_id": MASK_ID,
        "temperature": 0.2,
        "top_p": 0.95,
        "max_new_tokens": 512,
        "steps": 512,
        "alg": "entropy",
        "transformers_version": "4.46.2",
    }
    (tmp_path / "generation_config.json").write_text(json.dumps(shipped))
    plain = GenerationConfig.from_pretrained(tmp_path)
    built = build_generation_config(plain)
    assert (built.eos_token_id, built.pad_token_id, built.mask_token_id) == (EOS_ID, 124, MASK_ID)
    assert built.temperature == 0.0 and not built.do_sample and not built.is_sampling
    assert built.top_p is None and built.steps is None
    assert built.max_new_tokens == 512  # a length default is the backbone's to give
    assert built.block_length is None and built.threshold is None and built.mrp_mode == "off"


def test_plain_generation_config_through_generate(folders, tmp_path):
    """The same through a model: the backbone's own generation config gives eos/pad, not its sampler."""
    backbone = MRPModel.from_backbone_pretrained(str(folders["sdar"]), trust_remote_code=True).backbone
    backbone.generation_config = GenerationConfig(eos_token_id=EOS_ID, pad_token_id=124, temperature=0.2, top_p=0.95)
    model = MRPModel.from_backbone(backbone)  # its generation_config starts from the backbone's
    greedy = model.generate(PROMPT, max_new_tokens=8)
    assert torch.equal(greedy, model.generate(PROMPT, max_new_tokens=8, temperature=0.0))  # not sampled
    # EOS stops a row; what follows its first EOS is the config's pad token
    out = model.generate(PROMPT, max_new_tokens=8, eos_token_id=int(greedy[0, 4]))
    assert out[0, 4] == greedy[0, 4] and bool((out[0, 5:] == 124).all())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0}, r"threshold=0 is outside \(0, 1\]"),
        ({"threshold": 1.01}, r"threshold=1.01 is outside \(0, 1\]"),
        ({"block_length": 0}, "block_length=0 must be a positive integer"),
        ({"mrp_mode": "turbo"}, r"Unknown mrp_mode 'turbo'"),
        ({"mrp_mode": "remask"}, r"mrp_mode='remask' works in the dynamic regime: pass a threshold"),
        ({"remask_rule": "x"}, r"Unknown remask_rule 'x'; choose one of \['confidence', 'residual'\]"),
        ({"mrp_draft_tokens": 0}, r"mrp_draft_tokens=0 must be a positive integer \(K >= 1 drafts per round\)"),
        ({"temperature": -0.5}, "temperature=-0.5 is negative"),
        ({"top_p": 1.5}, r"top_p=1.5 is outside \(0, 1\]"),
        ({"top_k": 0}, "top_k=0 must be a positive int or None"),
        ({"steps": -1}, "steps=-1 must be a positive integer"),
        ({"max_new_tokens": 12.0}, "max_new_tokens=12.0 must be a positive integer"),
        ({"do_sample": True}, "do_sample=True disagrees with temperature=0.0"),
        ({"do_sample": False, "temperature": 0.7}, "do_sample=False disagrees with temperature=0.7"),
        ({"num_beams": 2}, "num_beams=2 is not supported"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_config_validation_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MRPGenerationConfig(**kwargs)


def test_config_validation_when_loading_and_saving(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"mrp_mode": "off", "threshold": 1.5}))
    with pytest.raises(ValueError, match=r"threshold=1.5 is outside \(0, 1\]"):
        MRPGenerationConfig.from_pretrained(tmp_path)
    config = MRPGenerationConfig()
    config.top_p = 2.0  # set after construction: caught by validate() and by save_pretrained
    with pytest.raises(ValueError, match=r"top_p=2.0 is outside"):
        config.validate()
    with pytest.raises(ValueError, match=r"top_p=2.0 is outside"):
        config.save_pretrained(tmp_path / "out")


def test_consistent_do_sample_is_accepted():
    assert MRPGenerationConfig(do_sample=True, temperature=0.7).is_sampling
    assert not MRPGenerationConfig(do_sample=False).is_sampling
    assert MRPGenerationConfig(num_beams=1, num_return_sequences=1).num_beams == 1


# ---------------------------------------------------------------------------------------------- streaming
class _RecordingStreamer(TextStreamer):
    def __init__(self, tokenizer, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())
        super().put(value)

    def end(self):
        self.ended = True
        super().end()


def test_text_streamer(folders, capsys):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["sdar"]), trust_remote_code=True)
    model = MRPModel.from_backbone_pretrained(str(folders["sdar"]), trust_remote_code=True)
    ids = tokenizer("t5 t6 t7 t8", return_tensors="pt").input_ids
    assert torch.equal(ids, PROMPT)
    capsys.readouterr()

    streamer = _RecordingStreamer(tokenizer, skip_prompt=True)
    out = model.generate(ids, max_new_tokens=12, block_length=4, streamer=streamer)
    printed = capsys.readouterr().out
    answer = out[0, ids.shape[1] :]
    assert printed == tokenizer.decode(answer) + "\n"
    assert not (answer == MASK_ID).any()
    # the prompt, then each block once it is fully decoded, then end()
    assert streamer.chunks == [ids[0].tolist()] + [answer[i : i + 4].tolist() for i in range(0, 12, 4)]
    assert streamer.ended

    model.generate(ids, max_new_tokens=12, block_length=4, streamer=TextStreamer(tokenizer))  # prompt included
    assert capsys.readouterr().out == tokenizer.decode(out[0]) + "\n"


def test_text_streamer_stops_at_eos(folders, capsys):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders["sdar"]), trust_remote_code=True)
    model = MRPModel.from_backbone_pretrained(str(folders["sdar"]), trust_remote_code=True)
    greedy = model.generate(PROMPT, max_new_tokens=12, block_length=4)
    eos = int(greedy[0, 4])  # the first answer token: the row stops after its first block
    capsys.readouterr()
    streamer = _RecordingStreamer(tokenizer, skip_prompt=True)
    out = model.generate(
        PROMPT, max_new_tokens=12, block_length=4, eos_token_id=eos, pad_token_id=EOS_ID, streamer=streamer
    )
    assert out[0, 4] == eos and bool((out[0, 5:] == EOS_ID).all())
    assert len(streamer.chunks) == 2 and streamer.ended  # prompt + the block holding EOS
    assert capsys.readouterr().out == tokenizer.decode(out[0, 4:8]) + "\n"


def test_mask_id_outside_the_vocabulary(tmp_path):
    # an SDAR folder whose config.json has no mask id and no tokenizer beside it: the family default 151669
    bare = save_stand_in("sdar", tmp_path / "bare", with_tokenizer=False, mask_token_id=None)
    with pytest.raises(ValueError, match="151669"):
        model = MRPModel.from_backbone_pretrained(str(bare), trust_remote_code=True)  # vocabulary of 128
        model.generate(PROMPT, max_new_tokens=8)


def test_family_default_block_lengths(stand_in_models):
    import mrp_hf
    from mrp_hf.generation.engine import DecodingEngine

    expected = {"sdar": 4, "llada2": 32}
    for family, block in expected.items():
        adapter = mrp_hf.get_adapter(stand_in_models[family], mask_token_id=126)
        config = MRPGenerationConfig(max_new_tokens=64, mask_token_id=126)
        assert DecodingEngine(adapter, config).block_length == block
