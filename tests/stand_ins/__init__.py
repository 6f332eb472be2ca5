"""Tiny stand-ins for the remote-code diffusion LM families that mrp-hf decodes.

Each sub-folder holds a configuration / modeling file pair written from scratch for
these tests.  The files reproduce the *public interface* of the family's Hub repo
(file names, ``model_type``, ``architectures``, ``auto_map``, config field names,
class names, module paths of embedding / final norm / lm_head, forward signature,
output type, attention pattern and KV-cache protocol) on a model small enough to run
in milliseconds on a CPU.  See ``docs/families.md`` for the facts they mirror.

Public API::

    save_stand_in(family, path, *, with_tokenizer=True, init_std=0.5, **config_overrides) -> Path
    load_stand_in(family, tmp_path, *, auto_class=None, **config_overrides) -> model in eval mode
    FAMILIES  # family name -> FamilySpec (facts + tiny default config)
    VARIANTS  # other remote-code files of a family (e.g. Fast-dLLM's own Dream modeling file)

``save_stand_in`` writes ``config.json`` (with the Hub ``auto_map``), the python files,
seeded random ``model.safetensors`` weights, the family's ``generation_config.json`` where
its Hub repo ships one the model reads (Dream) and, by default, a tiny word-level tokenizer
whose special tokens sit at the family's ids.  A config override set to ``None`` leaves the
field out of ``config.json`` (e.g. ``mask_token_id=None``: a repo whose config lacks it).

The folder loads with ``AutoModel*.from_pretrained(path, trust_remote_code=True)`` on
transformers 4.x; on 5.x the Dream files fail there exactly like the Hub's (see
``dream/generation_utils.py``), and ``load_stand_in`` works around it for the tests that only
need a loaded model (``mrp_hf.load_backbone`` must handle it by itself).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["FAMILIES", "VARIANTS", "FamilySpec", "accept_new_validate_keywords", "load_stand_in", "save_stand_in"]

_HERE = Path(__file__).resolve().parent

VOCAB_SIZE = 128
MASK_ID = 126
EOS_ID = 125
PAD_ID = 125
UNK_ID = 0


@dataclass(frozen=True)
class FamilySpec:
    """What a stand-in folder looks like and which public facts it mirrors."""

    folder: str  # sub-folder of tests/stand_ins holding the python files
    config_file: str  # file names exactly as the Hub repo names them
    modeling_file: str
    model_type: str
    architectures: tuple[str, ...]
    auto_map: dict[str, str]
    config: dict[str, Any]  # tiny defaults written to config.json (overridable)
    mask_token: str  # the real tokenizer's mask token string
    mask_token_id: int = MASK_ID  # stand-in id (real ids are in docs/families.md)
    mask_in_config: bool = False  # True where the real config.json carries mask_token_id
    block_size_field: str | None = None  # config field of the trained block size, if any
    shifted_logits: bool = False  # logits at i-1 predict token i (caller shifts)
    attention: str = "bidirectional"
    cache: str = "none"
    extra: dict[str, Any] = field(default_factory=dict)
    extra_files: tuple[str, ...] = ()  # further python files of the Hub repo (relative imports)
    files_from: str | None = None  # folder holding the files that `folder` does not have (variants)
    generation_config: dict[str, Any] | None = None  # generation_config.json fields, where the model reads it

    @property
    def model_class(self) -> str:
        return self.architectures[0]


# What the Hub Dream repos ship in generation_config.json (token ids at the stand-in's values); the model's own
# `from_pretrained` reads it with `DreamGenerationConfig.from_pretrained`.
_DREAM_GENERATION_CONFIG = {
    "bos_token_id": EOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
    "mask_token_id": MASK_ID,
    "temperature": 0.2,
    "top_p": 0.95,
    "alg": "entropy",
    "steps": 512,
}

FAMILIES: dict[str, FamilySpec] = {
    "llada": FamilySpec(
        folder="llada",
        config_file="configuration_llada.py",
        modeling_file="modeling_llada.py",
        model_type="llada",
        architectures=("LLaDAModelLM",),
        auto_map={
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
            "AutoModel": "modeling_llada.LLaDAModelLM",
        },
        config={
            "d_model": 32,
            "n_heads": 4,
            "n_kv_heads": 4,
            "n_layers": 2,
            "mlp_hidden_size": 64,
            "vocab_size": VOCAB_SIZE,
            "embedding_size": VOCAB_SIZE,
            "max_sequence_length": 256,
            "rope_theta": 10000.0,
            "weight_tying": False,
            "mask_token_id": MASK_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "use_cache": False,
        },
        mask_token="<|mdm_mask|>",
        mask_in_config=True,
        attention="bidirectional",
        cache="none",
    ),
    "dream": FamilySpec(
        folder="dream",
        config_file="configuration_dream.py",
        modeling_file="modeling_dream.py",
        model_type="Dream",
        architectures=("DreamModel",),
        auto_map={
            "AutoConfig": "configuration_dream.DreamConfig",
            "AutoModel": "modeling_dream.DreamModel",
        },
        config={
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            "rope_theta": 10000.0,
            "mask_token_id": MASK_ID,
            "pad_token_id": PAD_ID,
            "bos_token_id": EOS_ID,
            "eos_token_id": EOS_ID,
            "use_cache": False,
            "tie_word_embeddings": False,
        },
        mask_token="<|mask|>",
        mask_in_config=True,
        shifted_logits=True,
        attention="bidirectional (caller's 4-D mask passed to SDPA as is)",
        cache="appends to a caller-given Cache in place; never returned; unused by generate",
        extra_files=("generation_utils.py",),
        generation_config=_DREAM_GENERATION_CONFIG,
    ),
    "sdar": FamilySpec(
        folder="sdar",
        config_file="configuration_sdar.py",
        modeling_file="modeling_sdar.py",
        model_type="sdar",
        architectures=("SDARForCausalLM",),
        auto_map={
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
        config={
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 256,
            "rope_theta": 10000.0,
            "bos_token_id": EOS_ID,
            "eos_token_id": EOS_ID,
            "use_cache": True,
            "tie_word_embeddings": False,
            # SDAR-4B-Chat / SDAR-8B-Chat config.json: "block_size": 4, "mask_token_id": 151669
            "block_size": 4,
            "mask_token_id": MASK_ID,
        },
        mask_token="<|MASK|>",
        mask_in_config=True,
        block_size_field="block_size",
        attention="block-causal, 4-D mask built by the caller and used as given (blocks from token 0 in generate.py)",
        cache="store_kv flag: True appends to the Cache, False attends to it read-only",
        extra={"default_block_length": 4},
    ),
    "fast_dllm_v2": FamilySpec(
        folder="fast_dllm_v2",
        config_file="configuration.py",
        modeling_file="modeling.py",
        model_type="Fast_dLLM_Qwen",
        architectures=("Fast_dLLM_QwenForCausalLM",),
        auto_map={
            "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
            "AutoModel": "modeling.Fast_dLLM_QwenModel",
            "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
        },
        config={
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            "rope_theta": 10000.0,
            "bd_size": 4,
            "bos_token_id": EOS_ID,
            "eos_token_id": EOS_ID,
            "use_cache": True,
            "tie_word_embeddings": False,
        },
        mask_token="|<MASK>|",
        block_size_field="bd_size",
        shifted_logits=True,
        attention="block-causal, built inside forward from cache length + index and the block_size kwarg",
        cache="update_past_key_values flag (+ optional use_block_cache / replace_position block cache)",
    ),
    "llada2": FamilySpec(
        folder="llada2",
        config_file="configuration_llada2_moe.py",
        modeling_file="modeling_llada2_moe.py",
        model_type="llada2_moe",
        architectures=("LLaDA2MoeModelLM",),
        auto_map={
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        config={
            "vocab_size": VOCAB_SIZE,
            "hidden_size": 32,
            "intermediate_size": 64,
            "moe_intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "max_position_embeddings": 256,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "pad_token_id": PAD_ID,
            "eos_token_id": EOS_ID,
            "use_cache": False,
            "tie_word_embeddings": False,
        },
        mask_token="<|mask|>",
        attention="block-causal, 4-D additive mask built by the caller (2-D/None masks become causal)",
        cache="plain append-always Cache (generate does not use it); crop to undo in-block forwards",
        extra={"default_block_length": 32},
    ),
}



# Other remote-code files published for a family, with the family's model_type (the library detects the family,
# then has to tell the variant by its interface).
VARIANTS: dict[str, FamilySpec] = {
    # Fast-dLLM's copy of Dream's modeling file (NVlabs/Fast-dLLM dream/model/modeling_dream.py): same config,
    # weights and generation config as the Hub Dream, but legacy list-of-(k, v) caches and `dual_cache` /
    # `replace_position` forward arguments.
    "dream_fast_dllm": FamilySpec(
        folder="dream_fast_dllm",
        files_from="dream",
        config_file="configuration_dream.py",
        modeling_file="modeling_dream.py",
        model_type="Dream",
        architectures=("DreamModel",),
        auto_map={
            "AutoConfig": "configuration_dream.DreamConfig",
            "AutoModel": "modeling_dream.DreamModel",
        },
        config=FAMILIES["dream"].config,
        mask_token="<|mask|>",
        mask_in_config=True,
        shifted_logits=True,
        attention="bidirectional (caller's 4-D mask passed to SDPA as is); position_ids ignored (arange)",
        cache="legacy list of per-layer (k, v) pre-RoPE projections, returned; reads past_key_values[0][0]",
        extra_files=("generation_utils.py",),
        generation_config=_DREAM_GENERATION_CONFIG,
    ),
}


def _family(family: str) -> FamilySpec:
    if family in FAMILIES:
        return FAMILIES[family]
    if family in VARIANTS:
        return VARIANTS[family]
    raise ValueError(f"unknown stand-in family {family!r}; choose from {sorted(FAMILIES) + sorted(VARIANTS)}")


def _source(spec: FamilySpec, name: str) -> Path:
    """The stand-in file `name` of `spec`: in its own folder, else in the folder it shares files with."""
    own = _HERE / spec.folder / name
    if own.is_file() or spec.files_from is None:
        return own
    return _HERE / spec.files_from / name


def _save_tokenizer(spec: FamilySpec, path: Path, vocab_size: int, mask_id: int, eos_id: int, pad_id: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = {UNK_ID: "<unk>", eos_id: "<|endoftext|>", mask_id: spec.mask_token}
    if pad_id != eos_id:
        special[pad_id] = "<|pad|>"
    vocab = {special.get(i, f"t{i}"): i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<|endoftext|>",
        pad_token=special[pad_id],
        mask_token=spec.mask_token,
    )
    tokenizer.save_pretrained(str(path))


@torch.no_grad()
def _init_weights(model: torch.nn.Module, init_std: float) -> None:
    """Deterministic, deliberately large init so that logits are far from uniform."""
    generator = torch.Generator().manual_seed(0)
    special = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    norm_params = {
        id(p) for m in model.modules() if type(m).__name__.endswith("Norm") for p in m.parameters(recurse=False)
    }
    for _, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=generator)
        if id(param) in norm_params:  # RMSNorm scales: around one
            param.copy_(1.0 + 0.1 * noise)
        elif id(param) in special:  # embedding and lm_head
            param.copy_(init_std * noise)
        elif param.ndim == 1:  # biases
            param.copy_(0.1 * noise)
        else:
            param.copy_(noise / param.shape[-1] ** 0.5)


def save_stand_in(
    family: str,
    path: str | Path,
    *,
    with_tokenizer: bool = True,
    init_std: float = 0.5,
    **config_overrides: Any,
) -> Path:
    """Write a loadable stand-in model folder for ``family`` at ``path`` and return it.

    ``config_overrides`` replace entries of the tiny default config (e.g. ``n_layers=1`` for
    LLaDA, ``bd_size=8`` for Fast-dLLM v2); an override set to ``None`` leaves the field out
    of ``config.json``. Weights are seeded (``torch.manual_seed(0)``).
    """
    from transformers import AutoConfig
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    spec = _family(family)
    mask_id = config_overrides.get("mask_token_id", spec.mask_token_id)
    mask_id = int(spec.mask_token_id if mask_id is None else mask_id)  # the tokenizer's mask id
    if not spec.mask_in_config:  # the real family keeps the mask id in the tokenizer only
        config_overrides.pop("mask_token_id", None)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name in (spec.config_file, spec.modeling_file, *spec.extra_files):
        shutil.copyfile(_source(spec, name), path / name)

    config_dict = dict(spec.config)
    config_dict.update(config_overrides)
    config_dict = {key: value for key, value in config_dict.items() if value is not None}
    config_dict.update(
        model_type=spec.model_type,
        architectures=list(spec.architectures),
        auto_map=dict(spec.auto_map),
        torch_dtype="float32",
    )
    (path / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    if spec.generation_config is not None:
        generation = dict(spec.generation_config, mask_token_id=mask_id)
        (path / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=True)
    module_file = spec.modeling_file[: -len(".py")]
    model_cls = get_class_from_dynamic_module(f"{module_file}.{spec.model_class}", str(path))
    torch.manual_seed(0)
    model = model_cls(config)
    _init_weights(model, init_std)

    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})

    if with_tokenizer:
        vocab_size = int(getattr(config, "vocab_size", VOCAB_SIZE))
        eos = getattr(config, "eos_token_id", None)
        eos = eos if isinstance(eos, int) else EOS_ID
        pad = getattr(config, "pad_token_id", None)  # transformers 5 leaves unset token ids undefined
        pad = pad if isinstance(pad, int) else eos
        _save_tokenizer(spec, path, vocab_size, mask_id, eos, pad)
    return path


def accept_new_validate_keywords(path: str | Path) -> None:
    """Let the Dream stand-in saved at ``path`` load on transformers 5 through plain ``from_pretrained``.

    The Hub Dream's ``DreamModel.from_pretrained`` calls ``DreamGenerationConfig.from_pretrained``, and
    transformers 5 then calls ``validate(user_set_attributes=...)``, which Dream's ``validate(self,
    is_init=False)`` rejects (TypeError), as the stand-in reproduces. Test plumbing only: it widens that
    signature in the folder's remote-code module (shared by every folder with the same name and files), so
    tests that need a loaded Dream do not depend on the library's own fix, which ``mrp_hf.load_backbone``
    must apply by itself (tested on a folder of its own).
    """
    import sys

    import transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    if int(transformers.__version__.split(".")[0]) < 5:
        return
    # the class object the modeling module imported (the one its `from_pretrained` calls)
    model_cls = get_class_from_dynamic_module("modeling_dream.DreamModel", str(path))
    config_cls = sys.modules[model_cls.__module__].DreamGenerationConfig
    original = config_cls.validate
    if getattr(original, "_stand_in_wrapped", False):
        return

    def validate(self, *args, **kwargs):
        return original(self, is_init=kwargs.get("is_init", False))

    validate._stand_in_wrapped = True
    config_cls.validate = validate


def load_stand_in(
    family: str,
    tmp_path: str | Path,
    *,
    auto_class: str | None = None,
    with_tokenizer: bool = False,
    **config_overrides: Any,
) -> torch.nn.Module:
    """Save the stand-in under ``tmp_path / family`` (Dream: ``family_validate_widened``, see
    ``accept_new_validate_keywords``) and load it back through ``trust_remote_code``.

    ``auto_class`` picks the Auto class by name (default: the family's LM head class, i.e.
    ``AutoModelForCausalLM`` where the Hub ``auto_map`` has it, else ``AutoModel``).
    Returns the model in eval mode.
    """
    import transformers

    spec = _family(family)
    widen = "generation_utils.py" in spec.extra_files
    # the widened Dream module must not be the one other tests load from a folder named after the family
    # (remote-code modules are shared by folder name and content): those go through the real signature
    folder = Path(tmp_path) / (f"{family}_validate_widened" if widen else family)
    path = save_stand_in(family, folder, with_tokenizer=with_tokenizer, **config_overrides)
    if auto_class is None:
        auto_class = "AutoModelForCausalLM" if "AutoModelForCausalLM" in spec.auto_map else "AutoModel"
    if widen:
        accept_new_validate_keywords(path)
    model = getattr(transformers, auto_class).from_pretrained(str(path), trust_remote_code=True)
    return model.eval()
