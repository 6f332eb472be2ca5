"""MRP head training: the objective, the data pipeline, learning, exact resume, the CLI and chat data."""

import json
import os
import random
import signal
import subprocess
import sys

import pytest
import torch
from conftest import EOS_ID, STAND_IN_MASK_ID
from safetensors.torch import load_file
from stand_ins import save_stand_in
from transformers import AutoTokenizer

import mrp_hf
from mrp_hf import MRPConfig, MRPHead, MRPModel
from mrp_hf.cli import main as cli_main
from mrp_hf.training import (
    HeadChain,
    MRPObjective,
    MRPTrainingConfig,
    RecordTokenizer,
    RowBuilder,
    RowCollator,
    Sample,
    TrainingInterrupted,
    kl_per_position,
    train_head,
)
from mrp_hf.training.checkpoint import find_checkpoint

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ 't1 ' if m['role'] == 'user' else 't2 ' }}{{ m['content'] }} t3 {% endfor %}"
    "{% if add_generation_prompt %}t2 {% endif %}"
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest (and steadiest on a busy machine) on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def synthetic_records(count, seed=0, low=4, high=10):
    """Prompts of random tokens; the response is a fixed token map of the reversed prompt."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        prompt = [rng.randint(4, 60) for _ in range(rng.randint(low, high))]
        response = [(x * 7) % 60 + 61 for x in reversed(prompt)]
        records.append({"prompt": " ".join(f"t{x}" for x in prompt), "response": " ".join(f"t{x}" for x in response)})
    return records


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    root = tmp_path_factory.mktemp("training_backbones")
    return {family: save_stand_in(family, root / family) for family in ("llada", "sdar")}


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("training_data") / "data.jsonl", synthetic_records(800))


def fast_config(**overrides):
    values = dict(
        max_length=32, batch_size=8, max_steps=8, eval_every=0, save_every=0, num_hidden_layers=1,
        trust_remote_code=True, disable_progress=True, eval_fraction=0.1,
    )
    values.update(overrides)
    return MRPTrainingConfig(**values)


# ------------------------------------------------------------------------------------------ objective
def _sdar_objective(backbones, **kwargs):
    model = mrp_hf.load_backbone(str(backbones["sdar"]), trust_remote_code=True)
    adapter = mrp_hf.get_adapter(model, mask_token_id=STAND_IN_MASK_ID)
    objective = MRPObjective(adapter, block_length=4, grid=4, **kwargs)
    return adapter, objective


def _batch(adapter, samples, packing=False, max_length=48):
    rows, dropped = RowBuilder(max_length, EOS_ID, align=4, packing=packing).build(samples)
    assert dropped == 0
    return RowCollator(EOS_ID, 4, absolute_blocks=True)(rows)


def _samples(count=6, seed=0):
    rng = random.Random(seed)
    return [
        Sample([rng.randint(4, 100) for _ in range(rng.randint(2, 7))], [rng.randint(4, 100) for _ in range(rng.randint(5, 14))])
        for _ in range(count)
    ]


@pytest.mark.parametrize("objective_name", ["kl", "ce"])
def test_untrained_head_loss_is_the_backbone_kl_on_masked_positions_weighted_by_1_over_t(backbones, objective_name):
    adapter, objective = _sdar_objective(backbones, objective=objective_name, k_steps=2, reveal_per_block=2)
    batch = _batch(adapter, _samples())
    prepared = objective.prepare(batch, torch.Generator().manual_seed(3))
    head = MRPHead(MRPConfig.for_backbone(adapter, num_hidden_layers=1))
    loss = objective.loss(HeadChain(head), prepared)

    ids, response, doc = batch["input_ids"], batch["response_mask"], batch["doc_ids"]
    # the prompt is never masked; masked positions carry the mask id
    assert not (prepared.masked & ~response).any()
    assert (prepared.noisy_ids[prepared.masked] == STAND_IN_MASK_ID).all()
    assert torch.equal(prepared.noisy_ids[~prepared.masked], ids[~prepared.masked])
    assert ((prepared.t >= 1e-3) & (prepared.t <= 1)).all()
    # C = 0: A + C is the backbone's own logits on x_t
    base = adapter.forward(prepared.noisy_ids, batch["attention_mask"], batch["position_ids"], grid=4).logits
    lengths = torch.stack([response[doc == d].sum() for d in range(prepared.num_samples)]).double()
    expected = 0.0
    previously_masked = prepared.masked
    for step in prepared.steps:
        # still-masked positions only: a subset of the previous step's, minus this step's reveals
        assert not (step.masked & ~previously_masked).any() and not (step.masked & step.revealed).any()
        assert torch.equal(step.masked | step.revealed, previously_masked)
        assert torch.equal(step.ids[step.revealed], ids[step.revealed])
        weights = 1.0 / (prepared.t[doc[step.masked]] * lengths[doc[step.masked]])
        assert torch.allclose(step.weights.double(), weights, rtol=1e-6)
        if objective_name == "kl":
            per_position = kl_per_position(step.target_logits, base[step.masked])
        else:
            per_position = torch.nn.functional.cross_entropy(base[step.masked], ids[step.masked], reduction="none")
        expected = expected + (per_position.double() * weights).sum() / prepared.num_samples
        previously_masked = step.masked
    expected = expected / len(prepared.steps)
    assert prepared.steps[0].masked.any()
    assert torch.allclose(loss.double(), expected, rtol=1e-5, atol=1e-7)


def test_chunked_loss_matches_the_one_shot_loss_and_its_gradients(backbones):
    adapter, objective = _sdar_objective(backbones, k_steps=2, reveal_per_block=1)
    prepared = objective.prepare(_batch(adapter, _samples()), torch.Generator().manual_seed(0))
    head = MRPHead(MRPConfig.for_backbone(adapter, num_hidden_layers=1))
    torch.nn.init.normal_(head.norm.weight, std=0.5)
    results = []
    for elements in (1 << 26, 5 * adapter.vocab_size):  # one shot, then checkpointed chunks of 5 rows
        objective.chunk_elements = elements
        head.zero_grad()
        loss = objective.loss(HeadChain(head), prepared)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in head.parameters()]))
    assert prepared.steps[1].masked.sum() > 5
    assert torch.allclose(results[0][0], results[1][0], rtol=1e-5)
    for one, chunked in zip(results[0][1], results[1][1], strict=True):
        assert torch.allclose(one, chunked, rtol=1e-4, atol=1e-7)


def test_reveals_follow_the_backbone_confidence_per_block(backbones):
    adapter, objective = _sdar_objective(backbones, reveal_per_block=1, reveal_order="confidence")
    batch = _batch(adapter, _samples(8, seed=1))
    prepared = objective.prepare(batch, torch.Generator().manual_seed(0))
    step = prepared.steps[0]
    base = adapter.forward(prepared.noisy_ids, batch["attention_mask"], batch["position_ids"], grid=4).logits
    confidence = base.float().softmax(-1).max(-1).values
    groups = batch["reveal_groups"]
    for group in groups[prepared.masked].unique():
        in_group = (groups == group) & prepared.masked
        revealed = in_group & step.revealed
        assert int(revealed.sum()) == 1  # exactly r = 1 reveal in every block that had a masked position
        assert confidence[revealed].min() >= confidence[in_group].max() - 1e-6
    # block-causal grid: a reveal group never crosses a block boundary
    positions = batch["position_ids"]
    for group in groups[groups >= 0].unique():
        assert (positions[groups == group] // 4).unique().numel() == 1


def test_chained_steps_feed_the_accumulator(backbones):
    adapter, objective = _sdar_objective(backbones, k_steps=3)
    prepared = objective.prepare(_batch(adapter, _samples()), torch.Generator().manual_seed(0))
    head = MRPHead(MRPConfig.for_backbone(adapter, num_hidden_layers=1))
    torch.nn.init.normal_(head.norm.weight, std=0.5)  # a head with a non-zero output
    accumulators = HeadChain(head)(prepared.inputs_embeds, prepared.lm_head_input, prepared.head_mask, prepared.position_ids)
    acc = prepared.lm_head_input
    for k, embeds in enumerate(prepared.inputs_embeds):
        acc = acc + head(embeds, acc, attention_mask=prepared.head_mask, position_ids=prepared.position_ids)
        assert torch.allclose(accumulators[k], acc, atol=1e-6)
    assert not torch.allclose(accumulators[0], accumulators[1])


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "fast_dllm_v2", "llada2"])
def test_every_family_trains_and_untrained_head_reproduces_the_backbone_logits(family, tmp_path):
    path = save_stand_in(family, tmp_path / family)
    model = mrp_hf.load_backbone(str(path), trust_remote_code=True)
    adapter = mrp_hf.get_adapter(model, mask_token_id=STAND_IN_MASK_ID)
    grid = (adapter.block_size or 8) if adapter.block_causal else None
    objective = MRPObjective(adapter, block_length=grid or 8, grid=grid)
    rows, _ = RowBuilder(48, EOS_ID, align=grid if grid and adapter.supports_padding else 1).build(_samples(4))
    batch = RowCollator(EOS_ID, grid or 8, absolute_blocks=adapter.block_causal)(rows)
    prepared = objective.prepare(batch, torch.Generator().manual_seed(0), keep_base_logits=True)
    head = MRPHead(MRPConfig.for_backbone(adapter, num_hidden_layers=1))
    (logits,) = objective.step_logits(HeadChain(head), prepared)
    # lm_head(h_A + 0) is the backbone's own (aligned) logits: the captured hidden state is the lm_head's input
    assert logits.shape[0] > 0 and torch.allclose(logits, prepared.steps[0].base_logits, atol=1e-5)

    config = fast_config(max_steps=2, batch_size=4, block_length=8 if family == "llada2" else None, eval_fraction=0.2)
    train_head(str(path), synthetic_records(20), tmp_path / "head", config=config)
    assert MRPModel.from_pretrained(str(tmp_path / "head"), trust_remote_code=True).adapter.family == family


# ------------------------------------------------------------------------------------------ data
def test_rows_align_responses_to_blocks_and_packing_fills_rows():
    samples = [Sample([5, 6, 7], [8, 9]), Sample([10], [11, 12, 13]), Sample(list(range(20, 60)), list(range(60, 90)))]
    rows, dropped = RowBuilder(24, EOS_ID, align=4, packing=True).build(samples)
    assert dropped == 0
    batch = RowCollator(EOS_ID, 4, absolute_blocks=True, pad_to=24)(rows)
    assert batch["input_ids"].shape == (len(rows), 24)
    assert len(rows) == 2  # the first two samples share a row; the long one is truncated into its own
    for r in range(len(rows)):
        for d in batch["doc_ids"][r][batch["doc_ids"][r] >= 0].unique():
            resp = ((batch["doc_ids"][r] == d) & batch["response_mask"][r]).nonzero().flatten()
            assert int(resp[0]) % 4 == 0  # the response starts on a block boundary
    # pads (alignment and tail) are out of attention and loss; the long sample kept a quarter of the row for its response
    pads = batch["attention_mask"] == 0
    assert not batch["response_mask"][pads].any() and (batch["doc_ids"][pads] == -1).all()
    assert int(batch["response_mask"][1].sum()) == (24 - 3) // 4 and batch["input_ids"][1][batch["response_mask"][1]][0] == 60


def test_jsonl_records_tokenize_with_eos_and_chat_template(backbones, tmp_path):
    tok = AutoTokenizer.from_pretrained(str(backbones["sdar"]))
    to_ids = RecordTokenizer(tok)
    sample = to_ids({"prompt": "t5 t6", "response": "t7 t8"})
    assert sample.prompt == [5, 6] and sample.response == [7, 8, EOS_ID]
    with pytest.raises(ValueError, match="chat template"):
        to_ids({"messages": [{"role": "user", "content": "t5"}, {"role": "assistant", "content": "t9"}]})
    tok.chat_template = CHAT_TEMPLATE
    messages = [
        {"role": "user", "content": "t10 t11"}, {"role": "assistant", "content": "t70"},
        {"role": "user", "content": "t12"}, {"role": "assistant", "content": "t71 t72"},
    ]
    sample = RecordTokenizer(tok)({"messages": messages})
    assert sample.prompt == [1, 10, 11, 3, 2, 70, 3, 1, 12, 3, 2]  # all but the last assistant turn + generation prompt
    assert sample.response == [71, 72, 3, EOS_ID]
    assert RecordTokenizer(tok, chat_template=True)({"prompt": "t12", "response": "t71"}).prompt == [1, 12, 3, 2]


def test_chat_jsonl_trains(backbones, tmp_path):
    tok = AutoTokenizer.from_pretrained(str(backbones["sdar"]))
    tok.chat_template = CHAT_TEMPLATE
    records = [
        {"messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["response"]}]}
        for r in synthetic_records(40)
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    head = train_head(str(backbones["sdar"]), str(data), tmp_path / "out", tokenizer=tok, config=fast_config(max_steps=3))
    info = head.config.training["data"]
    assert info["format"] == "messages" and info["train"]["samples"] == 36 and info["eval"]["samples"] == 4
    assert head.config.training["metrics"]["positions"] > 0


# ------------------------------------------------------------------------------------------ learning
def test_trained_head_beats_reuse_the_last_logits_on_held_out_data(backbones, data_file, tmp_path):
    config = fast_config(
        max_steps=250, batch_size=16, num_hidden_layers=2, lr=3e-3, block_length=8, eval_fraction=0.25, eval_every=125
    )
    head = train_head(str(backbones["llada"]), str(data_file), tmp_path / "head", config=config)
    metrics = head.config.training["metrics"]
    assert metrics["positions"] >= 200
    assert metrics["agreement"] > metrics["baseline_agreement"] + 0.03, metrics
    assert metrics["kl"] < 0.85 * metrics["baseline_kl"], metrics
    saved = json.loads((tmp_path / "head" / "training_metrics.json").read_text())
    assert saved["final"] == metrics and [h["step"] for h in saved["history"]] == [125, 250]
    assert saved["history"][0]["kl"] > saved["history"][1]["kl"]
    reloaded = MRPHead.from_pretrained(tmp_path / "head")
    assert reloaded.config.training["metrics"] == metrics and reloaded.config.block_length == 8


# ------------------------------------------------------------------------------------------ resume
def test_resume_after_interruptions_gives_the_same_weights(backbones, tmp_path):
    records = synthetic_records(44, seed=5)  # 40 train rows: 5 batches of 8 per epoch, 3 steps with grad_accum 2
    config = dict(max_steps=11, grad_accum=2, save_every=4, eval_every=3, reveal_per_block="random", k_steps=2)
    reference = train_head(str(backbones["sdar"]), records, tmp_path / "straight", config=fast_config(**config))

    out = tmp_path / "interrupted"
    with pytest.raises(TrainingInterrupted) as stop:  # a preemption budget: checkpoint after 5 steps
        train_head(str(backbones["sdar"]), records, out, config=fast_config(stop_after=5, **config))
    assert stop.value.step == 5 and find_checkpoint(out) is not None

    def send_sigint(step, logs):
        if step == 8:
            signal.raise_signal(signal.SIGINT)

    with pytest.raises(TrainingInterrupted) as stop:  # SIGINT in the middle of the resumed run
        train_head(str(backbones["sdar"]), records, out, config=fast_config(resume=True, **config), on_step_end=send_sigint)
    assert stop.value.step == 8 and stop.value.reason == "SIGINT"
    resumed = train_head(str(backbones["sdar"]), records, out, config=fast_config(resume=True, **config))

    assert resumed.config.training["steps"] == 11
    for name, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    straight, interrupted = (json.loads((p / "training_metrics.json").read_text()) for p in (tmp_path / "straight", out))
    assert straight["history"] == interrupted["history"]
    # the head's files (with the code files its auto_map and custom_generate/ need) and the metrics, no checkpoints
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "configuration_mrp.py", "custom_generate",
                                                     "model.safetensors", "modeling_mrp.py", "training_metrics.json"]


@pytest.mark.slow
def test_ddp_two_processes_resume_matches_uninterrupted(backbones, data_file, tmp_path):
    """`accelerate`-DDP over two CPU processes (gloo), launched like `accelerate launch` does (torchrun)."""
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
    base = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
        "-m", "mrp_hf.train", "--backbone", str(backbones["sdar"]), "--trust-remote-code", "--dataset", str(data_file),
        "--steps", "12", "--batch-size", "8", "--grad-accum", "2", "--max-length", "32", "--num-layers", "1",
        "--block-length", "4", "--save-every", "4", "--eval-every", "6", "--no-progress",
    ]

    def launch(output, *extra):
        return subprocess.run(base + ["--output", str(output), *extra], env=env, capture_output=True, text=True, timeout=600)

    assert launch(tmp_path / "a").returncode == 0
    stopped = launch(tmp_path / "b", "--stop-after", "5")
    assert stopped.returncode != 0 and sorted(p.name for p in (tmp_path / "b" / "checkpoint").glob("*_state*_*")) == [
        "data_rng_state_0.pt", "data_rng_state_1.pt", "random_states_0.pkl", "random_states_1.pkl"
    ]
    resumed = launch(tmp_path / "b", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "a" / "config.json").read_text())["training"]["num_processes"] == 2


# ------------------------------------------------------------------------------------------ CLI
def test_cli_trains_and_the_output_loads_as_an_mrp_model(backbones, data_file, tmp_path):
    out = tmp_path / "cli-head"
    code = cli_main([
        "train", "--backbone", str(backbones["sdar"]), "--trust-remote-code", "--dataset", str(data_file),
        "--output", str(out), "--steps", "6", "--batch-size", "4", "--max-length", "32", "--num-layers", "1",
        "--block-length", "4", "--reveal-per-block", "1", "--k-steps", "2", "--eval-every", "3", "--save-every", "3",
        "--eval-fraction", "0.02", "--no-progress", "--seed", "1",
    ])
    assert code == 0
    # the head's files (with the code files its auto_map and custom_generate/ need) and the metrics, no checkpoints
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "configuration_mrp.py", "custom_generate",
                                                     "model.safetensors", "modeling_mrp.py", "training_metrics.json"]
    model = MRPModel.from_pretrained(str(out), trust_remote_code=True)
    config = model.head.config
    assert model.adapter.family == "sdar" and config.base_model_name_or_path == str(backbones["sdar"])
    assert config.mask_token_id == STAND_IN_MASK_ID and config.block_length == 4 and config.attention == "block_causal"
    training = config.training
    assert training["steps"] == 6 and training["k_steps"] == 2 and training["reveal_per_block"] == 1
    assert training["data"]["source"] == "data.jsonl" and training["data"]["format"] == "prompt/response"
    assert set(training["metrics"]) >= {"agreement", "baseline_agreement", "kl", "baseline_kl"}
    weights = load_file(str(out / "model.safetensors"))
    assert not any(k.startswith(("embed_tokens", "lm_head", "model.")) for k in weights)
    assert model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=8, block_length=4).shape == (1, 12)


def test_train_flags_map_onto_the_config():
    from mrp_hf.train import parse_train_args

    command, config = parse_train_args([
        "--backbone", "x", "--dataset", "d.jsonl", "--output", "o", "--epochs", "2", "--reveal-per-block", "random",
        "--reveal-order", "random", "--objective", "ce", "--mixed-precision", "bf16", "--head-hidden-size", "64",
        "--packing", "--resume",
    ])
    assert (command.backbone, command.dataset, command.output, command.tokenizer) == ("x", "d.jsonl", "o", None)
    assert (config.epochs, config.max_steps, config.reveal_per_block, config.reveal_order) == (2.0, None, "random", "random")
    assert (config.objective, config.mixed_precision, config.head_hidden_size, config.packing, config.resume) == (
        "ce", "bf16", 64, True, True
    )
    with pytest.raises(ValueError, match="objective"):
        MRPTrainingConfig(objective="mse")


def test_train_flags_default_to_the_config_and_keep_their_documented_names():
    """The flags come from MRPTrainingConfig (HfArgumentParser): no flag given is the dataclass's default; the
    names used in the docs (--steps, --dtype, --no-eos, --num-layers, --eval-file, ...) still work."""
    from mrp_hf.train import parse_train_args

    required = ["--backbone", "b", "--dataset", "d", "--output", "o"]
    assert parse_train_args(required)[1] == MRPTrainingConfig()
    _, config = parse_train_args(required + [
        "--steps", "5", "--dtype", "bfloat16", "--no-eos", "--no-progress", "--no-shard-backbone", "--num-layers", "2",
        "--num-heads", "4", "--eval-file", "held.jsonl", "--reveal-per-block", "2", "--adam-betas", "0.8", "0.9",
        "--backbone-device-map", "auto", "--trust-remote-code", "--min-lr-ratio", "0.1",
    ])
    assert (config.max_steps, config.backbone_dtype, config.append_eos, config.disable_progress) == (5, "bfloat16", False, True)
    assert (config.shard_backbone, config.num_hidden_layers, config.num_attention_heads) == (False, 2, 4)
    assert (config.eval_dataset, config.reveal_per_block, config.adam_betas) == ("held.jsonl", 2, (0.8, 0.9))
    assert (config.backbone_device_map, config.trust_remote_code, config.min_lr_ratio) == ("auto", True, 0.1)
    for bad in (["--reveal-per-block", "0"], ["--objective", "mse"], ["--no-such-flag"]):
        with pytest.raises(SystemExit):
            parse_train_args(required + bad)


def test_train_help_lists_every_config_field_with_its_default(capsys):
    import dataclasses

    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: mrp-hf train --backbone")
    for field in dataclasses.fields(MRPTrainingConfig):
        assert f"--{field.name.replace('_', '-')}" in text, field.name
    assert "--lr LR peak learning rate (AdamW) (default: 0.001)" in text
    assert "(default: 1024)" in text and "--no-eos" in text and "--steps" in text


def test_the_schedule_is_transformers_cosine_with_min_lr_counted_in_optimizer_steps():
    """Warm-up then cosine to lr * min_lr_ratio; with several processes accelerate steps the scheduler once per
    process for each optimizer step, and the schedule is stretched to match."""
    from mrp_hf.training.trainer import cosine_schedule

    config = MRPTrainingConfig(lr=1.0, warmup_steps=2, min_lr_ratio=0.1)
    for processes in (1, 2):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        scheduler = cosine_schedule(optimizer, config, total_steps=6, steps_per_optimizer_step=processes)
        lrs = []
        for _ in range(7):
            lrs.append(round(optimizer.param_groups[0]["lr"], 6))
            for _ in range(processes):
                optimizer.step()
                scheduler.step()
        assert lrs[:3] == [0.0, 0.5, 1.0], processes
        assert lrs[-1] == pytest.approx(0.1) and lrs[4] == pytest.approx(0.1 + 0.9 * 0.5)


def test_head_attends_within_its_reveal_block_as_in_decoding():
    from mrp_hf.training.objective import block_local_mask

    groups = torch.tensor([[-1, -1, 0, 0, 1, 1, -1]])
    mask = block_local_mask(groups)[0, 0]
    assert mask[2].tolist() == [False, False, True, True, False, False, False]
    assert mask[5].tolist() == [False, False, False, False, True, True, False]
    assert mask[0].tolist() == [True] + [False] * 6  # prompt and pads: themselves only


@pytest.mark.parametrize("family", ["sdar", "fast_dllm_v2", "llada2", "reference"])
def test_training_rows_use_the_decoding_layout(models, family):
    """For every block-causal family, a training sample's response blocks are the blocks the engine decodes its
    answer in: counted from the sample's first token (SDAR, Fast-dLLM v2, LLaDA2) or from the response start
    (the reference DLM), for prompts of every length modulo the block."""
    from mrp_hf.generation.layout import plan_layout
    from mrp_hf.training.trainer import row_builder

    if family == "reference":
        from mrp_hf.reference import ReferenceDLM, ReferenceDLMConfig

        torch.manual_seed(0)
        model = ReferenceDLM(ReferenceDLMConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                num_attention_heads=2, block_size=4, max_position_embeddings=128))
    else:
        model = models[family]
    adapter = mrp_hf.get_adapter(model, mask_token_id=STAND_IN_MASK_ID)
    grid = adapter.block_size or 4
    alignment = adapter.block_alignment
    assert alignment == ("answer" if family == "reference" else "sequence")
    for prompt_length in range(1, 2 * grid + 2):
        sample = Sample(list(range(3, 3 + prompt_length)), [90, 91, 92, 93, 94, 95])
        builder = row_builder(adapter, grid, 64, EOS_ID)
        rows, _ = builder.build([sample])
        batch = RowCollator(EOS_ID, grid, absolute_blocks=True)(rows)
        response = batch["response_mask"][0].nonzero().squeeze(1)
        trained_blocks = (batch["reveal_groups"][0, response] - batch["reveal_groups"][0, response[0]]).tolist()
        layout = plan_layout([prompt_length], 6, grid, grid, alignment, left_aligned=not adapter.supports_padding)
        start = layout.answer_start[0]
        decoded_blocks = [(start + j) // grid - start // grid for j in range(6)]
        assert trained_blocks == decoded_blocks, (prompt_length, trained_blocks, decoded_blocks)
        # the same positions relative to the block grid: the first response token's offset inside its block
        assert int(response[0]) % grid == start % grid


def test_one_block_length_rule_for_decoding_and_training(models):
    """`BackboneAdapter.resolve_block_length`: the engine passes the answer length, the trainer none."""
    adapter = {family: mrp_hf.get_adapter(models[family], mask_token_id=STAND_IN_MASK_ID)
               for family in ("llada", "dream", "sdar", "fast_dllm_v2")}
    assert adapter["llada"].resolve_block_length(None) == 32 and adapter["llada"].resolve_block_length(None, 8) == 8
    assert adapter["llada"].resolve_block_length(16, 64) == 16
    # Dream decodes the whole answer as one block; training without an answer length uses 32
    assert adapter["dream"].resolve_block_length(None, 24) == 24 and adapter["dream"].resolve_block_length(None) == 32
    assert adapter["sdar"].resolve_block_length(None) == adapter["sdar"].default_block_length
    fast = adapter["fast_dllm_v2"]
    assert fast.resolve_block_length(None) == fast.block_size and fast.resolve_block_length(2) == 2
    with pytest.raises(ValueError, match=rf"block_length={2 * fast.block_size} does not fit fast_dllm_v2's attention block"):
        fast.resolve_block_length(2 * fast.block_size)
