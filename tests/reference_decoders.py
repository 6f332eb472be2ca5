"""Reference decoders: each family's OFFICIAL generate function, rewritten small and readable, greedy, one prompt.

They call the model's forward exactly as the official code does (same inputs, same cache protocol) and follow the
official loop structure, so that the library can be compared with them token for token (tests/test_fidelity.py)
on the stand-ins, which reproduce each family's real interface. Each one was checked against the real official
generate on tiny random models built from the real modeling files (token-identical on every prompt length
1..2B+1, static and threshold decoding, with and without EOS; see the report of issue 11).

Sources (the official code each one follows):
    SDAR           JetAstra/SDAR generate.py `block_diffusion_generate` (low_confidence_static / _dynamic)
    Fast-dLLM v2   Fast_dLLM_QwenForCausalLM.generate (v2/modeling.py of the Hub repo, NVlabs/Fast-dLLM v2/)
    LLaDA2         LLaDA2MoeModelLM.generate (modeling_llada2_moe.py; ZHZisZZ/dllm, inclusionAI/dFactory)
    Dream          DreamGenerationMixin.diffusion_generate (the Hub generation_utils.py); threshold decoding:
                   Fast-dLLM dream/model/generation_utils_block.py (alg="confidence_threshold")
    LLaDA          Fast-dLLM llada/generate.py `generate`

Conventions shared by all of them, where the official code is ambiguous or broken (the library follows them too):

* Greedy proposal (`propose`): the confidence of a position is the softmax over the FULL vocabulary (the mask token
  in the denominator) of its logits in float32 (LLaDA: float64, as its generate); the token is the most probable
  one other than the mask token, which is never committed (several officials loop forever or fail when it wins).
* Exact ties go to the lowest position / token id (`most_confident`, `torch.argmax`). The officials call
  `torch.topk` / `torch.sort`, whose order among exactly equal values is implementation-defined; this only
  matters at exact ties, which float32 confidences of real models practically never produce.
* EOS: a row stops after the block holding its first EOS; every answer token after the first EOS becomes
  `pad_token_id`. Tokens up to the first EOS are what the official code returns.
* The result is exactly `max_new_tokens` answer tokens (the officials decode the trailing block whole and return
  it whole, or return fewer tokens; the extra positions are decoded here too, then cut).
"""

from __future__ import annotations

import inspect

