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

``save_stand_in`` writes ``config.json`` (with the Hub ``auto_map``), the two python
files, seeded random ``model.safetensors`` weights and, by default, a tiny word-level
tokenizer whose special tokens sit at the family's ids.  The folder then loads with
``AutoModel*.from_pretrained(path, trust_remote_code=True)`` on transformers 4.x and 5.x.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["FAMILIES", "FamilySpec", "load_stand_in", "save_stand_in"]

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

    @property
    def model_class(self) -> str:
        return self.architectures[0]


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
        },
        mask_token="<|MASK|>",
        attention="block-causal, mask built by the caller (block length is a decoding argument)",
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


def _family(family: str) -> FamilySpec:
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown stand-in family {family!r}; choose from {sorted(FAMILIES)}") from None


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
    LLaDA, ``bd_size=8`` for Fast-dLLM v2).  Weights are seeded (``torch.manual_seed(0)``).
    """
    from transformers import AutoConfig
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    spec = _family(family)
    mask_id = int(config_overrides.get("mask_token_id", spec.mask_token_id))
    if not spec.mask_in_config:  # the real family keeps the mask id in the tokenizer only
        config_overrides.pop("mask_token_id", None)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name in (spec.config_file, spec.modeling_file):
        shutil.copyfile(_HERE / spec.folder / name, path / name)

    config_dict = dict(spec.config)
    config_dict.update(config_overrides)
    config_dict.update(
        model_type=spec.model_type,
        architectures=list(spec.architectures),
        auto_map=dict(spec.auto_map),
        torch_dtype="float32",
    )
    (path / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")

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


def load_stand_in(
    family: str,
    tmp_path: str | Path,
    *,
    auto_class: str | None = None,
    with_tokenizer: bool = False,
    **config_overrides: Any,
) -> torch.nn.Module:
    """Save the stand-in under ``tmp_path / family`` and load it back through ``trust_remote_code``.

    ``auto_class`` picks the Auto class by name (default: the family's LM head class, i.e.
    ``AutoModelForCausalLM`` where the Hub ``auto_map`` has it, else ``AutoModel``).
    Returns the model in eval mode.
    """
    import transformers

    spec = _family(family)
    path = save_stand_in(family, Path(tmp_path) / family, with_tokenizer=with_tokenizer, **config_overrides)
    if auto_class is None:
        auto_class = "AutoModelForCausalLM" if "AutoModelForCausalLM" in spec.auto_map else "AutoModel"
    model = getattr(transformers, auto_class).from_pretrained(str(path), trust_remote_code=True)
    return model.eval()
