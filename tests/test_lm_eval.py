"""The lm-evaluation-harness backend (`mrp_hf.lm_eval`, `mrp-hf lm-eval`) on the bundled reference DLM, offline.

Expected outputs come from the library's own `generate` on the same prompts, never from fixed answers or
accuracies, so these tests hold for any bundled reference model."""

import glob
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install 'mrp-hf[eval]')")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402

import mrp_hf  # noqa: E402
from mrp_hf import lm_eval as backend  # noqa: E402
from mrp_hf.lm_eval import MRPLM, parse_model_args  # noqa: E402
from mrp_hf.reference import bundled, held_out_items  # noqa: E402

HEAD = str(bundled.head_path())
BACKBONE = str(bundled.backbone_path())
SRC = str(Path(mrp_hf.__file__).resolve().parents[1])
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
           ACCELERATE_USE_CPU="true", PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def items():
    return held_out_items(per_task=2)


@pytest.fixture(scope="module")
def lm():
    return MRPLM(head=HEAD, batch_size=3, device="cpu")


def requests(prompts, gen_kwargs=None, task="t"):
    gen_kwargs = {"until": []} if gen_kwargs is None else gen_kwargs
    return [Instance("generate_until", {}, (p, dict(gen_kwargs)), i, (task, i, 1)) for i, p in enumerate(prompts)]


def library_answers(model, tokenizer, prompts, **kwargs):
    """The library's own generate on the prompts: (answer token lists cut at the first EOS, stats)."""
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], return_dict_in_generate=True,
                         **kwargs)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    answers = []
    for row in out.sequences[:, batch["input_ids"].shape[1] :].tolist():
        cut = next((i for i, token in enumerate(row) if token in eos), len(row))
        answers.append(row[:cut])
    return answers, out.stats


def cut_at(text, stops):
    for stop in stops:
        text = text.split(stop)[0] if stop else text
    return text


# ---------------------------------------------------------------------------------------------- registration
def test_import_registers_mrp_hf_and_keeps_lm_evals_own_models():
    assert get_model("mrp-hf") is MRPLM
    assert get_model("hf").__name__ == "HFLM"  # lm-eval fills its registry lazily only while it is empty
    backend._register()  # a second registration of the same class is a no-op, not a clash


def test_a_foreign_model_under_the_name_is_refused(monkeypatch):
    class Other:
        pass

    monkeypatch.setattr(backend, "MODEL_REGISTRY", {"mrp-hf": Other})
    with pytest.raises(ValueError, match="already has a model named 'mrp-hf'"):
        backend._register()


# ---------------------------------------------------------------------------------------------- model args
def test_model_args_are_converted_from_lm_eval_strings():
    args = parse_model_args({"pretrained": "x", "threshold": "0.9", "block_length": "8", "trust_remote_code": "true",
                             "prefix_cache": "False", "draft_tokens": 4, "max_batch_size": None, "device": "cpu"})
    assert (args.backbone, args.threshold, args.block_length, args.trust_remote_code) == ("x", 0.9, 8, True)
    assert (args.prefix_cache, args.mrp_draft_tokens, args.device, args.seed) == (False, 4, "cpu", 0)
    args = parse_model_args({"head": "h", "verify_lookahead": "false", "confidence_resolution": "0.05"})
    assert (args.verify_lookahead, args.confidence_resolution) == (False, 0.05)


