"""The Hugging Face-native ways to a head (docs/hub.md): the Auto classes (in this interpreter and in a fresh one
through the head's `auto_map`), `custom_generate` from a head folder and from a Hub cache offline, and the generate
contract (one rule for keywords and generation_config fields, logits processors, stopping criteria, defaults from
generation_config.json, streamer drafts)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import STAND_IN_MASK_ID
from test_speculative import batch, make_head
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

import mrp_hf
from mrp_hf import MRPGenerateOutput, MRPGenerationConfig, MRPHead, MRPModel
from mrp_hf.hub import AUTO_MAP, CODE_FILES
from mrp_hf.reference import bundled

SRC = str(Path(mrp_hf.__file__).resolve().parents[1])
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def backbone_generation_config():
    """The bundled backbone's own generation_config.json."""
    return transformers.GenerationConfig.from_pretrained(bundled.backbone_path())


@pytest.fixture(scope="module")
def reference():
    """The bundled reference DLM (backbone), its tokenizer, and prompts it knows."""
    backbone = mrp_hf.load_backbone(str(bundled.backbone_path()))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(bundled.backbone_path()))
    encoded = tokenizer(["sort:dca", "sort:bdac"], return_tensors="pt", padding=True)
    return backbone, tokenizer, encoded.input_ids, encoded.attention_mask


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A copy of the bundled backbone and a head re-saved beside it (so "../backbone" resolves): the layout
    `save_pretrained` gives a head today (auto_map, code files, custom_generate/)."""
    root = tmp_path_factory.mktemp("pair")
    shutil.copytree(bundled.backbone_path(), root / "backbone")
    MRPHead.from_pretrained(str(bundled.head_path())).save_pretrained(root / "head")
    return root


def expected(backbone, inputs, mask, **kwargs):
    model = MRPModel.from_pretrained(str(bundled.head_path()), backbone=backbone)
    return model.generate(inputs, attention_mask=mask, **kwargs)  # the backbone's own lengths


# ---------------------------------------------------------------------------------------------- Auto classes
def test_head_folder_layout(pair):
    files = sorted(str(p.relative_to(pair / "head")) for p in (pair / "head").rglob("*") if p.is_file())
    assert files == sorted(["config.json", "model.safetensors", *CODE_FILES])
    config = json.loads((pair / "head" / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP
    assert (pair / "head" / "custom_generate" / "requirements.txt").read_text().split() == ["mrp-hf"]


def test_auto_model_for_causal_lm_is_a_ready_model(pair, reference):
    backbone, _, inputs, mask = reference
    model = AutoModelForCausalLM.from_pretrained(str(pair / "head"))
    assert isinstance(model, MRPModel) and isinstance(model, transformers.PreTrainedModel)
    assert isinstance(model, transformers.GenerationMixin) and model.can_generate()
    assert model.generation_config_class is MRPGenerationConfig
    assert isinstance(model.generation_config, MRPGenerationConfig)
    assert model.generation_config.max_new_tokens == backbone_generation_config().max_new_tokens  # its json
    out = model.generate(inputs, attention_mask=mask, mrp_mode="speculative", return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected(backbone, inputs, mask, mrp_mode="speculative"))
    assert out.stats.head_forwards > 0
    # AutoModel keeps giving the bare head (transformers' convention: no task head)
    assert type(AutoModel.from_pretrained(str(pair / "head"))) is MRPHead


def test_loading_arguments_reach_the_backbone(pair, monkeypatch):
    import mrp_hf.modeling_mrp as modeling

    seen = {}
    real = modeling.load_backbone

    def recording(location, **kwargs):
        seen.update(kwargs)
        return real(location, **kwargs)

    monkeypatch.setattr(modeling, "load_backbone", recording)
    head = MRPHead.from_pretrained(str(pair / "head"))
    head.config.base_model_revision = "v1.0"
    head.save_pretrained(pair / "head_rev")
    dtype_name = "dtype" if transformers.__version__ >= "5" else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(str(pair / "head_rev"), trust_remote_code=True, device_map="cpu",
                                                 **{dtype_name: torch.bfloat16})
    assert seen["trust_remote_code"] is True and seen["device_map"] == "cpu"
    assert seen["torch_dtype"] == torch.bfloat16 and model.backbone.dtype == torch.bfloat16
    assert seen["revision"] == "v1.0"  # the revision the head records; `revision=` is the head repo's own


def _run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          stdin=subprocess.DEVNULL)


def test_a_fresh_interpreter_resolves_the_head_through_auto_map(pair, reference):
    backbone, _, inputs, mask = reference
    want = expected(backbone, inputs, mask, mrp_mode="speculative").tolist()
    code = (
        "import sys, torch\n"
        "from transformers import AutoConfig, AutoModel, AutoModelForCausalLM\n"
        f"head = {str(pair / 'head')!r}\n"
        "assert 'mrp_hf' not in sys.modules\n"
        "try:\n"
        "    AutoConfig.from_pretrained(head)\n"
        "except ValueError as err:\n"
        "    print('refused:', 'trust_remote_code' in str(err))\n"
        "config = AutoConfig.from_pretrained(head, trust_remote_code=True)\n"
        "bare = AutoModel.from_pretrained(head, trust_remote_code=True)\n"
        "model = AutoModelForCausalLM.from_pretrained(head, trust_remote_code=True)\n"
        f"out = model.generate(torch.tensor({inputs.tolist()}), attention_mask=torch.tensor({mask.tolist()}),"
        " mrp_mode='speculative')\n"
        "print(type(config).__name__, type(bare).__name__, type(model).__name__, model.can_generate())\n"
        "print(out.tolist())\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-3].endswith("refused: True")  # (after transformers' prompt, which gets no answer here)
    assert lines[-2:] == ["MRPConfig MRPHead MRPModel True", str(want)]
    for code_file in (pair / "head").rglob("*.py"):  # they import mrp-hf by name, nothing relative
        assert "from ." not in code_file.read_text()


def test_without_mrp_hf_installed_transformers_names_the_package(pair):
    code = (
        "import importlib.abc, sys\n"
        "class NotInstalled(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'mrp_hf' or name.startswith('mrp_hf.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n"
        "from transformers import AutoModelForCausalLM\n"
        "try:\n"
        f"    AutoModelForCausalLM.from_pretrained({str(pair / 'head')!r}, trust_remote_code=True)\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "requires the following packages that were not found in your environment: mrp_hf" in result.stdout


def test_saving_a_model_loaded_through_auto_map_writes_the_same_files(pair, tmp_path):
    """transformers registers classes it loads through auto_map for saving; ours keep their own code files."""
    code = (
        "from transformers import AutoModelForCausalLM\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(pair / 'head')!r}, trust_remote_code=True)\n"
        f"model.save_pretrained({str(tmp_path / 'again')!r})\n"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    for name, text in CODE_FILES.items():
        assert (tmp_path / "again" / name).read_text() == text
    assert sorted(p.name for p in (tmp_path / "again").glob("*.py")) == ["configuration_mrp.py", "modeling_mrp.py"]


# ---------------------------------------------------------------------------------------------- custom_generate
def test_custom_generate_from_a_head_folder(pair, reference):
    backbone, _, inputs, mask = reference
    assert backbone.can_generate()
    head = str(pair / "head")
    out = backbone.generate(inputs, attention_mask=mask, custom_generate=head, trust_remote_code=True,
                            mrp_mode="speculative", return_dict_in_generate=True)
    assert isinstance(out, MRPGenerateOutput) and out.stats.head_forwards > 0
    assert torch.equal(out.sequences, expected(backbone, inputs, mask, mrp_mode="speculative"))
    # without mrp_mode: the backbone's own static decoding, no head forward
    plain = backbone.generate(inputs, attention_mask=mask, custom_generate=head, trust_remote_code=True,
                              return_dict_in_generate=True)
    assert torch.equal(plain.sequences, MRPModel.from_backbone(backbone).generate(inputs, attention_mask=mask))
    assert plain.stats.head_forwards == 0
    # dynamic decoding and remask mode take their arguments as with MRPModel
    remask = backbone.generate(inputs, attention_mask=mask, custom_generate=head, trust_remote_code=True,
                               mrp_mode="remask", threshold=0.5)
    assert torch.equal(remask, expected(backbone, inputs, mask, mrp_mode="remask", threshold=0.5))
    if transformers.__version__ >= "5":  # transformers 4.x runs a local folder's custom_generate without asking
        with pytest.raises(ValueError, match="trust_remote_code"):
            backbone.generate(inputs, attention_mask=mask, custom_generate=head, mrp_mode="speculative")
    with pytest.raises(TypeError, match="assistant_model"):
        backbone.generate(inputs, custom_generate=head, trust_remote_code=True, assistant_model=backbone)


def test_custom_generate_from_a_hub_cache_offline(pair, reference, tmp_path):
    """`custom_generate="user/repo"` resolved from huggingface_hub's cache layout, offline, in a fresh interpreter."""
    from test_loading import _hub_cache

    backbone, _, inputs, mask = reference
    want = expected(backbone, inputs, mask, mrp_mode="speculative").tolist()
    head = MRPHead.from_pretrained(str(pair / "head"))
    head.config.base_model_name_or_path = "someone/reference-dlm"  # a published head names a Hub id
    head.save_pretrained(tmp_path / "published")
    _hub_cache(tmp_path / "published", tmp_path / "cache", repo_id="someone/reference-dlm-mrp", commit=COMMIT)
    code = (
        "import torch\n"
        "from transformers import AutoModelForMaskedLM\n"
        f"backbone = AutoModelForMaskedLM.from_pretrained({str(pair / 'backbone')!r})\n"
        f"out = backbone.generate(torch.tensor({inputs.tolist()}), attention_mask=torch.tensor({mask.tolist()}),"
        " custom_generate='someone/reference-dlm-mrp', trust_remote_code=True, mrp_mode='speculative')\n"
        "print(out.tolist())\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "home")}
    result = _run("import mrp_hf\n" + code, env)  # the reference DLM's own classes come from mrp-hf
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(want)


def test_a_head_ships_decoding_defaults(pair, reference, tmp_path):
    backbone, _, inputs, mask = reference
    head = MRPHead.from_pretrained(str(pair / "head"))
    head.decoding_defaults = {"mrp_mode": "speculative", "mrp_draft_tokens": 2}
    shutil.copytree(pair / "backbone", tmp_path / "backbone")
    head.save_pretrained(tmp_path / "head")
    saved = json.loads((tmp_path / "head" / "generation_config.json").read_text())
    assert saved["mrp_mode"] == "speculative" and saved["mrp_draft_tokens"] == 2
    GenerationConfig.from_pretrained(tmp_path / "head").validate(strict=True)  # transformers' own reading: no flag issue
    assert MRPHead.from_pretrained(str(tmp_path / "head")).decoding_defaults == head.decoding_defaults
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "head"))
    assert model.generation_config.mrp_mode == "speculative" and model.generation_config.mrp_draft_tokens == 2
    want = expected(backbone, inputs, mask, mrp_mode="speculative", mrp_draft_tokens=2, return_dict_in_generate=True)
    for out in (
        model.generate(inputs, attention_mask=mask, return_dict_in_generate=True),
        backbone.generate(inputs, attention_mask=mask, custom_generate=str(tmp_path / "head"), trust_remote_code=True,
                          return_dict_in_generate=True),
    ):
        assert torch.equal(out.sequences, want.sequences) and out.stats.to_dict() == want.stats.to_dict()
    off = model.generate(inputs, attention_mask=mask, mrp_mode="off", return_dict_in_generate=True)
    assert off.stats.head_forwards == 0  # a keyword still wins over the head's default
    head.decoding_defaults = {"max_new_tokens": 4}
    with pytest.raises(ValueError, match=r"decoding_defaults has fields a head cannot ship: \['max_new_tokens'\]"):
        head.save_pretrained(tmp_path / "bad")


