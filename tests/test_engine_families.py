"""The engine against a deliberately naive reference loop, for every family's tiny model.

The reference below calls each model directly with a hand-built mask, recomputes the whole sequence at
every step, and reveals one token per step: nothing of the engine (canvas, cache, adapters) is reused.
Only the keyed random numbers are imported, because they are part of the sampling contract.
"""

import pytest
import torch
from conftest import STAND_IN_MASK_ID

import mrp_hf
from mrp_hf.generation.sampling import STREAM_TOKEN, keyed_uniform, row_keys

# grid used for block-causal stand-ins (their decode block); fast_dllm_v2's comes from config.bd_size = 4
GRID = 4


def naive_logits(family, model, seq):
    """Full-sequence logits aligned so that row i scores token i, built the way each family's own code does."""
    ids = torch.tensor([seq])
    length = len(seq)
    block = torch.arange(length) // GRID
    block_mask = (block[None, :] <= block[:, None])[None, None]
    if family == "llada" or family in ("bert", "modernbert"):
        logits = model(input_ids=ids).logits
    elif family == "dream":
        logits = model(input_ids=ids, attention_mask="full").logits
    elif family == "sdar":
        logits = model(input_ids=ids, attention_mask=block_mask, position_ids=torch.arange(length)[None]).logits
    elif family == "fast_dllm_v2":
        logits = model(input_ids=ids, block_size=model.config.bd_size).logits
    elif family == "llada2":
        additive = torch.zeros(block_mask.shape).masked_fill(~block_mask, torch.finfo(torch.float32).min)
        logits = model(input_ids=ids, attention_mask=additive, use_cache=False).logits
    else:
        raise AssertionError(family)
    logits = logits[0].float()
    if family in ("dream", "fast_dllm_v2"):
        logits = torch.cat([logits[:1], logits[:-1]])
    return logits


def naive_pick(logits, temperature, seed, key, answer_position, committed):
    """(confidence, token): the softmax over the full vocabulary gives the confidence, the mask token is never
    the token."""
    probs = torch.softmax(logits.detach() / (temperature or 1.0), dim=-1)
    if temperature > 0:
        u = float(keyed_uniform(seed, STREAM_TOKEN, key, torch.tensor(answer_position), torch.tensor(committed)))
        drawable = probs.clone()
        drawable[STAND_IN_MASK_ID] = 0
        cdf = drawable.double().cumsum(0)
        token = min(int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.double))), len(probs) - 1)
    else:
        without_mask = logits.clone()
        without_mask[STAND_IN_MASK_ID] = float("-inf")
        token = int(torch.argmax(without_mask))
    return float(probs[token].detach()), token


