"""Loading through the real paths: `mrp_hf.load_backbone` and `MRPModel.from_backbone_pretrained`.

Every test loads from disk the way a user does: stand-in folders written by `save_stand_in` (remote code,
safetensors, tokenizer), a Hugging Face Hub cache laid out exactly as huggingface_hub lays it out (loaded by
repo id, offline), and tiny remote-code folders written here that fail or need help on transformers 5.x the
way the Hub code of LLaDA and Dream does.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

import mrp_hf
from mrp_hf import MRPModel, load_backbone
from mrp_hf._compat import IS_TRANSFORMERS_5

try:
    from stand_ins import FAMILIES, save_stand_in
except ImportError:  # tests/ imported as a package
    from tests.stand_ins import FAMILIES, save_stand_in

MASK_ID = 126  # the stand-ins' mask id (config and/or tokenizer)
VOCAB = 128
PROMPT = torch.tensor([[5, 6, 7, 8]])
NEW = 8
BLOCK = 4
# families whose real config.json has no mask id: it must come from the tokenizer saved beside the model
TOKENIZER_MASK_FAMILIES = sorted(f for f, spec in FAMILIES.items() if not spec.mask_in_config)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> a stand-in folder (config with auto_map, remote code, safetensors, tokenizer), saved once."""
    root = tmp_path_factory.mktemp("loading")
    return {family: save_stand_in(family, root / family) for family in FAMILIES}


def _decode(model: MRPModel) -> torch.Tensor:
    return model.generate(PROMPT, max_new_tokens=NEW, block_length=BLOCK)


def _check_decoded(sequences: torch.Tensor) -> None:
    assert sequences.shape == (1, PROMPT.shape[1] + NEW)
    assert torch.equal(sequences[:, : PROMPT.shape[1]], PROMPT)
    answer = sequences[0, PROMPT.shape[1] :]
    assert not (answer == MASK_ID).any(), "mask tokens left in the answer"
    assert bool(((answer >= 0) & (answer < VOCAB)).all())


# ---------------------------------------------------------------------------------------------- local folders
@pytest.fixture(scope="module")
def reference(folders):
    """family -> the answer of the plain float32 load (computed on first use)."""
    cache: dict[str, torch.Tensor] = {}

    def get(family: str) -> torch.Tensor:
        if family not in cache:
            cache[family] = _decode(MRPModel.from_backbone_pretrained(str(folders[family]), trust_remote_code=True))
        return cache[family]

    return get


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_load_backbone_and_from_backbone_pretrained(family, folders, reference):
    spec = FAMILIES[family]
    backbone, tokenizer_mask_id = load_backbone(str(folders[family]), trust_remote_code=True, return_mask_token_id=True)
    assert type(backbone).__name__ == spec.model_class
    assert not backbone.training, "load_backbone returns the model in eval mode"
    assert tokenizer_mask_id == MASK_ID

    model = MRPModel.from_backbone_pretrained(str(folders[family]), trust_remote_code=True)
    assert model.adapter.family == family
    assert model.adapter.mask_token_id == MASK_ID
    if family in TOKENIZER_MASK_FAMILIES:  # the config has no mask id: it came from the tokenizer, not the default
        assert getattr(model.backbone.config, "mask_token_id", None) is None
        assert type(model.adapter).default_mask_token_id != MASK_ID
    sequences = _decode(model)
    _check_decoded(sequences)
    assert torch.equal(sequences, reference(family))  # deterministic


@pytest.mark.parametrize("family", TOKENIZER_MASK_FAMILIES)
def test_mask_id_comes_from_the_tokenizer(family, tmp_path):
    path = save_stand_in(family, tmp_path / "m", mask_token_id=120)  # tokenizer's mask token at id 120
    model = MRPModel.from_backbone_pretrained(str(path), trust_remote_code=True)
    assert model.adapter.mask_token_id == 120
    # an explicit mask_token_id wins over the tokenizer's
    assert (
        MRPModel.from_backbone_pretrained(str(path), trust_remote_code=True, mask_token_id=121).adapter.mask_token_id
        == 121
    )