def test_custom_generate_on_a_model_without_generation_mixin_points_to_attach(models):
    from mrp_hf.hub import custom_generate

    with pytest.raises(TypeError, match=r"no transformers GenerationMixin.*attach"):
        custom_generate(models["llada"], torch.tensor([[5, 6]]), mrp_head="unused")


# ---------------------------------------------------------------------------------------------- generate contract
@pytest.mark.parametrize(("name", "value"), [("output_scores", True), ("repetition_penalty", 1.3),
                                             ("min_new_tokens", 4), ("max_length", 30)])
def test_one_rule_for_keywords_and_generation_config_fields(reference, name, value):
    backbone, _, inputs, _ = reference
    model = MRPModel.from_backbone(backbone)
    with pytest.raises(TypeError, match=rf"unknown arguments \['{name}'\] \(as keyword arguments\)"):
        model.generate(inputs, **{name: value})
    with pytest.raises(TypeError, match=rf"unknown arguments \['{name}'\] \(set in generation_config\)"):
        model.generate(inputs, generation_config=GenerationConfig(**{name: value}))
    with pytest.raises(TypeError, match=rf"unknown arguments \['{name}'\] \(set in generation_config\)"):
        model.generate(inputs, generation_config=MRPGenerationConfig(**{name: value}))