def naive_decode(family, model, prompt, new_tokens, block_length, block_causal, temperature=0.0, seed=0):
    """One token per step, most confident masked position of the current block first (leftmost on ties).

    Block-causal families count blocks from the prompt's first token (the prompt's tail shares its block with
    the first answer tokens), decode the last block whole and return `new_tokens` answer tokens; Fast-dLLM v2
    commits each block's first token from the last logit of what precedes it. Bidirectional families start
    blocks at the answer."""
    p = len(prompt)
    grid = model.config.bd_size if family == "fast_dllm_v2" else GRID
    end_of_answer = p + new_tokens
    total = -(-end_of_answer // grid) * grid if block_causal else end_of_answer
    seq = list(prompt) + [STAND_IN_MASK_ID] * (total - p)
    key = row_keys(torch.tensor([prompt]), torch.ones(1, p, dtype=torch.long))[0]
    committed = 0
    first = (p // grid) * grid if block_causal else p
    for start in range(first, total, block_length):
        end = start + block_length
        if family == "fast_dllm_v2" and start % grid == 0 and seq[start] == STAND_IN_MASK_ID:
            logits = naive_logits(family, model, seq[: start + 1])
            seq[start] = naive_pick(logits[start], temperature, seed, key, start - p, committed)[1]
            committed += 1
        while STAND_IN_MASK_ID in seq[start:end]:
            visible = seq[: -(-end // grid) * grid] if block_causal else seq
            logits = naive_logits(family, model, visible)
            best = None
            for pos in range(start, end):
                if seq[pos] != STAND_IN_MASK_ID:
                    continue
                conf, token = naive_pick(logits[pos], temperature, seed, key, pos - p, committed)
                if best is None or conf > best[0]:
                    best = (conf, pos, token)
            seq[best[1]] = best[2]
            committed += 1
    return seq[:end_of_answer]


ALL_FAMILIES = ["llada", "dream", "sdar", "fast_dllm_v2", "llada2", "bert", "modernbert"]
BLOCK_CAUSAL = {"sdar", "fast_dllm_v2", "llada2"}


def wrap(family, model):
    return mrp_hf.MRPModel.from_backbone(model, mask_token_id=STAND_IN_MASK_ID)


def test_families_detected(models):
    expected = {"llada": "llada", "dream": "dream", "sdar": "sdar", "fast_dllm_v2": "fast_dllm_v2", "llada2": "llada2",
                "bert": "masked_lm", "modernbert": "masked_lm"}
    for family, model in models.items():
        adapter = wrap(family, model).adapter
        assert adapter.family == expected[family]
        assert adapter.block_causal == (family in BLOCK_CAUSAL)
        assert adapter.shifted_logits == (family in ("dream", "fast_dllm_v2"))


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_one_token_per_step_matches_naive_loop(models, family, temperature):
    model = models[family]
    prompt = [5, 17, 33, 9, 60, 2, 71, 40]  # a multiple of the grid: no alignment padding for block-causal models
    new, block = 8, 4
    expected = naive_decode(family, model, prompt, new, block, family in BLOCK_CAUSAL, temperature=temperature, seed=3)
    got = wrap(family, model).generate(
        torch.tensor([prompt]), max_new_tokens=new, block_length=block, temperature=temperature, seed=3
    )
    assert got[0].tolist() == expected


@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("threshold", [None, 0.05])
def test_batch_invariance_left_padding(models, family, threshold):
    prompts = [[5, 17, 33], [9, 60, 2, 71, 40, 11, 90], [44, 45, 46, 47, 48]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    model = wrap(family, models[family])
    kwargs = dict(max_new_tokens=8, block_length=4, threshold=threshold, temperature=0.7, seed=1)
    batched = model.generate(ids, attention_mask=mask, **kwargs)
    for i, p in enumerate(prompts):
        alone = model.generate(torch.tensor([p]), **kwargs)
        assert batched[i, width - len(p):].tolist() == alone[0].tolist(), f"row {i} differs"


@pytest.mark.parametrize("family", ["sdar", "fast_dllm_v2"])
def test_prefix_cache_equals_no_cache(models, family):
    model = wrap(family, models[family])
    assert model.adapter.exact_prefix_cache
    ids = torch.tensor([[0, 0, 5, 17, 33, 9], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    for threshold in (None, 0.1):
        cached = model.generate(ids, attention_mask=mask, max_new_tokens=12, block_length=4, threshold=threshold, return_dict_in_generate=True)
        plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, block_length=4, threshold=threshold, prefix_cache=False, return_dict_in_generate=True)
        assert torch.equal(cached.sequences, plain.sequences)
        assert cached.stats.backbone_forwards == plain.stats.backbone_forwards


def test_approximate_cache_is_opt_in_for_bidirectional(models):
    model = wrap("dream", models["dream"])
    ids = torch.tensor([[5, 17, 33, 9]])
    out = model.generate(ids, max_new_tokens=8, block_length=4, prefix_cache=True, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 12)
    assert STAND_IN_MASK_ID not in out.sequences[0, 4:].tolist()


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_eos_stops_rows_independently(models, family):
    model = wrap(family, models[family])
    ids = torch.tensor([[3, 99, 14, 77], [5, 17, 33, 9]])
    full = model.generate(ids, max_new_tokens=16, block_length=4, return_dict_in_generate=True)
    # "EOS": the first token that row 0 produces for the first time after its first block
    row0 = full.sequences[0, 4:].tolist()
    row1 = full.sequences[1, 4:].tolist()
    first = next(i for i in range(4, 12) if row0[i] not in row0[:i])
    eos = row0[first]
    out = model.generate(ids, max_new_tokens=16, block_length=4, eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True)
    assert out.sequences[0, 4 : 4 + first + 1].tolist() == row0[: first + 1]
    assert out.sequences[0, 4 + first + 1 :].tolist() == [0] * (16 - first - 1)
    # row 1 is not cut by row 0's stop: same tokens as without EOS until its own first EOS (if any)
    cut1 = row1.index(eos) + 1 if eos in row1 else 16
    assert out.sequences[1, 4 : 4 + cut1].tolist() == row1[:cut1]
    # each row ran (and counted) exactly the blocks up to the one holding its EOS, 4 forwards a block
    blocks0, blocks1 = first // 4 + 1, -(-cut1 // 4)
    assert out.stats.row_backbone_forwards == [4 * blocks0, 4 * blocks1]
    assert out.stats.row_new_tokens == [4 * blocks0, 4 * blocks1]
    assert out.stats.backbone_forwards == 4 * max(blocks0, blocks1)


def test_dynamic_reveals_more_per_forward(models):
    model = wrap("llada", models["llada"])
    ids = torch.tensor([[5, 17, 33, 9]])
    static = model.generate(ids, max_new_tokens=16, block_length=8, return_dict_in_generate=True)
    dynamic = model.generate(ids, max_new_tokens=16, block_length=8, threshold=0.01, return_dict_in_generate=True)
    assert static.stats.backbone_forwards == 16
    assert static.stats.mean_tokens_per_forward == 1.0
    assert dynamic.stats.backbone_forwards < 16
    assert dynamic.stats.mean_tokens_per_forward > 1.0


def test_steps_schedule_and_confidence_rules(models):
    model = wrap("llada", models["llada"])
    ids = torch.tensor([[5, 17, 33, 9]])
    out = model.generate(ids, max_new_tokens=16, block_length=8, steps=8, return_dict_in_generate=True)
    assert out.stats.backbone_forwards == 8
    for rule in ("margin", "neg_entropy", "random"):
        seq = model.generate(ids, max_new_tokens=8, block_length=8, confidence=rule)
        assert STAND_IN_MASK_ID not in seq[0, 4:].tolist()


def test_streamer_gets_prompt_then_blocks(models):
    model = wrap("sdar", models["sdar"])

    class Recorder:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.tolist())

        def end(self):
            self.ended = True

    rec = Recorder()
    ids = torch.tensor([[5, 17, 33, 9]])
    seq = model.generate(ids, max_new_tokens=8, block_length=4, streamer=rec)
    assert rec.chunks[0] == [[5, 17, 33, 9]]
    assert rec.chunks[1][0] + rec.chunks[2][0] == seq[0, 4:].tolist()  # [batch, tokens], as transformers streams
    assert rec.ended


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_adapter_returns_lm_head_input_in_the_same_forward(models, family):
    adapter = wrap(family, models[family]).adapter
    ids = torch.tensor([[5, 17, 33, 9, STAND_IN_MASK_ID, STAND_IN_MASK_ID, STAND_IN_MASK_ID, STAND_IN_MASK_ID]])
    calls = []
    handle = adapter.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        out = adapter.forward(ids, attention_mask=torch.ones_like(ids), return_lm_head_input=True, grid=4 if adapter.block_causal else None)
    finally:
        handle.remove()
    assert len(calls) == 1  # one backbone pass gives both
    head = adapter.get_output_embeddings()
    assert out.lm_head_input.shape == (1, 8, adapter.hidden_size)
    # the hidden state is what the lm_head reads: lm_head(h) reproduces the (aligned) logits
    assert torch.allclose(head(out.lm_head_input).float(), out.logits.float(), atol=1e-4)
    assert adapter.get_input_embeddings().weight.shape[0] >= adapter.vocab_size - 1
