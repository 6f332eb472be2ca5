"""`ReferenceDLM`: the project's small masked diffusion LM (SDAR-style block-causal attention, exact KV cache).

A pre-norm transformer (RMSNorm, rotary positions, SwiGLU MLP) whose logits at a masked position predict the
token there. It is trained by `mrp_hf.reference.train` on the synthetic tasks of `mrp_hf.reference.tasks` and
ships with the package, so the demo, the tests and the benchmarks run on a real trained DLM offline.

The forward takes a 2-D padding mask over every key (cached + current) and builds the attention pattern itself:
a query sees the non-pad keys of its own block and of earlier blocks, blocks counted by absolute index from
the start of the sequence (cache included). A 4-D boolean mask [B, 1, q, k] is used as given (training
layouts). With a `Cache` in `past_key_values` the forward appends its keys and values; callers crop it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .._compat import output_with_cache
from ..backbones.base import allowed_keys
from ..generation.config import MRPGenerationConfig
from .configuration_reference import ReferenceDLMConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


def rotary_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin [B, 1, T, head_dim] for rotate-half rotary embeddings."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim))
    angles = position_ids.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class ReferenceAttention(nn.Module):
    def __init__(self, config: ReferenceDLMConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, cache: Cache | None):
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class ReferenceMLP(nn.Module):
    def __init__(self, config: ReferenceDLMConfig):
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class ReferenceLayer(nn.Module):
    def __init__(self, config: ReferenceDLMConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = ReferenceAttention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = ReferenceMLP(config)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, cache)
        return x + self.mlp(self.mlp_norm(x))


class ReferenceDLMPreTrainedModel(PreTrainedModel):
    config_class = ReferenceDLMConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["ReferenceLayer"]
    _supports_sdpa = True
    _supports_cache_class = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


class ReferenceDLM(ReferenceDLMPreTrainedModel, GenerationMixin):
    """The reference masked diffusion LM: `embed_tokens` -> layers -> `norm` -> `lm_head`.

    It has transformers' `GenerationMixin` (as Hub DLMs do) so that `generate(..., custom_generate=<MRP head>)`
    works on it; a plain `generate(...)` decodes with mrp-hf's engine (static or dynamic), never with transformers'
    autoregressive loop, which means nothing for a masked diffusion LM. Its generation_config.json is an
    `MRPGenerationConfig`.
    """

    generation_config_class = MRPGenerationConfig  # read by transformers 5.x

    def __init__(self, config: ReferenceDLMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # learned in-block position (position id modulo block_size), added to the token embeddings
        self.embed_block_positions = (
            nn.Embedding(config.block_size, config.hidden_size) if getattr(config, "block_position_embedding", False) else None
        )
        self.layers = nn.ModuleList(ReferenceLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def generate(self, *args, **kwargs):
        """`custom_generate=<head>`: transformers' dispatch to the head's generate; otherwise mrp-hf's own
        masked diffusion decoding of this backbone (`MRPModel.from_backbone(self).generate`)."""
        if kwargs.get("custom_generate") is not None:
            return super().generate(*args, **kwargs)
        from ..modeling_mrp import MRPModel

        return MRPModel.from_backbone(self).generate(*args, **kwargs)

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def attention_pattern(self, attention_mask: torch.Tensor, query_length: int) -> torch.Tensor:
        """Bool [B, 1, q, k] from a 2-D padding mask over all keys (the queries are the last q keys): the engine's
        own block-causal (or bidirectional) pattern, and every query also sees itself, so a pad position's output
        stays finite (nothing reads it)."""
        grid = self.config.block_size if self.config.attention == "block_causal" else None
        allowed = allowed_keys(attention_mask, query_length, grid)
        key_length = attention_mask.shape[1]
        itself = torch.arange(key_length, device=attention_mask.device)[None, :] == torch.arange(
            key_length - query_length, key_length, device=attention_mask.device
        )[:, None]
        return allowed | itself

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """input_ids [B, q]; attention_mask: 2-D padding over cached + current keys [B, k], or a 4-D bool pattern;
        labels: token ids at masked positions and -100 elsewhere (loss = mean cross-entropy over them)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = x.shape[:2]
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=x.device).unsqueeze(0).expand(batch, -1)
        if self.embed_block_positions is not None:
            x = x + self.embed_block_positions(position_ids % self.config.block_size)
        if attention_mask is None:
            attention_mask = torch.ones(batch, past + length, dtype=torch.bool, device=x.device)
        mask = attention_mask.bool() if attention_mask.dim() == 4 else self.attention_pattern(attention_mask, length)
        if mask.shape[-1] != past + length:
            raise ValueError(
                f"attention_mask covers {mask.shape[-1]} keys, but the cache holds {past} and the input {length}."
            )
        cos, sin = rotary_tables(position_ids, self.config.hidden_size // self.config.num_attention_heads,
                                 self.config.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, past_key_values)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
        return output_with_cache(CausalLMOutputWithPast, past_key_values, loss=loss, logits=logits)
