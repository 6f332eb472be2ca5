"""`mrp_mode="speculative"` with a draft graph: many candidate states per verify forward, lossless.

One round, from exact backbone outputs on the current state S:
1. the backbone's own step on S is exact (static: its most confident pick; dynamic: every position its threshold
   rule reveals): commit it -> the root S_1;
2. drafting, level by level (no backbone forward): each node's draft logits are the head-corrected ones
   lm_head(h_A + C) (the head applied recurrently along the node's path), or, without a head, the backbone's own
   logits on S (C = 0: "auto-speculation"). A node's children reveal different next steps drafted from them:
   static: the best (position, token) pairs (the drafter's pick first, then the next positions and, under
   top_prob confidence, the next tokens); dynamic: the threshold rule's set first, then that set with the
   membership of the position whose draft confidence is nearest the threshold flipped, the next nearest, ...
   (where no draft confidence passes the threshold the rule reveals one position, and the alternatives are the
   next single picks, as under static decoding);
3. verification: ONE backbone forward over every node (`BlockContext.forward(candidates=...)`, stacked or packed);
   the backbone's own step on each node is computed with the node's committed count (so the keyed random draws
   are those of the base decoding on that state); a child is accepted iff its parent is and its reveal (positions
   and tokens) is exactly the backbone's step on the parent. Accepted nodes form a path from the root; each row
   keeps its deepest, whose verify outputs are the exact outputs of the next round. The last node of the
   first-choice path also reads the next block (the lookahead): if every row ends its block filled on that path,
   the next block starts from those outputs without a forward (`BlockContext.verify`, `carry`).
Every accepted state is a state the base decoding reaches, with the same committed count, so the output equals
the base decoding (static, or dynamic at that threshold) token for token, greedy or sampled. One read of the
device per round, as in the chain (generation/strategies/speculative.py), which a chain-shaped graph reproduces.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...backbones.base import BackboneOutput
from ..block import BlockContext
from ..draft_graph import DraftGraph
from .base import BlockDecoder, RevealStrategy, commit_exact_step, top_k_positions


class DraftTree(NamedTuple):
    """Every node of one round's graph, level by level: states [n, N, L], what each node revealed on its parent
    [n, N, L] (the root: nothing), committed counts [n, N], and whether the node is a real draft [n, N] (a parent
    with fewer alternatives than children leaves the rest invalid: they are verified but never accepted)."""

    states: torch.Tensor
    reveals: torch.Tensor
    committed: torch.Tensor
    valid: torch.Tensor


class GraphSpeculativeDecoder(BlockDecoder):
    """`head`: the MRP head drafting (None: the backbone's own logits); `reveal`: the base decoding's rule (None:
    static, one most confident pick per step; a `DynamicStrategy`: its threshold step); `token_alternatives`:
    whether siblings may differ by token at one position (confidence="top_prob", where a token's probability is
    its confidence, so pairs rank as the backbone ranks them)."""

    def __init__(self, head, graph: DraftGraph, reveal: RevealStrategy | None = None, token_alternatives: bool = True):
        self.head = head
        self.graph = graph
        self.reveal = reveal
        self.token_alternatives = token_alternatives

    def step(self, confidence: torch.Tensor, open_: torch.Tensor) -> torch.Tensor:
        """The base decoding's reveals for confidences [..., L] (a bool mask of the same shape)."""
        if self.reveal is None:
            return top_k_positions(confidence, open_, 1)
        return self.reveal.select(confidence, open_, 0) & open_

    @torch.no_grad()
    def decode_block(self, block: BlockContext) -> None:
        hidden = self.head is not None
        exact = block.first_forward(hidden=hidden)  # the backbone's own outputs on the current state S
        while True:
            # 1. the exact step on S -> the root
            ids, committed, masked, left = commit_exact_step(block, exact.logits, self.step)
            if left == 0:
                return
            # 2. the graph's nodes, no more than the masks left allow
            graph = self._fitted(left)
            tree = self._draft(block, ids, committed, exact, graph)
            # 3. one backbone forward over every node (and the next block after the node likeliest to end this one);
            #    each row keeps its deepest accepted node
            verify, ahead = block.verify(tree.states, hidden, self._lookahead_node(block, graph, left))
            node = self._deepest_accepted(block, verify.logits, tree, graph)
            rows = torch.arange(ids.shape[0], device=ids.device)
            block.commit(tree.states[rows, node], tree.committed[rows, node] - committed)
            if ahead is not None:  # exact for the next block where the row ended its block filled on that path
                on_path = graph.on_first_choice_path(node.device)[node]
                block.carry(ahead, on_path & (tree.states[rows, node] != block.mask_id).all(dim=1))
            block.record_acceptance(graph.depths(node.device)[node], masked.any(dim=1), self.graph.depth)
            lm_head_input = verify.lm_head_input[rows, node] if hidden else None
            exact = BackboneOutput(logits=verify.logits[rows, node], lm_head_input=lm_head_input)

    def _lookahead_node(self, block: BlockContext, graph: DraftGraph, left: int) -> int | None:
        """The node after which the verify also reads the next block (None: no lookahead): the last node of the
        drafter's first-choice path (each level's first node). A node whose block is filled has children that
        reveal nothing, whose states equal it, so that node holds the block the path fills, whatever the depth
        it fills it at. Static steps reveal one position each, so only a graph as deep as the masks left can fill
        the block: without one (known on the host) the lookahead is skipped. Only the first-choice path carries,
        so that calibration can count carried forwards from ranks alone."""
        if block.next_block is None or (self.reveal is None and graph.depth < left):
            return None
        return graph.level_starts[-1]

    def _fitted(self, left: int) -> DraftGraph:
        """The graph cut to what `left` masked positions (the most of any row) allow: every step reveals one position
        at least, so a node of depth d has at most left - d open positions and no more distinct children than
        that many positions (twice as many with token alternatives; one more, the threshold set itself, over
        dynamic decoding)."""
        branching = []
        for depth, width in enumerate(self.graph.branching[:left]):
            open_ = left - depth
            most = open_ + 1 if self.reveal is not None else open_ * (2 if self.token_alternatives else 1)
            branching.append(min(width, most))
        return DraftGraph(tuple(branching))

    def _draft(self, block: BlockContext, root: torch.Tensor, committed: torch.Tensor, exact: BackboneOutput,
               graph: DraftGraph) -> DraftTree:
        """The graph's nodes, level by level from the root [n, L] (committed count [n])."""
        n, length = root.shape
        states, reveals = [root.unsqueeze(1)], [torch.zeros_like(root, dtype=torch.bool).unsqueeze(1)]
        counts, valid = [committed.unsqueeze(1)], [torch.ones(n, 1, dtype=torch.bool, device=root.device)]
        acc = exact.lm_head_input.unsqueeze(1) if self.head is not None else None  # h on S, per parent node
        for width in graph.branching:
            parents = states[-1]  # [n, P, L]
            logits, acc = self.draft_logits(block, parents, exact.logits.unsqueeze(1), acc)
            open_ = parents == block.mask_id
            reveal, tokens, ok = self.children(block, logits, open_, counts[-1], width)  # [n, P, W, L] / [n, P, W]
            states.append(torch.where(reveal, tokens, parents.unsqueeze(2)).flatten(1, 2))
            reveals.append(reveal.flatten(1, 2))
            counts.append((counts[-1].unsqueeze(2) + reveal.sum(dim=-1)).flatten(1, 2))
            valid.append((valid[-1].unsqueeze(2) & ok).flatten(1, 2))
            if acc is not None:
                acc = acc.repeat_interleave(width, dim=1)  # each child starts from its parent's accumulator
        return DraftTree(torch.cat(states, dim=1), torch.cat(reveals, dim=1), torch.cat(counts, dim=1),
                         torch.cat(valid, dim=1))

    def draft_logits(self, block: BlockContext, parents: torch.Tensor, stale: torch.Tensor, acc):
        """Draft logits on every parent node [n, P, L, V] and the head's accumulators after them [n, P, L, H].
        `stale`: the backbone's logits on the round's S ([n, 1 or P, L, V]); `acc`: the accumulators the head
        continues from ([n, P, L, H]; h_A on S for the root's level)."""
        n, count, length = parents.shape
        if self.head is None:  # auto-speculation: the backbone's own logits on S, C = 0
            return stale.expand(n, count, *stale.shape[2:]), None
        flat_acc = acc.flatten(0, 1)
        positions = block.positions.repeat_interleave(count, dim=0)
        flat_acc = flat_acc + self.head(block.embed(parents.flatten(0, 1)), flat_acc, position_ids=positions)
        logits = block.lm_head(flat_acc)
        block.head_forward_done(logits)
        return logits.view(n, count, length, -1), flat_acc.view(n, count, length, -1)

    def children(self, block: BlockContext, logits, open_, committed, width: int):
        """Up to `width` different next steps per parent: reveal masks and their tokens [n, P, W, L], valid [n, P, W]."""
        tokens, confidence = block.propose(logits, open_, committed)
        if self.reveal is None:
            return self._single_pick_children(block, logits, tokens, confidence, width)
        flips = self._dynamic_children(tokens, confidence, open_, width)
        if width == 1:
            return flips
        # a node where no draft confidence passes the threshold reveals its one most confident position: its
        # alternatives are then the next single picks (as under static decoding), not membership flips
        singles = self._single_pick_children(block, logits, tokens, confidence, width)
        threshold = self.reveal.threshold
        passing = (confidence >= threshold) if self.reveal.inclusive else (confidence > threshold)
        single = ~(passing & open_).any(dim=-1)  # [n, P]
        return tuple(torch.where(single.view(*single.shape, *([1] * (a.dim() - 2))), a, b)
                     for a, b in zip(singles, flips, strict=True))

    def _single_pick_children(self, block: BlockContext, logits, tokens, confidence, width: int):
        """Children that each reveal one (position, token) pair: the drafter's pick first, then the next best pairs
        (other positions and, with token alternatives, other tokens), [n, P, W, L] / [n, P, W]."""
        length = tokens.shape[-1]
        scores, alternatives = confidence, tokens
        if width > 1 and self.token_alternatives:
            alt_scores, alt_tokens = self._token_alternatives(block, logits, tokens, confidence)
            scores, alternatives = torch.cat([confidence, alt_scores], -1), torch.cat([tokens, alt_tokens], -1)
        if scores.shape[-1] < width:  # fewer candidate pairs than children: the rest are invalid
            pad = torch.full((*scores.shape[:-1], width - scores.shape[-1]), float("-inf"), device=scores.device)
            scores, alternatives = torch.cat([scores, pad], -1), torch.cat([alternatives, torch.zeros_like(pad, dtype=torch.long)], -1)
        # the drafter's own pick first (a stable sort keeps the first maximum first, as argmax does)
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :width]  # [n, P, W]
        ok = scores.gather(-1, order) > float("-inf")
        positions = order % length
        reveal = torch.nn.functional.one_hot(positions, length).bool() & ok.unsqueeze(-1)
        chosen = alternatives.gather(-1, order)
        return reveal, chosen.unsqueeze(-1).expand_as(reveal), ok

    @staticmethod
    def _token_alternatives(block: BlockContext, logits, tokens, confidence):
        """Per position: the most probable other token and a score ranking it with the pairs of other positions
        (its probability under top_prob confidence: the proposal's confidence times the probability ratio)."""
        probs = logits.float().softmax(dim=-1)
        proposed = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        others = probs.scatter(-1, tokens.unsqueeze(-1), -1.0)
        if block.mask_id < others.shape[-1]:
            others[..., block.mask_id] = -1.0  # never proposed
        alt_prob, alt_tokens = others.max(dim=-1)
        ratio = (alt_prob / proposed.clamp_min(torch.finfo(probs.dtype).tiny)).clamp(max=1.0)
        scores = torch.where(alt_prob > 0, confidence * ratio, torch.full_like(confidence, float("-inf")))
        return scores.masked_fill(confidence == float("-inf"), float("-inf")), alt_tokens

    def _dynamic_children(self, tokens, confidence, open_, width: int):
        """The threshold rule's set on the draft confidences, then that set with the k-th least certain membership
        flipped (positions ordered by |confidence - threshold|), for k = 0 .. width - 2 (where some position passes
        the threshold; otherwise `children` uses single picks)."""
        base = self.step(confidence, open_)  # [n, P, L]
        reveal, flipped = [base], [torch.ones_like(base[..., 0])]
        if width > 1:
            distance = (confidence - self.reveal.threshold).abs().masked_fill(~open_, float("inf"))
            order = torch.sort(distance, dim=-1, stable=True).indices
            for k in range(width - 1):
                flip = torch.zeros_like(base)
                if k < base.shape[-1]:
                    flip.scatter_(-1, order[..., k : k + 1], True)
                flip &= open_  # a flip of a position that is not open would repeat the parent: invalid
                reveal.append(base ^ flip)
                flipped.append(flip.any(dim=-1))
        reveal = torch.stack(reveal, dim=2)  # [n, P, W, L]
        ok = reveal.any(dim=-1) & torch.stack(flipped, dim=2)
        return reveal, tokens.unsqueeze(2).expand_as(reveal), ok

    def _deepest_accepted(self, block: BlockContext, logits, tree: DraftTree, graph: DraftGraph) -> torch.Tensor:
        """Per row, the index of its deepest node on the path of the backbone's own steps from the root [n]."""
        on = tree.states == block.mask_id
        v_tokens, v_confidence = block.propose(logits, on, tree.committed)
        v_step = self.step(v_confidence, on)  # the backbone's own step on every node [n, N, L]
        parents = graph.parents(logits.device)
        step_of_parent, tokens_of_parent = v_step[:, parents], v_tokens[:, parents]
        same_reveal = (step_of_parent == tree.reveals).all(dim=-1)
        same_tokens = (torch.where(step_of_parent, tokens_of_parent, 0) == torch.where(tree.reveals, tree.states, 0)).all(-1)
        match = tree.valid & same_reveal & same_tokens
        match[:, 0] = True
        accepted = match
        for _ in range(graph.depth):  # a node is accepted iff it and every ancestor match
            accepted = match & accepted[:, parents]
        depth = graph.depths(logits.device)
        return (accepted.long() * (depth + 1)).argmax(dim=1)