def test_no_tokenizer_needs_an_explicit_mask_id(tmp_path):
    bare = save_stand_in("sdar", tmp_path / "bare", with_tokenizer=False, mask_token_id=None)
    backbone, found = load_backbone(str(bare), trust_remote_code=True, return_mask_token_id=True)
    assert found is None  # no tokenizer saved there: no mask id, and no error
    model = MRPModel.from_backbone(backbone, mask_token_id=MASK_ID)
    _check_decoded(_decode(model))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bfloat16_load_still_decodes(family, folders):
    backbone = load_backbone(str(folders[family]), trust_remote_code=True, torch_dtype=torch.bfloat16)
    dtypes = {p.dtype for p in backbone.parameters() if p.is_floating_point()}
    assert dtypes == {torch.bfloat16}
    model = MRPModel.from_backbone(backbone, mask_token_id=MASK_ID)
    _check_decoded(_decode(model))


def test_bfloat16_by_name_through_the_wrapper(folders):
    model = MRPModel.from_backbone_pretrained(str(folders["llada"]), trust_remote_code=True, torch_dtype="bfloat16")
    assert {p.dtype for p in model.backbone.parameters() if p.is_floating_point()} == {torch.bfloat16}
    _check_decoded(_decode(model))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_device_map_cpu(family, folders, reference):
    pytest.importorskip("accelerate")
    model = MRPModel.from_backbone_pretrained(str(folders[family]), trust_remote_code=True, device_map="cpu")
    assert {p.device.type for p in model.backbone.parameters()} == {"cpu"}
    assert model.device.type == "cpu"
    assert torch.equal(_decode(model), reference(family))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_trust_remote_code_is_never_forced_on(family, folders):
    # transformers' own error, asking for trust_remote_code, raised before any remote code runs
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_backbone(str(folders[family]))
    with pytest.raises(ValueError, match="trust_remote_code"):
        MRPModel.from_backbone_pretrained(str(folders[family]))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_backbone(str(folders[family]), trust_remote_code=False)


# ---------------------------------------------------------------------------------------------- Hub cache
REPO_ID = "tiny-org/tiny-sdar"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(source: Path, cache: Path, repo_id: str = REPO_ID, commit: str = COMMIT) -> Path:
    """Lay `source`'s files out as huggingface_hub's cache does: models--org--name/{blobs,refs/main,snapshots/<commit>}.

    Blobs are named by git blob sha1 (regular files) or sha256 (LFS files, here *.safetensors); snapshot
    entries are relative symlinks into blobs/, and refs/main holds the commit hash.
    """
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    for file in sorted(source.rglob("*")):
        if not file.is_file() or "__pycache__" in file.parts:
            continue
        data = file.read_bytes()
        if file.suffix == ".safetensors":
            blob = hashlib.sha256(data).hexdigest()
        else:
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / blob, link.parent), link)
    return repo


_LOAD_BY_REPO_ID = textwrap.dedent(
    """
    import json, sys
    import huggingface_hub.constants as hub
    import torch
    import mrp_hf

    repo, commit = sys.argv[1:3]
    backbone = mrp_hf.load_backbone(repo, trust_remote_code=True)
    pinned = mrp_hf.load_backbone(repo, trust_remote_code=True, revision=commit)
    model = mrp_hf.MRPModel.from_backbone_pretrained(repo, trust_remote_code=True)
    sequences = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=8, block_length=4)
    print("RESULT " + json.dumps({
        "hub_cache": hub.HF_HUB_CACHE,
        "offline": hub.HF_HUB_OFFLINE,
        "class": type(backbone).__name__,
        "pinned_class": type(pinned).__name__,
        "module_file": sys.modules[type(backbone).__module__].__file__,
        "family": model.adapter.family,
        "mask_token_id": model.adapter.mask_token_id,
        "sequences": sequences.tolist(),
    }))
    """
)


