"""Draft graphs (`mrp_draft_graph`), head-free auto-speculation (`mrp_drafter="backbone"`) and speculation over
dynamic decoding: token for token the base decoding's output, for every family and verify layout."""

import pytest
import torch
from conftest import STAND_IN_MASK_ID
from test_engine_families import ALL_FAMILIES
from test_speculative import PACKING, batch, make_head, packing_models  # noqa: F401  (a fixture)

from mrp_hf import MRPModel
from mrp_hf.generation.config import MRPGenerationConfig
from mrp_hf.generation.draft_graph import DraftGraph, parse_draft_graph

PROMPTS = [[5, 17, 33, 9, 60, 2, 71, 40], [9, 60, 2], [44, 45, 46, 47, 48]]  # a padded batch
GRAPHS = ["tree-2x2", "tree-3x1x1", [5]]


def models_for(backbone, head_kind="random"):
    plain = MRPModel.from_backbone(backbone, mask_token_id=STAND_IN_MASK_ID)
    spec = MRPModel.from_backbone(backbone, head=make_head(backbone, head_kind), mask_token_id=STAND_IN_MASK_ID)
    return plain, spec


def assert_lossless(out, base):
    assert torch.equal(out.sequences, base.sequences)
    assert out.stats.row_new_tokens == base.stats.row_new_tokens
    assert out.stats.backbone_forwards <= base.stats.backbone_forwards
    assert all(a <= b for a, b in zip(out.stats.row_backbone_forwards, base.stats.row_backbone_forwards, strict=True))


# ---------------------------------------------------------------- shapes
def test_shapes_parse_and_number_their_nodes():
    assert parse_draft_graph(None, 3) is None
    assert parse_draft_graph("chain", 3).branching == (1, 1, 1)
    assert parse_draft_graph("chain-5", 3).branching == (1,) * 5
    graph = parse_draft_graph("tree-2x3", 3)
    assert graph.branching == (2, 3) and graph.level_sizes == (1, 2, 6) and graph.nodes == 9
    assert parse_draft_graph([3, 1], 3) == DraftGraph((3, 1))
    assert graph.parents(torch.device("cpu")).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert graph.depths(torch.device("cpu")).tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert graph.truncated(1).branching == (2,) and graph.truncated(5) is graph
    assert graph.describe() == "tree-2x3" and parse_draft_graph("chain-2", 1).describe() == "chain-2"


@pytest.mark.parametrize(("value", "message"), [
    ("bush", r"mrp_draft_graph='bush' is not a draft graph shape; use e.g. 'chain'"),
    ("tree", r"mrp_draft_graph='tree' gives no branching"),
    ("chain-2x2", r"a chain takes one length"),
    ("tree-2x0", r"branchings >= 1"),
    ([], r"at least one depth"),
    ([2, "2"], r"must hold ints"),
    (3, r"must be a shape name or a list of ints"),
    ("tree-16x16", r"has 273 nodes over depth 2; the limits are 256 nodes"),
])
def test_bad_shapes_are_one_line_errors(value, message):
    with pytest.raises(ValueError, match=message):
        MRPGenerationConfig(mrp_mode="speculative", mrp_draft_graph=value)


def test_drafter_and_regime_errors(models):
    with pytest.raises(ValueError, match=r"Unknown mrp_drafter 'oracle'; choose one of \['head', 'backbone'\]"):
        MRPGenerationConfig(mrp_mode="speculative", mrp_drafter="oracle")
    with pytest.raises(ValueError, match=r"mrp_drafter='backbone' .* mrp_mode \['speculative'\] only; drop it for "
                                         r"mrp_mode='direct'"):
        MRPGenerationConfig(mrp_mode="direct", mrp_drafter="backbone")
    # a chain without a graph stays static-only, and names the way to speculate over dynamic decoding
    with pytest.raises(ValueError, match=r"lossless against static decoding .* set mrp_draft_graph"):
        MRPGenerationConfig(mrp_mode="speculative", threshold=0.5)
    with pytest.raises(ValueError, match=r"drop threshold, steps and tokens_per_step .*tokens_per_step=2\)\.$"):
        MRPGenerationConfig(mrp_mode="speculative", mrp_draft_graph="chain", tokens_per_step=2)
    # a stored graph does not break the other modes
    assert MRPGenerationConfig(mrp_mode="off", mrp_draft_graph="tree-2x2").mrp_draft_graph == "tree-2x2"
    # without a head: the speculative error names the head-free drafter, the other modes' errors are unchanged
    plain = MRPModel.from_backbone(models["sdar"], mask_token_id=STAND_IN_MASK_ID)
    ids = torch.tensor([[5, 17, 33, 9]])
    with pytest.raises(ValueError, match=r"needs an MRP head.*mrp_mode='off' \(or mrp_drafter='backbone'"):
        plain.generate(ids, max_new_tokens=4, block_length=4, mrp_mode="speculative")
    for mode, extra in (("direct", {}), ("remask", {"threshold": 0.5})):
        with pytest.raises(ValueError, match=r"needs an MRP head.* or use mrp_mode='off'\.$"):
            plain.generate(ids, max_new_tokens=4, block_length=4, mrp_mode=mode, **extra)


