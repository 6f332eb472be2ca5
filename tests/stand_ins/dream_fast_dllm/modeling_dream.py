"""Tiny stand-in for Fast-dLLM's copy of Dream's remote code (NVlabs/Fast-dLLM ``dream/model/modeling_dream.py``).

Written from scratch for the mrp-hf tests.  Same config, module paths, weights and ``from_pretrained`` (with
``DreamGenerationConfig``) as the Hub Dream stand-in in ``../dream``; what differs is the interface Fast-dLLM
changed for its approximate caches:

* ``forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, labels, use_cache,
  output_attentions, output_hidden_states, return_dict, cache_position, num_logits_to_keep, dual_cache=False,
  replace_position=None)`` returning ``MaskedLMOutputWithPastKeyValues`` (``MaskedLMOutput`` plus
  ``past_key_values``);
* caches are LEGACY: ``past_key_values`` is a list with one ``(keys, values)`` pair per layer, holding the
  k/v projections BEFORE RoPE and before the head split (``[B, S, kv_heads * head_dim]``). The model reads
  its length as ``past_key_values[0][0].shape[1]``, so a transformers ``Cache`` fails there (4.x:
  ``KeyError: 'Cache only has 0 layers...'`` for an empty ``DynamicCache``; 5.x: ``TypeError: 'DynamicCache'
  object is not subscriptable``), as with the real file. With ``use_cache=True`` the pairs of this forward
  (cache + current) are returned; the given list is not modified, except with ``dual_cache``;
* ``position_ids`` is ignored: positions are ``arange(cached + L)`` and RoPE rotates the queries with the last
  ``L`` of them (with ``dual_cache`` the cache holds the whole sequence and ``replace_position``, a bool
  ``[B, S]`` tensor, marks the block whose k/v are overwritten in place and whose positions the queries take);
* attention is never causal; a tensor ``attention_mask`` goes to SDPA as given, the string ``"full"`` (or
  None) means no mask; logits are not shifted (the caller shifts them).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput

from .configuration_dream import DreamConfig
from .generation_utils import DreamGenerationConfig


# As in the real file: ModelOutput subclasses with an __init__ of their own (not dataclasses) that store the
# legacy cache list as an attribute.
class BaseModelOutputWithPast(BaseModelOutput):
    def __init__(self, last_hidden_state, hidden_states=None, attentions=None, past_key_values=None):
        super().__init__(last_hidden_state=last_hidden_state, hidden_states=hidden_states, attentions=attentions)
        self.past_key_values = past_key_values


class MaskedLMOutputWithPastKeyValues(MaskedLMOutput):
    def __init__(self, past_key_values=None, **kwargs):
        super().__init__(**kwargs)
        self.past_key_values = past_key_values


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
    def __init__(self, config):
        super().__init__()
        self.dim = config.hidden_size // config.num_attention_heads
        self.base = config.rope_theta

    def forward(self, x, position_ids):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32, device=x.device) / self.dim))
        angles = position_ids.float()[..., None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _rotate(x, cos, sin):
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

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None, use_cache=False,
                dual_cache=False, replace_position=None):
        b, q_len, _ = hidden_states.shape
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)  # cached as they are: before RoPE and before the head split
        v = self.v_proj(hidden_states)
        block_end = None
        if past_key_value is not None:
            past_k, past_v = past_key_value
            if dual_cache:  # overwrite the block's entries of the whole-sequence cache, in place
                replaced = replace_position.nonzero(as_tuple=True)[1]
                past_k[:, replaced] = k
                past_v[:, replaced] = v
                k, v = past_k, past_v
                block_end = int(replaced.max()) + 1
            else:
                k = torch.cat([past_k, k], dim=-2)
                v = torch.cat([past_v, v], dim=-2)
        present = (k, v) if use_cache else None

        q = q.view(b, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, -1, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, -1, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings  # for every key position
        q_end = k.shape[-2] if block_end is None else block_end
        q = _rotate(q, cos[:, q_end - q_len : q_end], sin[:, q_end - q_len : q_end])
        k = _rotate(k, cos, sin)

        groups = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1)), present


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

    def forward(self, hidden_states, attention_mask, position_embeddings, **cache_kwargs):
        h, present = self.self_attn(self.input_layernorm(hidden_states), attention_mask, position_embeddings,
                                    **cache_kwargs)
        hidden_states = hidden_states + h
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states)), present


class DreamPreTrainedModel(PreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"
    _no_split_modules = ["DreamDecoderLayer"]
    _skip_keys_device_placement = "past_key_values"

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
        # as the Hub class (Fast-dLLM kept it): re-read generation_config.json with Dream's own class
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
        self.padding_idx = getattr(config, "pad_token_id", None)
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
        dual_cache=False,
        replace_position=None,
    ):
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        use_cache = bool(use_cache)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        length = inputs_embeds.shape[1]
        # the legacy read of the cache length (fails on a transformers Cache, as in the real file)
        past_seen = past_key_values[0][0].shape[1] if past_key_values is not None else 0
        if not dual_cache:  # position_ids is ignored: cached positions then this input's
            position_ids = torch.arange(past_seen + length, device=inputs_embeds.device)[None]
        elif past_key_values is not None:  # the cache holds the whole sequence
            position_ids = torch.arange(past_seen, device=inputs_embeds.device)[None]
        else:
            position_ids = torch.arange(length, device=inputs_embeds.device)[None]
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids)

        hidden_states = inputs_embeds
        presents = [] if use_cache else None
        all_hidden_states = () if output_hidden_states else None
        for index, layer in enumerate(self.layers):
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states, present = layer(
                hidden_states,
                attention_mask,
                position_embeddings,
                past_key_value=past_key_values[index] if past_key_values is not None else None,
                use_cache=use_cache,
                dual_cache=dual_cache,
                replace_position=replace_position,
            )
            if use_cache:
                presents.append(present)
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        if return_dict is False:
            return tuple(v for v in (hidden_states, all_hidden_states) if v is not None)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, past_key_values=presents
        )


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
        dual_cache=False,
        replace_position=None,
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
            dual_cache=dual_cache,
            replace_position=replace_position,
        )
        logits = self.lm_head(outputs.last_hidden_state[:, -num_logits_to_keep:, :])
        if return_dict is False:
            return (logits,) + tuple(v for v in (outputs.hidden_states,) if v is not None)
        return MaskedLMOutputWithPastKeyValues(
            logits=logits, hidden_states=outputs.hidden_states, past_key_values=outputs.past_key_values
        )
