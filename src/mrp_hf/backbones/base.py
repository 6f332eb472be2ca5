"""The interface every DLM family adapter implements.

An adapter is the only place that knows a family's quirks: where its mask token id lives, whether its
logits are shifted (Dream: the logits at position i-1 predict token i), its attention pattern, whether an
exact prefix KV cache is possible, and where its input embedding and lm_head are. The decoding engine and
the MRP head only talk to adapters.
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn


@dataclass
class BackboneOutput:
    """One backbone forward, aligned so that `logits[:, i]` scores the token AT input position i.

    For shifted families the adapter has already moved the logits one step right; position 0 of the
    input then has no score of its own (it repeats position 1's) and the engine never decodes it.
    `lm_head_input` is the final normalised hidden state that the lm_head read, aligned the same way
    (None unless asked for). A cache passed to the forward is updated in place by the model.
    """

    logits: torch.Tensor
    lm_head_input: torch.Tensor | None = None


class BackboneAdapter:
    """Base adapter: a loaded `PreTrainedModel` seen as a masked diffusion LM.

    Subclasses set the class attributes below and override a method only where their family's remote
    code really differs.
    """

    #: name used by `backbone_family=` and written into head configs
    family: ClassVar[str] = "generic"
    #: `config.model_type` values (compared case-insensitively) and `config.architectures` entries
    model_types: ClassVar[tuple[str, ...]] = ()
    architectures: ClassVar[tuple[str, ...]] = ()
    #: logits at position i-1 predict token i (models initialised from an AR LM, e.g. Dream)
    shifted_logits: ClassVar[bool] = False
    #: attention is causal across blocks and bidirectional inside a block (SDAR, Fast-dLLM v2, LLaDA2)
    block_causal: ClassVar[bool] = False
    #: config fields that hold the model's attention block size, first found wins
    block_size_fields: ClassVar[tuple[str, ...]] = ()
    #: config fields that hold the mask token id, first found wins
    mask_token_id_fields: ClassVar[tuple[str, ...]] = ("mask_token_id",)
    #: the family's documented mask id when its config does not carry one
    default_mask_token_id: ClassVar[int | None] = None
    #: the remote code masks padded keys (False: under the "answer" alignment the engine decodes rows of equal
    #: prompt length together; under the "sequence" alignment every row's prompt starts at column 0, unpadded)
    supports_padding: ClassVar[bool] = True
    #: block-causal families: where a row's blocks start. "sequence": counted from the row's first token, the
    #: prompt's tail sharing its block with the first answer tokens (the layout of SDAR's, Fast-dLLM v2's and
    #: LLaDA2's own generate and training); "answer": the answer starts a fresh block (see generation/layout.py)
    block_alignment: ClassVar[str] = "answer"
    #: dynamic decoding reveals confidence >= threshold (True) or > threshold (False), as the family's own code
    threshold_inclusive: ClassVar[bool] = False
    #: a model block's first token is committed from the previous block's last logit before denoising (Fast-dLLM v2)
    autoregressive_block_start: ClassVar[bool] = False
    #: with the approximate (bidirectional) prefix cache: the forward that refreshes the cache at a block's start
    #: also commits the block's first position (Fast-dLLM's Dream block decoding)
    commits_block_start_on_cache_refresh: ClassVar[bool] = False
    #: decoding block when neither `block_length` nor a model block size is given (None: the whole answer)
    default_block_length: ClassVar[int | None] = 32
    #: config fields that bound the positions a model can address
    max_positions_fields: ClassVar[tuple[str, ...]] = ("max_position_embeddings", "max_sequence_length", "n_positions")
    #: the forward takes an explicit 4-D attention pattern (see `packed_attention_mask`) and position ids, so the
    #: speculative verifier can pack several candidate versions of a block into one sequence
    packed_verify: ClassVar[bool] = False
    #: `verify_layout="auto"`: the layout measured faster for this family (benchmarks/bench_verify_layout.py)
    preferred_verify_layout: ClassVar[str] = "stacked"

    def __init__(self, model: nn.Module, mask_token_id: int | None = None):
        self.model = model
        self.config = model.config
        self.mask_token_id = self._resolve_mask_token_id(mask_token_id)
        self._check_mask_token_id(explicit=mask_token_id is not None)
        self.block_size = self._resolve_block_size()
        # a PEFT wrapper forwards *args/**kwargs: read the signature of the model it wraps
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._forward_params = set(inspect.signature(inner.forward).parameters)

    # ------------------------------------------------------------------ matching
    @classmethod
    def matches(cls, config) -> bool:
        model_type = str(getattr(config, "model_type", "") or "").lower()
        if model_type and model_type in {t.lower() for t in cls.model_types}:
            return True
        return any(arch in cls.architectures for arch in (getattr(config, "architectures", None) or ()))

    # ------------------------------------------------------------------ facts
    @classmethod
    def own_mask_token_id(cls, model: nn.Module) -> int | None:
        """The mask id the backbone itself declares: its config, its generation config, else the family's
        documented default when that id exists in its vocabulary; None when it declares none.

        This never looks at a head: a head's recorded mask id is checked against this, not used to build it.
        """
        for source in (model.config, getattr(model, "generation_config", None)):
            for field in cls.mask_token_id_fields:
                value = getattr(source, field, None) if source is not None else None
                if value is not None:
                    return int(value)
        default = cls.default_mask_token_id
        rows = _embedding_rows(model)
        if default is not None and (rows is None or default < rows):
            return default
        return None

    def _resolve_mask_token_id(self, explicit: int | None) -> int:
        if explicit is not None:
            return int(explicit)
        found = self.own_mask_token_id(self.model)
        if found is not None:
            return found
        if self.default_mask_token_id is not None:
            return self.default_mask_token_id  # outside the vocabulary: `_check_mask_token_id` says so
        raise ValueError(
            f"Cannot find a mask token id for this {type(self.model).__name__} (family {self.family!r}, "
            f"model_type {getattr(self.config, 'model_type', None)!r}): its config has none of "
            f"{list(self.mask_token_id_fields)}. Pass mask_token_id=<id of the [MASK] token> "
            f"(e.g. tokenizer.mask_token_id), or backbone_family=<a supported family>."
        )

    def _check_mask_token_id(self, explicit: bool) -> None:
        """The mask id must index the input embedding (else torch.embedding fails with a bare IndexError)."""
        rows = _embedding_rows(self.model)
        if rows is not None and not 0 <= self.mask_token_id < rows:
            source = "" if explicit else (
                f", {self.family}'s default (no mask id in the config, the generation config or a tokenizer beside "
                f"the model)"
            )
            raise ValueError(
                f"mask_token_id={self.mask_token_id}{source} is outside the vocabulary of this "
                f"{type(self.model).__name__} ({rows} embeddings); pass mask_token_id=<id of the [MASK] token> "
                f"(e.g. tokenizer.mask_token_id)."
            )

    def _resolve_block_size(self) -> int | None:
        if not self.block_causal:
            return None
        for field in self.block_size_fields:
            value = getattr(self.config, field, None)
            if value:
                return int(value)
        # some families (SDAR) take the block size at decoding time: the engine uses block_length
        return None

    def resolve_block_length(self, requested: int | None, answer_length: int | None = None) -> int:
        """The block length decoding (and training) uses: `requested`, else the model's attention block, else the
        family's `default_block_length` (at most `answer_length`), else the whole answer (`answer_length`; 32
        where there is none, in training). Raises when it does not tile the model's attention block.

        The one rule for the decoding engine and the trainer, so that a head trains on the blocks it decodes."""
        model_block = self.block_size
        if requested:
            block_length = requested
        elif model_block:
            block_length = model_block
        elif self.default_block_length is not None:
            block_length = min(self.default_block_length, answer_length or self.default_block_length)
        else:  # the family decodes the whole answer as one block (Dream's diffusion_generate)
            block_length = answer_length or 32
        if model_block is not None and (block_length > model_block or model_block % block_length):
            raise ValueError(
                f"block_length={block_length} does not fit {self.family}'s attention block of {model_block} "
                f"tokens: a block-causal model can only decode blocks that tile its own (use {model_block} "
                f"or a divisor of it)."
            )
        return block_length

    def first_scoring_position(self, position: int) -> int:
        """The input position whose output scores `position`: itself, or the one before for families with shifted
        logits (the logit at i-1 predicts token i)."""
        return position - 1 if self.shifted_logits else position

    @property
    def attention_pattern(self) -> str:
        return "block_causal" if self.block_causal else "bidirectional"

    @property
    def cache_argument(self) -> str | None:
        """The forward's name for the KV cache: `cache` (transformers >= 5.2x), `past_key_values`, or None."""
        for name in ("cache", "past_key_values"):
            if name in self._forward_params:
                return name
        return None

    @property
    def accepts_cache(self) -> bool:
        return self.cache_argument is not None

    def cache_refusal(self) -> str:
        """Why `prefix_cache=True` cannot be honoured (asked only when `accepts_cache` is False)."""
        return f"prefix_cache=True, but {type(self.model).__name__}'s forward takes no past_key_values."

    @property
    def exact_prefix_cache(self) -> bool:
        """A prefix KV cache gives exactly the no-cache output (block-causal attention + cache support)."""
        return self.block_causal and self.accepts_cache

    @property
    def accepts_position_ids(self) -> bool:
        return "position_ids" in self._forward_params

    @property
    def max_positions(self) -> int | None:
        for field in self.max_positions_fields:
            value = getattr(self.config, field, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def vocab_size(self) -> int:
        return int(self.get_output_embeddings().weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.get_input_embeddings().weight.shape[1])

    # ------------------------------------------------------------------ shared modules
    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        head = self.model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(self.model).__name__} exposes no output embedding (lm_head).")
        return head

    # ------------------------------------------------------------------ forward
    def attention_inputs(self, attention_mask: torch.Tensor, query_length: int, grid: int | None) -> Any:
        """The `attention_mask` argument this family's forward expects.

        `attention_mask` is the 2-D padding mask over every key (cached + current), `grid` the block size
        of block-causal attention. The base passes the 2-D mask and lets the model build its pattern.
        """
        return attention_mask

    @property
    def can_pack(self) -> bool:
        """The verifier may pack candidate states into one sequence (needs the pattern and position ids)."""
        return self.packed_verify and self.accepts_position_ids

    def packed_attention_mask(self, allowed: torch.Tensor) -> Any:
        """The `attention_mask` argument for an explicit pattern: `allowed` is bool [B, 1, q, k] over every
        key (cached + current; the queries are the last q keys). Families with `packed_verify` override it."""
        raise NotImplementedError(f"{self.family} takes no explicit attention pattern (packed_verify is False).")

    def model_inputs(self, input_ids, attention_mask, position_ids, past_key_values, grid=None) -> dict[str, Any]:
        """Keyword arguments for the model's forward; override for families with other names."""
        mask = None if attention_mask is None else self.attention_inputs(attention_mask, input_ids.shape[1], grid)
        inputs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask}
        if position_ids is not None and self.accepts_position_ids:
            inputs["position_ids"] = position_ids
        if past_key_values is not None:
            inputs[self.cache_argument or "past_key_values"] = past_key_values
            inputs["use_cache"] = True
        elif "use_cache" in self._forward_params:
            inputs["use_cache"] = False
        return inputs

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Any = None,
        return_lm_head_input: bool = False,
        grid: int | None = None,
        pattern: torch.Tensor | None = None,
    ) -> BackboneOutput:
        """One backbone forward returning aligned logits (and the lm_head's input when asked).

        The hidden state is captured from the lm_head's input (`capture_lm_head_input`), so it costs no
        second forward and no per-layer `output_hidden_states`. `pattern` (bool [B, 1, q, k], families with `packed_verify`)
        replaces the pattern built from `attention_mask`; logits are then shifted over the whole input, so
        for shifted families the caller reads only positions whose predecessor belongs to the same segment.
        """
        if pattern is None:
            inputs = self.model_inputs(input_ids, attention_mask, position_ids, past_key_values, grid)
        else:
            inputs = self.model_inputs(input_ids, None, position_ids, past_key_values, grid)
            inputs["attention_mask"] = self.packed_attention_mask(pattern)
        if return_lm_head_input:
            with capture_lm_head_input(self.get_output_embeddings()) as captured:
                out = self.model(**inputs)
        else:
            out = self.model(**inputs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        hidden = None
        if return_lm_head_input:
            if not captured:
                raise RuntimeError(
                    f"{type(self.model).__name__} computed its logits without calling its output embedding "
                    f"module, so the final hidden state could not be captured; this family needs its own adapter."
                )
            hidden = captured[-1]
        if self.shifted_logits:
            logits = _shift_right(logits)
            hidden = _shift_right(hidden) if hidden is not None else None
        return BackboneOutput(logits=logits, lm_head_input=hidden)



class _LmHeadCapture:
    """A pre-hook on the lm_head that hands its input to the capture of the calling thread only.

    A hook that simply records every call would also catch a forward that another thread runs on the same
    model at the same time (module hooks are shared by all threads), giving one `generate` the other one's
    hidden state. Module hooks run in the thread that calls the module, so the hook appends to a thread-local
    stack of captures. The hook stays registered while at least one capture of that module is open (counted
    under a lock), so the user's model carries no hook outside our forwards.
    """

    _local = threading.local()
    _lock = threading.Lock()
    _users: dict[int, list] = {}  # id(module) -> [handle, open captures]

    @classmethod
    def _hook(cls, module: nn.Module, args: tuple) -> None:
        stack = getattr(cls._local, "stack", None)
        if stack and args:
            stack[-1].append(args[0])

    @classmethod
    @contextmanager
    def capture(cls, module: nn.Module):
        key = id(module)
        with cls._lock:
            entry = cls._users.get(key)
            if entry is None:
                entry = cls._users[key] = [module.register_forward_pre_hook(cls._hook), 0]
            entry[1] += 1
        stack = cls._local.__dict__.setdefault("stack", [])
        captured: list[torch.Tensor] = []
        stack.append(captured)
        try:
            yield captured
        finally:
            stack.pop()
            with cls._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    entry[0].remove()
                    del cls._users[key]


def capture_lm_head_input(module: nn.Module):
    """Context manager: a list that receives the inputs `module` (the lm_head) gets in this thread meanwhile."""
    return _LmHeadCapture.capture(module)


def allowed_keys(attention_mask: torch.Tensor, query_length: int, grid: int | None) -> torch.Tensor:
    """Bool [B, 1, q, kv]: which keys each query may attend to.

    Padded keys are never visible (except a query's own position); with `grid`, a query sees keys of its own
    block and earlier ones (block-causal), blocks counted by absolute index from the start of the canvas.
    """
    key_length = attention_mask.shape[1]
    device = attention_mask.device
    query_index = torch.arange(key_length - query_length, key_length, device=device)
    key_index = torch.arange(key_length, device=device)
    # every query also sees itself: a pad query with no visible key would give NaN, which leaks into real
    # positions through 0 * NaN in the next layer's attention (real queries see themselves anyway)
    own = (key_index[None, :] == query_index[:, None])[None, None]
    allowed = attention_mask.bool()[:, None, None, :].expand(-1, 1, query_length, key_length)
    if grid is not None:
        allowed = allowed & (key_index[None, :] // grid <= query_index[:, None] // grid)[None, None]
    return allowed | own


def _embedding_rows(model: nn.Module) -> int | None:
    """Rows of the model's input embedding (its vocabulary), None when it exposes none."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return getattr(getattr(embeddings, "weight", None), "shape", (None,))[0]


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[:, :1], x[:, :-1]], dim=1)
