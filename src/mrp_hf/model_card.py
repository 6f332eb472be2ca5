"""The Hub model card of a trained MRP head (`MRPHead.push_to_hub` writes it as README.md)."""

from __future__ import annotations

from typing import Any

_METRICS = ("agreement", "baseline_agreement", "kl", "baseline_kl")


def head_model_card(head: Any, repo_id: str | None = None, tags: list[str] | None = None):
    """A `huggingface_hub.ModelCard` for `head` (an `MRPHead`): metadata (library, base model, tags) from
    `ModelCardData`, and what the head is for, how to load it, how it was trained and what it measured."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg = head.config
    data = ModelCardData(
        library_name="mrp-hf",
        base_model=cfg.base_model_name_or_path or None,
        tags=["mrp", "diffusion-language-model", cfg.backbone_family or "dlm", *(tags or [])],
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{_card_text(head, repo_id)}")


def _card_text(head: Any, repo_id: str | None) -> str:
    cfg = head.config
    training = cfg.training or {}
    metrics = training.get("metrics") or {}
    lines = [
        f"# MRP head for `{cfg.base_model_name_or_path}`",
        "",
        "A Multi-token Residual Prediction (MRP) head: it predicts how the backbone's logits change after the next",
        "reveal, so one backbone forward yields several tokens. This repo holds the head only (weights and config);",
        "the backbone is loaded from its own repo.",
        "",
        "```python",
        "import mrp_hf",
        f'model = mrp_hf.MRPModel.from_pretrained("{repo_id or "<this repo>"}", trust_remote_code=True)',
        'out = model.generate(input_ids, max_new_tokens=256, mrp_mode="speculative")',
        "```",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{cfg.base_model_name_or_path}` (revision `{cfg.base_model_revision}`) |",
        f"| PEFT adapter | `{cfg.peft_adapter_id}` |",
        f"| family / attention | {cfg.backbone_family} / {cfg.attention} |",
        f"| head | {cfg.num_hidden_layers} layers, width {cfg.head_hidden_size}, "
        f"{sum(p.numel() for p in head.parameters()):,} parameters |",
        f"| training data | {training.get('data', 'not recorded')} |",
        f"| training steps | {training.get('steps', 'not recorded')} |",
        f"| block length in training | {cfg.block_length} |",
    ]
    lines += [f"| held-out {key.replace('_', ' ')} | {metrics[key]:.4f} |" for key in _METRICS if key in metrics]
    if metrics:
        lines += ["", "Agreement: top-1 match between the head's predicted next-step argmax and the backbone's true",
                  "next-step argmax on still-masked held-out positions; the baseline reuses the last logits (C = 0)."]
    return "\n".join(lines) + "\n"
