"""A head repo as transformers sees it, and the `generate` that `custom_generate` runs.

A saved head folder (`MRPHead.save_pretrained`, `push_to_hub`) holds, beside its weights and config:

- `configuration_mrp.py` and `modeling_mrp.py`, the code files its config's `auto_map` names, so that
  `AutoConfig` / `AutoModel` / `AutoModelForCausalLM.from_pretrained(head, trust_remote_code=True)` resolve in an
  interpreter that has mrp-hf installed but never imported it. They only import mrp-hf's own classes (the code
  lives in the package, not in the repo); without mrp-hf installed, transformers' check of the files' imports
  names the missing package.
- `custom_generate/generate.py` and `custom_generate/requirements.txt`, so that any backbone with transformers'
  `GenerationMixin` decodes with the head through
  `backbone.generate(ids, custom_generate=<head repo or folder>, trust_remote_code=True, mrp_mode=...)`.
  The generate.py only calls `custom_generate` below.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

#: what config.json's `auto_map` says (class references into the code files below)
AUTO_MAP = {
    "AutoConfig": "configuration_mrp.MRPConfig",
    "AutoModel": "modeling_mrp.MRPHead",
    "AutoModelForCausalLM": "modeling_mrp.MRPModel",
}

#: the small code files of a head repo, by path in the repo
CODE_FILES = {
    "configuration_mrp.py": (
        '"""`MRPConfig` for transformers\' `auto_map`: the class lives in the mrp-hf package (pip install mrp-hf)."""\n'
        "\n"
        "from mrp_hf.configuration_mrp import MRPConfig\n"
        "\n"
        '__all__ = ["MRPConfig"]\n'
    ),
    "modeling_mrp.py": (
        '"""`MRPHead` (AutoModel) and `MRPModel` (AutoModelForCausalLM: backbone + head + decoding) for transformers\'\n'
        '`auto_map`: the classes live in the mrp-hf package (pip install mrp-hf)."""\n'
        "\n"
        "from mrp_hf.modeling_mrp import MRPHead, MRPModel\n"
        "\n"
        '__all__ = ["MRPHead", "MRPModel"]\n'
    ),
    "custom_generate/generate.py": (
        '"""transformers\' `custom_generate` entry of an MRP head repo: decode with the head of this repo on the model\n'
        'whose generate() was called, `model.generate(ids, custom_generate=<this repo>, trust_remote_code=True,\n'
        'mrp_mode="speculative")`. The decoding lives in the mrp-hf package (pip install mrp-hf)."""\n'
        "\n"
        "from mrp_hf.hub import custom_generate as generate\n"
        "\n"
        '__all__ = ["generate"]\n'
    ),
    "custom_generate/requirements.txt": "mrp-hf\n",
}

# generate() inputs transformers hands to every custom generate function that this decoding has no use for
_REFUSED_INPUTS = ("prefix_allowed_tokens_fn", "assistant_model", "negative_prompt_ids", "negative_prompt_attention_mask")
_IGNORED_WHEN_UNSET = ("synced_gpus",)
# where the head is read from: the same loading arguments as the repo's code
_LOADING_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "proxies", "subfolder")


def write_head_code(folder: str | os.PathLike) -> list[str]:
    """Write `CODE_FILES` into a head folder; returns their paths in the repo."""
    for name, text in CODE_FILES.items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(CODE_FILES)


