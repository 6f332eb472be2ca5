"""Tiny stand-in for LLaDA2's remote code (``modeling_llada2_moe.LLaDA2MoeModelLM``).

Written from scratch for the mrp-hf tests; only the public interface follows the
Hub model (a Ling/Bailing MoE decoder trained as a block diffusion LM):

* ``LLaDA2MoeModelLM`` -> ``model`` (``LLaDA2MoeModel``: ``word_embeddings``, ``layers``, ``norm``)
  + ``lm_head``; attention uses a fused ``query_key_value`` projection, ``dense`` output,
  ``query_layernorm`` / ``key_layernorm`` and partial rotary embeddings;
* ``forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, labels, use_cache,
  output_attentions, output_hidden_states, output_router_logits, return_dict, **kwargs)`` returning
  ``MoeCausalLMOutputWithPast`` with float32 logits (not shifted);
* masks follow the real file on transformers 4.x (``LLaDA2MoeModel.forward`` +
  ``_prepare_4d_causal_attention_mask_for_sdpa``, attention ``is_causal = False``): a 4-D mask
  ``[B, 1, q, kv]`` (additive 0/-inf, as the Hub ``generate`` builds it from block indices counted from
  token 0; bool becomes additive) is used as is. A 2-D mask holding a 0 gives *causal* attention plus key
  padding (additive ``finfo.min``). ``None`` or an all-ones 2-D mask gives NO mask when nothing is cached
  (or one query): transformers then leaves causality to SDPA's ``is_causal``, which this attention sets to
  False, so every position sees every other one; with a cache and several queries it is causal again;
* positions come from ``position_ids`` (``generate`` passes ``arange``), else past length + arange;
* KV cache: the plain append-always kind.  With ``use_cache=True`` (a ``DynamicCache`` is created if
  needed) every forward appends its keys/values and the cache is returned; there is no "read only"
  flag, so callers undo in-block forwards with ``cache.crop(-n)``.  The Hub ``generate`` uses no cache.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import MoeCausalLMOutputWithPast, MoeModelOutputWithPast

from .configuration_llada2_moe import LLaDA2MoeConfig


class LLaDA2MoeRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class LLaDA2MoeRotaryEmbedding(nn.Module):
    """Partial RoPE on the first ``head_dim * partial_rotary_factor`` channels."""

    def __init__(self, config):
        super().__init__()
        self.dim = int(config.head_dim * config.partial_rotary_factor)
        self.base = config.rope_theta

    def forward(self, x, position_ids):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float32, device=x.device) / self.dim))
        angles = position_ids.float()[..., None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _apply_rope(x, cos, sin):
    rot, rest = x[..., : cos.shape[-1]], x[..., cos.shape[-1] :]
    half = rot.shape[-1] // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos[:, None] + rotated * sin[:, None], rest], dim=-1)


class LLaDA2MoeMLP(nn.Module):
    def __init__(self, config, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LLaDA2MoeGate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        top_idx = torch.topk(scores + self.expert_bias, self.top_k, dim=-1).indices
        top_w = scores.gather(-1, top_idx)
        top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-20) * self.routed_scaling_factor
        return top_idx, top_w.to(x.dtype)


class LLaDA2MoeSparseMoeBlock(nn.Module):
    """Routed experts computed densely (tiny sizes only) plus optional shared experts."""

    def __init__(self, config):
        super().__init__()
        self.experts = nn.ModuleList(
            [LLaDA2MoeMLP(config, config.moe_intermediate_size) for _ in range(config.num_experts)]
        )
        self.gate = LLaDA2MoeGate(config)
        if config.num_shared_experts:
            self.shared_experts = LLaDA2MoeMLP(config, config.moe_intermediate_size * config.num_shared_experts)

    def forward(self, x):
        top_idx, top_w = self.gate(x)
        every = torch.stack([expert(x) for expert in self.experts], dim=-2)  # [B, L, E, H]
        picked = every.gather(-2, top_idx[..., None].expand(*top_idx.shape, x.shape[-1]))
        y = (picked * top_w[..., None]).sum(-2)
        if hasattr(self, "shared_experts"):
            y = y + self.shared_experts(x)
        return y


class LLaDA2MoeAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.query_key_value = nn.Linear(
            config.hidden_size,
            (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim,
            bias=config.use_qkv_bias,
        )
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.use_bias)
        self.query_layernorm = LLaDA2MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.key_layernorm = LLaDA2MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None):
        b, length, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(b, length, -1, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_key_value_heads, self.num_key_value_heads], dim=-2)
        q = self.query_layernorm(q.transpose(1, 2))
        k = self.key_layernorm(k.transpose(1, 2))
        v = v.transpose(1, 2)
        cos, sin = position_embeddings
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if past_key_value is not None:
            k, v = past_key_value.update(k, v, self.layer_idx)
        groups = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            attention_mask = attention_mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, is_causal=False)
        return self.dense(out.transpose(1, 2).reshape(b, length, -1))


class LLaDA2MoeDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attention = LLaDA2MoeAttention(config, layer_idx)
        if config.num_experts is not None and layer_idx >= config.first_k_dense_replace:
            self.mlp = LLaDA2MoeSparseMoeBlock(config)
        else:
            self.mlp = LLaDA2MoeMLP(config, config.intermediate_size)
        self.input_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value=None):
        h = self.attention(self.input_layernorm(hidden_states), attention_mask, position_embeddings, past_key_value)
        hidden_states = hidden_states + h
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class LLaDA2MoePreTrainedModel(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]
    _skip_keys_device_placement = "past_key_values"
    _supports_cache_class = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()
        elif isinstance(module, LLaDA2MoeRMSNorm):
            module.weight.data.fill_(1.0)


def _mask_from_padding(attention_mask, q_len, past_len, batch, dtype, device):
    """What ``_prepare_4d_causal_attention_mask_for_sdpa`` (transformers 4.x) gives for a 2-D mask or None.

    None / all ones with no cached key or a single query: None (the causal mask is "ignorable" and left to
    SDPA's is_causal, which this model's attention never sets: full attention). Otherwise an additive
    [B, 1, q, past+q] mask: causal, plus key padding, with finfo.min for hidden keys.
    """
    kv_len = past_len + q_len
    unpadded = attention_mask is None or bool((attention_mask == 1).all())
    if unpadded and (q_len == 1 or kv_len == q_len):
        return None
    allowed = torch.arange(kv_len, device=device)[None, :] <= (past_len + torch.arange(q_len, device=device))[:, None]
    allowed = allowed[None, None].expand(batch, 1, q_len, kv_len)
    if not unpadded:
        allowed = allowed & attention_mask[:, None, None, -kv_len:].bool()
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


class LLaDA2MoeModel(LLaDA2MoePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.padding_idx = getattr(config, "pad_token_id", None)  # not set by default on transformers 5
        self.vocab_size = config.vocab_size
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LLaDA2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LLaDA2MoeRotaryEmbedding(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

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
        output_router_logits=None,
        return_dict=None,
        **kwargs,
    ):
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You have to specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        batch, q_len = inputs_embeds.shape[:2]
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        # as the Hub code: a given cache is read and appended to whether or not use_cache is set
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + q_len, device=inputs_embeds.device)[None]
        if attention_mask is None or attention_mask.dim() != 4:
            attention_mask = _mask_from_padding(
                attention_mask, q_len, past_len, batch, inputs_embeds.dtype, inputs_embeds.device
            )
        elif attention_mask.dtype == torch.bool:  # the Hub converts a 4-D bool mask to additive finfo.min
            additive = torch.zeros(attention_mask.shape, dtype=inputs_embeds.dtype, device=inputs_embeds.device)
            attention_mask = additive.masked_fill(~attention_mask, torch.finfo(inputs_embeds.dtype).min)

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
        out = MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=all_hidden_states,
        )
        return out.to_tuple() if return_dict is False else out


class LLaDA2MoeModelLM(LLaDA2MoePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.word_embeddings

    def set_input_embeddings(self, value):
        self.model.word_embeddings = value

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
        output_router_logits=None,
        return_dict=None,
        **kwargs,
    ):
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state).float()
        out = MoeCausalLMOutputWithPast(
            logits=logits, past_key_values=outputs.past_key_values, hidden_states=outputs.hidden_states
        )
        return out.to_tuple() if return_dict is False else out
