"""Token proposals and their confidence, with randomness keyed by position instead of call order.

Every random number is a hash of (seed, stream, row key, position, committed count). The row key is a
hash of the prompt's tokens, so a prompt draws the same numbers alone or in any batch, and a verifier
that evaluates a state later (speculative decoding) draws what the baseline drew on the same state.
"""

from __future__ import annotations

import torch

from .config import MRPGenerationConfig

_MASK32 = 0xFFFFFFFF
STREAM_TOKEN = 1  # the draw that picks a token
STREAM_ORDER = 2  # the draw that orders positions under confidence="random"


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding 32-bit values (low bits survive wrap-around)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def _combine(h: torch.Tensor, value: torch.Tensor | int) -> torch.Tensor:
    return _mix32((h * 0x9E3779B1 + value) & _MASK32)


def _mix32_int(x: int) -> int:
    """`_mix32` on a Python int: the same 32-bit result (Python ints do not wrap, the final mask keeps the low bits)."""
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & _MASK32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def row_keys(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """A 32-bit key per row from its real (unpadded) prompt tokens: batch composition does not change it.

    The key is `h = len; h = _combine(h, token)` over the row's real tokens, computed in Python ints: the
    int64 tensor arithmetic of `_combine` keeps the same low 32 bits through wrap-around, so the keys are
    bit-identical to the tensor version, without a handful of tiny tensor ops per prompt token.
    """
    lengths = prompt_mask.sum(dim=1).tolist()
    rows = prompt_ids.tolist()
    keys = []
    for tokens, length in zip(rows, lengths, strict=True):
        h = int(length)
        for tok in tokens[len(tokens) - int(length) :]:
            h = _mix32_int((h * 0x9E3779B1 + tok) & _MASK32)
        keys.append(h)
    return torch.tensor(keys, dtype=torch.long, device=prompt_ids.device)


def keyed_uniform(
    seed: int, stream: int, row_key: torch.Tensor, position: torch.Tensor, committed: torch.Tensor
) -> torch.Tensor:
    """Uniform numbers in (0, 1), one per element of the broadcast of (row_key, position, committed)."""
    h = _combine(torch.as_tensor(seed & _MASK32, device=row_key.device), stream)
    h = _combine(h, row_key)
    h = _combine(h, position)
    h = _combine(h, committed)
    return (h.double() + 0.5) / 4294967296.0


_ARGMAX_CHUNK = 128


def _argmax_lastdim(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(dim=-1)`, index for index, faster on CPU.

    torch's CPU argmax over the last dimension is not vectorised (a few ns per logit, the largest cost of a
    greedy proposal for a large vocabulary) while `amax` is. So: the max of each chunk of `_ARGMAX_CHUNK`
    logits, the first chunk whose max is the row's (argmax over vocab/128 values), argmax inside that chunk,
    and a last look at the vocab % 128 tail. argmax returns the first maximal index and treats NaN as the
    maximum (the first NaN wins); amax propagates NaN, so every step keeps both rules. Other devices, small
    vocabularies and non-float tensors use argmax itself.
    """
    vocab = x.shape[-1]
    chunk = _ARGMAX_CHUNK
    if x.device.type != "cpu" or not x.is_floating_point() or vocab < 2 * chunk or x.dim() < 2:
        return x.argmax(dim=-1)
    head = vocab - vocab % chunk
    chunks = x[..., :head].unflatten(-1, (head // chunk, chunk))
    first_chunk = chunks.amax(dim=-1).argmax(dim=-1, keepdim=True)  # [..., 1]
    inside = chunks.gather(-2, first_chunk.unsqueeze(-1).expand(*first_chunk.shape, chunk)).squeeze(-2)
    best = first_chunk.squeeze(-1) * chunk + inside.argmax(dim=-1)
    if head == vocab:
        return best
    tail = x[..., head:]
    tail_best = tail.argmax(dim=-1)
    best_value = x.gather(-1, best.unsqueeze(-1)).squeeze(-1)
    tail_value = tail.gather(-1, tail_best.unsqueeze(-1)).squeeze(-1)
    # the tail is later in the row: it wins only on a strictly larger value, or on NaN against a number
    take_tail = (tail_value > best_value) | (tail_value.isnan() & ~best_value.isnan())
    return torch.where(take_tail, tail_best + head, best)


def _filter_logits(logits: torch.Tensor, config: MRPGenerationConfig) -> torch.Tensor:
    """Temperature (when sampling), then top-k and top-p: the distribution the confidence is read from.

    top-k / top-p apply at temperature 0 too when set, as in Dream's and SDAR's samplers (the confidence is then
    the probability renormalised over the kept tokens); they never change the greedy token.
    """
    if config.is_sampling:
        logits = logits / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= config.top_p  # keep the top token always
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class TokenProposer:
    """Turns logits into a proposed token and a confidence per position (one job, no reveal decision).

    As in the families' own code, the confidence is read from the softmax over the FULL vocabulary (the mask
    token included) of the float32 logits; unlike some of them, the mask token is never proposed (a position
    that "reveals" the mask token would stay masked forever: their loops then spin or fail).
    """

    def __init__(self, config: MRPGenerationConfig, mask_token_id: int | None = None):
        self.config = config
        self.mask_token_id = mask_token_id

    def __call__(
        self, logits: torch.Tensor, row_key: torch.Tensor, position: torch.Tensor, committed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [n, L, V]; row_key [n, 1]; position [n, L] or [1, L]; committed [n, 1].

        Returns (tokens [n, L], confidence [n, L]).
        """
        cfg = self.config
        logits = logits.float()
        probs = self._probabilities(logits)
        if cfg.is_sampling:
            drawable = self._without_mask_token(probs, 0.0)
            u = keyed_uniform(cfg.seed, STREAM_TOKEN, row_key, position, committed).to(probs.device)
            # inverse-CDF draw: one keyed uniform per position, independent of vocabulary layout on device
            cdf = drawable.double().cumsum(dim=-1)
            tokens = torch.searchsorted(cdf, (u * cdf[..., -1]).unsqueeze(-1)).squeeze(-1)
            tokens = tokens.clamp_max(probs.shape[-1] - 1)
        else:
            tokens = _argmax_lastdim(self._without_mask_token(logits, float("-inf")))
        confidence = self._confidence(probs, tokens, row_key, position, committed)
        return tokens, confidence

    def confidence_of(
        self, logits: torch.Tensor, tokens: torch.Tensor, row_key: torch.Tensor, position: torch.Tensor, committed: torch.Tensor
    ) -> torch.Tensor:
        """The confidence `__call__` gives `tokens` under `logits` (remask: the head-corrected logits)."""
        return self._confidence(self._probabilities(logits.float()), tokens, row_key, position, committed)

    def _probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Softmax over the full vocabulary of the filtered (and, when sampling, tempered) float32 logits."""
        return _filter_logits(logits, self.config).softmax(dim=-1)

    def _without_mask_token(self, values: torch.Tensor, fill: float) -> torch.Tensor:
        """A copy of `values` with the mask token's entry set to `fill`, so that it is never drawn or picked."""
        if self.mask_token_id is None or self.mask_token_id >= values.shape[-1]:
            return values
        values = values.clone()
        values[..., self.mask_token_id] = fill
        return values

    def _confidence(self, probs, tokens, row_key, position, committed) -> torch.Tensor:
        value = self._exact_confidence(probs, tokens, row_key, position, committed)
        resolution = self.config.confidence_resolution
        if resolution is None or self.config.threshold is not None:  # thresholds always see exact confidences
            return value
        return torch.round(value / resolution) * resolution

    def _exact_confidence(self, probs, tokens, row_key, position, committed) -> torch.Tensor:
        rule = self.config.confidence
        if rule == "top_prob":
            return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        if rule == "margin":
            top2 = torch.topk(probs, 2, dim=-1).values
            return top2[..., 0] - top2[..., 1]
        if rule == "neg_entropy":
            return (probs * torch.log(probs.clamp_min(1e-12))).sum(dim=-1)
        # "random": a keyed random order, the LLaDA "random remasking" baseline
        return keyed_uniform(self.config.seed, STREAM_ORDER, row_key, position, committed).float().to(probs.device)
