"""The MRP training objective (MRP_METHOD.md section 4), split in two so that each half is testable:

`MRPObjective.prepare` (no grad; the frozen backbone only):
    1. per sample t ~ U(eps, 1); mask each response token with probability t -> x_t (the prompt never);
    2. backbone forward on x_t -> h_A (the lm_head's input) and A;
    3. for k = 1..K: reveal r ground-truth tokens per reveal block among the still-masked ones (the most
       confident under the latest backbone logits, or random) -> x'_k; backbone forward on x'_k -> T_k.
`MRPObjective.loss` (the head's graph):
    4. the head chain: acc_0 = h_A, acc_k = acc_{k-1} + head(embed(x'_k), acc_{k-1}); logits_k =
       lm_head(acc_k) = A + C_k on the positions still masked in x'_k (the frozen, shared lm_head: gradients
       flow through it into the head, its weights get none);
    5. loss = 1/K sum_k 1/D sum_samples 1/(t * response length) sum_positions KL(softmax(T_k) || softmax(A + C_k))
       (or the cross-entropy of A + C_k against the ground truth with objective="ce").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..backbones.base import BackboneAdapter


class HeadChain(nn.Module):
    """The head applied K times on the accumulator (one module forward, so DDP sees one forward per backward)."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head = head
        # FSDP's transformer-based auto wrap reads the layer classes from the wrapped model
        self._no_split_modules = list(getattr(head, "_no_split_modules", None) or [])

    def forward(
        self,
        inputs_embeds: list[torch.Tensor],
        lm_head_input: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        acc = lm_head_input
        accumulators = []
        for embeds in inputs_embeds:
            acc = acc + self.head(embeds, acc, attention_mask=attention_mask, position_ids=position_ids)
            accumulators.append(acc)
        return accumulators


@dataclass
class StepTargets:
    """One chained step k: the ids after its reveal, which positions are still masked there, and on those
    positions (in row-major order) the backbone's target logits T_k, the ground truth and the loss weights."""

    ids: torch.Tensor  # [B, L]
    masked: torch.Tensor  # [B, L] bool, still masked in x'_k
    revealed: torch.Tensor  # [B, L] bool, revealed at this step
    target_logits: torch.Tensor  # [N_k, V]
    labels: torch.Tensor  # [N_k]
    weights: torch.Tensor  # [N_k]
    base_logits: torch.Tensor | None = None  # [N_k, V]: A on those positions (kept for metrics)


@dataclass
class Prepared:
    """Everything the head needs for one batch, built without gradients by `MRPObjective.prepare`."""

    lm_head_input: torch.Tensor  # h_A [B, L, H], float32
    inputs_embeds: list[torch.Tensor]  # embed(x'_k) per step
    head_mask: torch.Tensor  # [B, 1, L, L] bool
    position_ids: torch.Tensor
    steps: list[StepTargets]
    t: torch.Tensor  # [D] mask rate per sample
    response_length: torch.Tensor  # [D]
    num_samples: int
    noisy_ids: torch.Tensor  # x_t
    masked: torch.Tensor  # masked in x_t


def block_local_mask(groups: torch.Tensor) -> torch.Tensor:
    """Bool [B, 1, L, L]: the head's attention in training, as in decoding.

    At decoding time the head runs on the current block only (h_A already carries the prefix), so in
    training each response position attends to the positions of its own reveal block and nothing else;
    positions outside responses (prompt, pads) attend to themselves only, which keeps their rows finite.
    """
    same_block = (groups.unsqueeze(2) == groups.unsqueeze(1)) & (groups >= 0).unsqueeze(2)
    diagonal = torch.eye(groups.shape[1], dtype=torch.bool, device=groups.device).unsqueeze(0)
    return (same_block | diagonal).unsqueeze(1)


def kl_per_position(target_logits: torch.Tensor, logits: torch.Tensor, chunk_elements: int = 1 << 26) -> torch.Tensor:
    """KL(softmax(target) || softmax(logits)) per row, in float32, temperature 1 (rows taken in chunks so that
    the float32 temporaries stay bounded for large vocabularies)."""
    chunk = max(1, chunk_elements // max(1, logits.shape[-1]))
    out = []
    for i in range(0, max(1, logits.shape[0]), chunk):
        log_p = F.log_softmax(target_logits[i : i + chunk].float(), dim=-1)
        log_q = F.log_softmax(logits[i : i + chunk].float(), dim=-1)
        out.append((log_p.exp() * (log_p - log_q)).sum(-1))
    return torch.cat(out) if len(out) > 1 else out[0]


class MRPObjective:
    """Builds training targets with the frozen backbone and scores the head on them."""

    #: rows x vocabulary elements above which the loss runs in checkpointed chunks of rows, so that the
    #: [positions, vocab] float tensors of lm_head, softmax and KL never exist all at once (real vocabularies)
    chunk_elements: int = 1 << 26

    def __init__(
        self,
        adapter: BackboneAdapter,
        *,
        block_length: int,
        grid: int | None,
        objective: str = "kl",
        k_steps: int = 1,
        reveal_per_block: int | str = "random",
        reveal_max: int = 4,
        reveal_order: str = "confidence",
        mask_eps: float = 1e-3,
    ):
        self.adapter = adapter
        self.block_length = block_length
        self.grid = grid
        self.objective = objective
        self.k_steps = k_steps
        self.reveal_per_block = reveal_per_block
        self.reveal_max = reveal_max
        self.reveal_order = reveal_order
        self.mask_eps = mask_eps
        self.mask_id = adapter.mask_token_id
        self.embed = adapter.get_input_embeddings()
        self.lm_head = adapter.get_output_embeddings()

    @classmethod
    def from_config(cls, adapter: BackboneAdapter, config, block_length: int, grid: int | None) -> MRPObjective:
        return cls(
            adapter,
            block_length=block_length,
            grid=grid,
            objective=config.objective,
            k_steps=config.k_steps,
            reveal_per_block=config.reveal_per_block,
            reveal_max=config.reveal_max,
            reveal_order=config.reveal_order,
            mask_eps=config.mask_eps,
        )

    # ------------------------------------------------------------------ backbone side
    def _backbone(self, ids, attention_mask, position_ids, hidden: bool):
        return self.adapter.forward(
            ids, attention_mask=attention_mask, position_ids=position_ids, return_lm_head_input=hidden, grid=self.grid
        )

    def _reveal_counts(self, num_samples: int, generator: torch.Generator) -> torch.Tensor:
        if self.reveal_per_block == "random":
            return torch.randint(1, self.reveal_max + 1, (num_samples,), generator=generator)
        return torch.full((num_samples,), int(self.reveal_per_block), dtype=torch.long)

    def choose_reveals(
        self,
        logits: torch.Tensor,
        masked: torch.Tensor,
        groups: torch.Tensor,
        per_token_count: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Bool [B, L]: in each reveal group (sample x block), the `count` masked positions first in order
        (highest top-1 probability under `logits`, or a random order)."""
        if self.reveal_order == "random":
            score = torch.rand(masked.shape, generator=generator).to(masked.device, torch.float64)
        else:
            score = torch.zeros(masked.shape, dtype=torch.float64, device=masked.device)
            rows = logits[masked.to(logits.device)]
            if rows.numel():
                score[masked] = self._top_probability(rows).to(score.device, torch.float64)
        # sort by (group, -score): a group's masked positions are contiguous, most confident first
        key = torch.where(masked, groups.double() * 2.0 + (1.0 - score.clamp(0, 1)), torch.full_like(score, float("inf")))
        order = torch.sort(key.flatten(), stable=True).indices
        sorted_groups = groups.flatten()[order]
        position = torch.arange(order.numel(), device=order.device)
        is_start = torch.ones_like(sorted_groups, dtype=torch.bool)
        is_start[1:] = sorted_groups[1:] != sorted_groups[:-1]
        start = torch.cummax(torch.where(is_start, position, torch.zeros_like(position)), dim=0).values
        rank = position - start
        chosen = masked.flatten()[order] & (rank < per_token_count.flatten()[order])
        reveal = torch.zeros(order.numel(), dtype=torch.bool, device=order.device)
        reveal[order] = chosen
        return reveal.view_as(masked)

    @torch.no_grad()
    def prepare(self, batch: dict[str, torch.Tensor], generator: torch.Generator, keep_base_logits: bool = False) -> Prepared:
        """Steps 1-3 (no grad). `generator` (a CPU generator) draws every random choice."""
        ids, attention = batch["input_ids"], batch["attention_mask"]
        response, doc, groups = batch["response_mask"], batch["doc_ids"], batch["reveal_groups"]
        positions = batch.get("position_ids")
        device = ids.device
        num_samples = int(doc.max()) + 1 if doc.numel() else 0
        doc0 = doc.clamp_min(0)

        # 1. mask rate per sample, mask the response tokens
        t = self.mask_eps + (1.0 - self.mask_eps) * torch.rand(num_samples, generator=generator, dtype=torch.float64)
        t = t.to(device)
        coin = torch.rand(ids.shape, generator=generator, dtype=torch.float64).to(device)
        masked = response & (coin < t[doc0])
        noisy = ids.masked_fill(masked, self.mask_id)
        response_length = torch.zeros(num_samples, dtype=torch.float64, device=device).scatter_add_(
            0, doc0[response], torch.ones_like(doc0[response], dtype=torch.float64)
        )
        sample_weight = 1.0 / (t * response_length.clamp_min(1))

        # 2. backbone on x_t -> h_A, A
        out = self._backbone(noisy, attention, positions, hidden=True)
        # with a backbone split over devices (device_map), the logits and h_A live where the lm_head is
        base_logits, hidden = out.logits.to(device), out.lm_head_input.to(device)

        # 3. chained reveals and targets
        steps: list[StepTargets] = []
        current_ids, current_masked, current_logits = noisy, masked, base_logits
        for _ in range(self.k_steps):
            count = self._reveal_counts(num_samples, generator).to(device)[doc0]
            reveal = self.choose_reveals(current_logits, current_masked, groups, count, generator)
            current_ids = torch.where(reveal, ids, current_ids)
            current_masked = current_masked & ~reveal
            target = self._backbone(current_ids, attention, positions, hidden=False).logits.to(device)
            steps.append(
                StepTargets(
                    ids=current_ids,
                    masked=current_masked,
                    revealed=reveal,
                    target_logits=target[current_masked],
                    labels=ids[current_masked],
                    weights=sample_weight[doc0[current_masked]].float(),
                    base_logits=base_logits[current_masked] if keep_base_logits else None,
                )
            )
            current_logits = target
        embeds = [self.embed(step.ids.to(self.embed.weight.device)).to(device) for step in steps]
        head_mask = block_local_mask(groups)
        if positions is None:
            positions = torch.arange(ids.shape[1], device=device).unsqueeze(0).expand(ids.shape[0], -1)
        return Prepared(
            lm_head_input=hidden.float(),
            inputs_embeds=embeds,
            head_mask=head_mask,
            position_ids=positions,
            steps=steps,
            t=t,
            response_length=response_length,
            num_samples=max(num_samples, 1),
            noisy_ids=noisy,
            masked=masked,
        )

    # ------------------------------------------------------------------ head side
    def step_logits(self, chain: nn.Module, prepared: Prepared) -> list[torch.Tensor]:
        """A + C_k on each step's still-masked positions (rows in the order of `StepTargets`)."""
        accumulators = chain(
            prepared.inputs_embeds,
            prepared.lm_head_input,
            attention_mask=prepared.head_mask,
            position_ids=prepared.position_ids,
        )
        weight = self.lm_head.weight
        return [
            self.lm_head(acc[step.masked].to(weight.device, weight.dtype)).to(acc.device)
            for acc, step in zip(accumulators, prepared.steps, strict=True)
        ]

    def _top_probability(self, rows: torch.Tensor) -> torch.Tensor:
        chunk = max(1, self.chunk_elements // rows.shape[-1])
        out = []
        for i in range(0, rows.shape[0], chunk):
            part = rows[i : i + chunk].float()
            out.append((part.max(-1).values - torch.logsumexp(part, -1)).exp())
        return torch.cat(out)

    def per_position_loss(self, logits: torch.Tensor, step: StepTargets) -> torch.Tensor:
        return self._per_position(logits, step.target_logits, step.labels)

    def _per_position(self, logits, target_logits, labels) -> torch.Tensor:
        if self.objective == "ce":
            return F.cross_entropy(logits.float(), labels, reduction="none")
        return kl_per_position(target_logits, logits)

    def _weighted_rows_loss(self, rows, target_logits, labels, weights) -> torch.Tensor:
        weight = self.lm_head.weight
        logits = self.lm_head(rows.to(weight.device, weight.dtype)).to(rows.device)
        return (self._per_position(logits, target_logits, labels) * weights).sum()

    def _rows_loss(self, rows: torch.Tensor, step: StepTargets) -> torch.Tensor:
        chunk = max(1, self.chunk_elements // self.lm_head.weight.shape[0])
        if rows.shape[0] <= chunk:
            return self._weighted_rows_loss(rows, step.target_logits, step.labels, step.weights)
        total = rows.new_zeros((), dtype=torch.float32)
        for i in range(0, rows.shape[0], chunk):
            part = slice(i, i + chunk)
            total = total + checkpoint(
                self._weighted_rows_loss, rows[part], step.target_logits[part], step.labels[part], step.weights[part],
                use_reentrant=False,
            )
        return total

    def loss(self, chain: nn.Module, prepared: Prepared) -> torch.Tensor:
        """Steps 4-5: the weighted objective (a scalar with the head's graph)."""
        accumulators = chain(
            prepared.inputs_embeds,
            prepared.lm_head_input,
            attention_mask=prepared.head_mask,
            position_ids=prepared.position_ids,
        )
        total = None
        for acc, step in zip(accumulators, prepared.steps, strict=True):
            term = self._rows_loss(acc[step.masked], step) / prepared.num_samples
            total = term if total is None else total + term
        return total / len(prepared.steps)


class AgreementMeter:
    """Held-out metrics: on still-masked positions, top-1 agreement of the head's next-step argmax (A + C)
    with the backbone's true next-step argmax (T), next to the C = 0 baseline (reuse A), and both KLs."""

    def __init__(self, k_steps: int):
        self.k_steps = k_steps
        # per step: positions, head agree, base agree, head kl sum, base kl sum, weighted loss sum, samples
        self.sums = torch.zeros(k_steps, 7, dtype=torch.float64)

    def update(self, objective: MRPObjective, logits: list[torch.Tensor], prepared: Prepared) -> None:
        for k, (head_logits, step) in enumerate(zip(logits, prepared.steps, strict=True)):
            target_top = step.target_logits.argmax(-1)
            base = step.base_logits
            head_kl = kl_per_position(step.target_logits, head_logits)
            base_kl = kl_per_position(step.target_logits, base)
            loss = (objective.per_position_loss(head_logits, step) * step.weights).sum()
            self.sums[k] += torch.tensor(
                [
                    step.masked.sum().item(),
                    (head_logits.argmax(-1) == target_top).sum().item(),
                    (base.argmax(-1) == target_top).sum().item(),
                    head_kl.double().sum().item(),
                    base_kl.double().sum().item(),
                    float(loss),
                    prepared.num_samples,
                ],
                dtype=torch.float64,
            )

    def result(self, sums: torch.Tensor | None = None) -> dict:
        sums = self.sums if sums is None else sums
        total = sums.sum(0)
        n = max(float(total[0]), 1.0)

        def summary(row: torch.Tensor) -> dict:
            m = max(float(row[0]), 1.0)
            return {
                "agreement": float(row[1]) / m,
                "baseline_agreement": float(row[2]) / m,
                "kl": float(row[3]) / m,
                "baseline_kl": float(row[4]) / m,
                "positions": int(row[0]),
            }

        out = {
            "agreement": float(total[1]) / n,
            "baseline_agreement": float(total[2]) / n,
            "kl": float(total[3]) / n,
            "baseline_kl": float(total[4]) / n,
            "loss": float(sum(sums[k, 5] / max(float(sums[k, 6]), 1.0) for k in range(self.k_steps))) / self.k_steps,
            "positions": int(total[0]),
        }
        if self.k_steps > 1:
            out["per_step"] = [summary(sums[k]) for k in range(self.k_steps)]
        return out
