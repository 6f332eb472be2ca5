"""`MRPGenerationConfig`: every knob of masked-diffusion decoding, validated with errors that name the fix."""

from __future__ import annotations

import math
from typing import Any

from transformers import GenerationConfig

from .modes import check_mode_arguments

CONFIDENCE_RULES = ("top_prob", "margin", "neg_entropy", "random")
REMASK_RULES = ("confidence", "residual")
VERIFY_LAYOUTS = ("auto", "stacked", "packed")
STEP_SCHEDULES = ("even", "dream")
#: sampling temperatures outside this range overflow (tiny: every draw the same token) or drown the logits
TEMPERATURE_RANGE = (1e-4, 100.0)

# Our own fields and their defaults. Sampling fields are set here too because transformers 4.x and 5.x
# disagree on their defaults (4.x: top_k=50, temperature=1.0), and decoding must not change with the version.
_DEFAULTS: dict[str, Any] = {
    "block_length": None,  # None: the model's block size, else the family's default (see the engine)
    "steps": None,  # total denoising steps over max_new_tokens (LLaDA/Dream convention); None: tokens_per_step
    "tokens_per_step": 1,
    "step_schedule": "even",  # with steps: "even" (LLaDA, SDAR) or "dream" (Dream's diffusion_generate)
    "threshold": None,  # set: dynamic regime (reveal every masked position above it, at least one)
    "confidence": "top_prob",
    "confidence_resolution": None,  # set: the static regime ranks confidences rounded to multiples of it
    "temperature": 0.0,
    "top_k": None,
    "top_p": None,
    "seed": 0,
    "prefix_cache": None,  # None: exact cache where the family allows it, off otherwise
    "mrp_mode": "off",
    "mrp_draft_tokens": 3,
    "mrp_draft_graph": None,  # speculative: a draft graph shape (generation/draft_graph.py); None: the head's chain
    "mrp_drafter": "head",  # speculative: "head" drafts with the MRP head, "backbone" with the backbone's own logits
    "remask_rule": "confidence",
    "remask_delta": 1.5,
    "verify_layout": "auto",  # speculative verify: candidates "stacked" in the batch or "packed" in one sequence
    "verify_lookahead": True,  # speculative verify: the node likeliest to fill the block also reads the next block
    "block_alignment": None,  # None: the family's own layout ("sequence" for SDAR/Fast-dLLM v2/LLaDA2), or "answer"
    "group_by_prompt_length": None,  # None: only where the attention ignores padding (LLaDA)
    "mask_token_id": None,
}
#: the fields a head repo's generation_config.json may set as decoding defaults (token ids and lengths belong to
#: the backbone and its tokenizer)
HEAD_DEFAULT_FIELDS = tuple(name for name in _DEFAULTS if name != "mask_token_id")
#: what generate() takes, as keyword arguments or as fields of a `generation_config`, with one rule: anything else is
#: refused the same way from either place. `mask_token_id` is fixed when the model is built.
GENERATE_FIELDS = frozenset(set(HEAD_DEFAULT_FIELDS) | {
    "max_new_tokens", "eos_token_id", "pad_token_id", "bos_token_id", "do_sample", "num_beams", "num_return_sequences",
    "return_dict_in_generate",
})