# ---------------------------------------------------------------- lossless over static decoding
@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("drafter", ["head", "backbone"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_graphs_equal_static(models, family, drafter, temperature):
    plain, spec = models_for(models[family])
    ids, mask = batch(PROMPTS)
    kwargs = dict(max_new_tokens=8, block_length=4, temperature=temperature, seed=7, return_dict_in_generate=True)
    static = plain.generate(ids, attention_mask=mask, **kwargs)
    model = plain if drafter == "backbone" else spec  # head-free: the model needs no head at all
    for graph in GRAPHS:
        out = model.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_draft_graph=graph,
                             mrp_drafter=drafter, **kwargs)
        assert_lossless(out, static)
        assert sum(out.stats.acceptance_histogram) >= 1
        assert (out.stats.head_forwards > 0) == (drafter == "head")


@pytest.mark.parametrize(("family", "prefix_cache"), PACKING)
@pytest.mark.parametrize("layout", ["stacked", "packed"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_graphs_equal_static_in_both_layouts(packing_models, family, prefix_cache, layout, temperature):  # noqa: F811
    plain, spec = models_for(packing_models[family])
    ids, mask = batch(PROMPTS)
    kwargs = dict(max_new_tokens=8, block_length=4, temperature=temperature, seed=7, prefix_cache=prefix_cache,
                  return_dict_in_generate=True)
    static = plain.generate(ids, attention_mask=mask, **kwargs)
    for model, drafter in ((spec, "head"), (plain, "backbone")):
        out = model.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_draft_graph="tree-2x2",
                             mrp_drafter=drafter, verify_layout=layout, **kwargs)
        assert_lossless(out, static)


@pytest.mark.parametrize(("family", "prefix_cache"), [("sdar", None), ("reference", None), ("dream", True)])
def test_packed_and_stacked_graphs_count_the_same(packing_models, family, prefix_cache):  # noqa: F811
    _, spec = models_for(packing_models[family])
    ids, mask = batch(PROMPTS)
    runs = [spec.generate(ids, attention_mask=mask, max_new_tokens=16, block_length=4, prefix_cache=prefix_cache,
                          mrp_mode="speculative", mrp_draft_graph="tree-3x2", verify_layout=layout,
                          return_dict_in_generate=True) for layout in ("stacked", "packed")]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.to_dict() == runs[1].stats.to_dict()


@pytest.mark.parametrize("family", ["llada", "sdar", "dream"])
def test_a_chain_shaped_graph_is_the_chain(models, family):
    """The graph decoder with the chain's shape drafts, verifies and accepts exactly as the chain decoder."""
    _, spec = models_for(models[family])
    ids, mask = batch(PROMPTS)
    for temperature in (0.0, 0.8):
        kwargs = dict(max_new_tokens=8, block_length=4, temperature=temperature, seed=3, mrp_mode="speculative",
                      mrp_draft_tokens=3, return_dict_in_generate=True)
        chain = spec.generate(ids, attention_mask=mask, **kwargs)
        graph = spec.generate(ids, attention_mask=mask, mrp_draft_graph="chain", **kwargs)
        assert torch.equal(graph.sequences, chain.sequences)
        assert graph.stats.to_dict() == chain.stats.to_dict()


@pytest.mark.parametrize("family", ["llada", "sdar", "bert"])
def test_graphs_wider_and_deeper_than_the_masks_left(models, family):
    """Blocks of 2: a node has at most 2 open positions (4 (position, token) pairs) and 1 step left after the
    exact pick, so most children are invalid and the graph is cut to one level; the output does not change."""
    plain, spec = models_for(models[family])
    ids, mask = batch(PROMPTS)
    for temperature in (0.0, 0.8):
        kwargs = dict(max_new_tokens=8, block_length=2, temperature=temperature, seed=5, return_dict_in_generate=True)
        static = plain.generate(ids, attention_mask=mask, **kwargs)
        for graph in ([9], "tree-4x4x4", "chain-6"):
            for model, drafter in ((spec, "head"), (plain, "backbone")):
                out = model.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_draft_graph=graph,
                                     mrp_drafter=drafter, **kwargs)
                assert_lossless(out, static)
                assert len(out.stats.acceptance_histogram) <= 2  # never more than one accepted level


@pytest.mark.parametrize("family", ["llada", "sdar", "dream"])
def test_eos_inside_a_block(models, family):
    plain, spec = models_for(models[family])
    ids, mask = batch(PROMPTS)
    kwargs = dict(max_new_tokens=12, block_length=4, seed=1, return_dict_in_generate=True)
    free = plain.generate(ids, attention_mask=mask, **kwargs)
    eos = int(free.sequences[1, ids.shape[1] + 5])  # a token row 1 writes inside its second block
    static = plain.generate(ids, attention_mask=mask, eos_token_id=eos, pad_token_id=0, **kwargs)
    assert static.stats.row_new_tokens[1] <= 8  # row 1 stopped after that block
    for graph, model, drafter in (("tree-2x2", spec, "head"), ("tree-3x2", plain, "backbone")):
        out = model.generate(ids, attention_mask=mask, eos_token_id=eos, pad_token_id=0, mrp_mode="speculative",
                             mrp_draft_graph=graph, mrp_drafter=drafter, **kwargs)
        assert_lossless(out, static)


def test_head_free_chain_without_a_graph(models):
    """`mrp_drafter="backbone"` alone: a chain of mrp_draft_tokens drafts from the backbone's stale logits; a head,
    when the model has one, is not used."""
    plain, spec = models_for(models["llada"])
    ids, mask = batch(PROMPTS)
    kwargs = dict(max_new_tokens=8, block_length=4, return_dict_in_generate=True)
    static = plain.generate(ids, attention_mask=mask, **kwargs)
    runs = [model.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_drafter="backbone",
                           mrp_draft_tokens=4, **kwargs) for model in (plain, spec)]
    for out in runs:
        assert_lossless(out, static)
        assert out.stats.head_forwards == 0
    assert runs[0].stats.to_dict() == runs[1].stats.to_dict()


