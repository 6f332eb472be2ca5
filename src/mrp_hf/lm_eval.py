"""lm-evaluation-harness backend: `import mrp_hf.lm_eval` registers the lm-eval model `mrp-hf`.

    lm-eval run --model mrp-hf --model_args head=...,mrp_mode=speculative --tasks gsm8k   # after the import
    mrp-hf lm-eval --model_args head=...,mrp_mode=speculative --tasks gsm8k               # does the import

`MRPLM` decodes with `MRPModel.generate` (every mode), and scores log-likelihoods the way LLaDA and Dream
report them, with a Monte Carlo estimate of the masked-diffusion ELBO. Under `accelerate launch` (or
`torchrun`) each process evaluates its share of the documents and lm-eval gathers the results on rank 0.
What a run cost (tokens per forward, backbone and head forwards) is returned by `get_model_info()`, which
lm-eval writes into the results' `config` (`config.mrp_stats`); docs/evaluation.md#lm-evaluation-harness.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from tqdm import tqdm

try:
    # lm-eval's own models first: since 0.4.9 its registry fills itself lazily, only while it is empty
    import lm_eval.models  # noqa: F401
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import MODEL_REGISTRY, register_model
except ImportError as _exc:  # pragma: no cover - exercised without lm-eval installed
    raise ImportError(
        "mrp_hf.lm_eval needs lm-evaluation-harness >= 0.4.8: pip install 'mrp-hf[eval]' (or 'lm-eval>=0.4.8')."
    ) from _exc

from transformers.utils import logging

from .backbones.loading import DTYPES
from .generation.config import build_generation_config

logger = logging.get_logger(__name__)

MODEL_NAME = "mrp-hf"
#: decoding fields that model args set for the run and a task's gen_kwargs may override per task
_DECODING_FIELDS = (
    "mrp_mode", "threshold", "block_length", "mrp_draft_tokens", "mrp_draft_graph", "mrp_drafter", "steps", "tokens_per_step", "remask_rule",
    "remask_delta", "prefix_cache", "confidence", "confidence_resolution", "verify_layout", "verify_lookahead",
    "temperature", "top_p", "top_k", "seed",
)
_GEN_KWARGS = {"until", "max_gen_toks", "max_new_tokens", "do_sample", "num_beams", *_DECODING_FIELDS}


# ---------------------------------------------------------------------------------------------- model args
@dataclass
class MRPLMArgs:
    """The model args of `mrp-hf` (`--model_args key=value,...`); see docs/evaluation.md for each."""

    backbone: str | None = None
    head: str | None = None
    tokenizer: str | None = None
    revision: str | None = None
    head_revision: str | None = None
    backbone_family: str | None = None
    mask_token_id: int | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    device: str | None = None
    batch_size: int = 1
    max_new_tokens: int | None = None
    max_length: int | None = None
    mrp_mode: str | None = None
    threshold: float | None = None
    block_length: int | None = None
    mrp_draft_tokens: int | None = None
    mrp_draft_graph: str | None = None  # a shape name, e.g. "tree-2x2" (model args are comma-separated)
    mrp_drafter: str | None = None
    steps: int | None = None
    tokens_per_step: int | None = None
    remask_rule: str | None = None
    remask_delta: float | None = None
    prefix_cache: bool | None = None
    confidence: str | None = None
    confidence_resolution: float | None = None
    verify_layout: str | None = None
    verify_lookahead: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0
    mc_num: int = 128
    mc_batch_size: int = 32
    greedy_check: bool = True


#: other spellings accepted for a model arg
_ALIASES = {"pretrained": "backbone", "draft_tokens": "mrp_draft_tokens", "torch_dtype": "dtype"}
#: args lm-eval itself passes to every model, which this backend does not use
_IGNORED = {"max_batch_size"}
_KINDS = {f.name: f.type for f in fields(MRPLMArgs)}


def parse_model_args(raw: dict[str, Any]) -> MRPLMArgs:
    """Check and convert lm-eval's model args (strings, or values lm-eval already converted) to `MRPLMArgs`.

    Raises `ValueError` naming an unknown arg (with the accepted ones) or a value of the wrong kind."""
    values: dict[str, Any] = {}
    unknown = []
    for name, value in raw.items():
        if name in _IGNORED:
            continue
        target = _ALIASES.get(name, name)
        if target not in _KINDS:
            unknown.append(name)
            continue
        if target in values:
            raise ValueError(f"mrp-hf model args: {name!r} and {target!r} are the same arg; give it once.")
        values[target] = _convert(name, value, _KINDS[target])
    if unknown:
        accepted = sorted(set(_KINDS) | set(_ALIASES))
        raise ValueError(f"Unknown mrp-hf model args {sorted(unknown)}; accepted: {', '.join(accepted)}.")
    args = MRPLMArgs(**values)
    if args.backbone is None and args.head is None:
        raise ValueError("mrp-hf model args need head=<MRP head folder or repo> and/or backbone=<DLM id or folder>.")
    if args.dtype not in DTYPES:
        raise ValueError(f"mrp-hf model arg dtype={args.dtype!r}: choose one of {list(DTYPES)}.")
    for name in ("batch_size", "mc_num", "mc_batch_size", "max_new_tokens", "max_length"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"mrp-hf model arg {name}={value} must be a positive integer.")
    return args


def _convert(name: str, value: Any, kind: str) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none" and "None" in kind):
        if "None" not in kind:
            raise ValueError(f"mrp-hf model arg {name} cannot be None.")
        return None
    base = kind.replace(" | None", "")
    if base == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise ValueError(f"mrp-hf model arg {name}={value!r} must be true or false.")
    if base == "int":
        if name == "batch_size" and str(value).startswith("auto"):
            raise ValueError(
                f"mrp-hf model arg batch_size={value!r}: automatic batch sizes are not supported (a DLM's memory "
                f"depends on max_new_tokens and the mode, not only on the prompt); pass an integer, e.g. 8."
            )
        try:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"mrp-hf model arg {name}={value!r} must be an integer.") from None
    if base == "float":
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"mrp-hf model arg {name}={value!r} must be a number.") from None
    return str(value)


# ---------------------------------------------------------------------------------------------- stats
@dataclass
class _Tally:
    """What a set of requests cost. Row counts do not depend on batching or on the number of processes;
    `backbone_forwards` and `head_forwards` count batched calls (a forward over a batch counts once)."""

    requests: int = 0
    new_tokens: int = 0
    row_backbone_forwards: int = 0
    tokens_per_forward_sum: float = 0.0
    backbone_forwards: int = 0
    head_forwards: int = 0
    accepted_drafts: int = 0
    proposals: int = 0
    revoked_reveals: int = 0
    seconds: float = 0.0

    def add(self, other: _Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self, likelihood: bool = False) -> dict[str, Any]:
        if likelihood:
            return {"requests": self.requests, "backbone_forwards": self.backbone_forwards,
                    "seconds": round(self.seconds, 3)}
        return {
            "requests": self.requests,
            "tokens_per_forward": self.tokens_per_forward_sum / self.requests if self.requests else 0.0,
            "new_tokens": self.new_tokens,
            "row_backbone_forwards": self.row_backbone_forwards,
            "backbone_forwards": self.backbone_forwards,
            "head_forwards": self.head_forwards,
            "accepted_drafts": self.accepted_drafts,
            "proposals": self.proposals,
            "revoked_reveals": self.revoked_reveals,
            "generate_seconds": round(self.seconds, 3),
        }


def _tally_batch(stats: Any, rows: list[int], seconds: float) -> _Tally:
    tpf = stats.tokens_per_forward
    return _Tally(
        requests=len(rows),
        new_tokens=sum(stats.row_new_tokens[i] for i in rows),
        row_backbone_forwards=sum(stats.row_backbone_forwards[i] for i in rows),
        tokens_per_forward_sum=sum(tpf[i] for i in rows),
        backbone_forwards=stats.backbone_forwards,
        head_forwards=stats.head_forwards,
        accepted_drafts=stats.accepted_drafts,
        proposals=stats.proposals,
        revoked_reveals=stats.revoked_reveals,
        seconds=seconds,
    )


@dataclass
class _Settings:
    """One task's decoding settings, from the model args and its gen_kwargs."""

    until: list[str]
    max_new_tokens: int  # what the task asked for
    decode: dict[str, Any]  # generate() keywords, max_new_tokens rounded up to whole blocks
    sampling: bool


