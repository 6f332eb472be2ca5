"""`load_backbone`: load a DLM by Hub id or local path, with the family's compatibility needs handled."""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlparse

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


class ModelSourceError(OSError):
    """A model location that cannot be loaded: a local folder that does not exist, or a Hub id that is neither in
    the local cache nor reachable. The message says which, in one line."""


def check_model_source(name_or_path: str, revision: str | None = None, what: str = "model", **hub_kwargs: Any) -> None:
    """Fail at once, in one line, when `name_or_path` cannot be loaded: transformers would otherwise print a
    "Repo id must be in the form" error for a mistyped folder, or try the Hub for about a minute on a machine with
    no connection before saying the id is not cached."""
    path = os.path.expanduser(str(name_or_path))
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise ModelSourceError(f"{what} {name_or_path}: is a file; give the folder that holds config.json, or a Hub id.")
    looks_local = path.startswith(("./", "../", "/", "~", ".\\")) or path in (".", "..") or path.count("/") > 1
    if looks_local:
        raise ModelSourceError(f"no such folder: {name_or_path} (the {what} to load)")
    if _cached_on_hub(path, revision, hub_kwargs.get("cache_dir")):
        return
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or hub_kwargs.get("local_files_only"):
        raise ModelSourceError(
            f"{what} {name_or_path!r}: no such folder, not in the local cache ({hub_kwargs.get('cache_dir') or constants.HF_HUB_CACHE}), "
            f"and offline (HF_HUB_OFFLINE=1 or local_files_only): download it where there is a connection, or give a local folder."
        )
    unreachable = _hub_unreachable(constants.ENDPOINT)
    if unreachable:
        raise ModelSourceError(
            f"{what} {name_or_path!r}: no such folder, not in the local cache ({hub_kwargs.get('cache_dir') or constants.HF_HUB_CACHE}), "
            f"and offline: {constants.ENDPOINT} cannot be reached ({unreachable}). Download it where there is a connection, "
            f"or give a local folder."
        )


def _cached_on_hub(repo_id: str, revision: str | None, cache_dir: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir, revision=revision)
    except HFValidationError as err:  # not a valid repo id, and no such folder either
        raise ModelSourceError(f"no such folder, and not a Hub id: {repo_id} ({err})") from None
    return isinstance(found, str)


def _hub_unreachable(endpoint: str, timeout: float = 3.0) -> str | None:
    """Why the Hub cannot be reached (a TCP connection within `timeout` seconds), or None when it can. Behind a
    proxy the direct connection says nothing, so it is not tried."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout).close()
    except OSError as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return None


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
    check_model_source(pretrained_model_name_or_path, revision, what="backbone", **hub_kwargs)
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


def load_mrp_model(head: str | None, backbone: str | None, load: dict, identity: dict | None = None):
    """(MRPModel, where its tokenizer is): the head with the given backbone or the one its config names (a
    missing head folder or an uncached id fails at once, in one line), or the backbone alone. `load`: backbone
    loading arguments (dtype, device_map, trust_remote_code, ...); `identity`: token ids the model should use.
    One loader for `mrp-hf generate`, `mrp-hf eval` and `mrp-hf demo --head`."""
    from ..modeling_mrp import MRPHead, MRPModel, _base_model_location

    identity = identity or {}
    if not head:
        return MRPModel.from_backbone_pretrained(backbone, **identity, **load), backbone
    check_model_source(head, what="head")
    loaded = load_backbone(backbone, **load) if backbone else None
    model = MRPModel.from_pretrained(head, backbone=loaded, **identity, **({} if loaded is not None else load))
    return model, backbone or _base_model_location(MRPHead.config_class.from_pretrained(head).base_model_name_or_path, head)
