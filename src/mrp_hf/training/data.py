"""Training data: records -> tokenized (prompt, response) samples -> rows -> padded batches.

Records come from a JSONL file (`{"prompt", "response"}` or `{"messages": [...]}`, or pre-tokenized
`{"prompt_ids", "response_ids"}`), a local `datasets` folder (`save_to_disk`; needs the optional
`datasets` package), a list of dicts, or a `datasets.Dataset`. Chat rows go through the tokenizer's chat
template: the prompt is every turn before the last assistant turn (with the generation prompt), the
response is that assistant turn.

A row is one sample (right-padded per batch) or, with packing, several samples concatenated up to
`max_length`. For block-causal backbones each sample is preceded by pad columns so that its blocks fall where
the decoding engine puts them: its first token on a block boundary for families that count blocks from the
sequence start (SDAR, Fast-dLLM v2, LLaDA2), its response start for the reference DLM ("answer" alignment). Pads are masked
out of attention and of the loss; the prompt is never masked.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler
from transformers.utils import logging

from ..jsonl import jsonl_lines

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------- records
#: how many bad records one error message lists (the rest are only counted)
MAX_REPORTED_PROBLEMS = 10


class TrainingDataError(ValueError):
    """Training records that cannot be used. Raised before training starts, after reading every record;
    `problems` holds the first `MAX_REPORTED_PROBLEMS` as "location: what is wrong" (a location is
    `file:line` for JSONL) and `total` counts them all."""

    def __init__(self, source: str, problems: list[str], total: int):
        self.source = source
        self.problems = list(problems)
        self.total = total
        if total == 1:
            message = f"Invalid training data: {problems[0]}"
        else:
            listed = "\n".join(f"  {p}" for p in problems)
            more = f"\n  ... and {total - len(problems)} more" if total > len(problems) else ""
            message = f"Invalid training data in {source}: {total} bad records (fix or remove them):\n{listed}{more}"
        super().__init__(message)


class _Problems:
    """Collects record problems: keeps the first few messages, counts all of them."""

    def __init__(self, source: str):
        self.source = source
        self.messages: list[str] = []
        self.total = 0

    def add(self, message: str) -> None:
        self.total += 1
        if len(self.messages) < MAX_REPORTED_PROBLEMS:
            self.messages.append(message)

    def raise_if_any(self) -> None:
        if self.total:
            raise TrainingDataError(self.source, self.messages, self.total)


@dataclass
class RecordSet:
    """Records, where each one came from (`data.jsonl:12`, `records[3]`, ...) and a short description."""

    records: list[dict[str, Any]]
    locations: list[str]
    description: str


def read_records(source: Any) -> RecordSet:
    """Read and check every record of `source` (a JSONL / JSON file, a `datasets` folder, a list of dicts or a
    `datasets.Dataset`). Raises `TrainingDataError` naming the file and line of each bad record (invalid UTF-8,
    invalid JSON, not an object, a missing, empty or wrongly typed field, a token id that is not a
    non-negative int) and when there is no record at all."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            rows = _load_datasets_folder(path)
            return _checked(rows, [f"{path} row {i}" for i in range(len(rows))], f"datasets folder {path}", str(path))
        if not path.exists():
            raise FileNotFoundError(f"Dataset {str(path)!r} does not exist; give a .jsonl file or a datasets folder.")
        return _read_json_file(path)
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        rows = list(source)
        return _checked(rows, [f"records[{i}]" for i in range(len(rows))], f"{len(rows)} in-memory records", "the records")
    if hasattr(source, "column_names") and hasattr(source, "__getitem__"):  # a datasets.Dataset
        rows = [dict(r) for r in source]
        return _checked(rows, [f"dataset row {i}" for i in range(len(rows))], f"datasets.Dataset ({len(rows)} rows)", "the dataset")
    raise TypeError(
        f"Unsupported dataset {type(source).__name__}: give a JSONL path, a datasets folder, a list of dicts or a "
        f"datasets.Dataset."
    )


def _checked(values: list[Any], locations: list[str], description: str, name: str) -> RecordSet:
    problems = _Problems(name)
    for value, where in zip(values, locations, strict=True):
        problem = record_problem(value)
        if problem:
            problems.add(f"{where}: {problem}")
    if not values:
        problems.add(f"{name} holds no records")
    problems.raise_if_any()
    return RecordSet([dict(v) for v in values], locations, description)


