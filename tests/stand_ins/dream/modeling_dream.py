"""Tiny stand-in for Dream's remote code (``modeling_dream.DreamModel``), also used by DiffuCoder.

Written from scratch for the mrp-hf tests; only the public interface follows the
Hub model:

* ``DreamModel`` -> ``model`` (``DreamBaseModel``: ``embed_tokens``, ``layers``, ``norm``) + ``lm_head``;
* ``forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, labels, use_cache, ...,
  num_logits_to_keep)`` returning ``MaskedLMOutput`` (no ``past_key_values`` field);
* attention is never causal; ``attention_mask`` is handed to SDPA exactly as given (the Hub
  ``generate`` builds a 4-D bool ``[B, 1, L, L]`` mask, or passes the string ``"full"``), so a 2-D
  padding mask is *not* expanded for you;
* positions come from ``position_ids`` (Dream's ``generate`` passes ``cumsum(mask) - 1``), else from
  ``cache_position`` (past length + arange);
* logits are *not* shifted inside the model: the caller does ``cat([logits[:, :1], logits[:, :-1]])``
  (logits at ``i - 1`` predict token ``i``);
* a ``Cache`` passed as ``past_key_values`` is appended to in place by every forward, as in the Hub
  code; it is not returned in the output;
* ``DreamPreTrainedModel.from_pretrained`` loads the model, then replaces its generation config by
  ``DreamGenerationConfig.from_pretrained(path)`` (``generation_utils.py``), as the Hub class does: on
  transformers 5.x that call raises ``TypeError`` (see ``generation_utils.py``).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput

from .configuration_dream import DreamConfig
from .generation_utils import DreamGenerationConfig


class DreamRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class DreamRotaryEmbedding(nn.Module):
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


def _apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class DreamAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None):
        b, length, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if past_key_value is not None:
            k, v = past_key_value.update(k, v, self.layer_idx)
        groups = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))


class DreamMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = DreamAttention(config, layer_idx)
        self.mlp = DreamMLP(config)
        self.input_layernorm = DreamRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DreamRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None):
        h = self.self_attn(self.input_layernorm(hidden_states), attention_mask, position_embeddings, past_key_value)
        hidden_states = hidden_states + h
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class DreamPreTrainedModel(PreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"
    _no_split_modules = ["DreamDecoderLayer"]
    _skip_keys_device_placement = "past_key_values"
    _supports_cache_class = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()
        elif isinstance(module, DreamRMSNorm):
            module.weight.data.fill_(1.0)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        # As the Hub class: the generation config loaded by `from_pretrained` lacks Dream's fields, so read
        # generation_config.json again with Dream's own class (the call that fails on transformers 5.x).
        hub = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision", "subfolder")
        model.generation_config = DreamGenerationConfig.from_pretrained(
            pretrained_model_name_or_path,
            **{key: kwargs[key] for key in hub if key in kwargs},
            _from_auto=kwargs.get("_from_auto", False),
            _from_pipeline=kwargs.get("_from_pipeline", None),
        )
        return model


class DreamBaseModel(DreamPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = getattr(config, "pad_token_id", None)  # not set by default on transformers 5
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([DreamDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = DreamRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = DreamRotaryEmbedding(config)
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
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        cache_position=None,
    ):
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()  # as in the Hub code: filled, then dropped
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
            hidden_states = layer(hidden_states, attention_mask, position_embeddings, past_key_values)
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        if return_dict is False:
            return tuple(v for v in (hidden_states, all_hidden_states) if v is not None)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states)


class DreamModel(DreamPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = DreamBaseModel(config)
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
        return_dict=None,
        cache_position=None,
        num_logits_to_keep=0,
        **loss_kwargs,
    ):
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            cache_position=cache_position,
        )
        logits = self.lm_head(outputs.last_hidden_state[:, -num_logits_to_keep:, :])
        if return_dict is False:
            return (logits,) + tuple(v for v in (outputs.hidden_states,) if v is not None)
        return MaskedLMOutput(logits=logits, hidden_states=outputs.hidden_states)