# ---------------------------------------------------------------- lossless over dynamic decoding
@pytest.mark.parametrize("family", ALL_FAMILIES)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_graphs_equal_dynamic(models, family, temperature):
    plain, spec = models_for(models[family])
    ids, mask = batch(PROMPTS)
    for threshold in (0.05, 0.3, 1.0):
        kwargs = dict(max_new_tokens=8, block_length=4, threshold=threshold, temperature=temperature, seed=11,
                      return_dict_in_generate=True)
        dynamic = plain.generate(ids, attention_mask=mask, **kwargs)
        for graph, model, drafter in (("chain", spec, "head"), ("tree-3x2", spec, "head"), ("tree-2x2", plain, "backbone")):
            out = model.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_draft_graph=graph,
                                 mrp_drafter=drafter, **kwargs)
            assert_lossless(out, dynamic)


@pytest.mark.parametrize(("family", "prefix_cache"), [("sdar", None), ("reference", None), ("dream", True)])
@pytest.mark.parametrize("layout", ["stacked", "packed"])
def test_graphs_equal_dynamic_in_both_layouts(packing_models, family, prefix_cache, layout):  # noqa: F811
    plain, spec = models_for(packing_models[family])
    ids, mask = batch(PROMPTS)
    kwargs = dict(max_new_tokens=8, block_length=4, threshold=0.3, temperature=0.8, seed=2, prefix_cache=prefix_cache,
                  return_dict_in_generate=True)
    dynamic = plain.generate(ids, attention_mask=mask, **kwargs)
    out = spec.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_draft_graph="tree-2x2",
                        verify_layout=layout, **kwargs)
    assert_lossless(out, dynamic)


