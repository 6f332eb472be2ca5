"""FSDP support for head training: shard the frozen backbone's layers, gather full state dicts.

Under an `accelerate` FSDP config (FSDP1 or FSDP2, `fsdp_version`):

- the head (the trained module, inside `HeadChain`) goes through `Accelerator.prepare` and is wrapped and
  sharded by `accelerate` as configured; a `fsdp_transformer_layer_cls_to_wrap` naming the backbone's layer
  class is applied to the backbone (below), and the head's own layers are wrapped instead;
- the frozen backbone's transformer layers are sharded over all processes by `shard_backbone` (the same
  FSDP version, `FULL_SHARD` / `reshard_after_forward=True` since it never runs a backward, CPU offload
  if the config asks for it). Its embedding, final norm and lm_head stay replicated: the head's loss runs
  through the backbone's embedding and lm_head outside the backbone's forward, where sharded weights
  would not be gathered;
- checkpoints and the saved head use full (gathered) state dicts (`torch.distributed.checkpoint.state_dict`),
  so the files are the same plain tensors as without FSDP (the optimizer state is keyed by parameter name).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.utils import logging

logger = logging.get_logger(__name__)


def fsdp_version(accelerator) -> int | None:
    """1 or 2 when `accelerator` runs FSDP, else None."""
    if accelerator.distributed_type.name != "FSDP":
        return None
    plugin = accelerator.state.fsdp_plugin
    return int(getattr(plugin, "fsdp_version", 1) or 1)


def _class_names(module: nn.Module) -> set[str]:
    return {type(m).__name__ for m in module.modules()}


def split_wrap_classes(plugin, head_module: nn.Module) -> list[str] | None:
    """Take the backbone's layer classes out of the plugin's `transformer_cls_names_to_wrap` (accelerate would
    look for them in the head and fail) and return them; the plugin keeps the names present in the head
    (or none: then the head's own `_no_split_modules` are used)."""
    names = getattr(plugin, "transformer_cls_names_to_wrap", None)
    if not names:
        return None
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    in_head = _class_names(head_module)
    plugin.transformer_cls_names_to_wrap = [n for n in names if n in in_head] or None
    return [n for n in names if n not in in_head] or None


def backbone_layers(model: nn.Module, class_names: list[str] | None = None) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of the backbone's transformer layers, outermost matches only: the classes named
    in the FSDP config, else the model's `_no_split_modules` (transformers' and most remote code's list of
    layer classes). Modules that hold the input or output embedding are never chosen."""
    names = list(class_names or [])
    if not names:
        for module in model.modules():
            found = getattr(module, "_no_split_modules", None)
            if found:
                names = list(found)
                break
    if not names:
        return []
    keep = set(names)
    shared = set()
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        try:
            embedding = getattr(model, getter)()
        except (AttributeError, NotImplementedError):
            embedding = None
        if embedding is not None:
            shared.update(id(p) for p in embedding.parameters())
    layers: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if type(module).__name__ not in keep or any(name.startswith(outer + ".") for outer, _ in layers):
            continue
        if any(id(p) in shared for p in module.parameters()):
            continue
        layers.append((name, module))
    return layers


def _move_rest(model: nn.Module, skip: set[int], device: torch.device) -> None:
    """Move every parameter and buffer outside the sharded layers to `device`, keeping tied parameters tied."""
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None and id(param) not in skip and param.device != device:
                param.data = param.data.to(device)
        for name, buffer in module._buffers.items():
            if buffer is not None and id(buffer) not in skip and buffer.device != device:
                module._buffers[name] = buffer.to(device)


def shard_backbone(model: nn.Module, accelerator, class_names: list[str] | None = None) -> int:
    """Shard the frozen backbone's transformer layers with FSDP (in place) and move the rest of it to the
    process's device. Returns the number of sharded layers (0: nothing matched, the backbone is replicated)."""
    version = fsdp_version(accelerator)
    plugin = accelerator.state.fsdp_plugin
    device = accelerator.device
    layers = backbone_layers(model, class_names)
    if not layers:
        return 0
    inside = {id(t) for _, layer in layers for t in (*layer.parameters(), *layer.buffers())}
    _move_rest(model, inside, device)
    offload = bool(getattr(getattr(plugin, "cpu_offload", None), "offload_params", False))
    if version == 2:
        try:
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
        except ImportError:  # torch < 2.6
            from torch.distributed._composable.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (accelerator.num_processes,))
        policy = CPUOffloadPolicy() if offload else OffloadPolicy()
        for _, layer in layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=True, offload_policy=policy)
    else:
        from torch.distributed.fsdp import CPUOffload, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        modules = dict(model.named_modules())
        for name, layer in layers:
            parent_name, _, child = name.rpartition(".")
            wrapped = FSDP(
                layer,
                sharding_strategy=ShardingStrategy.FULL_SHARD,
                cpu_offload=CPUOffload(offload_params=offload),
                device_id=torch.device("cpu") if device.type == "cpu" else device,
                use_orig_params=True,
                limit_all_gathers=True,
            )
            setattr(modules[parent_name] if parent_name else model, child, wrapped)
    return len(layers)


# ---------------------------------------------------------------------------------------- state dicts
def _options(accelerator, **kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # On GPU the full state is gathered to the CPU of the first process only; on CPU, FSDP1's offloading
    # gather crashes (torch 2.13), and every process gets the full state instead (the head is small).
    return StateDictOptions(full_state_dict=True, cpu_offload=accelerator.device.type != "cpu", **kwargs)


def _strip(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in state.items()}


def full_model_state(accelerator, model: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The full state dict of an FSDP-prepared model (collective: every process calls it). The main process
    gets CPU tensors; the others may get an empty dict."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(accelerator))
    out = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if k.startswith(prefix)}
    return _strip(out, prefix)


def load_full_model_state(accelerator, model: nn.Module, state: dict[str, torch.Tensor], prefix: str = "") -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = {prefix + k: v for k, v in state.items()}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=True))


def full_optimizer_state(accelerator, model: nn.Module, optimizer) -> dict[str, Any]:
    """The full optimizer state keyed by parameter name (collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, _unwrap_optimizer(optimizer), options=_options(accelerator))


def load_full_optimizer_state(accelerator, model: nn.Module, optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        model, _unwrap_optimizer(optimizer), optim_state_dict=state, options=StateDictOptions(full_state_dict=True)
    )


def _unwrap_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