def custom_generate(
    model: Any,
    inputs: Any = None,
    generation_config: Any = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    streamer: Any = None,
    mrp_head: str | os.PathLike | None = None,
    **kwargs: Any,
):
    """What `model.generate(..., custom_generate=<head repo>, trust_remote_code=True)` runs.

    Steps:
        1. Refuse generate() inputs masked-diffusion decoding does not use (`assistant_model`, negative prompts,
           `prefix_allowed_tokens_fn`, `synced_gpus=True`).
        2. Find the head: `mrp_head` if given, else the `custom_generate` argument of the `generate` call that
           runs this function (a Hub repo id or a local folder), read with the call's `revision`, `token`,
           `cache_dir`, `local_files_only`.
        3. Load it once per (model, head, revision) and wrap the model with it (`MRPModel.from_backbone`: the head
           is checked against the model); its decoding defaults (generation_config.json) apply.
        4. `MRPModel.generate` with the remaining arguments: an MRP mode with `mrp_mode=...`, else the model's own
           static / dynamic decoding (`mrp_mode="off"`, unless the head repo ships another default).
    """
    from transformers import GenerationMixin

    from .modeling_mrp import attach

    if not isinstance(model, GenerationMixin):  # only reachable by calling this function directly
        raise TypeError(
            f"{type(model).__name__} has no transformers GenerationMixin, so generate(custom_generate=...) cannot reach "
            f"it (e.g. LLaDA's remote code on transformers >= 4.50); use mrp_hf.{attach.__name__}(model, head) or "
            f"mrp_hf.MRPModel.from_pretrained(head, backbone=model) instead."
        )
    # 1. inputs this decoding has no use for
    for name in _REFUSED_INPUTS:
        if kwargs.pop(name, None) is not None:
            raise TypeError(f"generate(custom_generate=<MRP head>) does not support {name}: remove it.")
    for name in _IGNORED_WHEN_UNSET:
        if kwargs.pop(name, None):
            raise TypeError(f"generate(custom_generate=<MRP head>) does not support {name}=True: remove it.")
    kwargs.pop("use_model_defaults", None)  # transformers 4.x: the model's defaults are always the starting point here
    # 2. the head's location and how to read it
    loading = {name: kwargs.pop(name) for name in _LOADING_KWARGS if kwargs.get(name) is not None}
    kwargs.pop("trust_remote_code", None)
    location = str(mrp_head) if mrp_head is not None else _custom_generate_argument()
    # 3. the wrapped model, 4. decoding
    wrapped = _wrapped(model, location, loading)
    input_ids = kwargs.pop("input_ids", None)
    return wrapped.generate(
        inputs if inputs is not None else input_ids, generation_config=generation_config,
        logits_processor=logits_processor, stopping_criteria=stopping_criteria, streamer=streamer, **kwargs,
    )


def _custom_generate_argument() -> str:
    """The `custom_generate` string of the transformers `generate` call that is running us. transformers passes a
    custom generate function every generate() argument except `custom_generate` itself, and copies the function
    out of the repo, so the repo is found in the calling frame (both transformers 4.56+ and 5.x call the function
    straight from `GenerationMixin.generate`)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == "generate":
                value = frame.f_locals.get("custom_generate")
                if isinstance(value, (str, os.PathLike)):
                    return str(value)
            frame = frame.f_back
    finally:
        del frame
    raise ValueError(
        "Could not tell which MRP head repo this custom generate function comes from (it was not called through "
        "model.generate(custom_generate=<repo or folder>)); pass mrp_head=<head repo id or folder>."
    )


# where a model keeps its wrappers, {(head location, loading arguments): MRPModel}: on the model itself (a plain
# attribute, not a submodule: saving the model never saves a head), so they go when the model goes
_WRAPPERS_ATTRIBUTE = "_mrp_custom_generate_wrappers"


def _wrapped(model: Any, location: str, loading: dict[str, Any]):
    from .modeling_mrp import MRPHead, MRPModel, model_generation_config

    key = (location, tuple(sorted((k, str(v)) for k, v in loading.items())))
    wrappers = model.__dict__.get(_WRAPPERS_ATTRIBUTE)
    if wrappers is None:
        wrappers = {}
        object.__setattr__(model, _WRAPPERS_ATTRIBUTE, wrappers)
    wrapped = wrappers.get(key)
    if wrapped is None:
        head = MRPHead.from_pretrained(location, **loading)
        wrapped = MRPModel.from_backbone(model, head=head)
        head.to(device=wrapped.device).eval()
        wrappers[key] = wrapped
    # the model's own generation_config may have changed since: its defaults are read at every call
    wrapped.generation_config = model_generation_config(model, wrapped.head)
    return wrapped