# ---------------------------------------------------------------- the bundled reference model
def test_head_free_graph_accelerates_the_bundled_model():
    """On a real (trained) model the backbone's stale logits are good drafts: a head-free graph needs clearly
    fewer forwards than static decoding, with the same tokens."""
    from mrp_hf.reference import held_out_items
    from mrp_hf.reference.bundled import load_reference

    model, tokenizer = load_reference(with_head=False)
    tokenizer.padding_side = "left"
    prompts = [item.prompt for item in held_out_items(per_task=2)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    kwargs = dict(attention_mask=encoded["attention_mask"], return_dict_in_generate=True)
    static = model.generate(encoded["input_ids"], **kwargs)
    out = model.generate(encoded["input_ids"], mrp_mode="speculative", mrp_drafter="backbone",
                         mrp_draft_graph="tree-3x2x1", **kwargs)
    assert_lossless(out, static)
    assert out.stats.backbone_forwards <= 0.7 * static.stats.backbone_forwards


# ---------------------------------------------------------------- calibration
SHAPES = [(1,), (1, 1, 1), (2, 2), (3, 2, 1), (4, 1, 1, 1, 1, 1), (2, 2, 2)]


@pytest.mark.parametrize("family", ["llada", "sdar", "fast_dllm_v2", "dream"])
@pytest.mark.parametrize(("drafter", "threshold", "temperature"),
                         [("head", None, 0.0), ("backbone", None, 0.8), ("head", 0.2, 0.8), ("backbone", 0.2, 0.0)])
def test_simulated_forwards_are_the_real_ones(models, family, drafter, threshold, temperature):
    """The ranks recorded on the base decoding's trajectory replay any shape's rounds exactly: the simulated
    backbone forwards equal those of real speculative decoding with that shape, prompt by prompt (batch 1)."""
    from mrp_hf.generation.calibration import record_traces, simulate_forwards

    _, spec = models_for(models[family])
    prompts = [torch.tensor([p]) for p in PROMPTS]
    kwargs = dict(max_new_tokens=12, block_length=4, temperature=temperature, seed=9)
    traces, tokens, extra = record_traces(spec, prompts, threshold=threshold, drafter=drafter, depth=6, width=4, **kwargs)
    assert tokens == 12 * len(prompts)
    for shape in SHAPES:
        real = [spec.generate(p, mrp_mode="speculative", mrp_draft_graph=list(shape), mrp_drafter=drafter,
                              threshold=threshold, return_dict_in_generate=True, **kwargs) for p in prompts]
        assert simulate_forwards(traces, shape) + extra == sum(out.stats.backbone_forwards for out in real), shape


def test_calibration_is_deterministic_and_prefers_fewer_nodes(models):
    from mrp_hf.generation.calibration import calibration_record, candidate_shapes, record_traces

    _, spec = models_for(models["llada"])
    prompts = [torch.tensor([p]) for p in PROMPTS]
    records = []
    for _ in range(2):
        traces, tokens, extra = record_traces(spec, prompts, drafter="backbone", depth=4, width=3, max_new_tokens=8,
                                              block_length=4)
        records.append(calibration_record(traces, tokens, extra, [2, 4, 8, 16], depth=4, width=3))
    assert records[0] == records[1]
    budgets = records[0]["budgets"]
    assert [row["nodes"] <= int(b) for b, row in budgets.items()] == [True] * 4
    forwards = [budgets[b]["forwards"] for b in ("2", "4", "8", "16")]
    assert forwards == sorted(forwards, reverse=True) and forwards[0] < records[0]["base_forwards"]
    assert candidate_shapes(5, 3, 3) == [(3,), (2,), (1,), (2, 1), (1, 1), (1, 1, 1)]  # (2, 1): 1 + 2 + 2 nodes


def test_calibrate_command_stores_the_graph_a_loaded_head_then_uses(tmp_path, capsys):
    """`mrp-hf calibrate` on a copy of the bundled head: the chosen shape lands in the head's generation_config.json,
    MRPModel.from_pretrained picks it up as its speculative default, and decoding with it spends exactly the
    forwards the calibration predicted, with the static tokens."""
    import json
    import shutil

    from mrp_hf.cli import main
    from mrp_hf.reference import bundled, held_out_items

    for part in ("backbone", "head"):
        shutil.copytree(bundled.CHECKPOINTS / part, tmp_path / part)
    items = held_out_items(per_task=1, seed=5)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": it.prompt}) + "\n" for it in items))
    head = str(tmp_path / "head")
    argv = ["calibrate", "--head", head, "--prompts", str(tmp_path / "prompts.jsonl"), "--budgets", "3,8",
            "--budget", "8", "--max-depth", "6", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    stored = json.loads((tmp_path / "head" / "generation_config.json").read_text())
    assert stored["mrp_draft_graph"] == record["budgets"]["8"]["mrp_draft_graph"]
    assert stored["mrp_draft_graph_calibration"]["chosen_budget"] == 8 and record["prompts"] == len(items)
    model = MRPModel.from_pretrained(head)
    assert model.head.decoding_defaults == {"mrp_draft_graph": stored["mrp_draft_graph"]}
    assert model.generation_config.mrp_draft_graph == stored["mrp_draft_graph"]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "backbone"))
    forwards = 0
    for item in items:
        ids = tokenizer(item.prompt, return_tensors="pt")["input_ids"]
        out = model.generate(ids, mrp_mode="speculative", return_dict_in_generate=True)
        assert torch.equal(out.sequences, model.generate(ids))
        forwards += out.stats.backbone_forwards
    assert forwards == record["budgets"]["8"]["forwards"]
    # errors: a budget not calibrated, a head that is not a local folder
    assert main([*argv[:5], "--budgets", "3,8", "--budget", "9"]) == 2
    assert main(["calibrate", "--head", "someone/hub-head", "--prompts", str(tmp_path / "prompts.jsonl")]) == 2
    assert "is not a local folder" in capsys.readouterr().err
    # --budget auto: the budgets' shapes timed against the base decoding, the fastest stored
    assert main([*argv[:5], "--budgets", "3,8", "--budget", "auto", "--drafter", "backbone", "--timing-repeats", "1",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    shapes = {"x".join(map(str, row["mrp_draft_graph"])) for row in record["budgets"].values()}
    assert set(record["measured_speedups"]) == shapes
    best = max(record["measured_speedups"].values())
    assert record["fastest"]["measured_speedup_vs_base"] == best
    stored = json.loads((tmp_path / "head" / "generation_config.json").read_text())
    assert stored["mrp_draft_graph"] == record["fastest"]["mrp_draft_graph"]
    assert stored["mrp_draft_graph_calibration"]["chosen_budget"] == "auto"


def test_evaluation_modes_take_draft_graphs(models):
    """`mrp-hf eval --modes ...,speculative:tree-2x2` and dict modes with a head-free drafter or a threshold."""
    from mrp_hf.evaluation.runner import mode_generate_kwargs, mode_label, parse_modes

    modes = parse_modes(["speculative:tree-2x2", {"mode": "speculative", "threshold": 0.5, "mrp_draft_graph": "chain",
                                                  "mrp_drafter": "backbone"}])
    assert modes[1] == {"mode": "speculative", "mrp_draft_graph": "tree-2x2"}
    assert [mode_label(m) for m in modes] == ["static", "speculative:tree-2x2",
                                              'speculative:0.5:chain{"mrp_drafter": "backbone"}']
    plain = MRPModel.from_backbone(models["sdar"], mask_token_id=STAND_IN_MASK_ID)
    ids, mask = batch(PROMPTS)
    dynamic = plain.generate(ids, attention_mask=mask, max_new_tokens=8, block_length=4, threshold=0.5)
    out = plain.generate(ids, attention_mask=mask, max_new_tokens=8, block_length=4, **mode_generate_kwargs(modes[2]))
    assert torch.equal(out, dynamic)
    with pytest.raises(ValueError, match="drop threshold=0.5"):
        parse_modes([{"mode": "speculative", "threshold": 0.5}])


# ---------------------------------------------------------------- the verify's lookahead
@pytest.mark.parametrize(("family", "prefix_cache"), PACKING + [("llada", None), ("fast_dllm_v2", None)])
@pytest.mark.parametrize("layout", ["stacked", "packed"])
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_a_carried_lookahead_is_the_next_blocks_first_forward(models, packing_models, family, prefix_cache, layout,  # noqa: F811
                                                              threshold, monkeypatch):
    """Where a verify's lookahead stands in for the next block's first forward, its outputs are that forward's
    (checked against a fresh forward each time one is used), the output stays the base decoding's, and families
    whose next block cannot start from it (Fast-dLLM v2's autoregressive first token, Dream's approximate cache)
    never carry. The drafter is an oracle (each node's drafts from the backbone's real outputs on it), so that
    rounds fill their blocks and carries happen on these random models."""
    from mrp_hf.generation.block import BlockContext
    from mrp_hf.generation.strategies.graph import GraphSpeculativeDecoder

    monkeypatch.setattr(GraphSpeculativeDecoder, "draft_logits",
                        lambda self, block, parents, stale, acc: (block.forward(candidates=parents).logits, None))

    backbone = {**models, **packing_models}[family]
    plain, _ = models_for(backbone)
    if layout == "packed" and family in ("llada", "fast_dllm_v2"):
        pytest.skip("the family cannot pack")
    used, can_carry = [], set()
    first_forward = BlockContext.first_forward

    def checked(self, hidden=False):
        can_carry.add(self._engine.can_carry)
        carried = self._state.carried
        out = first_forward(self, hidden)
        if carried is not None and out is carried[1]:
            fresh = self.forward(hidden=hidden)
            torch.testing.assert_close(out.logits, fresh.logits, atol=1e-5, rtol=1e-4)
            if hidden:
                torch.testing.assert_close(out.lm_head_input, fresh.lm_head_input, atol=1e-5, rtol=1e-4)
            used.append(self.start)
        return out

    monkeypatch.setattr(BlockContext, "first_forward", checked)
    ids, mask = batch([[5, 17, 33], [9, 60, 2]])
    kwargs = dict(max_new_tokens=12, block_length=2, prefix_cache=prefix_cache, threshold=threshold,
                  return_dict_in_generate=True)
    base = plain.generate(ids, attention_mask=mask, **kwargs)
    out = plain.generate(ids, attention_mask=mask, mrp_mode="speculative", mrp_drafter="backbone",
                         mrp_draft_graph="tree-2x1", verify_layout=layout, **kwargs)
    assert torch.equal(out.sequences, base.sequences)
    assert len(can_carry) == 1 and bool(used) == can_carry.pop()
    if family == "fast_dllm_v2" or (family == "dream" and prefix_cache):
        assert not used


def test_the_lookahead_saves_forwards_on_the_bundled_model():
    """On the trained reference model, head-free graphs over static and over dynamic decoding need fewer forwards
    with the lookahead than without it (`verify_lookahead=False`), with the same tokens."""
    from mrp_hf.reference import held_out_items
    from mrp_hf.reference.bundled import load_reference

    model, tokenizer = load_reference(with_head=False)
    prompts = [tokenizer(item.prompt, return_tensors="pt")["input_ids"] for item in held_out_items(per_task=2)]

    def forwards(**kwargs):
        outs = [model.generate(p, mrp_mode="speculative", mrp_drafter="backbone", return_dict_in_generate=True,
                               **kwargs) for p in prompts]
        return sum(o.stats.backbone_forwards for o in outs), [o.sequences for o in outs]

    for kwargs in (dict(mrp_draft_graph="chain-7"), dict(mrp_draft_graph="chain-4", threshold=0.9)):
        with_lookahead, tokens = forwards(**kwargs)
        without, same_tokens = forwards(verify_lookahead=False, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(tokens, same_tokens, strict=True))
        assert with_lookahead < without, (kwargs, with_lookahead, without)
    with pytest.raises(ValueError, match="verify_lookahead='yes' must be True or False"):
        model.generate(prompts[0], mrp_mode="speculative", mrp_drafter="backbone", verify_lookahead="yes")