def test_load_by_repo_id_from_hub_cache_offline(tmp_path, monkeypatch):
    """Offline load by repo id from a Hub cache named by HF_HUB_CACHE, with HF_HOME holding the remote code.

    huggingface_hub (0.36 and 2.x) reads HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE once, at import
    (`huggingface_hub.constants`), and transformers 4.57 copies them into `transformers.utils.hub` at its
    own import, so setting them in this already-running interpreter changes nothing. The load therefore
    runs in a fresh interpreter that inherits the environment, as it would for a user who sets them.
    HF_HUB_CACHE places the Hub cache; HF_HOME places the copy of the remote code ($HF_HOME/modules).
    HF_ENDPOINT points at a closed local port so that any network access fails at once.
    """
    # mask id in the tokenizer only (an SDAR config.json without it): read from the cache too
    source = save_stand_in("sdar", tmp_path / "source", mask_token_id=None)
    expected = _decode(MRPModel.from_backbone_pretrained(str(source), trust_remote_code=True)).tolist()
    hub_cache, hf_home = tmp_path / "hub_cache", tmp_path / "hf_home"
    _hub_cache(source, hub_cache)
    for name in ("HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_MODULES_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")

    run = subprocess.run(
        [sys.executable, "-c", _LOAD_BY_REPO_ID, REPO_ID, COMMIT],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT ") :])
    assert Path(result["hub_cache"]) == hub_cache
    assert result["offline"] is True
    assert result["class"] == result["pinned_class"] == "SDARForCausalLM"
    assert Path(result["module_file"]).resolve().is_relative_to((hf_home / "modules").resolve()), result["module_file"]
    assert result["family"] == "sdar"
    assert result["mask_token_id"] == MASK_ID
    assert result["sequences"] == expected  # the very model of the source folder


def _offline_in_process(monkeypatch) -> None:
    """What HF_HUB_OFFLINE=1 set before import does, for this already-running interpreter.

    huggingface_hub reads the flag into `huggingface_hub.constants.HF_HUB_OFFLINE` at import (transformers 5.x
    asks huggingface_hub at each call); transformers 4.x keeps its own copy in `transformers.utils.hub`.
    Without offline mode, `local_files_only=True` alone is not enough: with peft installed, transformers
    (4.57 and 5.24) looks up `adapter_config.json` on the Hub without passing `cache_dir`/`local_files_only`
    on, and retries for ~25 s before giving up.
    """
    import huggingface_hub.constants as hub_constants
    from transformers.utils import hub as transformers_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    if hasattr(transformers_hub, "_is_offline_mode"):
        monkeypatch.setattr(transformers_hub, "_is_offline_mode", True)


def test_load_by_repo_id_with_explicit_cache_dir(tmp_path, monkeypatch):
    """In-process fallback: cache_dir= (and local_files_only=) reach the config, the model and the tokenizer."""
    _offline_in_process(monkeypatch)
    source = save_stand_in("llada2", tmp_path / "source")
    cache = tmp_path / "cache"
    _hub_cache(source, cache, repo_id="tiny-org/tiny-llada2")
    kwargs = dict(trust_remote_code=True, cache_dir=str(cache), local_files_only=True)
    backbone, mask_id = load_backbone("tiny-org/tiny-llada2", return_mask_token_id=True, **kwargs)
    assert type(backbone).__name__ == "LLaDA2MoeModelLM"
    assert mask_id == MASK_ID
    model = MRPModel.from_backbone_pretrained("tiny-org/tiny-llada2", **kwargs)
    reference = MRPModel.from_backbone_pretrained(str(source), trust_remote_code=True)
    assert torch.equal(_decode(model), _decode(reference))
    with pytest.raises(OSError):  # not in that cache, and no network allowed
        load_backbone("tiny-org/absent", **kwargs)


# ---------------------------------------------------------------------------------------------- transformers 5.x
_LLADA_LIKE_CONFIG = """
from transformers import PretrainedConfig


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(self, vocab_size=128, d_model=16, mask_token_id=126, **kwargs):
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.mask_token_id = mask_token_id
        super().__init__(**kwargs)
"""

_LLADA_LIKE_MODELING = '''
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import LLaDAConfig


class LLaDAModelLM(PreTrainedModel):
    """As LLaDA's Hub class: builds its modules in __init__ and never calls self.post_init()."""

    config_class = LLaDAConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.ff_out = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def get_input_embeddings(self):
        return self.wte

    def get_output_embeddings(self):
        return self.ff_out

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return CausalLMOutputWithPast(logits=self.ff_out(self.wte(input_ids)))
'''


def _llada_like_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "configuration_llada.py").write_text(_LLADA_LIKE_CONFIG)
    (path / "modeling_llada.py").write_text(_LLADA_LIKE_MODELING)
    config = {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        },
        "vocab_size": VOCAB,
        "d_model": 16,
        "mask_token_id": MASK_ID,
        "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(0)
    weights = {
        "wte.weight": torch.randn(VOCAB, 16, generator=generator),
        "ff_out.weight": torch.randn(VOCAB, 16, generator=generator),
    }
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_remote_code_broken_on_5x_gives_our_error(tmp_path):
    path = _llada_like_folder(tmp_path / "llada_like")
    if IS_TRANSFORMERS_5:
        # the failure is real on this transformers: post_init() never ran, so all_tied_weights_keys is missing
        with pytest.raises(AttributeError, match="all_tied_weights_keys"):
            transformers.AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=True)
        for load in (load_backbone, MRPModel.from_backbone_pretrained):
            with pytest.raises(RuntimeError) as info:
                load(str(path), trust_remote_code=True)
            message = str(info.value)
            assert "'transformers>=4.46,<5'" in message
            assert transformers.__version__ in message and "llada" in message
            assert "all_tied_weights_keys" in message
            assert isinstance(info.value.__cause__, AttributeError)
    else:  # 4.x runs the same code as the Hub intends
        model = MRPModel.from_backbone_pretrained(str(path), trust_remote_code=True)
        assert model.adapter.family == "llada" and model.adapter.mask_token_id == MASK_ID
        _check_decoded(_decode(model))


