"""Tiny stand-in for SDAR's remote code (``modeling_sdar.SDARForCausalLM``).

Written from scratch for the mrp-hf tests; only the public interface follows the
Hub model (a Qwen3 decoder with per-head q/k RMSNorm):

* ``SDARForCausalLM`` -> ``model`` (``SDARModel``: ``embed_tokens``, ``layers``, ``norm``) + ``lm_head``;
* ``forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, labels, use_cache,
  output_attentions, output_hidden_states, cache_position, logits_to_keep, **kwargs)`` where the extra
  kwarg ``store_kv`` reaches the attention layers; returns ``CausalLMOutputWithPast``;
* the model does not build any causal or block mask: at inference ``attention_mask`` (the caller's
  block-causal 0/1 mask, ``[B, q, k]`` or ``[B, 1, q, k]``) is cast to bool and given to SDPA as is;
  an all-true mask means "no mask"; ``None`` is an error (the Hub code fails on it too). SDAR's
  ``generate.py`` builds it from block indices counted from token 0 (``tril`` over blocks, expanded by the
  block size), the prompt sitting at positions ``0..P-1``, so the prompt's tail shares its block with the
  first answer tokens; ``config.block_size`` is that block size;
* positions come from ``position_ids``, else from ``cache_position`` (cache length + arange);
* KV cache: with a ``Cache`` in ``past_key_values``, ``store_kv=True`` appends this forward's keys and
  values (and attends to cache + current), ``store_kv=False`` attends to cache + current without
  storing anything.  ``use_cache=True`` without a cache creates a ``DynamicCache``.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_sdar import SDARConfig


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


class SDARRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class SDARMLP(nn.Module):
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


class SDARAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = SDARRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = SDARRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_value=None, store_kv=False):
        b, length, _ = hidden_states.shape
        q = self.q_norm(self.q_proj(hidden_states).view(b, length, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states).view(b, length, -1, self.head_dim)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, length, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if past_key_value is not None and store_kv:
            k, v = past_key_value.update(k, v, self.layer_idx)
        elif past_key_value is not None:
            cached = _cached_kv(past_key_value, self.layer_idx)
            if cached is not None:  # read-only use of the cache
                k = torch.cat([cached[0], k], dim=-2)
                v = torch.cat([cached[1], v], dim=-2)
        if attention_mask is None:
            raise ValueError("SDAR needs an explicit attention_mask at inference (the caller's block mask).")
        mask = attention_mask.bool()
        if torch.all(mask):
            mask = None  # the Hub code switches to un-masked flash attention here
        groups = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))


class SDARDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = SDARAttention(config, layer_idx)
        self.mlp = SDARMLP(config)
        self.input_layernorm = SDARRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = SDARRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None, store_kv=False):
        h = self.self_attn(
            self.input_layernorm(hidden_states), position_embeddings, attention_mask, past_key_value, store_kv
        )
        hidden_states = hidden_states + h
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class SDARPreTrainedModel(PreTrainedModel):
    config_class = SDARConfig
    base_model_prefix = "model"
    _no_split_modules = ["SDARDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_cache_class = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()
        elif isinstance(module, SDARRMSNorm):
            module.weight.data.fill_(1.0)


class SDARRotaryEmbedding(nn.Module):
    """Plain RoPE; the Hub class looks up ``ROPE_INIT_FUNCTIONS["default"]`` instead."""

    def __init__(self, config):
        super().__init__()
        self.dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.base = config.rope_theta

    def forward(self, x, position_ids):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32, device=x.device) / self.dim))
        angles = position_ids.float()[..., None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


class SDARModel(SDARPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = getattr(config, "pad_token_id", None)  # not set by default on transformers 5
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([SDARDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = SDARRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = SDARRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        use_cache=None,
        store_kv=None,
        output_attentions=None,
        output_hidden_states=None,
        cache_position=None,
        **kwargs,
    ):
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if not isinstance(past_key_values, (type(None), Cache)):
            raise ValueError("The `past_key_values` should be either a `Cache` object or `None`.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if cache_position is None:
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            cache_position = torch.arange(past, past + inputs_embeds.shape[1], device=inputs_embeds.device)
        if position_ids is None:
            position_ids = cache_position.unsqueeze(0)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        all_hidden_states = () if output_hidden_states else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states = layer(hidden_states, attention_mask, position_embeddings, past_key_values, bool(store_kv))
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        out = BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=all_hidden_states,
        )
        return out.to_tuple() if kwargs.get("return_dict") is False else out


class SDARForCausalLM(SDARPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = SDARModel(config)
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
        output_attentions=None,
        output_hidden_states=None,
        cache_position=None,
        logits_to_keep=0,
        **kwargs,
    ):
        return_dict = kwargs.pop("return_dict", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            cache_position=cache_position,
            **kwargs,
        )
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(outputs.last_hidden_state[:, keep, :])
        out = CausalLMOutputWithPast(
            logits=logits, past_key_values=outputs.past_key_values, hidden_states=outputs.hidden_states
        )
        return out.to_tuple() if return_dict is False else out
