"""Draft graph shapes for `mrp_mode="speculative"`: how many candidate states one verify forward evaluates.

A draft graph is a tree of candidate states of the current block. Its root is the state after the round's exact
pick; a node's children each reveal a different next pick, drafted from the same (head-corrected, or the
backbone's own stale) logits: the best child reveals the drafter's own pick, the others its next alternatives.
The shape is the branching per depth: `(2, 2)` gives the root 2 children and each of them 2, 1 + 2 + 4 = 7 nodes,
all evaluated by one backbone forward. `(1,) * K` is today's chain of K drafts.

Shapes are given as `mrp_draft_graph`:
- `"chain"`: the chain of `mrp_draft_tokens` drafts; `"chain-K"`: a chain of K;
- `"tree-AxBxC"`: branching A at depth 1, B at depth 2, C at depth 3 (`"tree-4"`: four alternatives, depth 1);
- a list of positive ints, the branching per depth (as stored in a generation_config.json).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import Any

import torch

#: a verify forward over more candidate states than this is a mistake, not a speed-up (memory grows with it)
MAX_GRAPH_NODES = 256
MAX_GRAPH_DEPTH = 64
_NAMED = re.compile(r"^(chain|tree)(?:-(\d+(?:x\d+)*))?$")


@dataclass(frozen=True)
class DraftGraph:
    """A draft tree by its branching per depth. Nodes are numbered level by level (the root is node 0); child j of
    level d (0-based among that level's nodes) has parent j // branching[d-1] on level d - 1 and is its parent's
    (j % branching[d-1])-th alternative (0: the drafter's own pick)."""

    branching: tuple[int, ...]

    @property
    def depth(self) -> int:
        return len(self.branching)

    @cached_property
    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per level, the root's level first."""
        return tuple(accumulate(self.branching, operator.mul, initial=1))

    @property
    def nodes(self) -> int:
        return sum(self.level_sizes)

    @cached_property
    def level_starts(self) -> tuple[int, ...]:
        """Index of each level's first node."""
        return tuple(accumulate(self.level_sizes[:-1], initial=0))

    def truncated(self, depth: int) -> DraftGraph:
        """The graph cut to at most `depth` levels below the root (no more picks than masked positions left)."""
        return self if depth >= self.depth else DraftGraph(self.branching[: max(depth, 0)])

    def parents(self, device: torch.device) -> torch.Tensor:
        """Global index of each node's parent [nodes] (the root is its own parent)."""
        out = [0]
        for level in range(1, self.depth + 1):
            start, width = self.level_starts[level - 1], self.branching[level - 1]
            out += [start + j // width for j in range(self.level_sizes[level])]
        return torch.tensor(out, dtype=torch.long, device=device)

    def depths(self, device: torch.device) -> torch.Tensor:
        """Depth of each node [nodes] (the root: 0)."""
        return torch.tensor([d for d, size in enumerate(self.level_sizes) for _ in range(size)], device=device)

    def on_first_choice_path(self, device: torch.device) -> torch.Tensor:
        """Bool [nodes]: the nodes of the drafter's first-choice path (each level's first node: the first child of
        the first child ...)."""
        path = torch.zeros(self.nodes, dtype=torch.bool, device=device)
        path[list(self.level_starts)] = True
        return path

    def describe(self) -> str:
        return f"chain-{self.depth}" if set(self.branching) == {1} else "tree-" + "x".join(map(str, self.branching))


def parse_draft_graph(value: Any, draft_tokens: int) -> DraftGraph | None:
    """`mrp_draft_graph` -> a `DraftGraph` (None: no graph); `ValueError` naming the value and the fix."""
    if value is None:
        return None
    hint = "use e.g. 'chain', 'chain-4', 'tree-2x2' or a list of branchings such as [3, 2, 1]"
    if isinstance(value, str):
        match = _NAMED.match(value.strip())
        if match is None:
            raise ValueError(f"mrp_draft_graph={value!r} is not a draft graph shape; {hint}.")
        kind, spec = match.groups()
        if kind == "chain" and spec is None:
            branching = [1] * draft_tokens
        elif spec is None:
            raise ValueError(f"mrp_draft_graph={value!r} gives no branching; {hint}.")
        else:
            branching = [int(part) for part in spec.split("x")]
            if kind == "chain":
                if len(branching) != 1:
                    raise ValueError(f"mrp_draft_graph={value!r}: a chain takes one length (e.g. 'chain-4'); {hint}.")
                branching = [1] * branching[0]
    elif isinstance(value, (list, tuple)):
        branching = list(value)
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in branching):
            raise ValueError(f"mrp_draft_graph={value!r} must hold ints (children per node at each depth); {hint}.")
    else:
        raise ValueError(f"mrp_draft_graph={value!r} must be a shape name or a list of ints; {hint}.")
    if not branching or any(b < 1 for b in branching):
        raise ValueError(f"mrp_draft_graph={value!r} needs at least one depth and branchings >= 1; {hint}.")
    graph = DraftGraph(tuple(branching))
    if graph.depth > MAX_GRAPH_DEPTH or graph.nodes > MAX_GRAPH_NODES:
        raise ValueError(
            f"mrp_draft_graph={value!r} has {graph.nodes} nodes over depth {graph.depth}; the limits are "
            f"{MAX_GRAPH_NODES} nodes and depth {MAX_GRAPH_DEPTH} (one verify forward holds every node)."
        )
    return graph

