"""Calibrating a draft graph's shape offline, from acceptance statistics on held-out prompts (`mrp-hf calibrate`).

What a graph accepts in a round depends on its shape only through ranks: the graph decoder drafts a node's
children in a fixed order (`GraphSpeculativeDecoder.children`: the drafter's own step first, then its
alternatives), and a node's drafts depend only on the node's path, not on the rest of the graph. So one decode
with the base decoding (static, or dynamic at a threshold) records, for every state S_t of its trajectory and
every depth k, the rank r(t, k) of the base decoding's true next step among the drafter's ordered alternatives on
the true path's node S_{t+k} (drafts started from S_t's exact outputs, as a round started there would). A
round started at S_t with branching (b_1, ..., b_D) accepts the deepest d with r(t, k) < b_k for every k <= d:
replaying the rounds over the trajectory gives the exact backbone forwards of speculative decoding with any
shape, without running it (`simulate_forwards`; tests/test_draft_graphs.py checks it against real decodes). A
round that fills its block along the drafter's first-choice path (every rank 0) also computes the next block's
first outputs (the verify's lookahead, `BlockContext.verify`): the next block, if it follows in the same decode,
then starts without a forward.
`calibrate` then picks, per node budget, the shape with the fewest forwards.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .block import BlockContext
from .draft_graph import MAX_GRAPH_NODES, DraftGraph
from .strategies.base import BlockDecoder
from .strategies.graph import GraphSpeculativeDecoder


@dataclass(frozen=True)
class BlockTrace:
    """One block of one prompt: `steps` base-decoding steps fill it; `ranks[t][k-1]` is r(t, k), the rank of the
    true step at depth k of a round started at S_t (`width`: not among the first `width` alternatives);
    `follows`: the block comes right after the previous trace's, in the same decode, and the engine lets a
    verify's lookahead carry into it (`DecodingEngine.can_carry`)."""

    steps: int
    ranks: tuple[tuple[int, ...], ...]
    follows: bool = False


class RankRecorder(BlockDecoder):
    """Decodes each block with the base decoding of `drafter` (its exact step, one backbone forward per step) and
    records its `BlockTrace` up to `depth` and `width`. One row at a time (calibration decodes prompts alone)."""

    def __init__(self, drafter: GraphSpeculativeDecoder, depth: int, width: int):
        self.drafter, self.depth, self.width = drafter, depth, width
        self.traces: list[BlockTrace] = []
        self._expected = None  # (decoding state, block start) of the block a lookahead could carry into

    @torch.no_grad()
    def decode_block(self, block: BlockContext) -> None:
        if block.ids().shape[0] != 1:
            raise ValueError("RankRecorder decodes one prompt at a time: run it with a batch of 1.")
        hidden = self.drafter.head is not None
        states, logits, accumulators, committed = [], [], [], []
        ids = block.ids()
        while bool((ids == block.mask_id).any()):  # the base decoding, one exact step per forward
            exact = block.forward(hidden=hidden)
            masked = ids == block.mask_id
            states.append(ids)
            logits.append(exact.logits)
            accumulators.append(exact.lm_head_input)
            committed.append(block.committed)
            tokens, confidence = block.propose(exact.logits, masked, block.committed)
            step = self.drafter.step(confidence, masked)
            if not bool(step.any()):
                block.raise_if_stalled(masked.any(dim=1), confidence)
            ids = torch.where(step, tokens, ids)
            block.commit(ids, step.sum(dim=1))
        follows = self._expected == (id(block._state), block.start)
        self._expected = None
        if not logits:  # nothing to decode in this block: no forward, no trace
            return
        if block.next_block is not None:
            self._expected = (id(block._state), block.next_block[0])
        states.append(ids)
        committed.append(block.committed)
        self.traces.append(self._trace(block, states, logits, accumulators, committed, follows))

    def _trace(self, block, states, logits, accumulators, committed, follows: bool) -> BlockTrace:
        """r(t, k) for every start t with a round (t + 1 < steps) and depth k (t + k + 1 <= steps), depth by depth,
        all starts at once (they are the candidate dimension of the drafter's calls)."""
        steps = len(states) - 1
        starts = list(range(max(steps - 1, 0)))
        ranks = [[] for _ in starts]
        acc = torch.stack([accumulators[t] for t in starts], dim=1) if starts and accumulators[0] is not None else None
        stale = torch.stack([logits[t] for t in starts], dim=1) if starts else None
        for k in range(1, self.depth + 1):
            live = [t for t in starts if t + k + 1 <= steps]
            if not live:
                break
            count = len(live)  # the live starts are always a prefix of `starts`
            nodes = torch.stack([states[t + k] for t in live], dim=1)  # [1, P, L]
            following = torch.stack([states[t + k + 1] for t in live], dim=1)
            node_committed = torch.stack([committed[t + k] for t in live], dim=1)
            draft, acc = self.drafter.draft_logits(block, nodes, stale[:, :count],
                                                   None if acc is None else acc[:, :count])
            open_ = nodes == block.mask_id
            reveal, tokens, ok = self.drafter.children(block, draft, open_, node_committed, self.width)
            true_reveal = open_ & (following != block.mask_id)
            same = ((reveal == true_reveal.unsqueeze(2)).all(dim=-1)
                    & (torch.where(reveal, tokens, 0) == torch.where(true_reveal, following, 0).unsqueeze(2)).all(-1))
            match = ok & same  # [1, P, W]: at most one alternative is the true step
            rank = torch.where(match.any(dim=-1), match.long().argmax(dim=-1), self.width)[0].tolist()
            for t, r in zip(live, rank, strict=True):
                ranks[t].append(int(r))
        return BlockTrace(steps=steps, ranks=tuple(tuple(r) for r in ranks), follows=follows)