import torch

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------- shared rules
def propose(logits: torch.Tensor, mask_id: int, softmax_dtype: torch.dtype = torch.float32):
    """Greedy proposal per position: (token, confidence). `logits` [..., vocab]."""
    probs = torch.softmax(logits.to(softmax_dtype), dim=-1)  # mask token included in the denominator
    eligible = probs.clone()
    eligible[..., mask_id] = -1.0  # never propose the mask token
    tokens = eligible.argmax(dim=-1)  # first maximum: lowest token id on exact ties
    return tokens, probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def most_confident(confidence: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k highest confidences of a 1-D tensor; exact ties go to the lowest index (stable sort).

    The officials use torch.topk here; both agree except among exactly equal values."""
    return torch.sort(confidence, descending=True, stable=True).indices[:k]


def transfer_counts(block_length: int, steps: int) -> list[int]:
    """Tokens revealed at each step of a block: as even as possible, the remainder at the first steps
    (SDAR `get_num_transfer_tokens`, LLaDA2 `_get_num_transfer_tokens`, LLaDA per block)."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if step < extra else 0) for step in range(steps)]


def finish(answer: list[int], max_new_tokens: int, eos_token_id: int | None, pad_token_id: int) -> list[int]:
    """The first `max_new_tokens` answer tokens, `pad_token_id` after the first EOS (a decoder that stopped at
    EOS may hand over fewer tokens)."""
    answer = list(answer[:max_new_tokens])
    if eos_token_id is not None and eos_token_id in answer:
        cut = answer.index(eos_token_id) + 1
        answer[cut:] = [pad_token_id] * (max_new_tokens - cut)
    if len(answer) != max_new_tokens:
        raise AssertionError(f"decoded {len(answer)} answer tokens without an EOS, expected {max_new_tokens}")
    return answer


def _holds_eos(tokens: torch.Tensor, eos_token_id: int | None) -> bool:
    return eos_token_id is not None and bool((tokens == eos_token_id).any())


def _shift(logits: torch.Tensor) -> torch.Tensor:
    """Shifted families (Dream, Fast-dLLM v2): the logits at i-1 predict token i; position 0 keeps its own."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def _crop(cache, length: int) -> None:
    """Keep the first `length` positions of a transformers cache (4.x and 5.x both take a negative count)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


# ----------------------------------------------------------------------------------------------- SDAR
@torch.no_grad()
def sdar_generate(model, prompt: list[int], *, mask_id: int, max_new_tokens: int, block_length: int = 4,
                  steps: int | None = None, threshold: float | None = None, eos_token_id: int | None = None,
                  pad_token_id: int = 0) -> list[int]:
    """SDAR's `block_diffusion_generate`: `threshold=None` is low_confidence_static, else low_confidence_dynamic.

    Blocks are counted from token 0 (the prompt at positions 0..P-1): the block holding the prompt's tail is the
    first one decoded, shared with the first answer tokens. The whole prompt blocks are prefilled into the cache
    (`store_kv=True`); each step feeds the current block only and reads the cache (`store_kv=False`); a finished
    block is written to the cache by one more forward. Static: `transfer_counts(B, steps)[step]` tokens per step
    (steps = B: one), capped at the masks left (the official is not capped and overwrites prompt tokens when
    steps < B). Dynamic: every masked position with confidence > threshold if there are at least that many,
    else the most confident ones.
    """
    from transformers import DynamicCache

    B, P, G = block_length, len(prompt), max_new_tokens
    steps = steps or B
    num_blocks = -(-(P + G) // B)
    T = num_blocks * B
    x = torch.full((1, T), mask_id, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    block_index = torch.arange(T) // B
    allowed = (block_index[None, :] <= block_index[:, None])[None, None]  # [1, 1, T, T] block-causal
    positions = torch.arange(T)[None]
    cache = DynamicCache()
    counts = transfer_counts(B, steps)

    def forward(start: int, end: int, store: bool):
        return model(x[:, start:end], attention_mask=allowed[:, :, start:end, :end],
                     position_ids=positions[:, start:end], past_key_values=cache, use_cache=True, store_kv=store)

    first = P // B
    if first > 0:  # prefill the whole prompt blocks
        forward(0, first * B, store=True)
    for k in range(first, num_blocks):
        s, e = k * B, (k + 1) * B
        for step in range(steps + 1):
            masked = x[0, s:e] == mask_id
            if not masked.any():
                if k + 1 < num_blocks:  # the official also stores the last block; nothing reads it
                    forward(s, e, store=True)
                break
            tokens, confidence = propose(forward(s, e, store=False).logits[0], mask_id)
            confidence = torch.where(masked, confidence, NEG_INF)
            k_step = min(counts[step], int(masked.sum()))
            reveal = torch.zeros(B, dtype=torch.bool)
            high = confidence > threshold if threshold is not None else reveal
            if threshold is not None and int(high.sum()) >= k_step:
                reveal = high
            else:
                reveal[most_confident(confidence, k_step)] = True
            x[0, s:e] = torch.where(reveal, tokens, x[0, s:e])
        if _holds_eos(x[0, P:e], eos_token_id):
            break
    return finish(x[0, P:].tolist(), G, eos_token_id, pad_token_id)


# ----------------------------------------------------------------------------------------------- Fast-dLLM v2
@torch.no_grad()
def fast_dllm_v2_generate(model, prompt: list[int], *, mask_id: int, max_new_tokens: int, block_size: int,
                          small_block_size: int | None = None, threshold: float | None = None,
                          eos_token_id: int | None = None, pad_token_id: int = 0) -> list[int]:
    """Fast-dLLM v2's `generate`: static is its default threshold=1 (one token per forward).

    The grid is absolute (blocks of `block_size` = config.bd_size from token 0). The prompt's whole blocks are
    prefilled (`update_past_key_values=True`); if the prompt ends on a block boundary, the argmax of the
    prefill's last logit is the first answer token, committed at once. Each block: for each sub-block of
    `small_block_size`, while it has masks, one forward of the WHOLE block with the cache read-only, logits
    shifted, and the sub-block's masked positions with confidence > threshold plus the most confident one are
    revealed. A finished block is fed once more with `update_past_key_values=True` (writing its KV); the
    argmax of its last logit is the next block's first token, committed at once.

    Deliberate differences: a prompt of exactly `block_size` tokens is prefilled too (the official tests
    `P > block_size` and then decodes the first block without the prompt); every forward gets
    `block_size=block_size` (the official's in-block forwards use the forward's default 32: the same when the
    block divides 32); the mask token is never committed (the official loops forever when it wins).
    """
    from transformers import DynamicCache

    B, S, P, G = block_size, small_block_size or block_size, len(prompt), max_new_tokens
    if B % S:
        raise ValueError(f"small_block_size={S} must divide block_size={B}")
    x = torch.tensor([prompt])
    cache = DynamicCache()

    def forward(start: int, end: int, write: bool):
        return model(x[:, start:end], use_cache=True, past_key_values=cache, update_past_key_values=write,
                     block_size=B).logits

    def append_next_token(last_logit: torch.Tensor) -> None:
        nonlocal x
        token, _ = propose(last_logit, mask_id)
        x = torch.cat([x, token.view(1, 1)], dim=1)

    if P >= B:  # prefill the whole prompt blocks (official: P > B)
        logits = forward(0, P // B * B, write=True)
        if P % B == 0:
            append_next_token(logits[0, -1])
    while x.shape[1] < P + G:
        s = x.shape[1] // B * B  # the block holding the current end; the cache holds exactly [0, s)
        e = s + B
        x = torch.cat([x, torch.full((1, e - x.shape[1]), mask_id, dtype=torch.long)], dim=1)
        for j in range(0, B, S):
            in_sub_block = torch.zeros(B, dtype=torch.bool)
            in_sub_block[j : j + S] = True
            while True:
                candidates = (x[0, s:e] == mask_id) & in_sub_block
                if not candidates.any():
                    break
                tokens, confidence = propose(_shift(forward(s, e, write=False))[0], mask_id)
                confidence = torch.where(candidates, confidence, NEG_INF)
                reveal = confidence > (threshold if threshold is not None else 1.0)
                reveal[int(confidence.argmax())] = True  # the most confident one (first maximum)
                reveal &= candidates
                x[0, s:e] = torch.where(reveal, tokens, x[0, s:e])
        if _holds_eos(x[0, P:e], eos_token_id) or e >= P + G:
            break
        append_next_token(forward(s, e, write=True)[0, -1])
    return finish(x[0, P:].tolist(), G, eos_token_id, pad_token_id)


# ----------------------------------------------------------------------------------------------- LLaDA2
@torch.no_grad()
def llada2_generate(model, prompt: list[int], *, mask_id: int, max_new_tokens: int, block_length: int = 32,
                    steps: int | None = None, threshold: float | None = None, eos_token_id: int | None = None,
                    pad_token_id: int = 0) -> list[int]:
    """LLaDA2's `generate`, temperature 0 (its greedy branch), without a cache (the official uses none).

    Blocks from token 0, as SDAR; each step feeds the whole window up to the current block's end with the
    additive block-causal mask and position ids 0..; at most `steps` (default: block) steps per block, with
    `transfer_counts(B, steps)[step]` tokens each, capped at the masks left; threshold: every masked position
    with confidence > threshold if at least that many, else the most confident ones. (dFactory's copy has no
    greedy branch: there temperature 0 samples at temperature 1; greedy stays greedy here.)
    """
    B, P, G = block_length, len(prompt), max_new_tokens
    steps = min(steps or B, G)  # the official caps steps at gen_length // minimal_topk (1)
    num_blocks = -(-(P + G) // B)
    T = num_blocks * B
    x = torch.full((1, T), mask_id, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    block_index = torch.arange(T) // B
    allowed = (block_index[None, :] <= block_index[:, None])[None, None]
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, NEG_INF)  # the official's tril(...).log()
    positions = torch.arange(T)[None]
    counts = transfer_counts(B, steps)
    for k in range(P // B, num_blocks):
        s, e = k * B, (k + 1) * B
        for step in range(steps):
            masked = x[0, s:e] == mask_id
            if not masked.any():
                break
            logits = model(x[:, :e], attention_mask=additive[:, :, :e, :e], position_ids=positions[:, :e]).logits
            tokens, confidence = propose(logits[0, s:e], mask_id)
            confidence = torch.where(masked, confidence, NEG_INF)
            k_step = counts[step]
            reveal = torch.zeros(B, dtype=torch.bool)
            high = confidence > threshold if threshold is not None else reveal
            if threshold is not None and int(high.sum()) >= k_step:
                reveal = high
            else:
                reveal[most_confident(confidence, min(k_step, int(masked.sum())))] = True
            x[0, s:e] = torch.where(reveal, tokens, x[0, s:e])
        if _holds_eos(x[0, P:e], eos_token_id):
            break
    return finish(x[0, P:].tolist(), G, eos_token_id, pad_token_id)


# ----------------------------------------------------------------------------------------------- Dream
@torch.no_grad()
def dream_generate(model, prompt: list[int], *, mask_id: int, max_new_tokens: int, steps: int | None = None,
                   eps: float = 1e-3, eos_token_id: int | None = None, pad_token_id: int = 0) -> list[int]:
    """Dream's `diffusion_generate` with alg="maskgit_plus" (confidence = top probability), temperature 0.

    The whole answer is one block; every step feeds the whole sequence (attention "full", no cache) and shifts
    the logits. Dream's schedule: timesteps = linspace(1, eps, steps + 1); step i < steps - 1 reveals
    int(m * (1 - t[i+1] / t[i])) of the m masked positions left (float32, truncated: 0 at the first step when
    steps = max_new_tokens), the last step all that remain; the most confident ones over the whole row.
    `top_k=None`: on transformers 4.x, Dream's default generation config (from_model_config) silently sets
    top_k=50, which renormalises the confidences over the 50 best tokens; the reference does not.
    """
    P, G = len(prompt), max_new_tokens
    steps = steps or G
    x = torch.tensor([prompt + [mask_id] * G])
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        masked = x[0] == mask_id
        logits = _shift(model(x, attention_mask="full").logits)[0]
        tokens, confidence = propose(logits, mask_id)
        confidence = torch.where(masked, confidence, NEG_INF)
        left = masked.sum() / 1  # a float tensor, as the official's mask_index.sum() / batch
        count = int(left * (1 - timesteps[i + 1] / timesteps[i])) if i < steps - 1 else int(left)
        if count > 0:
            reveal = most_confident(confidence, count)
            x[0, reveal] = tokens[reveal]
    return finish(x[0, P:].tolist(), G, eos_token_id, pad_token_id)


def dream_schedule(max_new_tokens: int, steps: int, eps: float = 1e-3) -> list[int]:
    """Tokens `dream_generate` reveals at each step of a fresh answer (its timestep schedule)."""
    timesteps = torch.linspace(1, eps, steps + 1)
    left, counts = torch.tensor(float(max_new_tokens)), []
    for i in range(steps):
        count = int(left * (1 - timesteps[i + 1] / timesteps[i])) if i < steps - 1 else int(left)
        counts.append(count)
        left = left - count
    return counts


def _has_legacy_dream_cache(model) -> bool:
    """Fast-dLLM's Dream file: forward takes `dual_cache` / `replace_position`, caches are lists of (k, v)."""
    return "dual_cache" in inspect.signature(model.forward).parameters


@torch.no_grad()
def dream_threshold_generate(model, prompt: list[int], *, mask_id: int, max_new_tokens: int, block_length: int,
                             threshold: float, prefix_cache: bool, eos_token_id: int | None = None,
                             pad_token_id: int = 0) -> list[int]:
    """Threshold decoding of Dream in blocks of `block_length` from the answer start; a step reveals the block's
    most confident masked position and every other one with confidence >= threshold.

    `prefix_cache=True` is Fast-dLLM's Dream block decoding (generation_utils_block.py, alg
    "confidence_threshold", dual_cache=False): per block, one forward of the whole sequence commits the block's
    FIRST position (its argmax, no threshold) and gives the prefix cache (keys/values of the positions before the
    block, computed with the block still masked: approximate); then each step feeds the block and everything
    after it against that cache. On the Hub file the cache is a transformers Cache appended to in place (cropped
    back to the prefix after each forward); on Fast-dLLM's own file it is the legacy list of (k, v) it returns.

    `prefix_cache=False` has no official counterpart (Dream's own diffusion_generate has no threshold rule): the
    same reveal rule with one full forward per step and no first-position commit, as the library's default.
    """
    from transformers import DynamicCache

    P, G, B = len(prompt), max_new_tokens, block_length
    if G % B:
        raise ValueError(f"block_length={B} must divide max_new_tokens={G}")
    x = torch.tensor([prompt + [mask_id] * G])
    legacy = _has_legacy_dream_cache(model)
    for start in range(P, P + G, B):
        end = start + B
        cache = None
        if prefix_cache:
            if legacy:
                out = model(x, "full", use_cache=True)
                cache = [tuple(t[:, :start] for t in layer) for layer in out.past_key_values]
            else:
                cache = DynamicCache()
                out = model(x, "full", past_key_values=cache, use_cache=True)
                _crop(cache, start)
            tokens, _ = propose(_shift(out.logits)[0, start], mask_id)
            x[0, start] = tokens
        while (x[0, start:end] == mask_id).any():
            if cache is None:
                logits = _shift(model(x, attention_mask="full").logits)[0, start:end]
            elif legacy:
                logits = _shift(model(x[:, start:], "full", past_key_values=cache, use_cache=True).logits)[0, :B]
            else:
                out = model(x[:, start:], "full", position_ids=torch.arange(start, P + G)[None],
                            past_key_values=cache, use_cache=True)
                _crop(cache, start)
                logits = _shift(out.logits)[0, :B]
            masked = x[0, start:end] == mask_id
            tokens, confidence = propose(logits, mask_id)
            confidence = torch.where(masked, confidence, NEG_INF)
            reveal = masked & (confidence >= threshold)
            reveal[int(most_confident(confidence, 1))] = True
            x[0, start:end] = torch.where(reveal, tokens, x[0, start:end])
        if _holds_eos(x[0, P:end], eos_token_id):
            break
    return finish(x[0, P:].tolist(), G, eos_token_id, pad_token_id)


# ----------------------------------------------------------------------------------------------- LLaDA
@torch.no_grad()
def llada_generate(model, prompt: list[int], *, mask_id: int, max_new_tokens: int, block_length: int,
                   steps: int | None = None, threshold: float | None = None, eos_token_id: int | None = None,
                   pad_token_id: int = 0, softmax_dtype: torch.dtype = torch.float64) -> list[int]:
    """Fast-dLLM's LLaDA `generate` (low_confidence remasking, temperature 0, no cache).

    Blocks of `block_length` from the answer start; every step feeds the whole sequence (no attention mask:
    LLaDA attends to everything); confidences from a float64 softmax, as the official. Static: the block's
    masks spread evenly over steps // num_blocks steps (default steps = max_new_tokens: one per step), the
    most confident first. Threshold: every masked position of the block with confidence >= threshold, plus the
    most confident one.
    """
    P, G, B = len(prompt), max_new_tokens, block_length
    if G % B:
        raise ValueError(f"block_length={B} must divide max_new_tokens={G}")
    num_blocks = G // B
    steps_per_block = (steps or G) // num_blocks
    x = torch.tensor([prompt + [mask_id] * G])
    for start in range(P, P + G, B):
        end = start + B
        counts = transfer_counts(int((x[0, start:end] == mask_id).sum()), steps_per_block)
        step = 0
        while (x[0, start:end] == mask_id).any():
            tokens, confidence = propose(model(x).logits[0], mask_id, softmax_dtype)
            candidates = torch.zeros_like(x[0], dtype=torch.bool)
            candidates[start:end] = x[0, start:end] == mask_id
            confidence = torch.where(candidates, confidence, NEG_INF)
            if threshold is None:
                reveal = torch.zeros_like(candidates)
                reveal[most_confident(confidence, counts[step])] = True
            else:
                reveal = candidates & (confidence >= threshold)
                reveal[int(confidence.argmax())] = True
            x[0] = torch.where(reveal, tokens, x[0])
            step += 1
        if _holds_eos(x[0, P:end], eos_token_id):
            break
    return finish(x[0, P:].tolist(), G, eos_token_id, pad_token_id)
