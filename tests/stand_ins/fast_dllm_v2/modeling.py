"""Tiny stand-in for Fast-dLLM v2's remote code (``modeling.Fast_dLLM_QwenForCausalLM``).

Written from scratch for the mrp-hf tests; only the public interface follows the
Hub model (a Qwen2.5 decoder turned into a block diffusion model):

* ``Fast_dLLM_QwenForCausalLM`` -> ``model`` (``Fast_dLLM_QwenModel``: ``embed_tokens``, ``layers``,
  ``norm``) + ``lm_head``;
* ``forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, labels, use_cache,
  cache_position, logits_to_keep, update_past_key_values, block_size=32, use_block_cache,
  block_past_key_values, replace_position, mask_id, **kwargs)`` returning
  ``CausalLMOutputWithPastAndBlockCache`` (a ``CausalLMOutputWithPast`` with ``block_past_key_values``);
  its ``hidden_states`` is always the final normalised hidden state as ONE tensor ``[B, L, H]`` (not a
  per-layer tuple, whatever ``output_hidden_states`` says), as the Hub forward returns it;
* at inference the model *ignores* ``attention_mask`` and builds its own block-causal mask: query at
  absolute index ``cache_len + i`` may see key ``j`` iff ``(cache_len + i) // block_size >= j // block_size``
  (``block_size`` is the forward kwarg, default 32, not ``config.bd_size``), so blocks are aligned on
  absolute index and the cached prefix must end on a block boundary; padding is not supported;
* positions come from ``position_ids``, else from ``cache_position``;
* logits are not shifted inside the model; the caller does ``cat([logits[:, :1], logits[:, :-1]])``;
* KV cache: ``use_cache=True`` (a ``DynamicCache`` is created if none is given) with
  ``update_past_key_values=True`` appends this forward's keys/values to ``past_key_values``; with
  ``False`` the cache is only read.  ``use_block_cache=True`` keeps the current block's keys/values in
  ``block_past_key_values``; a later call with a sub-block and ``replace_position=p`` overwrites positions
  ``p..p+len`` of that block cache and attends, unmasked, to cache + the whole cached block.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration import Fast_dLLM_QwenConfig


@dataclass
class CausalLMOutputWithPastAndBlockCache(CausalLMOutputWithPast):
    block_past_key_values: Cache | None = None


@dataclass
class BaseModelOutputWithPastAndBlockCache(BaseModelOutputWithPast):
    block_past_key_values: Cache | None = None


def _cached_kv(cache, layer_idx):
    """(keys, values) stored for ``layer_idx`` in a transformers Cache, or None (4.x and 5.x)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        if layer_idx < len(layers) and getattr(layers[layer_idx], "keys", None) is not None:
            if getattr(layers[layer_idx], "is_initialized", True):
                return layers[layer_idx].keys, layers[layer_idx].values
        return None
    if len(cache) > layer_idx:  # older DynamicCache: tuple access
        return cache[layer_idx]
    return None


def eval_block_diff_mask(q_idx, kv_idx, block_size=None):
    return q_idx // block_size >= kv_idx // block_size


class Fast_dLLM_QwenMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Fast_dLLM_QwenAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        hidden_states,
        position_embeddings,
        attention_mask,
        past_key_value=None,
        update_past_key_values=False,
        block_past_key_values=None,
        replace_position=None,
    ):
        b, length, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, length, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, length, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, length, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)

        if block_past_key_values is not None:
            cached = _cached_kv(block_past_key_values, self.layer_idx)
            if cached is None:  # first call for this block: remember the whole block
                k, v = block_past_key_values.update(k, v, self.layer_idx)
            else:  # later call with a sub-block: overwrite it in place, attend to the whole block
                block_k, block_v = cached
                block_k[:, :, replace_position : replace_position + length] = k
                block_v[:, :, replace_position : replace_position + length] = v
                k, v = block_k, block_v

        if past_key_value is not None:
            if update_past_key_values:
                k, v = past_key_value.update(k, v, self.layer_idx)
            else:
                cached = _cached_kv(past_key_value, self.layer_idx)
                if cached is not None:
                    k = torch.cat([cached[0], k], dim=-2)
                    v = torch.cat([cached[1], v], dim=-2)

        groups = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=False, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))