def simulate_forwards(traces: list[BlockTrace], branching: tuple[int, ...]) -> int:
    """Backbone forwards the graph decoder spends on these blocks with this branching (batch 1): per block one
    forward on the first state unless the previous block's last verify carried it, then per round the exact step
    and, unless it finished the block, one verify."""
    verifies, carried = _replay(traces, branching)
    return len(traces) - carried + verifies


def _replay(traces: list[BlockTrace], branching: tuple[int, ...]) -> tuple[int, int]:
    """(verify forwards, blocks whose first forward a lookahead carried)."""
    verifies = carried = 0
    carries = False  # whether the previous block ended along the first-choice path (its lookahead is exact)
    for trace in traces:
        carried += int(carries and trace.follows)
        carries = False
        start = 0
        while True:
            root = start + 1  # after the round's exact step
            if root >= trace.steps:
                break
            accepted = 0
            ranks = trace.ranks[start]
            while (accepted < len(branching) and accepted < len(ranks) and root + accepted + 1 <= trace.steps
                   and ranks[accepted] < branching[accepted]):
                accepted += 1
            verifies += 1
            start = root + accepted
            if start >= trace.steps:
                carries = not any(ranks[:accepted])
                break
    return verifies, carried


def candidate_shapes(max_nodes: int, max_depth: int, max_width: int) -> list[tuple[int, ...]]:
    """Every non-increasing branching (wider near the root, where drafts are surest) within the limits."""
    shapes = []
    for depth in range(1, max_depth + 1):
        for branching in itertools.combinations_with_replacement(range(max_width, 0, -1), depth):
            graph = DraftGraph(branching)
            if graph.nodes <= max_nodes:
                shapes.append(branching)
    return shapes


@dataclass(frozen=True)
class Choice:
    budget: int
    branching: tuple[int, ...]
    forwards: int
    tokens_per_forward: float


def choose_shapes(traces: list[BlockTrace], tokens: int, budgets: list[int], max_depth: int,
                  max_width: int) -> list[Choice]:
    """Per node budget: the shape with the fewest simulated forwards (ties: fewer nodes, then shallower)."""
    if any(b < 2 or b > MAX_GRAPH_NODES for b in budgets):
        raise ValueError(f"node budgets {budgets} must lie in [2, {MAX_GRAPH_NODES}] (the root and one draft at least).")
    shapes = candidate_shapes(max(budgets), max_depth, max_width)
    scored = [(simulate_forwards(traces, shape), DraftGraph(shape).nodes, len(shape), shape) for shape in shapes]
    choices = []
    for budget in sorted(budgets):
        forwards, _, _, shape = min(entry for entry in scored if entry[1] <= budget)
        choices.append(Choice(budget, shape, forwards, round(tokens / forwards, 4)))
    return choices


def measured_speedups(model, prompts: list[torch.Tensor], shapes: list[tuple[int, ...]], drafter: str = "head",
                      threshold: float | None = None, repeats: int = 3, **generate_kwargs) -> dict[tuple[int, ...], float]:
    """Per shape: the base decoding's CPU seconds over these prompts (one at a time) / speculative decoding's with
    that shape, medians of `repeats` interleaved passes (process CPU time: a busy shared machine disturbs it less
    than wall-clock). Measured rather than modelled: a round's cost has parts (drafting, the acceptance over every
    node, Python per round) that no per-forward figure predicts."""
    import statistics
    import time

    settings = [{"threshold": threshold, **generate_kwargs}] + [
        {"mrp_mode": "speculative", "mrp_draft_graph": list(shape), "mrp_drafter": drafter, "threshold": threshold,
         **generate_kwargs} for shape in shapes]
    seconds = [[] for _ in settings]
    for ids in prompts[:1]:  # warm-up
        for kwargs in settings:
            model.generate(ids.to(model.device), **kwargs)
    for _ in range(repeats):
        for kwargs, spent in zip(settings, seconds, strict=True):
            start = time.process_time()
            for ids in prompts:
                model.generate(ids.to(model.device), **kwargs)
            spent.append(time.process_time() - start)
    base = statistics.median(seconds[0])
    return {shape: round(base / statistics.median(spent), 3) for shape, spent in zip(shapes, seconds[1:], strict=True)}