def _read_json_file(path: Path) -> RecordSet:
    """A JSON array (`.json` starting with `[`) or JSONL, streamed line by line: each line is decoded on its own,
    so one bad line is reported with its number and the others are still checked."""
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip(codecs.BOM_UTF8).lstrip()
    if path.suffix == ".json" and head.startswith(b"["):
        return _read_json_array(path)
    problems = _Problems(str(path))
    records: list[dict[str, Any]] = []
    locations: list[str] = []
    for line in jsonl_lines(path):
        problem = line.problem or record_problem(line.value)
        if problem:
            problems.add(f"{line.location}: {problem}")
            continue
        records.append(line.value)
        locations.append(line.location)
    if not problems.total and not records:
        problems.add(f"{path} holds no records (the file is empty or has only blank lines)")
    problems.raise_if_any()
    return RecordSet(records, locations, path.name)


def _read_json_array(path: Path) -> RecordSet:
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise TrainingDataError(str(path), [f"{path}:{line}: invalid UTF-8 (byte 0x{data[err.start]:02x}); save the file as UTF-8"], 1) from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        raise TrainingDataError(str(path), [f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})"], 1) from None
    if not isinstance(values, list):
        raise TrainingDataError(str(path), [f"{path}: a JSON file must hold one array of records"], 1)
    return _checked(values, [f"{path}[{i}]" for i in range(len(values))], path.name, str(path))


_FORMATS = "expected 'prompt' and 'response', 'messages', or 'prompt_ids' and 'response_ids'"


def _present(record: Mapping[str, Any], key: str) -> bool:
    # `datasets` gives every row every column, None where a row has no value
    return record.get(key) is not None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def record_problem(record: Any) -> str | None:
    """What is wrong with one record, or None. The format is picked as `RecordTokenizer` picks it."""
    if not isinstance(record, Mapping):
        return f"is {_json_kind(record)}, not an object: each record must be an object such as {{\"prompt\": ..., \"response\": ...}}"
    if _present(record, "prompt_ids") and _present(record, "response_ids"):
        return _ids_problem(record, "prompt_ids", allow_empty=True) or _ids_problem(record, "response_ids", allow_empty=False)
    if _present(record, "messages"):
        return _messages_problem(record["messages"])
    if _present(record, "prompt") and _present(record, "response"):
        for key in ("prompt", "response"):
            if not isinstance(record[key], str):
                return f"'{key}' is {_json_kind(record[key])}; it must be a string"
        if not record["response"].strip():
            return "'response' is empty: there is nothing to train on"
        return None
    for one, other in (("prompt", "response"), ("response", "prompt"), ("prompt_ids", "response_ids"), ("response_ids", "prompt_ids")):
        if _present(record, one) and not _present(record, other):
            return f"has '{one}' but no '{other}' (keys {sorted(record)})"
    return f"has keys {sorted(record)}; {_FORMATS}"


def _ids_problem(record: Mapping[str, Any], key: str, allow_empty: bool) -> str | None:
    ids = record[key]
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):  # a tensor or an array
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)):
        return f"'{key}' is {_json_kind(ids)}; it must be a list of token ids"
    if not ids and not allow_empty:
        return f"'{key}' is empty: there is nothing to train on"
    for i, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"'{key}'[{i}] is {value!r}, not an integer token id"
        if value < 0:
            return f"'{key}'[{i}] is {value}: token ids are >= 0"
    return None


def _messages_problem(messages: Any) -> str | None:
    if not isinstance(messages, (list, tuple)) or not messages:
        return f"'messages' is {_json_kind(messages) if messages else 'empty'}; it must be a non-empty list of turns"
    last_assistant = None
    for i, turn in enumerate(messages):
        if not isinstance(turn, Mapping):
            return f"'messages'[{i}] is {_json_kind(turn)}; each turn must be an object with 'role' and 'content'"
        if not isinstance(turn.get("role"), str):
            return f"'messages'[{i}] has no string 'role'"
        if not isinstance(turn.get("content"), (str, list)):
            return f"'messages'[{i}]['content'] is {_json_kind(turn.get('content'))}; it must be a string (or a list of parts)"
        if turn["role"] == "assistant":
            last_assistant = i
    if last_assistant is None:
        return "'messages' has no assistant turn to train on"
    content = messages[last_assistant]["content"]
    if not content or (isinstance(content, str) and not content.strip()):
        return f"'messages'[{last_assistant}] (the last assistant turn) is empty: there is nothing to train on"
    return None


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
        if _present(record, "prompt_ids") and _present(record, "response_ids"):
            prompt, response = _int_list(record["prompt_ids"]), _int_list(record["response_ids"])
        elif _present(record, "messages"):
            prompt, response = self._chat(record["messages"])
        elif _present(record, "prompt") and _present(record, "response"):
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