@dataclass
class _Job:
    context: str
    settings: _Settings
    sample: int
    task: str
    text: str | None = None


@dataclass
class _Stats:
    generate: dict[str, _Tally] = field(default_factory=lambda: defaultdict(_Tally))
    likelihood: dict[str, _Tally] = field(default_factory=lambda: defaultdict(_Tally))


# ---------------------------------------------------------------------------------------------- the model
class MRPLM(TemplateLM):
    """lm-eval model `mrp-hf`: a DLM backbone (+ MRP head) decoded by `MRPModel.generate`.

    `generate_until`: left-padded batches of `batch_size` prompts of one task, decoded in the configured mode;
    the answer is cut at the first EOS, at the task's `max_gen_toks` and at the first stop string of `until`.
    `loglikelihood` / `loglikelihood_rolling`: Monte Carlo estimate of the masked-diffusion ELBO (LLaDA's
    evaluation), `mc_num` masked copies per request, seeded by the request so every process draws the same.
    """

    backend = "causal"  # TemplateLM: encode context + continuation together, then split
    #: the most recently built model (`mrp-hf lm-eval` prints its stats when lm-eval is done)
    last_instance: MRPLM | None = None

    def __init__(self, **model_args: Any):
        super().__init__()
        self.args = args = parse_model_args(model_args)
        self._setup_processes(args.device)
        self.model, self.tokenizer = _load(args)
        self.model.to(self._device)
        self.model.eval()
        adapter = self.model.adapter
        base = build_generation_config(self.model.generation_config)
        self._eos_ids = _id_list(base.eos_token_id if base.eos_token_id is not None else self.tokenizer.eos_token_id)
        pad_candidates = (base.pad_token_id, self.tokenizer.pad_token_id, *self._eos_ids, adapter.mask_token_id)
        self._pad_id = next(int(i) for i in pad_candidates if i is not None)
        self._decoding = {name: getattr(args, name) for name in _DECODING_FIELDS if getattr(args, name) is not None}
        self._default_new = args.max_new_tokens or base.max_new_tokens
        self._max_length = args.max_length or adapter.max_positions or _tokenizer_limit(self.tokenizer)
        self._settings_cache: dict[str, _Settings] = {}
        self._settings_for({})  # check the model args' decoding settings now, before any request
        self.stats = _Stats()
        self._likelihood_tally = _Tally()  # this call's log-likelihood costs, summed over processes at its end
        self._truncation_warned = False
        MRPLM.last_instance = self

    # ------------------------------------------------------------------ processes
    def _setup_processes(self, device: str | None) -> None:
        """Data parallel under `accelerate launch` / `torchrun`: one model per process, on its device."""
        from accelerate import PartialState

        # accelerate counts CPU processes as data parallel only when told it runs on the CPU (its Accelerator
        # reads ACCELERATE_USE_CPU; PartialState does not), so say so here too, and where there is no accelerator
        state = PartialState(cpu=_flag("ACCELERATE_USE_CPU") or not _has_accelerator())
        self._state = state
        self._rank, self._world_size = state.process_index, state.num_processes
        if state.num_processes > 1:
            if device is not None and torch.device(device).type != torch.device(state.device).type:
                logger.warning("mrp-hf: %d processes: process %d uses %s, not device=%s.", state.num_processes,
                               state.process_index, state.device, device)
            self._device = torch.device(state.device)
        else:
            self._device = _usable_device(device)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        return self._device

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._world_size == 1:
            return tensor
        from accelerate.utils import gather

        return gather(tensor if tensor.dim() else tensor[None])

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        if self._world_size == 1:
            return [obj]
        gathered = [None] * self._world_size if self._rank == dst else None
        torch.distributed.gather_object(obj, gathered, dst=dst)
        return gathered

    def barrier(self) -> None:
        if self._world_size > 1:
            self._state.wait_for_everyone()

    def _sum_over_processes(self, tallies: dict[str, _Tally]) -> dict[str, _Tally]:
        """Every process's tallies, summed per task (a collective: every process calls it)."""
        if self._world_size == 1:
            return tallies
        gathered: list[Any] = [None] * self._world_size
        torch.distributed.all_gather_object(gathered, dict(tallies))
        total: dict[str, _Tally] = defaultdict(_Tally)
        for part in gathered:
            for task, tally in part.items():
                total[task].add(tally)
        return total

    # ------------------------------------------------------------------ tokenizer
    @property
    def eot_token_id(self) -> int:
        return self._eos_ids[0] if self._eos_ids else self._pad_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int | None:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._default_new

    @property
    def batch_size(self) -> int:
        return self.args.batch_size

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of `string`; with `add_special_tokens=None` special tokens are added unless the string
        already starts with the BOS token (a chat-templated prompt)."""
        if add_special_tokens is None:
            bos = self.tokenizer.bos_token
            add_special_tokens = not (bos and string.startswith(bos))
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"--apply_chat_template was given, but the tokenizer {self.tokenizer.name_or_path!r} has no chat "
                f"template; drop the flag, or pass model arg tokenizer=<a tokenizer with one>."
            )
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # ------------------------------------------------------------------ settings
    def _settings_for(self, gen_kwargs: dict[str, Any] | None) -> _Settings:
        key = json.dumps(gen_kwargs or {}, sort_keys=True, default=str)
        if key not in self._settings_cache:
            try:
                self._settings_cache[key] = self._build_settings(dict(gen_kwargs or {}))
            except (TypeError, ValueError) as exc:
                where = f"gen_kwargs {gen_kwargs}" if gen_kwargs else "model args"
                raise ValueError(f"mrp-hf: {where}: {exc}") from exc
        return self._settings_cache[key]

    def _build_settings(self, kw: dict[str, Any]) -> _Settings:
        unknown = sorted(set(kw) - _GEN_KWARGS)
        if unknown:
            raise ValueError(
                f"unsupported generation arguments {unknown}; mrp-hf takes {sorted(_GEN_KWARGS)} (the MRP decoding "
                f"fields can also be set for the whole run as model args)."
            )
        until = kw.pop("until", None)
        until = [until] if isinstance(until, str) else list(until or [])
        if not all(isinstance(s, str) for s in until):
            raise ValueError(f"until={until!r} must be a string or a list of strings.")
        asked_new = kw.pop("max_gen_toks", None)
        alias_new = kw.pop("max_new_tokens", None)
        new = asked_new if asked_new is not None else alias_new if alias_new is not None else self._default_new
        if isinstance(new, bool) or not isinstance(new, int) or new < 1:
            raise ValueError(f"max_gen_toks={new!r} must be a positive integer.")
        do_sample = kw.pop("do_sample", None)
        decode = {**self._decoding, **kw}
        if do_sample is False:
            decode["temperature"] = 0.0
        elif do_sample:
            temperature = kw.get("temperature", self._decoding.get("temperature"))
            if temperature == 0:
                raise ValueError("do_sample=True with temperature=0; give a temperature > 0 (e.g. 0.7) to sample.")
            decode["temperature"] = temperature if temperature is not None else 1.0
        block = self._block_length(new, decode.get("block_length"))
        decode["max_new_tokens"] = -(-new // block) * block  # whole blocks; the answer is cut back to `new`
        decode["eos_token_id"] = self._eos_ids or None
        decode["pad_token_id"] = self._pad_id
        config = build_generation_config(self.model.generation_config, **decode)  # validates every field
        head_free = config.mrp_mode == "speculative" and config.mrp_drafter == "backbone"
        if config.mrp_mode != "off" and self.model.head is None and not head_free:
            raise ValueError(f"mrp_mode={config.mrp_mode!r} needs an MRP head: add model arg head=<folder or repo>.")
        if decode["max_new_tokens"] != new and "block_length" not in decode:
            decode["block_length"] = block  # keep the block length that `new` resolved to
        return _Settings(until=until, max_new_tokens=new, decode=decode, sampling=config.temperature > 0)

    def _block_length(self, new: int, block_length: int | None) -> int:
        """The block length generate() will use (its rule in `DecodingEngine`), to round answers up to it."""
        if block_length is not None:
            return int(block_length)
        adapter = self.model.adapter
        return adapter.block_size or getattr(adapter, "default_block_length", None) or min(32, new)

    def decoding_settings(self) -> dict[str, Any]:
        """The run's decoding settings as recorded in lm-eval's results (`config.mrp`)."""
        # the model's generation config already holds a head's decoding defaults (e.g. a calibrated draft graph)
        config = build_generation_config(self.model.generation_config, **self._settings_for({}).decode)
        keep = ("mrp_mode", "threshold", "block_length", "mrp_draft_tokens", "mrp_draft_graph", "mrp_drafter",
                "steps", "tokens_per_step", "remask_rule", "remask_delta", "prefix_cache", "confidence",
                "temperature", "top_p", "top_k", "seed", "max_new_tokens")
        settings = {name: getattr(config, name) for name in keep}
        settings.update(backbone=self.args.backbone, head=self.args.head, batch_size=self.args.batch_size,
                        family=self.model.adapter.family, device=str(self._device), processes=self._world_size)
        return settings

    # ------------------------------------------------------------------ generate_until
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Decode each request's context; return the answer text cut at EOS, `max_gen_toks` and `until`.

        Each distinct (context, gen_kwargs, sample) is decoded once: lm-eval's `repeats` copies of a sampled
        request get seeds seed, seed + 1, ...; greedy copies and the copies lm-eval adds to even out processes
        reuse the first answer."""
        if not requests:
            return []
        jobs: dict[tuple[str, str, int], _Job] = {}
        keys = []
        seen: dict[int, int] = defaultdict(int)
        for request in requests:
            context, gen_kwargs = request.args[0], request.args[1] if len(request.args) > 1 else {}
            settings = self._settings_for(gen_kwargs)
            copy = seen[id(request)]
            seen[id(request)] += 1
            sample = copy if settings.sampling and copy < (getattr(request, "repeats", None) or 1) else 0
            key = (context, json.dumps(gen_kwargs or {}, sort_keys=True, default=str), sample)
            keys.append(key)
            if key not in jobs:
                jobs[key] = _Job(context, settings, sample, getattr(request, "task_name", None) or "default")
        tallies: dict[str, _Tally] = defaultdict(_Tally)
        groups: dict[tuple[str, int, int], list[_Job]] = defaultdict(list)  # one seed and one setting per batch
        for job in jobs.values():
            groups[(job.task, id(job.settings), job.sample)].append(job)
        bar = tqdm(total=len(jobs), desc="mrp-hf generate_until", disable=disable_tqdm or self._rank != 0)
        for group in groups.values():
            encoded = [(self._encode_context(job.context, job.settings), job) for job in group]
            encoded.sort(key=lambda pair: -len(pair[0]))  # similar lengths together: less padding
            for start in range(0, len(encoded), self.args.batch_size):
                batch = encoded[start : start + self.args.batch_size]
                tallies[batch[0][1].task].add(self._generate_batch(batch))
                bar.update(len(batch))
        bar.close()
        for task, tally in self._sum_over_processes(tallies).items():
            self.stats.generate[task].add(tally)
        answers = [jobs[key].text for key in keys]
        for request, answer in zip(requests, answers, strict=True):
            self.cache_hook.add_partial("generate_until", request.args, answer)
        return answers

    def _encode_context(self, context: str, settings: _Settings) -> list[int]:
        ids = self.tok_encode(context)
        room = self._context_room(settings.decode["max_new_tokens"])
        if room is not None and len(ids) > room:
            if not self._truncation_warned:
                logger.warning("mrp-hf: prompts longer than %d tokens are cut on the left (max_length %s, %d new "
                               "tokens).", room, self._max_length, settings.decode["max_new_tokens"])
                self._truncation_warned = True
            ids = ids[-room:]
        return ids

    def _context_room(self, new: int) -> int | None:
        """The longest prompt that fits the model's positions with `new` answer tokens (block-causal
        families lay the prompt out to whole blocks, see `DecodingEngine`)."""
        if self._max_length is None:
            return None
        room = self._max_length - new
        if self._grid() and self.model.adapter.supports_padding:
            room = (room // self._grid()) * self._grid()
        if room < 1:
            raise ValueError(
                f"mrp-hf: {new} new tokens leave no room for a prompt in the model's {self._max_length} positions; "
                f"lower max_gen_toks / max_new_tokens (or set model arg max_length if the model takes more)."
            )
        return room

    def _generate_batch(self, batch: list[tuple[list[int], _Job]]) -> _Tally:
        settings = batch[0][1].settings
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        decode = dict(settings.decode)
        decode["seed"] = decode.get("seed", self.args.seed) + batch[0][1].sample
        started = time.perf_counter()
        out = self.model.generate(input_ids.to(self._device), attention_mask=attention_mask.to(self._device),
                                  return_dict_in_generate=True, **decode)
        seconds = time.perf_counter() - started
        answers = out.sequences[:, width:].tolist()
        for (_, job), answer in zip(batch, answers, strict=True):
            job.text = self.answer_text(answer, settings.max_new_tokens, settings.until)
        return _tally_batch(out.stats, list(range(len(batch))), seconds)

    def answer_text(self, answer: list[int], max_new_tokens: int, until: list[str]) -> str:
        """An answer's text: its tokens up to the first EOS and at most `max_new_tokens` of them, decoded,
        then cut before the first stop string."""
        answer = answer[:max_new_tokens]
        ends = [answer.index(eos) for eos in self._eos_ids if eos in answer]
        if ends:
            answer = answer[: min(ends)]
        text = self.tok_decode(answer, skip_special_tokens=True)
        cuts = [text.find(stop) for stop in until if stop and stop in text]
        return text[: min(cuts)] if cuts else text

    # ------------------------------------------------------------------ log-likelihood
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        distinct, order = _distinct_requests(requests)
        results = super().loglikelihood(distinct, disable_tqdm=disable_tqdm)
        self._gather_likelihood_stats("loglikelihood")
        return [results[i] for i in order]

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, **_: Any) -> list[tuple[float, bool]]:
        results = []
        tally = self._likelihood_tally
        for strings, context, continuation in tqdm(requests, desc="mrp-hf loglikelihood",
                                                   disable=disable_tqdm or self._rank != 0):
            started = time.perf_counter()
            value = self.elbo(context, continuation)
            greedy = self._is_greedy(context, continuation) if self.args.greedy_check else False
            tally.requests += 1
            tally.seconds += time.perf_counter() - started
            results.append((value, greedy))
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, (value, greedy))
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """ELBO of each whole text, in windows of at most `max_length` positions (each token scored once)."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        distinct, order = _distinct_requests(requests)
        results = []
        tally = self._likelihood_tally
        for request in tqdm(distinct, desc="mrp-hf loglikelihood_rolling", disable=disable_tqdm or self._rank != 0):
            (text,) = request.args
            tokens = self.tok_encode(text, add_special_tokens=False)
            window = self._rolling_window(len(tokens))
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=window, context_len=1)]
            started = time.perf_counter()
            total = sum(self.elbo(list(context), list(target)) for context, target in windows)
            tally.requests += 1
            tally.seconds += time.perf_counter() - started
            results.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        self._gather_likelihood_stats("loglikelihood_rolling")
        return [results[i] for i in order]

    def _rolling_window(self, length: int) -> int:
        if self._max_length is None:
            return length + 1
        grid = self._grid() or 0
        return max(1, self._max_length - 1 - 2 * grid)  # room for the context token and block-causal padding

    def _gather_likelihood_stats(self, kind: str) -> None:
        tally, self._likelihood_tally = self._likelihood_tally, _Tally()
        for _, total in self._sum_over_processes({kind: tally}).items():
            self.stats.likelihood[kind].add(total)

    @torch.no_grad()
    def elbo(self, context: list[int], continuation: list[int]) -> float:
        """Monte Carlo estimate of the ELBO of `continuation` given `context` (a lower bound of its log-likelihood).

        As in LLaDA's evaluation: each of `mc_num` copies masks l of the n continuation tokens (l uniform in
        1..n, stratified over the copies) and scores the masked ones; a copy's estimate is n / l times their
        summed log-probabilities. Block-causal families score each model block of the continuation separately,
        with the blocks before it unmasked and the rest of its block masked, as they decode. Draws are seeded
        by the request and `seed`, so they are the same in every process and batch."""
        if not continuation:
            return 0.0
        adapter, grid = self.model.adapter, self._grid()
        ids, attention, start, end = self._likelihood_layout(context, continuation)
        if grid:
            edges = sorted({start, end} | set(range(-(-start // grid) * grid, end, grid)))
            segments = list(zip(edges[:-1], edges[1:], strict=True))
        else:
            segments = [(start, end)]
        generator = torch.Generator().manual_seed(_request_seed(context, continuation, self.args.seed))
        mc = self.args.mc_num
        total = 0.0
        for seg_start, seg_end in segments:
            n = seg_end - seg_start
            strata = (torch.arange(mc) + torch.rand(mc, generator=generator)) / mc
            counts = (strata * n).ceil().clamp(1, n).long()
            ranks = torch.rand(mc, n, generator=generator).argsort(dim=1).argsort(dim=1)
            masked = ranks < counts[:, None]  # `count` positions chosen uniformly at random per copy
            # block-causal: the model block holding the segment is the last one that can see it
            visible = min(len(ids), -(-seg_end // grid) * grid) if grid else len(ids)
            rows = ids[:visible].repeat(mc, 1)
            rows[:, seg_start:seg_end][masked] = adapter.mask_token_id
            target = ids[seg_start:seg_end].to(self._device)
            estimate = torch.zeros(mc, dtype=torch.float64)
            for chunk in range(0, mc, self.args.mc_batch_size):
                part = slice(chunk, chunk + self.args.mc_batch_size)
                batch = rows[part].to(self._device)
                out = adapter.forward(batch, attention_mask=attention[:visible].expand(len(batch), -1).to(self._device),
                                      grid=grid)
                logp = torch.log_softmax(out.logits[:, seg_start:seg_end].float(), dim=-1)
                token_logp = logp.gather(-1, target[None, :, None].expand(len(batch), -1, 1))[..., 0]
                scored = (token_logp * masked[part].to(self._device)).sum(dim=1).double().cpu()
                estimate[part] = scored * n / counts[part].double()
                self._likelihood_tally.backbone_forwards += 1
            total += float(estimate.mean())
        return total

    def _grid(self) -> int | None:
        """The block grid of a block-causal family (its own block size, else the run's block length)."""
        adapter = self.model.adapter
        if not adapter.block_causal:
            return None
        return adapter.block_size or self._block_length(self._default_new, self._decoding.get("block_length"))

    def _likelihood_layout(self, context: list[int], continuation: list[int]) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """(ids, attention mask, continuation start, continuation end) laid out as `generate` lays out a prompt
        and its answer: for block-causal families the prompt left-padded to whole model blocks (where the
        family masks padding) and the continuation's last block filled up with mask tokens (not scored)."""
        grid = self._grid()
        pad = -len(context) % grid if grid and self.model.adapter.supports_padding else 0
        end = pad + len(context) + len(continuation)
        fill = -end % grid if grid else 0
        ids = torch.tensor([self._pad_id] * pad + list(context) + list(continuation)
                           + [self.model.adapter.mask_token_id] * fill, dtype=torch.long)
        attention = torch.tensor([0] * pad + [1] * (end - pad + fill), dtype=torch.long)
        if self._max_length is not None and ids.numel() > self._max_length:
            raise ValueError(
                f"mrp-hf: context ({len(context)} tokens) + continuation ({len(continuation)} tokens) need "
                f"{ids.numel()} positions, beyond the model's {self._max_length}; shorten the task's prompts."
            )
        return ids, attention, pad + len(context), end

    def _is_greedy(self, context: list[int], continuation: list[int]) -> bool:
        """Would greedy static decoding (one token per step, most confident first) write the continuation?"""
        greedy = {"max_gen_toks": len(continuation), "mrp_mode": "off", "temperature": 0.0, "threshold": None,
                  "steps": None, "tokens_per_step": 1}
        if not self.model.adapter.block_causal:
            greedy["block_length"] = len(continuation)  # one block: every position competes, as in LLaDA's check
        decode = self._settings_for(greedy).decode
        out = self.model.generate(torch.tensor([context], device=self._device), return_dict_in_generate=True, **decode)
        self._likelihood_tally.backbone_forwards += out.stats.backbone_forwards
        return out.sequences[0, len(context) : len(context) + len(continuation)].tolist() == list(continuation)

    # ------------------------------------------------------------------ results
    def stats_dict(self) -> dict[str, Any]:
        """Per request type, over all tasks ("all") and per task: what the run cost (summed over processes)."""
        out: dict[str, Any] = {}
        if self.stats.generate:
            total = _Tally()
            for tally in self.stats.generate.values():
                total.add(tally)
            out["generate_until"] = {"all": total.to_dict(),
                                     "tasks": {t: v.to_dict() for t, v in sorted(self.stats.generate.items())}}
        for kind, tally in self.stats.likelihood.items():
            out[kind] = tally.to_dict(likelihood=True)
        return out

    def get_model_info(self) -> dict[str, Any]:
        """lm-eval merges this into its results' `config` (rank 0): settings under `mrp`, costs under `mrp_stats`."""
        parameters = sum(p.numel() for p in self.model.parameters())
        dtype = next(self.model.backbone.parameters()).dtype
        return {"model_num_parameters": parameters, "model_dtype": str(dtype), "mrp": self.decoding_settings(),
                "mrp_stats": self.stats_dict()}


def _register() -> None:
    existing = MODEL_REGISTRY.get(MODEL_NAME, None)
    if existing is None:
        register_model(MODEL_NAME)(MRPLM)
    elif (getattr(existing, "__module__", None), getattr(existing, "__qualname__", None)) != (
        MRPLM.__module__, MRPLM.__qualname__
    ):
        raise ValueError(f"lm-eval already has a model named {MODEL_NAME!r} ({existing}); mrp-hf cannot register its own.")


_register()


# ---------------------------------------------------------------------------------------------- helpers
def _load(args: MRPLMArgs):
    """(MRPModel, tokenizer) from the model args."""
    from transformers import AutoTokenizer

    from .backbones import load_backbone
    from .modeling_mrp import MRPHead, MRPModel, _base_model_location

    load = {"trust_remote_code": args.trust_remote_code, "torch_dtype": DTYPES[args.dtype]}
    if args.head:
        backbone, found_mask = (None, None)
        if args.backbone:
            backbone, found_mask = load_backbone(args.backbone, backbone_family=args.backbone_family,
                                                 revision=args.revision, return_mask_token_id=True, **load)
        mask_id = args.mask_token_id if args.mask_token_id is not None else found_mask
        model = MRPModel.from_pretrained(args.head, backbone=backbone, revision=args.head_revision,
                                         backbone_family=args.backbone_family, mask_token_id=mask_id,
                                         **({} if backbone is not None else load))
        source = args.backbone or _base_model_location(
            MRPHead.config_class.from_pretrained(args.head, revision=args.head_revision).base_model_name_or_path,
            args.head)
    else:
        model = MRPModel.from_backbone_pretrained(args.backbone, backbone_family=args.backbone_family,
                                                  mask_token_id=args.mask_token_id, revision=args.revision, **load)
        source = args.backbone
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or source, trust_remote_code=args.trust_remote_code,
                                              **({"revision": args.revision} if args.revision and not args.tokenizer else {}))
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6: CUDA, XPU, MPS, ...
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return accelerator.is_available()
    return torch.cuda.is_available()


def _usable_device(device: str | None) -> torch.device:
    """The device asked for; lm-eval's CLI asks for cuda:0 by default, so without CUDA that falls back to the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        wanted = torch.device(device)
    except RuntimeError:
        raise ValueError(f"mrp-hf model arg device={device!r} is not a torch device (e.g. cpu, cuda, cuda:1).") from None
    if wanted.type == "cuda" and not torch.cuda.is_available():
        logger.warning("mrp-hf: device %s asked for, but CUDA is not available: running on the CPU.", device)
        return torch.device("cpu")
    return wanted


def _id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _tokenizer_limit(tokenizer: Any) -> int | None:
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else None


def _request_seed(context: list[int], continuation: list[int], seed: int) -> int:
    digest = hashlib.sha256(json.dumps([seed, list(context), list(continuation)]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _distinct_requests(requests: list[Any]) -> tuple[list[Any], list[int]]:
    """Each request object once (lm-eval repeats objects to even out processes), and where each input went."""
    index: dict[int, int] = {}
    distinct, order = [], []
    for request in requests:
        if id(request) not in index:
            index[id(request)] = len(distinct)
            distinct.append(request)
        order.append(index[id(request)])
    return distinct, order