class MRPGenerationConfig(GenerationConfig):
    """Decoding settings for diffusion LMs, with the MRP modes.

    Args:
        max_new_tokens: length of the answer region (under the "answer" block alignment a multiple of
            `block_length`; under "sequence" any length: the last block is decoded whole, then cut).
        block_length: tokens per semi-autoregressive block; each block is finished before the next starts.
        steps: total denoising steps over `max_new_tokens` (static regime), split evenly over blocks as in
            LLaDA; the tokens of a block are spread over its steps. Overrides `tokens_per_step`.
        tokens_per_step: tokens revealed per step in the static regime (default 1: best quality).
        step_schedule: with `steps`, how a block's tokens are spread over its steps: `"even"` (the remainder in
            the first steps, as LLaDA's and SDAR's `get_num_transfer_tokens`) or `"dream"` (Dream's
            `diffusion_generate` timestep schedule: int(M * (1 - t_next / t)) of the M masks left per step, every
            remaining one at the last; some steps reveal nothing). Dream decodes the whole answer as one block:
            `steps=max_new_tokens, step_schedule="dream"` reproduces its `diffusion_generate` (greedy).
        threshold: dynamic regime: reveal every masked position whose confidence exceeds it (at least one).
        confidence: `"top_prob"`, `"margin"` (top-1 minus top-2), `"neg_entropy"`, or `"random"` order.
        confidence_resolution: the static regime (no threshold: static, speculative, direct) ranks confidences
            rounded to multiples of it, so positions whose confidences differ by less are ties, decided by
            position (leftmost first); `None` (default): exact confidences. Speculative decoding stays identical
            to static decoding under the same setting, and its drafts are accepted far more often where many
            positions are near-certain (docs/benchmarks.md: the reference DLM ships with 0.05). The dynamic
            regime's thresholds (dynamic, remask) always see exact confidences.
        temperature, top_k, top_p: sampling; `temperature=0` is greedy. Random draws are keyed by
            (prompt, position, tokens committed so far) and `seed`, so they do not depend on batch
            composition or call order.
        prefix_cache: `None` uses an exact prefix KV cache for block-causal families and none for
            bidirectional ones; `True` also enables the Fast-dLLM-style approximate cache for
            bidirectional families (refreshed at each block; output may differ from no cache);
            `False` disables caching.
        mrp_mode: one of `generation.modes.MODE_NAMES`: `"off"`, `"speculative"`, `"remask"` or `"direct"` (the
            last three need an MRP head).
        mrp_draft_tokens: drafts per round for the speculative and direct modes.
        mrp_draft_graph: speculative mode: verify a draft graph (several candidate next steps per node, every node
            in one forward) instead of the chain: `"chain"` (`mrp_draft_tokens` deep), `"chain-K"`, `"tree-AxB..."`
            (branching per depth) or a list of ints (see docs/modes.md). With a graph, `threshold` is allowed: the
            graph then speculates over dynamic decoding at that threshold, lossless against it.
        mrp_drafter: speculative mode: `"head"` (default) drafts with the MRP head; `"backbone"` drafts from the
            backbone's own last logits (C = 0) and needs no head ("auto-speculation"; a chain of
            `mrp_draft_tokens` unless `mrp_draft_graph` says otherwise).
        verify_layout: how the speculative verify forward holds the K+1 candidate states of a row: `"stacked"`
            in the batch dimension, `"packed"` in one sequence with block-diagonal attention over the shared
            prefix (families whose forward takes an explicit 4-D pattern), or `"auto"` (the layout measured
            faster for the family). Both give the same tokens.
        verify_lookahead: speculative mode: the verify forward also runs the next block (still masked) after the
            candidate likeliest to fill the current block, so that when the block ends as that candidate the next
            block starts without a forward of its own (docs/modes.md#draft-graphs). Same tokens either way;
            `False` keeps every verify to the block's own candidates.
        block_alignment: where a block-causal model's blocks start. `None` (default): the family's own layout,
            which is `"sequence"` for SDAR, Fast-dLLM v2 and LLaDA2 (blocks counted from each row's first token,
            the prompt's tail sharing its block with the first answer tokens, as their generate functions and
            training do; the last block is decoded whole and cut to `max_new_tokens`) and `"answer"` for the
            project's reference DLM (the answer starts a fresh block, the prompt left-padded to a block multiple).
            `"answer"` on a "sequence" family departs from what the model was trained on; it lets prompts of any
            length share uniform blocks (see docs/generation.md). Bidirectional families always use "answer".
        group_by_prompt_length: decode rows of equal prompt length together, unpadded. `None` (default): only for
            families whose attention ignores the padding mask (LLaDA), which keeps every row's answer equal to
            decoding it alone; `False` decodes such a padded batch in one forward per step (faster, but rows then
            attend to their pads); `True` forces it for any family.
        eos_token_id, pad_token_id: a row stops after a block containing EOS; later tokens become pad.
    """

    def __init__(self, **kwargs):
        own = {name: kwargs.pop(name, default) for name, default in _DEFAULTS.items()}
        if own["temperature"] is None:
            own["temperature"] = 0.0
        _real("temperature", own["temperature"], "0 for greedy decoding, or e.g. 0.7 to sample")
        asked = kwargs.get("do_sample")
        if asked is not None and bool(asked) != (own["temperature"] > 0):
            raise ValueError(
                f"do_sample={asked} disagrees with temperature={own['temperature']}: here sampling is on exactly "
                f"when temperature > 0. Pass temperature=<a value > 0> (e.g. 0.7) to sample, or temperature=0 "
                f"(greedy) without do_sample."
            )
        kwargs.setdefault("max_new_tokens", 128)
        kwargs["do_sample"] = own["temperature"] > 0
        super().__init__(**kwargs)
        for name, value in own.items():  # after super(): GenerationConfig.__init__ resets the shared ones
            setattr(self, name, value)
        self.validate()

    def validate(self, *args, **kwargs) -> None:  # noqa: D401 - replaces GenerationConfig.validate
        """Check every decoding field; raise `ValueError` naming the bad value and the fix."""
        if not hasattr(self, "mrp_mode"):  # called from GenerationConfig.__init__ before our fields are set
            return
        if self.confidence not in CONFIDENCE_RULES:
            raise ValueError(f"Unknown confidence {self.confidence!r}; choose one of {list(CONFIDENCE_RULES)}.")
        if self.verify_layout not in VERIFY_LAYOUTS:
            raise ValueError(f"Unknown verify_layout {self.verify_layout!r}; choose one of {list(VERIFY_LAYOUTS)}.")
        if self.remask_rule not in REMASK_RULES:
            raise ValueError(f"Unknown remask_rule {self.remask_rule!r}; choose one of {list(REMASK_RULES)}.")
        _resolution(self.confidence_resolution)
        _positive_int("max_new_tokens", self.max_new_tokens)
        _positive_int("tokens_per_step", self.tokens_per_step)
        _positive_int("mrp_draft_tokens", self.mrp_draft_tokens, hint="K >= 1 drafts per round")
        if self.block_length is not None:  # whether it must divide max_new_tokens depends on the layout (engine)
            _positive_int("block_length", self.block_length)
        if self.steps is not None:
            _positive_int("steps", self.steps)
        if self.threshold is not None:
            _real("threshold", self.threshold, "e.g. threshold=0.9, or None for static decoding")
            if not 0.0 < self.threshold <= 1.0:
                raise ValueError(
                    f"threshold={self.threshold} is outside (0, 1]; use e.g. threshold=0.9, or None for static decoding."
                )
        _real("temperature", self.temperature, "0 for greedy decoding, or e.g. 0.7 to sample")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} is negative; use 0 for greedy or a positive value.")
        if 0 < self.temperature < TEMPERATURE_RANGE[0] or self.temperature > TEMPERATURE_RANGE[1]:
            # logits / 1e-300 overflow to inf (every draw the same token), logits / 1e300 are all zero (uniform noise)
            raise ValueError(
                f"temperature={self.temperature} is outside [{TEMPERATURE_RANGE[0]}, {TEMPERATURE_RANGE[1]}], where "
                f"sampling stays numerically meaningful; use 0 for greedy decoding, or e.g. temperature=0.7."
            )
        if self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1):
            raise ValueError(f"top_k={self.top_k!r} must be a positive int or None.")
        if self.top_p is not None:
            _real("top_p", self.top_p, "e.g. top_p=0.95, or None to disable it")
            if not 0.0 < self.top_p <= 1.0:
                raise ValueError(f"top_p={self.top_p} is outside (0, 1]; use None to disable it.")
        _real("remask_delta", self.remask_delta, "the |C| above which remask_rule='residual' revokes, e.g. 1.5")
        if self.remask_delta < 0:
            raise ValueError(f"remask_delta={self.remask_delta} is negative; it bounds |C|, use e.g. 1.5.")
        if self.seed is None:
            if self.temperature > 0:
                raise ValueError(
                    "seed=None with temperature > 0: sampling draws are keyed by the seed (so that they do not depend "
                    "on batch composition); pass an int, e.g. seed=0."
                )
        elif not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"seed={self.seed!r} must be an int (it keys the random draws), e.g. seed=0.")
        for name in ("eos_token_id", "pad_token_id"):
            _token_ids(name, getattr(self, name, None))
        if self.step_schedule not in STEP_SCHEDULES:
            raise ValueError(f"Unknown step_schedule {self.step_schedule!r}; choose one of {list(STEP_SCHEDULES)}.")
        if self.block_alignment not in (None, "sequence", "answer"):
            raise ValueError(f"block_alignment={self.block_alignment!r} must be None (the family's own), 'sequence' or 'answer'.")
        if self.verify_lookahead not in (True, False):
            raise ValueError(f"verify_lookahead={self.verify_lookahead!r} must be True or False.")
        if self.group_by_prompt_length not in (None, True, False):
            raise ValueError(f"group_by_prompt_length={self.group_by_prompt_length!r} must be None (auto), True or False.")
        if self.prefix_cache not in (None, True, False):
            raise ValueError(f"prefix_cache={self.prefix_cache!r} must be None (auto), True or False.")
        for name in ("num_beams", "num_return_sequences"):  # GenerationConfig fields the engine would ignore
            value = getattr(self, name, None)
            if value is not None and value != 1:
                raise ValueError(
                    f"{name}={value!r} is not supported by masked-diffusion decoding (one answer per prompt, no "
                    f"beams); remove it, or repeat the prompt in the batch with temperature > 0 for several answers."
                )
        check_mode_arguments(self)  # the mode exists and its regime fits (generation/modes.py)

    @property
    def is_sampling(self) -> bool:
        return self.temperature > 0

    def to_diff_dict(self) -> dict[str, Any]:
        """What `save_pretrained` writes: greedy decoding is written as `temperature: null` (read back as 0), so that
        transformers' own `GenerationConfig` loading the file (a backbone's, a head repo's) finds no sampling flag
        set without `do_sample` and does not warn that "generation flags are not valid"."""
        fields = super().to_diff_dict()
        if not self.is_sampling:
            fields["temperature"] = None
        return fields

    @classmethod
    def from_model_config(cls, model_config) -> MRPGenerationConfig:
        """transformers builds a model's default generation config from its model config: only the token ids carry
        over (a model config's other fields are no decoding settings)."""
        source = model_config if isinstance(model_config, dict) else model_config.to_dict()
        ids = {k: source[k] for k in ("eos_token_id", "pad_token_id", "bos_token_id", "mask_token_id") if source.get(k) is not None}
        return cls(**ids)