def _int_list(ids: Any) -> list[int]:
    return list(map(int, ids.tolist() if hasattr(ids, "tolist") else ids))


def tokenize_records(found: RecordSet, to_ids: RecordTokenizer, vocab_size: int) -> list[Sample]:
    """Every record of `found` as a `Sample`, after checking that each token id (from the data or from the
    tokenizer) is inside the backbone's vocabulary: raises `TrainingDataError` naming the file and line of
    each bad record, before training starts rather than when the row is drawn."""
    problems = _Problems(found.description)
    samples = []
    for record, where in zip(found.records, found.locations, strict=True):
        sample = to_ids(record)
        for part, ids in (("prompt", sample.prompt), ("response", sample.response)):
            if ids and (min(ids) < 0 or max(ids) >= vocab_size):  # min/max: C speed; find the culprit only when needed
                index, value = next((i, v) for i, v in enumerate(ids) if not 0 <= v < vocab_size)
                if part == "response" and index == len(ids) - 1 and value == to_ids.eos_token_id:
                    origin, fix = "the EOS appended to the response", "pass the backbone's eos id (or append_eos=False)"
                elif _present(record, f"{part}_ids"):
                    origin, fix = f"'{part}_ids'[{index}]", "pre-tokenized ids must come from the backbone's tokenizer"
                else:
                    origin, fix = f"{part} token {index}", "the tokenizer does not match the backbone"
                problems.add(
                    f"{where}: {origin} is token id {value}, outside the backbone's vocabulary (ids 0..{vocab_size - 1}); {fix}"
                )
                break
        samples.append(sample)
    problems.raise_if_any()
    return samples


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
    """Lays samples out in rows with the decoding engine's block alignment (generation/layout.py):
    `alignment="answer"` pads before a sample so that its response starts on a block of `align` tokens;
    `"sequence"` pads so that the sample itself starts on one (its prompt's tail then shares a block with the
    first response tokens, as SDAR, Fast-dLLM v2 and LLaDA2 are trained and decode)."""

    def __init__(self, max_length: int, pad_token_id: int, align: int = 1, packing: bool = False,
                 alignment: str = "answer"):
        if alignment not in ("answer", "sequence"):
            raise ValueError(f"alignment={alignment!r} must be 'answer' or 'sequence'.")
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.align = max(1, align)
        self.packing = packing
        self.alignment = alignment

    def _pads(self, offset: int, sample: Sample) -> int:
        aligned = offset if self.alignment == "sequence" else offset + len(sample.prompt)
        return (-aligned) % self.align

    def _place(self, row: Row, sample: Sample) -> None:
        offset = len(row)
        pads = self._pads(offset, sample)
        doc = (max(row.doc) + 1) if row.doc and max(row.doc) >= 0 else 0
        start = offset + pads + len(sample.prompt)
        row.input_ids += [self.pad_token_id] * pads + sample.prompt + sample.response
        row.attention += [0] * pads + [1] * (len(sample.prompt) + len(sample.response))
        row.response += [0] * (pads + len(sample.prompt)) + [1] * len(sample.response)
        row.doc += [-1] * pads + [doc] * (len(sample.prompt) + len(sample.response))
        row.response_start += [-1] * pads + [start] * (len(sample.prompt) + len(sample.response))

    def _fits(self, row: Row, sample: Sample) -> bool:
        pads = self._pads(len(row), sample)
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
    reveal_groups (unique per sample and block, over the blocks that hold the sample's response, the prompt's
    tail included where it shares the first of them; -1 elsewhere), position_ids."""

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
        if self.absolute_blocks:
            # every token of the blocks that hold the response: with blocks counted from the sample's first token,
            # the prompt's tail shares the first of them, and the head sees it there when decoding
            in_blocks = (doc >= 0) & (block >= start.clamp_min(0) // self.block_length)
        else:
            in_blocks = response
        groups = torch.where(in_blocks, doc.clamp_min(0) * blocks_per_doc + block, torch.full_like(doc, -1))
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


def split_records(records: list[Any], fraction: float, seed: int, max_samples: int) -> tuple[list, list]:
    """(train, held-out): a seeded random `fraction` of the records, or of any list (at most `max_samples`, at
    least one)."""
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