@pytest.mark.parametrize(("raw", "message"), [
    ({"head": "h", "thresold": 0.9}, r"Unknown mrp-hf model args \['thresold'\]; accepted: .*threshold"),
    ({"head": "h", "block_length": "eight"}, "block_length='eight' must be an integer"),
    ({"head": "h", "threshold": "high"}, "threshold='high' must be a number"),
    ({"head": "h", "trust_remote_code": "maybe"}, "trust_remote_code='maybe' must be true or false"),
    ({"head": "h", "batch_size": "auto"}, "automatic batch sizes are not supported"),
    ({"head": "h", "batch_size": 0}, "batch_size=0 must be a positive integer"),
    ({"head": "h", "dtype": "fp8"}, "dtype='fp8': choose one of"),
    ({"mrp_mode": "speculative"}, "need head=.* and/or backbone="),
    ({"backbone": "a", "pretrained": "b"}, "the same arg"),
])
def test_bad_model_args_are_clear_errors(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_model_args(raw)


@pytest.mark.parametrize(("args", "message"), [
    ({"backbone": BACKBONE, "mrp_mode": "speculative"}, "needs an MRP head: add model arg head="),
    ({"head": HEAD, "mrp_mode": "remask"}, "model args: .*remask.* pass a threshold"),
    ({"head": HEAD, "mrp_mode": "fast"}, "Unknown mrp_mode 'fast'"),
])
def test_bad_decoding_settings_fail_when_the_model_is_built(args, message):
    with pytest.raises(ValueError, match=message):
        MRPLM(device="cpu", **args)


def test_bad_gen_kwargs_name_the_task_setting(lm, items):
    with pytest.raises(ValueError, match=r"unsupported generation arguments \['repetition_penalty'\]"):
        lm.generate_until(requests([items[0].prompt], {"until": [], "repetition_penalty": 1.2}))
    with pytest.raises(ValueError, match="do_sample=True with temperature=0"):
        lm.generate_until(requests([items[0].prompt], {"do_sample": True, "temperature": 0.0}))


# ---------------------------------------------------------------------------------------------- generate_until
@pytest.mark.parametrize("mode", [{}, {"threshold": 0.7}, {"mrp_mode": "speculative"}, {"mrp_mode": "remask", "threshold": 0.5}])
def test_generate_until_equals_the_librarys_generate(mode, items):
    # one prompt per call on both sides: threshold decisions can flip on float rounding between batch layouts
    lm = MRPLM(head=HEAD, batch_size=1, device="cpu", **mode)
    prompts = [item.prompt for item in items]
    answers, row_new_tokens = [], 0
    for prompt in prompts:
        (answer,), stats = library_answers(lm.model, lm.tokenizer, [prompt], **mode)
        answers.append(answer)
        row_new_tokens += sum(stats.row_new_tokens)
    texts = [lm.tokenizer.decode(a, skip_special_tokens=True) for a in answers]
    # a stop string that occurs in the answers, so that cutting is exercised on any model
    stop = next((t[1:2] for t in texts if len(t) > 1), "")
    got = lm.generate_until(requests(prompts, {"until": [stop, "never"]}))
    assert got == [cut_at(t, [stop]) for t in texts]
    assert any(g != t for g, t in zip(got, texts, strict=True)) or not stop
    recorded = lm.stats_dict()["generate_until"]
    assert recorded["all"] == recorded["tasks"]["t"]
    assert recorded["all"]["requests"] == len(prompts)
    assert recorded["all"]["new_tokens"] == row_new_tokens
    assert recorded["all"]["backbone_forwards"] > 0
    assert (recorded["all"]["head_forwards"] > 0) == ("mrp_mode" in mode)
    assert recorded["all"]["tokens_per_forward"] >= 1.0
    info = lm.get_model_info()
    assert info["mrp"]["mrp_mode"] == mode.get("mrp_mode", "off") and info["mrp_stats"]["generate_until"] == recorded


def test_answer_text_cuts_at_eos_then_length_then_stop_strings(lm):
    a, b, c = lm.tok_encode("abc", add_special_tokens=False)[:3]
    eos = lm.eot_token_id
    assert lm.answer_text([a, b, eos, c], 8, []) == lm.tok_decode([a, b])  # what follows EOS is not the answer
    assert lm.answer_text([a, b, c, eos], 2, []) == lm.tok_decode([a, b])
    text = lm.tok_decode([a, b, c])
    assert lm.answer_text([a, b, c], 8, [text[2:], text[1:]]) == text[:1]  # the earliest stop string wins
    assert lm.answer_text([a, b, c], 8, ["", "never"]) == text


def test_max_gen_toks_cuts_the_answer_after_decoding_whole_blocks(lm, items):
    block = lm.decoding_settings()["block_length"]
    if block is None or block < 2:
        pytest.skip("the bundled model decodes without a fixed block length")
    prompts = [item.prompt for item in items]
    answers, _ = library_answers(lm.model, lm.tokenizer, prompts, max_new_tokens=block)
    got = lm.generate_until(requests(prompts, {"until": [], "max_gen_toks": block - 1}))
    assert got == [lm.tokenizer.decode(a[: block - 1], skip_special_tokens=True) for a in answers]


def test_requests_repeated_to_even_out_processes_are_decoded_once(items):
    lm = MRPLM(head=HEAD, batch_size=2, device="cpu")
    batch = requests([item.prompt for item in items[:3]])
    got = lm.generate_until(batch + [batch[-1]] * 2)  # lm-eval pads a process's share with copies of its last one
    assert got[3:] == [got[2]] * 2
    assert lm.stats_dict()["generate_until"]["all"]["requests"] == 3


def test_sampled_repeats_use_successive_seeds(items):
    lm = MRPLM(head=HEAD, batch_size=2, device="cpu", temperature=1.5, seed=7)
    request = Instance("generate_until", {}, (items[0].prompt, {"until": []}), 0, ("t", 0, 3))  # repeats: 3
    got = lm.generate_until([request] * 3)
    expected = []
    for seed in (7, 8, 9):
        (answer,), _ = library_answers(lm.model, lm.tokenizer, [items[0].prompt], temperature=1.5, seed=seed)
        expected.append(lm.tokenizer.decode(answer, skip_special_tokens=True))
    assert got == expected
    greedy = lm.generate_until(requests([items[0].prompt], {"until": [], "do_sample": False}) * 2)
    assert greedy[0] == greedy[1]


def test_chat_template(lm):
    with pytest.raises(ValueError, match="has no chat template"):
        lm.apply_chat_template([{"role": "user", "content": "sort:cba"}])
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
    saved, lm.tokenizer.chat_template = getattr(lm.tokenizer, "chat_template", None), template
    try:
        assert lm.apply_chat_template([{"role": "user", "content": "sort:cba"}]) == "sort:cba="
        assert lm.tokenizer_name.endswith("backbone") and "/" not in lm.tokenizer_name
    finally:
        lm.tokenizer.chat_template = saved


# ---------------------------------------------------------------------------------------------- log-likelihood
def test_loglikelihood_scores_the_greedy_answer_above_another_answer(lm, items):
    prompts = [item.prompt for item in items]
    answers, _ = library_answers(lm.model, lm.tokenizer, prompts)
    texts = [lm.tokenizer.decode(a, skip_special_tokens=True) for a in answers]
    pairs = [(i, j) for i in range(len(texts)) for j in range(len(texts)) if texts[i] and texts[j] and texts[i] != texts[j]]
    i, j = pairs[0]
    batch = [Instance("loglikelihood", {}, (prompts[i], cont), k, ("t", k, 1)) for k, cont in enumerate([texts[i], texts[j]])]
    before = lm.stats_dict().get("loglikelihood", {}).get("requests", 0)
    (own, own_greedy), (other, other_greedy) = lm.loglikelihood(batch + [batch[1]])[:2]
    assert other < own <= 0 and math.isfinite(other)
    if lm.tok_encode(prompts[i] + texts[i])[len(lm.tok_encode(prompts[i])) :] == answers[i]:
        assert own_greedy and not other_greedy
    assert lm.loglikelihood(batch[:1])[0] == (own, own_greedy)  # seeded by the request: the same every time
    assert lm.stats_dict()["loglikelihood"]["requests"] == before + 3  # the repeated request was scored once


@pytest.fixture(scope="module")
def bidirectional(tmp_path_factory):
    """A tiny random bidirectional masked LM (BERT) with the reference tokenizer."""
    from conftest import STAND_IN_MASK_ID, tiny_masked_lm

    path = tmp_path_factory.mktemp("bert")
    tiny_masked_lm("bert").save_pretrained(path)
    return MRPLM(backbone=str(path), tokenizer=BACKBONE, mask_token_id=STAND_IN_MASK_ID, mc_num=512, mc_batch_size=128,
                 device="cpu")


def exact_logp(lm, ids, position):
    out = lm.model.adapter.forward(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return torch.log_softmax(out.logits[0, position].float(), dim=-1)


def test_elbo_of_one_token_is_its_masked_log_probability(bidirectional):
    lm = bidirectional
    context, token = lm.tok_encode("sort:cab"), lm.tok_encode("a")[0]
    expected = exact_logp(lm, context + [lm.model.adapter.mask_token_id], len(context))[token].item()
    assert lm.elbo(context, [token]) == pytest.approx(expected, rel=1e-5)


def test_elbo_of_two_tokens_matches_its_expectation(bidirectional):
    lm = bidirectional
    mask = lm.model.adapter.mask_token_id
    context, (a, b) = lm.tok_encode("sort:cab"), lm.tok_encode("ab")
    c = len(context)
    one_masked = exact_logp(lm, context + [mask, b], c)[a] + exact_logp(lm, context + [a, mask], c + 1)[b]
    both = exact_logp(lm, context + [mask, mask], c)[a] + exact_logp(lm, context + [mask, mask], c + 1)[b]
    # l = 1 (half the draws): 2 log p of the one masked token; l = 2: the sum over both
    expected = 0.5 * one_masked.item() + 0.5 * both.item()
    assert lm.elbo(context, [a, b]) == pytest.approx(expected, abs=0.15)


def test_loglikelihood_rolling(bidirectional, lm, items):
    text = items[0].prompt
    for model in (bidirectional, lm):  # one window (256 positions), several windows (the reference model's 24)
        (value,) = model.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0, ("t", 0, 1))])
        assert value < 0 and math.isfinite(value)
        assert model.stats_dict()["loglikelihood_rolling"]["requests"] >= 1
    tokens = bidirectional.tok_encode(text, add_special_tokens=False)
    (one_window,) = bidirectional.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0, ("t", 0, 1))])
    assert one_window == pytest.approx(bidirectional.elbo([bidirectional.prefix_token_id], tokens))