def test_return_dict_in_generate_inside_a_config(reference):
    backbone, _, inputs, _ = reference
    model = MRPModel.from_backbone(backbone)
    out = model.generate(inputs, generation_config=GenerationConfig(return_dict_in_generate=True, max_new_tokens=8))
    assert isinstance(out, MRPGenerateOutput)
    assert torch.equal(out.sequences, model.generate(inputs, max_new_tokens=8))
    assert isinstance(model.generate(inputs, generation_config=MRPGenerationConfig(return_dict_in_generate=True,
                                                                                   max_new_tokens=8)), MRPGenerateOutput)


@pytest.mark.parametrize("fields", [
    dict(mrp_mode="speculative", mrp_draft_tokens=4, block_length=8, max_new_tokens=16, eos_token_id=2),
    dict(mrp_mode="remask", threshold=0.5, temperature=0.7, top_p=0.9, seed=3),
])
def test_mrp_generation_config_round_trips_through_generation_config_json(tmp_path, fields):
    config = MRPGenerationConfig(**fields)
    config.save_pretrained(tmp_path)
    plain = GenerationConfig.from_pretrained(tmp_path)
    plain.validate(strict=True)  # what transformers itself reads from the file: no "flags are not valid"
    again = MRPGenerationConfig.from_pretrained(tmp_path)
    drop = ("transformers_version",)
    assert {k: v for k, v in again.to_dict().items() if k not in drop} == \
        {k: v for k, v in config.to_dict().items() if k not in drop}
    # and a model whose backbone ships the file as a plain GenerationConfig decodes with exactly these settings
    from mrp_hf.generation.config import build_generation_config

    built = build_generation_config(plain)
    assert all(getattr(built, k) == getattr(config, k) for k in fields)
    assert built.top_k is None  # not transformers 4.x's default of 50


