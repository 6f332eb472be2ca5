"""Tiny stand-in for LLaDA's remote code (``modeling_llada.LLaDAModelLM``).

Written from scratch for the mrp-hf tests; only the public interface follows the
Hub model: class names, the ``model.transformer.{wte, blocks, ln_f, ff_out}``
module paths, the forward signature, a ``CausalLMOutputWithPast`` output whose
``hidden_states`` holds every block input plus the final post-``ln_f`` state, fully
bidirectional attention with positions ``0..L-1`` (no ``position_ids`` argument: a
left pad takes a position like any token), and no KV cache (the Hub code asserts
``past_key_values is None and not use_cache``).

Padding is NOT masked, as in the real file: its forward turns ``attention_mask`` /
``attention_bias`` into an attention bias and then calls SDPA with ``attn_mask=None``
(Fast-dLLM's copy of ``modeling_llada.py``, ``LLaDALlamaBlock.attention``; LLaDA issue
#90), so the pads of a left-padded row are attended to and change its logits.  The
stand-in accepts both arguments and ignores them.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import LLaDAConfig


class LLaDARMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rope(positions, dim, theta, dtype):
    """cos/sin of shape [B, L, dim] for integer positions [B, L] (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class LLaDALlamaBlock(nn.Module):
    def __init__(self, layer_id, config):
        super().__init__()
        self.layer_id = layer_id
        d = config.d_model
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads or config.n_heads
        self.head_dim = d // config.n_heads
        self.attn_norm = LLaDARMSNorm(d, config.rms_norm_eps)
        self.ff_norm = LLaDARMSNorm(d, config.rms_norm_eps)
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.attn_out = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.ff_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(config.mlp_hidden_size, d, bias=False)

    def forward(self, x, attn_mask, cos, sin):
        b, length, _ = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, length, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, length, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=False)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, length, -1))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class LLaDAModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        modules = {
            "wte": nn.Embedding(config.embedding_size or config.vocab_size, config.d_model),
            "blocks": nn.ModuleList([LLaDALlamaBlock(i, config) for i in range(config.n_layers)]),
            "ln_f": LLaDARMSNorm(config.d_model, config.rms_norm_eps),
        }
        if not config.weight_tying:
            modules["ff_out"] = nn.Linear(config.d_model, config.embedding_size or config.vocab_size, bias=False)
        self.transformer = nn.ModuleDict(modules)

    def forward(
        self,
        input_ids,
        input_embeddings=None,
        attention_mask=None,
        attention_bias=None,
        past_key_values=None,
        use_cache=False,
        last_logits_only=False,
        output_hidden_states=None,
    ):
        if past_key_values is not None or use_cache:
            raise AssertionError("The kvcache is not supported for MDM (LLaDA stand-in, as in the Hub code).")
        x = self.transformer.wte(input_ids) if input_embeddings is None else input_embeddings
        b, length = x.shape[:2]
        # attention_mask and attention_bias are accepted and ignored: the Hub attention calls SDPA with
        # attn_mask=None, so every key (pads included) is visible to every query.
        mask = None

        positions = torch.arange(length, device=x.device)[None].expand(b, -1)
        cos, sin = _rope(positions, self.config.d_model // self.config.n_heads, self.config.rope_theta, x.dtype)

        all_hidden_states = []
        for block in self.transformer.blocks:
            if output_hidden_states:
                all_hidden_states.append(x)
            x = block(x, mask, cos, sin)
        if last_logits_only:
            x = x[:, -1:, :]
        x = self.transformer.ln_f(x)
        if output_hidden_states:
            all_hidden_states.append(x)
        if self.config.weight_tying:
            logits = F.linear(x, self.transformer.wte.weight)
        else:
            logits = self.transformer.ff_out(x)
        return logits, (tuple(all_hidden_states) if output_hidden_states else None)


class LLaDAModelLM(PreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"
    _no_split_modules = ["LLaDALlamaBlock"]

    def __init__(self, config, model=None, init_params=False):
        super().__init__(config)
        self.model = model if model is not None else LLaDAModel(config)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)
        elif isinstance(module, LLaDARMSNorm):
            module.weight.data.fill_(1.0)

    def forward(
        self,
        input_ids=None,
        inputs_embeds=None,
        attention_mask=None,
        attention_bias=None,
        past_key_values=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        cache_position=None,
    ):
        if use_cache is None:
            use_cache = self.config.use_cache
        if output_attentions:
            raise ValueError("output_attentions is not yet supported in LLaDA")
        logits, hidden_states = self.model(
            input_ids=input_ids,
            input_embeddings=inputs_embeds,
            attention_mask=attention_mask,
            attention_bias=attention_bias,
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )
        if return_dict is False:
            return (logits,) if hidden_states is None else (logits, hidden_states)
        return CausalLMOutputWithPast(logits=logits, past_key_values=None, hidden_states=hidden_states)

    def can_generate(self):
        return True

    def get_input_embeddings(self):
        return self.model.transformer.wte

    def set_input_embeddings(self, value):
        self.model.transformer.wte = value

    def get_output_embeddings(self):
        if self.config.weight_tying:
            return self.model.transformer.wte
        return self.model.transformer.ff_out

    def set_output_embeddings(self, value):
        if self.config.weight_tying:
            self.model.transformer.wte = value
        else:
            self.model.transformer.ff_out = value

    def tie_weights(self, *args, **kwargs):
        # Same policy as the Hub class: only ``weight_tying`` decides (tie_word_embeddings is ignored).
        if self.config.weight_tying:
            self.model.transformer.ff_out = self.model.transformer.wte