# ---------------------------------------------------------------------------------------------- the CLI
TASK = "mrp_lmeval_test"


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory):
    """A local lm-eval task over a JSONL file of held-out reference prompts, with the library's own answers
    (speculative mode) and the reference checker as metrics."""
    folder = tmp_path_factory.mktemp("lm_eval_task")
    per_task = 3
    chosen = held_out_items(per_task=per_task)
    model, tokenizer = bundled.load_reference(with_head=True)
    answers, stats = library_answers(model, tokenizer, [item.prompt for item in chosen], mrp_mode="speculative")
    texts = [tokenizer.decode(a, skip_special_tokens=True) for a in answers]
    with open(folder / "data.jsonl", "w", encoding="utf-8") as handle:
        for item, text in zip(chosen, texts, strict=True):
            handle.write(json.dumps({"id": item.id, "prompt": item.prompt, "library": text}) + "\n")
    (folder / "utils.py").write_text(textwrap.dedent(f"""
        from mrp_hf.reference import held_out_items

        ITEMS = {{item.id: item for item in held_out_items(per_task={per_task})}}


        def process_results(doc, results):
            return {{"valid": float(ITEMS[doc["id"]].check(results[0])), "same_as_library": float(results[0] == doc["library"])}}
    """))
    (folder / f"{TASK}.yaml").write_text(textwrap.dedent(f"""
        task: {TASK}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {folder / "data.jsonl"}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{{{prompt}}}}"
        doc_to_target: "{{{{library}}}}"
        process_results: !function utils.process_results
        generation_kwargs:
          until: ["\\n\\n"]
          do_sample: false
        metric_list:
          - metric: valid
            aggregation: mean
            higher_is_better: true
          - metric: same_as_library
            aggregation: mean
            higher_is_better: true
    """))
    accuracy = sum(item.check(t) for item, t in zip(chosen, texts, strict=True)) / len(chosen)
    return {"folder": folder, "n": len(chosen), "accuracy": accuracy, "texts": texts,
            "new_tokens": sum(stats.row_new_tokens)}