_DREAM_LIKE_CONFIG = """
from transformers import PretrainedConfig


class DreamConfig(PretrainedConfig):
    model_type = "Dream"

    def __init__(self, vocab_size=128, hidden_size=32, num_attention_heads=4, max_position_embeddings=64,
                 rope_theta=10000.0, rope_scaling=None, mask_token_id=126, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.mask_token_id = mask_token_id
        super().__init__(**kwargs)
"""

_DREAM_LIKE_MODELING = '''
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_dream import DreamConfig


class DreamRotaryEmbedding(nn.Module):
    """As Dream's Hub class (Qwen2 of transformers 4.45): the init function is looked up by rope type and
    inv_freq is a non-persistent buffer computed at construction."""

    def __init__(self, config=None, device=None):
        super().__init__()
        self.rope_kwargs = {}
        if config.rope_scaling is not None:
            self.rope_type = config.rope_scaling.get("rope_type", config.rope_scaling.get("type"))
        else:
            self.rope_type = "default"
        self.config = config
        self.rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = self.rope_init_fn(self.config, device, **self.rope_kwargs)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq


class DreamPreTrainedModel(PreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"

    def _init_weights(self, module):  # as Dream's: Linear and Embedding only
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)


class DreamModel(DreamPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = DreamRotaryEmbedding(config=config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        return MaskedLMOutput(logits=self.lm_head(self.embed_tokens(input_ids)))
'''


def _dream_like_folder(path: Path, **config) -> Path:
    path.mkdir(parents=True)
    (path / "configuration_dream.py").write_text(_DREAM_LIKE_CONFIG)
    (path / "modeling_dream.py").write_text(_DREAM_LIKE_MODELING)
    config = {
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "tie_word_embeddings": False,
        **config,
    }
    (path / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(0)
    weights = {
        "embed_tokens.weight": torch.randn(VOCAB, 32, generator=generator),
        "lm_head.weight": torch.randn(VOCAB, 32, generator=generator),
    }
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")  # Dream's config sets it
@pytest.mark.parametrize(
    ("config", "rotary_dim", "theta"),
    [
        ({}, 8, 10000.0),
        ({"rope_theta": 500000.0}, 8, 500000.0),
        ({"head_dim": 16, "partial_rotary_factor": 0.5}, 8, 10000.0),
    ],
    ids=["default", "theta", "partial"],
)
def test_dream_default_rope_on_5x(config, rotary_dim, theta, tmp_path, monkeypatch):
    from transformers import modeling_rope_utils

    path = _dream_like_folder(tmp_path / "dream_like", **config)
    if IS_TRANSFORMERS_5:
        # as installed, 5.x has no "default" rope type (whether or not an earlier load_backbone registered it)
        monkeypatch.delitem(modeling_rope_utils.ROPE_INIT_FUNCTIONS, "default", raising=False)
        with pytest.raises(KeyError, match="default"):
            transformers.AutoModel.from_pretrained(str(path), trust_remote_code=True)
    backbone = load_backbone(str(path), trust_remote_code=True)
    rotary = backbone.rotary_emb
    expected = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    # not uninitialised memory: 5.x re-allocates non-persistent buffers after loading
    torch.testing.assert_close(rotary.inv_freq, expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(rotary.original_inv_freq, expected, rtol=1e-6, atol=0)
    assert rotary.attention_scaling == 1.0
    model = MRPModel.from_backbone(backbone)
    assert model.adapter.family == "dream"
    _check_decoded(_decode(model))


def test_public_api_exports():
    assert mrp_hf.load_backbone is load_backbone
    assert {"dream", "fast_dllm_v2", "generic", "llada", "llada2", "masked_lm", "sdar"} <= set(
        mrp_hf.available_families()
    )