def test_max_new_tokens_defaults_come_from_the_backbone(models, monkeypatch):
    backbone = models["sdar"]
    monkeypatch.setattr(backbone, "generation_config", GenerationConfig(max_new_tokens=12, eos_token_id=None),
                        raising=False)
    model = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    assert model.generation_config.max_new_tokens == 12
    assert model.generate(torch.tensor([[5, 17, 33, 9]]), block_length=4).shape == (1, 16)


class _Bias(LogitsProcessor):
    """Pushes some tokens up and one down, depending on how long the context is (input_ids are used)."""

    def __call__(self, input_ids, scores):
        bias = torch.zeros(scores.shape[-1])
        bias[40:60] = 8.0 + 0.1 * (input_ids.shape[-1] % 3)
        bias[7] = -1e9
        return scores + bias


@pytest.mark.parametrize("family", ["sdar", "llada"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logits_processor_keeps_speculative_exact(models, family, temperature):
    backbone = models[family]
    plain = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    spec = MRPModel.from_backbone(backbone, head=make_head(backbone, "random"), mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch([[5, 17, 33, 9, 60, 2, 71, 40], [9, 60, 2]])
    kwargs = dict(attention_mask=mask, max_new_tokens=8, block_length=4, temperature=temperature, seed=3,
                  eos_token_id=None)
    processors = LogitsProcessorList([_Bias()])
    unprocessed = plain.generate(ids, **kwargs)
    static = plain.generate(ids, logits_processor=processors, **kwargs)
    assert not torch.equal(static, unprocessed)
    answers = static[:, ids.shape[1]:]
    assert not (answers == 7).any() and ((answers >= 40) & (answers < 60)).float().mean() > 0.5
    out = spec.generate(ids, logits_processor=processors, mrp_mode="speculative", return_dict_in_generate=True, **kwargs)
    assert torch.equal(out.sequences, static)
    assert sum(out.stats.acceptance_histogram) > 0
    assert torch.equal(plain.generate(ids, logits_processor=[_Bias()], **kwargs), static)  # a plain list too


class _StopOnBlock(StoppingCriteria):
    """Stops a row whose last tokens are `pattern`."""

    def __init__(self, pattern: list[int]):
        self.pattern = torch.tensor(pattern)

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids[:, -len(self.pattern):] == self.pattern).all(dim=1)


def test_stopping_criteria_stop_rows_after_their_block(models):
    backbone = models["sdar"]
    model = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch([[5, 17, 33, 9], [9, 60, 2, 11]])
    kwargs = dict(attention_mask=mask, max_new_tokens=12, block_length=4, eos_token_id=None, pad_token_id=0)
    free = model.generate(ids, **kwargs)
    answers = free[:, ids.shape[1]:]
    pattern = answers[0, 4:8].tolist()  # row 0 stops after its second block
    out = model.generate(ids, stopping_criteria=StoppingCriteriaList([_StopOnBlock(pattern)]),
                         return_dict_in_generate=True, **kwargs)
    for row in range(2):
        stop = next((end for end in (4, 8) if answers[row, end - 4:end].tolist() == pattern), 12)
        got = out.sequences[row, ids.shape[1]:]
        assert torch.equal(got[:stop], answers[row, :stop]) and bool((got[stop:] == 0).all())
        assert out.stats.row_new_tokens[row] == stop
    assert out.stats.row_new_tokens[0] in (4, 8)


class _Recorder:
    def __init__(self):
        self.put_values, self.drafts, self.ended = [], [], False

    def put(self, value):
        self.put_values.append(value)

    def put_draft(self, value):
        self.drafts.append(value)

    def end(self):
        self.ended = True


def test_streamer_gets_drafts_and_confirmed_tokens_for_a_batch(models):
    backbone = models["sdar"]
    model = MRPModel.from_backbone(backbone, head=make_head(backbone, "random"), mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch([[5, 17, 33, 9], [9, 60, 2, 11]])
    for mode in ("off", "speculative"):
        rec = _Recorder()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=8, block_length=4, eos_token_id=None,
                             mrp_mode=mode, streamer=rec)
        assert torch.equal(rec.put_values[0], ids) and rec.ended
        assert torch.equal(torch.cat(rec.put_values, dim=1), out)
        assert [v.shape[1] for v in rec.put_values[1:]] == [4, 4]
        assert rec.drafts and all(d.shape[0] == 2 for d in rec.drafts)
        assert (rec.drafts[0] == STAND_IN_MASK_ID).any()  # a draft shows what is still undecided
        assert torch.equal(rec.drafts[-1], out[:, -4:])  # the last draft is the last block, all decided


@pytest.mark.skipif(not hasattr(transformers, "TextDiffusionStreamer"), reason="transformers 5.x streamer")
def test_text_diffusion_streamer(reference, capsys):
    backbone, tokenizer, inputs, mask = reference
    model = MRPModel.from_pretrained(str(bundled.head_path()), backbone=backbone)
    streamer = transformers.TextDiffusionStreamer(tokenizer, skip_prompt=True)
    out = model.generate(inputs[:1], attention_mask=mask[:1], mrp_mode="speculative", streamer=streamer,
                         max_new_tokens=8)  # one block, no EOS: every token printed
    printed = capsys.readouterr().out
    assert "\0337" in printed  # drafts were drawn (and cleared)
    assert printed.endswith(tokenizer.decode(out[0, inputs.shape[1]:]) + "\n")