def lm_eval_args(task_folder, output):
    return ["lm-eval", "--model_args", f"head={HEAD},mrp_mode=speculative", "--tasks", TASK, "--include_path",
            str(task_folder["folder"]), "--batch_size", "4", "--device", "cpu", "--output_path", str(output),
            "--log_samples"]


def run(command, timeout=600):
    """Run in its own process group, so that a timeout also ends the workers a launcher started."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{command} timed out after {timeout} s: {err[-3000:]}")
    assert process.returncode == 0, err[-5000:]
    return out, err, time.perf_counter() - started


def read_results(output):
    (results,) = glob.glob(str(output / "**" / "results_*.json"), recursive=True)
    (samples,) = glob.glob(str(output / "**" / f"samples_{TASK}_*.jsonl"), recursive=True)
    with open(samples, encoding="utf-8") as handle:
        answers = {row["doc_id"]: row["resps"][0][0] for row in map(json.loads, handle)}
    return json.loads(Path(results).read_text()), answers


@pytest.fixture(scope="module")
def single_process_run(task_folder, tmp_path_factory):
    output = tmp_path_factory.mktemp("lm_eval_out")
    out, err, seconds = run([sys.executable, "-m", "mrp_hf.cli", *lm_eval_args(task_folder, output)])
    return (*read_results(output), out, err, seconds)


def test_mrp_hf_lm_eval_runs_a_local_task(task_folder, single_process_run):
    results, answers, out, err, seconds = single_process_run
    scores = results["results"][TASK]
    assert scores["same_as_library,none"] == 1.0
    assert scores["valid,none"] == pytest.approx(task_folder["accuracy"])
    assert [answers[i] for i in range(task_folder["n"])] == task_folder["texts"]
    assert results["config"]["mrp"]["mrp_mode"] == "speculative" and results["config"]["mrp"]["processes"] == 1
    stats = results["config"]["mrp_stats"]["generate_until"]
    assert stats["tasks"][TASK]["requests"] == task_folder["n"]
    assert stats["all"]["new_tokens"] == task_folder["new_tokens"]
    assert stats["all"]["head_forwards"] > 0 and stats["all"]["tokens_per_forward"] >= 1.0
    assert TASK in out and "mrp-hf stats:" in err
    print(f"1 process: {seconds:.1f} s")


def test_cli_help_and_model_default(capsys):
    from mrp_hf.cli import main

    assert main(["lm-eval", "-h"]) == 0
    assert "--model mrp-hf" in capsys.readouterr().out


@pytest.mark.slow  # about 45 s on 2 busy CPU cores, most of it lm-eval starting up (and indexing its tasks) twice
def test_data_parallel_run_equals_the_single_process_run(task_folder, single_process_run, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # accelerate's `--cpu` starts ONE process whatever --num_processes says; CPU data parallel is its multi-process
    # launcher (named --multi_gpu) with ACCELERATE_USE_CPU=true in the environment (ENV)
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
              "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]
    _, err, seconds = run([*launch, "-m", "mrp_hf.cli", *lm_eval_args(task_folder, tmp_path)])
    results, answers = read_results(tmp_path)
    single, single_answers = single_process_run[:2]
    # the same figures; lm-eval aggregates the two processes' shares in another order, so a standard error can
    # differ in its last bit
    ours, theirs = results["results"][TASK], single["results"][TASK]
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert ours[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key
    assert answers == single_answers
    assert results["config"]["mrp"]["processes"] == 2
    stats, single_stats = (r["config"]["mrp_stats"]["generate_until"]["all"] for r in (results, single))
    # each process decoded its share; rank 0 reports the sums over both
    assert stats["requests"] == single_stats["requests"] == task_folder["n"]
    assert stats["new_tokens"] == single_stats["new_tokens"]
    assert stats["head_forwards"] > 0
    assert err.count("mrp-hf stats:") == 1
    print(f"2 processes: {seconds:.1f} s")
