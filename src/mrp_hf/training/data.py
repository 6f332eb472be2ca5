"""Training data: records -> tokenized (prompt, response) samples -> rows -> padded batches.

Records come from a JSONL file (`{"prompt", "response"}` or `{"messages": [...]}`, or pre-tokenized
`{"prompt_ids", "response_ids"}`), a local `datasets` folder (`save_to_disk`; needs the optional
`datasets` package), a list of dicts, or a `datasets.Dataset`. Chat rows go through the tokenizer's chat
template: the prompt is every turn before the last assistant turn (with the generation prompt), the
response is that assistant turn.

A row is one sample (right-padded per batch) or, with packing, several samples concatenated up to
`max_length`. For block-causal backbones each sample's prompt is preceded by pad columns so that its
response starts on a block boundary, exactly as the decoding engine lays out its canvas. Pads are masked
out of attention and of the loss; the prompt is never masked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler
from transformers.utils import logging

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------- records
def load_records(source: Any) -> tuple[list[dict[str, Any]], str]:
    """The records of `source` and a short description of where they came from."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return _load_datasets_folder(path), f"datasets folder {path}"
        if not path.exists():
            raise FileNotFoundError(f"Dataset {str(path)!r} does not exist; give a .jsonl file or a datasets folder.")
        return _load_json_file(path), f"{path.name}"
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return [dict(r) for r in source], f"{len(source)} in-memory records"
    if hasattr(source, "column_names") and hasattr(source, "__getitem__"):  # a datasets.Dataset
        return [dict(r) for r in source], f"datasets.Dataset ({len(source)} rows)"
    raise TypeError(
        f"Unsupported dataset {type(source).__name__}: give a JSONL path, a datasets folder, a list of dicts or a "
        f"datasets.Dataset."
    )


def _load_json_file(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return list(json.loads(text))
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number} is not valid JSON ({err.msg}); each line must be one JSON object.") from None
    return records


def _load_datasets_folder(path: Path) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise ImportError(
            f"{str(path)!r} is a folder: reading a saved `datasets` dataset needs the optional `datasets` package "
            f"(pip install datasets), or export it to JSONL."
        ) from None
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ValueError(f"{str(path)!r} holds splits {list(loaded)}; mrp-hf trains on 'train'.")
        loaded = loaded["train"]
    return [dict(r) for r in loaded]


# ---------------------------------------------------------------------------------------------- samples
@dataclass
class Sample:
    prompt: list[int]
    response: list[int]


