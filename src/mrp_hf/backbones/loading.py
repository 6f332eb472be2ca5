"""`load_backbone`: load a DLM by Hub id or local path, with the family's compatibility needs handled."""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import AutoConfig
from transformers.utils import logging

from .._compat import (
    DTYPE_KWARG,
    IS_TRANSFORMERS_5,
    accept_4x_generation_config_validate,
    register_default_rope,
    reinit_rope_buffers,
)
from .registry import resolve_adapter_class

logger = logging.get_logger(__name__)

# Auto classes tried, in order, among those a remote-code repo's `auto_map` names.
_AUTO_PREFERENCE = ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel")
#: `from_pretrained` keyword arguments that say where the files are: the config, the tokenizer, a head and a PEFT
#: adapter need them too
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "token")
#: `torch_dtype` / `dtype` values by name (the CLIs' and lm-eval's `--dtype`)
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """A dtype from its name ("auto": the checkpoint's own), or a dtype/None passed through."""
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not one of {sorted(DTYPES)}.")
    return DTYPES[name]


def _auto_class(config) -> type:
    auto_map = getattr(config, "auto_map", None) or {}
    for name in _AUTO_PREFERENCE:
        if name in auto_map:
            return getattr(transformers, name)
    for arch in getattr(config, "architectures", None) or ():
        if arch.endswith("ForMaskedLM"):
            return transformers.AutoModelForMaskedLM
        if arch.endswith("ForCausalLM") or arch.endswith("LMHeadModel"):
            return transformers.AutoModelForCausalLM
    return transformers.AutoModelForMaskedLM


def _import_remote_code(path: str, config, revision: str | None, hub_kwargs: dict[str, Any]) -> None:
    """Import the model class the config's `auto_map` names (as `from_pretrained` is about to), so that the
    compatibility fixes can see its module before it runs; transformers keeps the module for the load."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    reference = (getattr(config, "auto_map", None) or {}).get(_auto_class(config).__name__)
    if reference:
        get_class_from_dynamic_module(reference, path, revision=revision, **hub_kwargs)


def _tokenizer_mask_id(path: str, revision: str | None, trust_remote_code: bool, **hub_kwargs: Any) -> int | None:
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            path, revision=revision, trust_remote_code=trust_remote_code, **hub_kwargs
        )
    except Exception:  # no tokenizer saved beside the model is fine: the mask id may come from the config
        return None
    return getattr(tokenizer, "mask_token_id", None)


def _saved_generation_config(path: str, revision: str | None, **hub_kwargs: Any):
    """The `generation_config.json` saved beside a backbone, or None when there is none."""
    try:
        return transformers.GenerationConfig.from_pretrained(path, revision=revision, **hub_kwargs)
    except OSError:
        return None


def load_backbone(
    pretrained_model_name_or_path: str,
    backbone_family: str | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    torch_dtype: torch.dtype | str | None = None,
    device_map: Any = None,
    return_mask_token_id: bool = False,
    **kwargs: Any,
):
    """Load a diffusion LM backbone (in eval mode) from the Hub or a local folder.

    The family is detected from the config (or forced with `backbone_family`); families that cannot be
    decoded as masked diffusion are refused before any weight is loaded. `trust_remote_code` is passed
    through, never forced on. With `return_mask_token_id=True` also returns the tokenizer's mask token
    id (None if no tokenizer is saved there), for families whose config does not carry it.
    """
    hub_kwargs = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}
    config_kwargs = dict(hub_kwargs, **({"subfolder": kwargs["subfolder"]} if "subfolder" in kwargs else {}))
    config = AutoConfig.from_pretrained(
        pretrained_model_name_or_path, trust_remote_code=trust_remote_code, revision=revision, **config_kwargs
    )
    adapter_cls = resolve_adapter_class(config, backbone_family)
    remote = bool(getattr(config, "auto_map", None)) and trust_remote_code
    if IS_TRANSFORMERS_5 and remote:
        register_default_rope()
        _import_remote_code(pretrained_model_name_or_path, config, revision, hub_kwargs)
        accept_4x_generation_config_validate()
    load_kwargs: dict[str, Any] = dict(kwargs, trust_remote_code=trust_remote_code, revision=revision, config=config)
    if torch_dtype is not None:
        load_kwargs[DTYPE_KWARG] = torch_dtype
    if device_map is not None:
        load_kwargs["device_map"] = device_map
    try:
        model = _auto_class(config).from_pretrained(pretrained_model_name_or_path, **load_kwargs)
    except Exception as err:
        if not remote:
            raise
        raise RuntimeError(
            f"Loading {pretrained_model_name_or_path!r} ({adapter_cls.family} family) failed inside its remote code "
            f"under transformers {transformers.__version__}: {type(err).__name__}: {err}. "
            + (
                "Most Hub DLMs' remote code was written for transformers 4.x: install "
                "'transformers>=4.46,<5' (tested with 4.57.6) in this environment."
                if IS_TRANSFORMERS_5
                else "Check that the repo's remote code matches this transformers version."
            )
        ) from err
    if IS_TRANSFORMERS_5 and remote:
        reinit_rope_buffers(model)
    if getattr(model, "generation_config", None) is None:
        # transformers 5 attaches generation_config.json only to models that can generate(); ours decodes them
        model.generation_config = _saved_generation_config(pretrained_model_name_or_path, revision, **config_kwargs)
    model.eval()
    if not return_mask_token_id:
        return model
    return model, _tokenizer_mask_id(pretrained_model_name_or_path, revision, trust_remote_code, **hub_kwargs)
