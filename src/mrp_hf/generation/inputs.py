"""Checking the prompt a `generate` call gets, before anything is allocated."""

from __future__ import annotations

from typing import Any

import torch


def validate_prompt(input_ids: Any, attention_mask: Any, vocab_size: int | None = None,
                    mask_token_id: int | None = None) -> torch.Tensor:
    """Check types, shapes, left padding and token ids; return the attention mask (all ones when none was given).

    Every id must index the embedding (`vocab_size`): pads too, since they are fed to the model. A prompt may
    not contain the mask token: masked-diffusion decoding here fills the answer region only (no infilling),
    and a mask in the prompt would be taken for an answer position that never gets decoded.
    """
    for name, value in (("input_ids", input_ids), ("attention_mask", attention_mask)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name} must be a 2-D torch.Tensor [batch, prompt_len], got {type(value).__name__}; "
                f"tokenize with return_tensors='pt'."
            )
    if input_ids.dim() != 2:
        raise TypeError(f"input_ids must be a 2-D LongTensor [batch, prompt_len], got Tensor{tuple(input_ids.shape)}.")
    if input_ids.dtype not in (torch.long, torch.int, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}.")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids is an empty batch (shape [0, n]): pass at least one prompt.")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids has no prompt tokens; diffusion decoding needs a prompt of at least one token.")
    mask = torch.ones_like(input_ids, dtype=torch.long) if attention_mask is None else attention_mask.to(torch.long)
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has {tuple(input_ids.shape)}; "
            f"pass the mask the tokenizer returned with these ids."
        )
    # every check's verdict in one read of the (possibly device) tensors; the messages are built only on failure
    problems = {
        "vocab": (input_ids < 0) | (input_ids >= vocab_size) if vocab_size is not None else None,
        "mask_token": (input_ids == mask_token_id) & mask.bool() if mask_token_id is not None else None,
        "mask_values": (mask != 0) & (mask != 1),
        "empty_row": (mask.sum(dim=1) == 0),
        "right_padded": mask[:, 1:] < mask[:, :-1],
    }
    found = _any_of(problems)
    if found["vocab"]:
        row, col = (int(i) for i in problems["vocab"].nonzero()[0])
        raise ValueError(
            f"input_ids[{row}, {col}] = {int(input_ids[row, col])} is not a token id of this model (ids run from "
            f"0 to {vocab_size - 1}); tokenize with the backbone's own tokenizer."
        )
    if found["mask_values"]:
        raise ValueError("attention_mask must contain only 0 and 1.")
    if found["empty_row"]:
        raise ValueError("a row of attention_mask is all zeros: every prompt needs at least one real token.")
    if found["right_padded"]:
        raise ValueError(
            "attention_mask is not left-padded (a 1 is followed by a 0). Diffusion decoding appends the answer "
            "after the prompt: tokenize with tokenizer.padding_side = 'left'."
        )
    if found["mask_token"]:
        row, col = (int(i) for i in problems["mask_token"].nonzero()[0])
        raise ValueError(
            f"input_ids[{row}, {col}] is the mask token ({mask_token_id}): prompts may not contain masks here "
            f"(the answer region after the prompt is what gets decoded; infilling inside the prompt is not "
            f"supported). Remove the mask tokens from the prompt."
        )
    return mask


def _any_of(problems: dict[str, torch.Tensor | None]) -> dict[str, bool]:
    """name -> whether that bool tensor has a True, all read in one go (None: not checked)."""
    checked = [name for name, flags in problems.items() if flags is not None]
    verdicts = torch.stack([problems[name].any() for name in checked]).tolist()
    return {name: dict(zip(checked, verdicts, strict=True)).get(name, False) for name in problems}
