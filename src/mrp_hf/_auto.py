"""Registering mrp-hf's configs and models with transformers' Auto classes, without importing transformers.

`import mrp_hf` must stay fast and must not import transformers or torch. Yet `AutoConfig.from_pretrained(head)`
and `AutoModel.from_pretrained(head)` (and the bundled reference DLM's folders) should resolve once mrp-hf is
imported. So:

- the config types (`"mrp"`, `"mrp_reference_dlm"`) are registered with `AutoConfig` right after transformers
  imports its `configuration_auto` module (an import hook that fires once), or at once when it already has;
- the model classes are registered with `AutoModel`, `AutoModelForCausalLM` (the head: `MRPModel`, backbone + head
  + decoding) and `AutoModelForMaskedLM` (the reference DLM) when
  one of those configs is first built: a model is only looked up from a config, and by then transformers is fully
  imported (registering from inside transformers' own import chain could meet half-initialised modules).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading

_CONFIG_AUTO = "transformers.models.auto.configuration_auto"
_lock = threading.Lock()
_models_registered = False


def register_configs() -> None:
    """`AutoConfig.register` for the head's and the reference DLM's config types (idempotent)."""
    from transformers import AutoConfig

    from .configuration_mrp import MRPConfig
    from .reference.configuration_reference import ReferenceDLMConfig

    AutoConfig.register(MRPConfig.model_type, MRPConfig, exist_ok=True)
    AutoConfig.register(ReferenceDLMConfig.model_type, ReferenceDLMConfig, exist_ok=True)


def register_models() -> None:
    """`AutoModel` -> `MRPHead` and `AutoModelForCausalLM` -> `MRPModel` (backbone + head + decoding) for "mrp"
    configs; `AutoModel`/`AutoModelForMaskedLM` -> `ReferenceDLM`. Called when an MRP or reference config is built
    (once)."""
    global _models_registered
    if _models_registered:
        return
    with _lock:
        if _models_registered:
            return
        from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

        from .configuration_mrp import MRPConfig
        from .modeling_mrp import MRPHead, MRPModel
        from .reference.configuration_reference import ReferenceDLMConfig
        from .reference.modeling_reference import ReferenceDLM

        register_configs()
        AutoModel.register(MRPConfig, MRPHead, exist_ok=True)
        AutoModelForCausalLM.register(MRPConfig, MRPModel, exist_ok=True)
        AutoModel.register(ReferenceDLMConfig, ReferenceDLM, exist_ok=True)
        AutoModelForMaskedLM.register(ReferenceDLMConfig, ReferenceDLM, exist_ok=True)
        _models_registered = True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `callback` right after the module `name` has been executed (once), then steps aside."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute, callback = spec.loader.exec_module, self.callback

        def exec_module(module):
            execute(module)
            callback()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called by `import mrp_hf`: register the configs now if transformers' auto module is loaded, else when it is."""
    if _CONFIG_AUTO in sys.modules:
        register_configs()
    elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_CONFIG_AUTO, register_configs))