class RecordTokenizer:
    """Turns records into token ids; see the module docstring for the accepted formats."""

    def __init__(self, tokenizer=None, append_eos: bool = True, chat_template: bool = False, eos_token_id: int | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id = eos if append_eos else None

    def __call__(self, record: dict[str, Any]) -> Sample:
        if "prompt_ids" in record and "response_ids" in record:
            prompt, response = list(map(int, record["prompt_ids"])), list(map(int, record["response_ids"]))
        elif "messages" in record:
            prompt, response = self._chat(record["messages"])
        elif "prompt" in record and "response" in record:
            if self.chat_template:
                prompt, response = self._chat(
                    [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["response"]}]
                )
            else:
                tok = self._need_tokenizer()
                prompt = list(tok(record["prompt"], add_special_tokens=True)["input_ids"])
                response = list(tok(record["response"], add_special_tokens=False)["input_ids"])
        else:
            raise ValueError(
                f"A record has keys {sorted(record)}; expected 'prompt' and 'response', 'messages', or 'prompt_ids' "
                f"and 'response_ids'."
            )
        if self.eos_token_id is not None and (not response or response[-1] != self.eos_token_id):
            response.append(self.eos_token_id)
        return Sample(prompt, response)

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("Text records need a tokenizer: pass tokenizer=... (or a backbone path that has one).")
        return self.tokenizer

    def _chat(self, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
        tok = self._need_tokenizer()
        if not getattr(tok, "chat_template", None):
            raise ValueError(
                f"Chat records need a tokenizer with a chat template, and this {type(tok).__name__} has none: set "
                f"tokenizer.chat_template, or give {{'prompt', 'response'}} records."
            )
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is None:
            raise ValueError("A 'messages' record has no assistant turn to train on.")
        prompt_text = tok.apply_chat_template(messages[:last], tokenize=False, add_generation_prompt=True)
        full_text = tok.apply_chat_template(messages[: last + 1], tokenize=False)
        prompt = list(tok(prompt_text, add_special_tokens=False)["input_ids"])
        full = list(tok(full_text, add_special_tokens=False)["input_ids"])
        if full[: len(prompt)] == prompt:
            return prompt, full[len(prompt) :]
        # the template tokenizes differently at the boundary: tokenize the response text on its own
        response_text = full_text[len(prompt_text) :] if full_text.startswith(prompt_text) else messages[last]["content"]
        return prompt, list(tok(response_text, add_special_tokens=False)["input_ids"])


def truncate(sample: Sample, budget: int) -> Sample:
    """Fit a sample into `budget` tokens: cut the response's end, and the prompt's start when the prompt
    alone would leave the response less than a quarter of the budget."""
    p, r = sample.prompt, sample.response
    if len(p) + len(r) <= budget:
        return sample
    r_keep = min(len(r), max(budget - len(p), budget // 4))
    p_keep = budget - r_keep
    return Sample(p[len(p) - p_keep :] if p_keep > 0 else [], r[:r_keep])


# ---------------------------------------------------------------------------------------------- rows
@dataclass
class Row:
    """One training row: ids, 1 on real tokens, 1 on response tokens, and per token the index of its
    sample inside the row (-1 on pads) and the index where that sample's response starts."""

    input_ids: list[int]
    attention: list[int]
    response: list[int]
    doc: list[int]
    response_start: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


class RowBuilder:
    def __init__(self, max_length: int, pad_token_id: int, align: int = 1, packing: bool = False):
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.align = max(1, align)
        self.packing = packing

    def _place(self, row: Row, sample: Sample) -> None:
        offset = len(row)
        pads = (-(offset + len(sample.prompt))) % self.align
        doc = (max(row.doc) + 1) if row.doc and max(row.doc) >= 0 else 0
        start = offset + pads + len(sample.prompt)
        row.input_ids += [self.pad_token_id] * pads + sample.prompt + sample.response
        row.attention += [0] * pads + [1] * (len(sample.prompt) + len(sample.response))
        row.response += [0] * (pads + len(sample.prompt)) + [1] * len(sample.response)
        row.doc += [-1] * pads + [doc] * (len(sample.prompt) + len(sample.response))
        row.response_start += [-1] * pads + [start] * (len(sample.prompt) + len(sample.response))

    def _fits(self, row: Row, sample: Sample) -> bool:
        pads = (-(len(row) + len(sample.prompt))) % self.align
        return len(row) + pads + len(sample.prompt) + len(sample.response) <= self.max_length

    def build(self, samples: Iterable[Sample]) -> tuple[list[Row], int]:
        """Rows, and the number of samples dropped (no response token left after truncation)."""
        budget = self.max_length - (self.align - 1)
        if budget < 2:
            raise ValueError(
                f"max_length={self.max_length} leaves no room for a sample once its response is aligned to the "
                f"{self.align}-token attention block; raise max_length (e.g. to {4 * self.align}) or lower block_length."
            )
        rows: list[Row] = []
        dropped = 0
        current: Row | None = None
        for sample in samples:
            sample = truncate(sample, budget)
            if not sample.response:
                dropped += 1
                continue
            if not self.packing or current is None or not self._fits(current, sample):
                current = Row([], [], [], [], [])
                rows.append(current)
            self._place(current, sample)
        return rows, dropped


class RowDataset(Dataset):
    def __init__(self, rows: list[Row]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Row:
        return self.rows[index]


class RowCollator:
    """Right-pads rows to the batch's longest (with packing: to `max_length`) and builds the tensors:
    input_ids, attention_mask, response_mask, doc_ids (unique per sample in the batch, -1 on pads),
    reveal_groups (unique per sample and reveal block, -1 outside responses), position_ids."""

    def __init__(self, pad_token_id: int, block_length: int, absolute_blocks: bool, pad_to: int | None = None):
        self.pad_token_id = pad_token_id
        self.block_length = block_length
        self.absolute_blocks = absolute_blocks
        self.pad_to = pad_to

    def __call__(self, rows: list[Row]) -> dict[str, torch.Tensor]:
        width = max(len(r) for r in rows)
        if self.pad_to is not None:
            width = max(width, self.pad_to)
        batch = len(rows)
        ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros(batch, width, dtype=torch.long)
        response = torch.zeros(batch, width, dtype=torch.bool)
        doc = torch.full((batch, width), -1, dtype=torch.long)
        start = torch.full((batch, width), -1, dtype=torch.long)
        offset = 0
        for i, row in enumerate(rows):
            n = len(row)
            ids[i, :n] = torch.tensor(row.input_ids)
            attention[i, :n] = torch.tensor(row.attention)
            response[i, :n] = torch.tensor(row.response, dtype=torch.bool)
            row_doc = torch.tensor(row.doc)
            doc[i, :n] = torch.where(row_doc >= 0, row_doc + offset, row_doc)
            start[i, :n] = torch.tensor(row.response_start)
            offset += max(row.doc) + 1
        index = torch.arange(width).unsqueeze(0).expand(batch, -1)
        block = index // self.block_length if self.absolute_blocks else (index - start).clamp_min(0) // self.block_length
        blocks_per_doc = width // self.block_length + 2
        groups = torch.where(response, doc.clamp_min(0) * blocks_per_doc + block, torch.full_like(doc, -1))
        return {
            "input_ids": ids,
            "attention_mask": attention,
            "response_mask": response,
            "doc_ids": doc,
            "reveal_groups": groups,
            "position_ids": index.clone(),
        }


class EpochSampler(Sampler[int]):
    """A fresh permutation per epoch, fixed by (seed, epoch): the data order needs no state beyond the epoch
    and the position in it, so a resumed run sees exactly the batches an uninterrupted one would."""

    def __init__(self, length: int, seed: int, shuffle: bool = True):
        self.length = length
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(self.length))
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed * 100_003 + self.epoch))
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.length


def split_records(records: list[dict[str, Any]], fraction: float, seed: int, max_samples: int) -> tuple[list, list]:
    """(train, held-out): a seeded random `fraction` of the records (at most `max_samples`, at least one)."""
    if fraction <= 0 or len(records) < 2:
        return records, []
    count = min(max_samples, max(1, round(fraction * len(records))), len(records) - 1)
    order = torch.randperm(len(records), generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(order[:count])
    return [r for i, r in enumerate(records) if i not in held], [records[i] for i in order[:count]]


def describe_rows(rows: list[Row]) -> dict[str, int]:
    return {
        "rows": len(rows),
        "samples": sum(max(r.doc) + 1 for r in rows),
        "tokens": sum(sum(r.attention) for r in rows),
        "response_tokens": sum(sum(r.response) for r in rows),
    }