def record_traces(model, prompts: list[torch.Tensor], threshold: float | None = None, drafter: str = "head",
                  depth: int = 8, width: int = 4, **generate_kwargs) -> tuple[list[BlockTrace], int, int]:
    """Decode each prompt ([1, T] ids) alone with the base decoding (static, or dynamic at `threshold`), recording
    the drafter's ranks. Returns (traces, tokens decoded, backbone forwards outside the traced steps: e.g. the
    forward that commits a Fast-dLLM v2 block's first token)."""
    from .config import build_generation_config
    from .engine import DecodingEngine

    config = build_generation_config(model.generation_config, mrp_mode="speculative", mrp_draft_graph=[1],
                                     mrp_drafter=drafter, threshold=threshold, **generate_kwargs)
    graph_decoder = DecodingEngine(model.adapter, config, head=model.head).block_decoder
    recorder = RankRecorder(graph_decoder, depth, width)
    tokens = forwards = 0
    for ids in prompts:
        before = len(recorder.traces)
        stats = DecodingEngine(model.adapter, config, head=model.head, block_decoder=recorder).run(
            ids.to(model.device)).stats
        tokens += sum(stats.row_new_tokens)
        forwards += stats.backbone_forwards - sum(trace.steps for trace in recorder.traces[before:])
    return recorder.traces, tokens, forwards


def calibration_record(traces: list[BlockTrace], tokens: int, extra_forwards: int, budgets: list[int],
                       depth: int, width: int, speedups: dict[tuple[int, ...], float] | None = None) -> dict:
    """The per-budget choices as stored in a head's generation_config.json (`mrp_draft_graph_calibration`); with
    `speedups` measured for some shapes, also the fastest of them (`"fastest"`)."""
    choices = choose_shapes(traces, tokens, budgets, depth, width)

    def entry(shape):
        forwards = simulate_forwards(traces, shape) + extra_forwards
        return {"mrp_draft_graph": list(shape), "nodes": DraftGraph(shape).nodes, "forwards": forwards,
                "tokens_per_forward": round(tokens / forwards, 4)}

    record = {"base_forwards": sum(trace.steps for trace in traces) + extra_forwards, "tokens": tokens,
              "budgets": {str(c.budget): entry(c.branching) for c in choices}}
    if speedups:
        shape = max(speedups, key=lambda s: (speedups[s], -DraftGraph(s).nodes))
        record["fastest"] = {**entry(shape), "measured_speedup_vs_base": speedups[shape]}
        record["measured_speedups"] = {"x".join(map(str, s)): v for s, v in speedups.items()}
    return record


#: the key under which the whole calibration record is kept in the head folder's generation_config.json; the
#: chosen `mrp_draft_graph` is a plain field there, read back as one of the head's decoding defaults
#: (`MRPHead.decoding_defaults`, applied by `MRPModel.generation_config`)
CALIBRATION_KEY = "mrp_draft_graph_calibration"


def write_head_calibration(head_folder: str, record: dict, budget: int | str) -> dict:
    """Store the calibration in the head folder's generation_config.json (other keys kept): `mrp_draft_graph` = the
    shape chosen for `budget` (a node budget, or "auto": the fastest), and the whole record under
    `mrp_draft_graph_calibration`. Returns what was written."""
    import json
    import os

    from .draft_graph import parse_draft_graph

    chosen = record.get("fastest") if budget == "auto" else record["budgets"].get(str(budget))
    if chosen is None:
        raise ValueError(f"budget {budget!r} was not calibrated; choose one of {sorted(map(int, record['budgets']))}"
                         f"{' or auto (with measured speed-ups)' if 'fastest' in record else ''}.")
    parse_draft_graph(chosen["mrp_draft_graph"], 1)
    path = os.path.join(head_folder, "generation_config.json")
    stored = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            stored = json.load(handle)
    stored["mrp_draft_graph"] = chosen["mrp_draft_graph"]
    stored[CALIBRATION_KEY] = {**record, "chosen_budget": budget}
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(stored, handle, indent=2)
        handle.write("\n")
    os.replace(temporary, path)  # a reader never sees half a file
    return stored