class Fast_dLLM_QwenRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class Fast_dLLM_QwenDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = Fast_dLLM_QwenAttention(config, layer_idx)
        self.mlp = Fast_dLLM_QwenMLP(config)
        self.input_layernorm = Fast_dLLM_QwenRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Fast_dLLM_QwenRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, **cache_kwargs):
        h = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask, **cache_kwargs)
        hidden_states = hidden_states + h
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Fast_dLLM_QwenPreTrainedModel(PreTrainedModel):
    config_class = Fast_dLLM_QwenConfig
    base_model_prefix = "model"
    _no_split_modules = ["Fast_dLLM_QwenDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_cache_class = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()
        elif isinstance(module, Fast_dLLM_QwenRMSNorm):
            module.weight.data.fill_(1.0)


class Fast_dLLM_QwenRotaryEmbedding(nn.Module):
    """Plain RoPE; the Hub class looks up ``ROPE_INIT_FUNCTIONS["default"]`` instead."""

    def __init__(self, config):
        super().__init__()
        self.dim = config.hidden_size // config.num_attention_heads
        self.base = config.rope_theta

    def forward(self, x, position_ids):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32, device=x.device) / self.dim))
        angles = position_ids.float()[..., None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


class Fast_dLLM_QwenModel(Fast_dLLM_QwenPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = getattr(config, "pad_token_id", None)  # not set by default on transformers 5
        self.vocab_size = config.vocab_size
        self.bd_size = config.bd_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([Fast_dLLM_QwenDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Fast_dLLM_QwenRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Fast_dLLM_QwenRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def eval_mask(self, seqlen, block_size, cache_seq_len, device=None):
        q_idx = torch.arange(seqlen, device=device) + cache_seq_len
        kv_idx = torch.arange(seqlen + cache_seq_len, device=device)
        return eval_block_diff_mask(q_idx[:, None], kv_idx[None, :], block_size=block_size)

    def forward(
        self,
        input_ids=None,
        labels=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        use_cache=None,
        cache_position=None,
        update_past_key_values=False,
        block_size=32,
        use_block_cache=False,
        block_past_key_values=None,
        replace_position=None,
        **kwargs,
    ):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if use_block_cache and block_past_key_values is None:
            block_past_key_values = DynamicCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if cache_position is None:
            start = past + (replace_position or 0) if use_block_cache else past
            cache_position = torch.arange(start, start + inputs_embeds.shape[1], device=inputs_embeds.device)
        if position_ids is None:
            position_ids = cache_position.unsqueeze(0)

        if use_block_cache and block_past_key_values.get_seq_length() != 0:
            attention_mask = None  # sub-block call: see the whole cached block and prefix
        else:  # the caller's attention_mask is ignored, as in the Hub code
            attention_mask = self.eval_mask(inputs_embeds.shape[1], block_size, past, device=inputs_embeds.device)

        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                attention_mask,
                position_embeddings,
                past_key_value=past_key_values,
                update_past_key_values=update_past_key_values,
                block_past_key_values=block_past_key_values,
                replace_position=replace_position,
            )
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPastAndBlockCache(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if use_cache else None,
            block_past_key_values=block_past_key_values if use_block_cache else None,
        )


class Fast_dLLM_QwenForCausalLM(Fast_dLLM_QwenPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = Fast_dLLM_QwenModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def get_decoder(self):
        return self.model

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        cache_position=None,
        logits_to_keep=0,
        update_past_key_values=False,
        block_size=32,
        use_block_cache=False,
        block_past_key_values=None,
        replace_position=None,
        mask_id=151665,
        **kwargs,
    ):
        if self.training:
            raise NotImplementedError("the stand-in has no training path")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            cache_position=cache_position,
            update_past_key_values=update_past_key_values,
            block_size=block_size,
            use_block_cache=use_block_cache,
            block_past_key_values=block_past_key_values,
            replace_position=replace_position,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])
        out = CausalLMOutputWithPastAndBlockCache(
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=hidden_states,  # the Hub returns the last hidden state here, as a tensor
            block_past_key_values=outputs.block_past_key_values,
        )
        return out.to_tuple() if kwargs.get("return_dict") is False else out