def _real(name: str, value: Any, hint: str) -> None:
    """A finite real number (not a bool, a string or NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} must be a number ({hint}), got {type(value).__name__}.")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a finite number; use {hint}.")


def _token_ids(name: str, value: Any) -> None:
    """None, a non-negative int, or a list of them (checked against the vocabulary by the engine)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    for item in values:
        if item is None and not isinstance(value, (list, tuple)):
            continue
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(f"{name}={value!r} must be a token id (an int >= 0) or a list of them.")


def _resolution(value: Any) -> None:
    if value is None:
        return
    _real("confidence_resolution", value, "e.g. 0.05, or None for exact confidences")
    if not 0.0 < value < 1.0:
        raise ValueError(f"confidence_resolution={value} is outside (0, 1); use e.g. 0.05, or None for exact confidences.")


def _positive_int(name: str, value: Any, hint: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer{f' ({hint})' if hint else ''}.")


def build_generation_config(base: GenerationConfig | None, **overrides: Any) -> MRPGenerationConfig:
    """Merge a model's generation config with call-time overrides.

    A model that ships an `MRPGenerationConfig` (e.g. the reference DLM) gives all its fields, and so does a plain
    `GenerationConfig` read from such a file (the fields the file sets, not transformers' defaults: those differ
    between 4.x and 5.x); any other plain `GenerationConfig` (remote-code DLMs) gives its token ids and its
    `max_new_tokens`, because its sampling defaults were written for the family's own sampler, not ours.
    """
    fields: dict[str, Any] = {}
    if isinstance(base, MRPGenerationConfig):
        # do_sample is derived from the base's temperature; an override's do_sample is checked against it
        fields.update({k: v for k, v in base.to_dict().items() if not k.startswith("_") and k != "do_sample"})
    elif base is not None:
        written = base.to_diff_dict()
        if written.get("mrp_mode") is not None:
            fields.update({k: v for k, v in written.items() if not k.startswith("_") and k != "do_sample"})
        else:
            for key in ("eos_token_id", "pad_token_id", "mask_token_id", "max_new_tokens"):
                if written.get(key) is not None:
                    fields[key] = written[key]
    # an explicit None resets one of our fields (e.g. top_p=None undoes a model default); for the token ids
    # and other GenerationConfig fields None means "not given"
    fields.update({k: v for k, v in overrides.items() if v is not None or k in _DEFAULTS})
    fields.pop("transformers_version", None)
    return MRPGenerationConfig(**fields)


def requested_fields(generation_config: GenerationConfig) -> dict[str, Any]:
    """The fields a `generation_config` passed to generate() asks for: the generate fields of an
    `MRPGenerationConfig` and the fields a `GenerationConfig` sets away from transformers' defaults. Its
    `mask_token_id` is left out: the mask id is fixed when the model is built (a backbone's own generation config
    passed here may carry it)."""
    fields = GenerationConfig.to_diff_dict(generation_config)
    if isinstance(generation_config, MRPGenerationConfig):
        every = generation_config.to_dict()
        fields.update({k: every[k] for k in GENERATE_FIELDS if k in every})
    return {k: v for k, v in fields.items()
            if not k.startswith("_") and k not in ("transformers_version", "mask_token_id")}


def refuse_unsupported(fields: dict[str, Any], where: str) -> None:
    """One rule for keyword arguments and generation_config fields: anything outside `GENERATE_FIELDS` is refused
    (a TypeError naming it), never silently ignored."""
    unknown = sorted(set(fields) - GENERATE_FIELDS)
    if unknown:
        raise TypeError(
            f"generate() got unknown arguments {unknown} ({where}): masked-diffusion decoding does not use them; remove "
            f"them. It takes the MRPGenerationConfig fields {sorted(GENERATE_FIELDS)}, plus logits_processor, "
            f"stopping_criteria and streamer."
        )


def resolve_generate_config(
    defaults: GenerationConfig | None, generation_config: GenerationConfig | None, kwargs: dict[str, Any]
) -> MRPGenerationConfig:
    """generate()'s settings: the model's defaults, then `generation_config`, then keyword arguments (validated)."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"generation_config must be a transformers GenerationConfig (e.g. MRPGenerationConfig(...)), got "
            f"{type(generation_config).__name__}; pass its fields as keyword arguments instead."
        )
    config = build_generation_config(defaults)
    if generation_config is not None:
        fields = requested_fields(generation_config)
        refuse_unsupported(fields, "set in generation_config")
        config = build_generation_config(config, **fields)
    if kwargs:
        refuse_unsupported(kwargs, "as keyword arguments")
        config = build_generation_config(config, **kwargs)
    return config
