"""`MRPHead` (the trained module) and `MRPModel` (backbone + optional head + `generate()`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.utils import logging

from .backbones import BackboneAdapter, get_adapter, load_backbone, resolve_adapter_class
from .backbones.loading import HUB_KWARGS as _HUB_KWARGS
from .configuration_mrp import MRPConfig
from .generation.config import (
    _DEFAULTS,
    HEAD_DEFAULT_FIELDS,
    MRPGenerationConfig,
    build_generation_config,
    resolve_generate_config,
)
from .generation.engine import DecodingEngine, MRPGenerateOutput

logger = logging.get_logger(__name__)

# arguments transformers' Auto classes pass to a model class's from_pretrained that mean nothing to MRPModel
_AUTO_CLASS_ARGUMENTS = ("_from_auto", "_from_pipeline", "adapter_kwargs", "_commit_hash", "code_revision")


class MRPHead(PreTrainedModel):
    """Predicts the residual C between the backbone's logits on a state and on the next state.

    h_C = Norm(Layers(W [RMSNorm(e); RMSNorm(h_A)])), where e is the backbone's own (frozen, shared)
    embedding of the updated ids and h_A the backbone's final normalised hidden state on the previous
    state; the next-step logits are lm_head(h_A + h_C). The head holds neither the embedding nor the
    lm_head: callers pass `inputs_embeds`, and `save_pretrained` writes only the head's weights.
    An untrained head outputs h_C = 0 exactly ("reuse the last logits").
    """

    config_class = MRPConfig
    base_model_prefix = "mrp_head"
    main_input_name = "inputs_embeds"
    supports_gradient_checkpointing = False
    _no_split_modules = ["LlamaDecoderLayer"]
    _supports_sdpa = True

    def __init__(self, config: MRPConfig):
        super().__init__(config)
        width = config.head_hidden_size
        layer_config = LlamaConfig(
            hidden_size=width,
            intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            num_hidden_layers=config.num_hidden_layers,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=config.rope_theta,
            max_position_embeddings=config.max_position_embeddings,
        )
        layer_config._attn_implementation = "sdpa"
        self.embed_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fuse = nn.Linear(2 * config.hidden_size, width, bias=False)
        self.layers = nn.ModuleList(LlamaDecoderLayer(layer_config, layer_idx=i) for i in range(config.num_hidden_layers))
        self.rotary_emb = LlamaRotaryEmbedding(layer_config)
        self.norm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.out_proj = nn.Linear(width, config.hidden_size, bias=False) if width != config.hidden_size else None
        self.post_init()
        self.zero_output()
        #: decoding defaults this head ships (its repo's generation_config.json): `MRPGenerationConfig` fields such
        #: as mrp_mode, mrp_draft_tokens, threshold, block_length; generate() starts from them
        self.decoding_defaults: dict[str, Any] = {}

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModel") -> None:
        """Does nothing: the head's `auto_map` and code files are written by `save_pretrained` (`mrp_hf/hub.py`).
        transformers calls this after loading the class through `auto_map`; registering would make the next
        `save_pretrained` copy mrp-hf's own source file (with its package-relative imports) into the folder."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args: Any, **kwargs: Any) -> MRPHead:
        """Load a head (safetensors only), strictly: the config's sizes are checked, and the weights file must
        hold exactly the tensors this config builds, with their shapes, before any weight is allocated (a
        missing tensor would otherwise be initialised at random and silently change the output). The decoding
        defaults of the head's generation_config.json, if it has one, go to `decoding_defaults`."""
        if kwargs.get("use_safetensors") is False:
            raise ValueError("MRP heads load from safetensors only (a pickle can run code); drop use_safetensors=False.")
        kwargs["use_safetensors"] = True
        _check_head_weights(cls, pretrained_model_name_or_path, kwargs)
        head = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        head.decoding_defaults = _saved_decoding_defaults(pretrained_model_name_or_path, kwargs)
        return head

    def save_pretrained(self, save_directory, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.save_pretrained` (config.json with `auto_map`, model.safetensors), then the code files
        `auto_map` names and `custom_generate/` (`mrp_hf/hub.py`), and generation_config.json when the head has
        `decoding_defaults`."""
        from .hub import write_head_code

        decoding = MRPGenerationConfig(**self.decoding_defaults) if self.decoding_defaults else None  # validated first
        unknown = sorted(set(self.decoding_defaults) - set(HEAD_DEFAULT_FIELDS))
        if unknown:
            raise ValueError(
                f"decoding_defaults has fields a head cannot ship: {unknown}; a head's defaults are among "
                f"{list(HEAD_DEFAULT_FIELDS)} (token ids and lengths come from the backbone)."
            )
        super().save_pretrained(save_directory, *args, **kwargs)
        write_head_code(save_directory)
        if decoding is not None:
            decoding.save_pretrained(save_directory)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, LlamaRMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, LlamaRotaryEmbedding):
            # transformers 5 builds the model on the meta device and materialises the rotary embedding's
            # non-persistent `inv_freq` buffers empty: only its own `_init_weights` fills them (from the config).
            # Skipping it left uninitialised memory as the head's frequencies (zeros, sometimes NaN).
            super()._init_weights(module)

    @torch.no_grad()
    def zero_output(self) -> None:
        """Make h_C = 0 for every input: the last learned scale (out_proj, else the final norm) is zeroed."""
        last = self.out_proj if self.out_proj is not None else self.norm
        if last.weight.device.type != "meta":
            last.weight.zero_()

    def model_card(self, repo_id: str | None = None) -> str:
        """A Hub model card: what the head is for, its base model, how it was trained, what it measured
        (`mrp_hf.model_card.head_model_card`, as text)."""
        from .model_card import head_model_card

        return str(head_model_card(self, repo_id))

    def push_to_hub(
        self,
        repo_id: str,
        commit_message: str = "Upload MRP head",
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        commit_description: str | None = None,
        tags: list[str] | None = None,
        **save_kwargs: Any,
    ):
        """Upload the head's files (those `save_pretrained` writes: config.json, model.safetensors, the auto_map code
        files and custom_generate/) and its model card (README.md) in one commit, never the backbone. `private`,
        `token`, `revision` (a branch, created if missing), `create_pr`, `commit_message` and `commit_description`
        act as in transformers' `push_to_hub`; `tags` go into the card's metadata; other keyword arguments go to
        `save_pretrained` (e.g. `max_shard_size`). Returns the commit info."""
        import os
        import tempfile

        from huggingface_hub import CommitOperationAdd, HfApi

        from .model_card import head_model_card

        api = HfApi(token=token)
        repo_id = getattr(api.create_repo(repo_id, private=private, exist_ok=True), "repo_id", repo_id)
        if revision is not None and not revision.startswith("refs/pr"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder, **save_kwargs)
            head_model_card(self, repo_id, tags=tags).save(os.path.join(folder, "README.md"))
            names = sorted(
                os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/")
                for parent, _, files in os.walk(folder) for name in files
            )  # custom_generate/ is a subfolder
            operations = [
                CommitOperationAdd(path_in_repo=name, path_or_fileobj=os.path.join(folder, name)) for name in names
            ]
            return api.create_commit(repo_id=repo_id, operations=operations, commit_message=commit_message,
                                     commit_description=commit_description, revision=revision, create_pr=create_pr)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        lm_head_input: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """inputs_embeds: backbone embedding of the updated ids [B, L, H]; lm_head_input: h_A [B, L, H];
        attention_mask: bool [B, 1, L, L] of allowed keys (None: everything sees everything).
        Returns h_C [B, L, H] in the dtype of `lm_head_input`."""
        dtype = self.fuse.weight.dtype
        e, h = inputs_embeds.to(dtype), lm_head_input.to(dtype)
        z = self.fuse(torch.cat([self.embed_norm(e), self.hidden_norm(h)], dim=-1))
        if position_ids is None:
            position_ids = torch.arange(z.shape[1], device=z.device).unsqueeze(0).expand(z.shape[0], -1)
        if attention_mask is None:  # an explicit all-true mask keeps the Llama layer bidirectional
            attention_mask = torch.ones(z.shape[0], 1, z.shape[1], z.shape[1], dtype=torch.bool, device=z.device)
        position_embeddings = self.rotary_emb(z, position_ids)
        for layer in self.layers:
            z = layer(z, attention_mask=attention_mask, position_ids=position_ids, position_embeddings=position_embeddings)
            z = z[0] if isinstance(z, tuple) else z
        z = self.norm(z)
        if self.out_proj is not None:
            z = self.out_proj(z)
        return z.to(lm_head_input.dtype)


class MRPModel(PreTrainedModel, GenerationMixin):
    """A diffusion LM backbone wrapped with the project's decoding engine (and an MRP head, when it has one).

    `AutoModelForCausalLM.from_pretrained(head_repo)` builds one (its `config` is the head's `MRPConfig`), and so do
    `MRPModel.from_pretrained(head_repo_or_path, backbone=None)`, `MRPModel.from_backbone(model, head=None)` for a
    model already in memory and `MRPModel.from_backbone_pretrained(repo_or_path, ...)`. Without a head only
    `mrp_mode="off"` (the backbone's own static / dynamic decoding) is available. It follows transformers'
    generation conventions: `generation_config` (an `MRPGenerationConfig`: the backbone's generation_config.json,
    then the head's decoding defaults), `can_generate()`, `generation_config_class`; `save_pretrained` and
    `push_to_hub` write the head only (PEFT-style), never the backbone.
    """

    config_class = MRPConfig
    generation_config_class = MRPGenerationConfig
    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    _supports_sdpa = True

    def __init__(self, backbone: nn.Module, adapter: BackboneAdapter, head: nn.Module | None = None,
                 config: MRPConfig | None = None):
        if config is None:
            config = head.config if isinstance(head, MRPHead) else _headless_config(adapter)
        super().__init__(config)
        self.backbone = backbone
        self.adapter = adapter
        self.head = head
        self.generation_config = model_generation_config(backbone, head)

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModelForCausalLM") -> None:
        """Does nothing, as `MRPHead.register_for_auto_class` (the head's `save_pretrained` writes the code files)."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_backbone(
        cls,
        backbone: nn.Module,
        head: nn.Module | None = None,
        backbone_family: str | None = None,
        mask_token_id: int | None = None,
        strict: bool = True,
    ) -> MRPModel:
        """Wrap a loaded backbone (`PreTrainedModel`); the family is detected from its config unless forced.

        With an `MRPHead`, the backbone's facts come from the backbone itself, never from the head: its family
        from its config (or `backbone_family`), its mask id from `mask_token_id`, else its config, generation
        config or the family's documented default. They are then compared with what the head recorded (family,
        vocab, hidden size, mask id, weight fingerprint) and a mismatch raises `ValueError` naming both values.
        The head's mask id is used only for a backbone that declares none. `strict=False` turns a fingerprint
        mismatch (or a head without a fingerprint) into a warning."""
        head_config = head.config if isinstance(head, MRPHead) else None
        if head_config is not None and not isinstance(backbone, BackboneAdapter):
            backbone_family, mask_token_id = _backbone_identity(backbone, head_config, backbone_family, mask_token_id)
        adapter = get_adapter(backbone, backbone_family=backbone_family, mask_token_id=mask_token_id)
        if head_config is not None:
            check_head_matches_backbone(head_config, adapter, strict=strict)
        backbone.eval()
        return cls(backbone, adapter, head)

    @classmethod
    def from_pretrained(
        cls,
        head_name_or_path: str,
        *model_args: Any,
        backbone: nn.Module | None = None,
        strict: bool = True,
        revision: str | None = None,
        backbone_family: str | None = None,
        mask_token_id: int | None = None,
        **backbone_kwargs: Any,
    ) -> MRPModel:
        """Load an MRP head (safetensors + config only) and attach it to its backbone.

        With no `backbone`, the base model named in the head's config is loaded with `backbone_kwargs`
        (`torch_dtype` / `dtype`, `device_map`, `trust_remote_code`, ...), at the revision the head records
        (`revision` is the head's own), plus the PEFT adapter the config names. A base model recorded as a
        relative path must lie beside the head folder (inside the folder that holds it), and a head from the Hub
        must name its base model by Hub id. The backbone is then checked against the head (`from_backbone`):
        family, vocab, hidden size, mask id and weight fingerprint, each derived from the backbone itself; a
        mismatch raises `ValueError` naming both values; with `strict=False` a fingerprint mismatch is only a
        warning. This is also what `AutoModelForCausalLM.from_pretrained(head)` runs.
        """
        if len(model_args) == 1 and backbone is None and isinstance(model_args[0], nn.Module):
            backbone, model_args = model_args[0], ()  # from_pretrained(head, backbone), as before it was a PreTrainedModel
        if model_args:
            raise TypeError(
                f"MRPModel.from_pretrained takes the head and optionally the backbone as positional arguments, got "
                f"{len(model_args) + 1}; pass the rest by keyword."
            )
        for name in _AUTO_CLASS_ARGUMENTS:
            backbone_kwargs.pop(name, None)
        head_kwargs = {k: backbone_kwargs[k] for k in _HUB_KWARGS if k in backbone_kwargs}
        for name in ("config", "subfolder", "use_safetensors"):  # the head's, not the backbone's
            if name in backbone_kwargs:
                head_kwargs[name] = backbone_kwargs.pop(name)
        if "dtype" in backbone_kwargs:  # transformers 5's name for torch_dtype
            backbone_kwargs.setdefault("torch_dtype", backbone_kwargs.pop("dtype"))
        head = MRPHead.from_pretrained(head_name_or_path, revision=revision, **head_kwargs)
        config = head.config
        if backbone is None:
            if not config.base_model_name_or_path:
                raise ValueError(
                    f"The head at {head_name_or_path!r} does not name its base model; pass backbone=<loaded model>."
                )
            backbone_kwargs.setdefault("revision", config.base_model_revision)
            backbone, found_mask_id = load_backbone(
                _base_model_location(config.base_model_name_or_path, head_name_or_path),
                backbone_family=backbone_family, return_mask_token_id=True, **backbone_kwargs,
            )
            mask_token_id = mask_token_id if mask_token_id is not None else found_mask_id
            if config.peft_adapter_id:
                from peft import PeftModel

                backbone = PeftModel.from_pretrained(backbone, config.peft_adapter_id,
                                                     **{k: v for k, v in head_kwargs.items() if k in _HUB_KWARGS})
        model = cls.from_backbone(
            backbone, head=head, backbone_family=backbone_family, mask_token_id=mask_token_id, strict=strict
        )
        head.to(device=model.device)
        head.eval()
        return model

    @classmethod
    def from_backbone_pretrained(
        cls,
        pretrained_model_name_or_path: str,
        backbone_family: str | None = None,
        mask_token_id: int | None = None,
        **load_kwargs: Any,
    ) -> MRPModel:
        """Load a backbone by Hub id or local path (see `mrp_hf.load_backbone`) and wrap it."""
        backbone, found_mask_id = load_backbone(
            pretrained_model_name_or_path, backbone_family=backbone_family, return_mask_token_id=True, **load_kwargs
        )
        return cls.from_backbone(
            backbone, backbone_family=backbone_family, mask_token_id=mask_token_id if mask_token_id is not None else found_mask_id
        )

    # ------------------------------------------------------------------ the model
    @property
    def device(self) -> torch.device:
        return self.adapter.get_input_embeddings().weight.device

    def get_input_embeddings(self) -> nn.Module:
        return self.adapter.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.adapter.get_output_embeddings()

    def forward(self, *args: Any, **kwargs: Any):
        """The backbone's own forward (e.g. for log-likelihoods); decoding is `generate`."""
        return self.backbone(*args, **kwargs)

    def save_pretrained(self, save_directory, *args: Any, **kwargs: Any) -> None:
        """Save the head (`MRPHead.save_pretrained`), never the backbone: a head repo names its base model."""
        self._saved_head().save_pretrained(save_directory, *args, **kwargs)

    def push_to_hub(self, repo_id: str, *args: Any, **kwargs: Any):
        """Upload the head (`MRPHead.push_to_hub`), never the backbone."""
        return self._saved_head().push_to_hub(repo_id, *args, **kwargs)

    def _saved_head(self) -> MRPHead:
        if not isinstance(self.head, MRPHead):
            raise ValueError(
                "This MRPModel has no MRP head to save; save the backbone with model.backbone.save_pretrained(...)."
            )
        return self.head

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        streamer=None,
        logits_processor=None,
        stopping_criteria=None,
        **kwargs: Any,
    ) -> torch.LongTensor | MRPGenerateOutput:
        """Decode the answer after each (left-padded) prompt.

        Steps:
            1. Build the `MRPGenerationConfig`: `self.generation_config` (the backbone's generation_config.json,
               then the head's decoding defaults), then `generation_config`, then keyword arguments; validate.
               One rule for both places: a field outside `GENERATE_FIELDS` is refused with a TypeError.
            2. Build the block decoder of `mrp_mode` from the mode registry (`generation/modes.py`; `"off"`:
               static, or dynamic when `threshold` is set); modes that need a head refuse to run without one.
            3. Run the block loop (`DecodingEngine.run`): canvas and positions; per block, backbone
               forward, proposals (after `logits_processor`), reveals; per-row EOS and `stopping_criteria` stop;
               streamer (drafts through `put_draft`, confirmed tokens through `put`).
            4. Return `sequences` ([batch, prompt_len + max_new_tokens]), or with
               `return_dict_in_generate=True` an `MRPGenerateOutput` with `sequences` and `stats`.

        Keyword arguments are `MRPGenerationConfig` fields: `max_new_tokens`, `block_length`, `steps`,
        `tokens_per_step`, `threshold`, `confidence`, `temperature`, `top_k`, `top_p`, `seed`,
        `prefix_cache`, `mrp_mode`, `mrp_draft_tokens`, `mrp_draft_graph`, `mrp_drafter`, `eos_token_id`,
        `pad_token_id`, `return_dict_in_generate`, ... (`mrp_hf.generation.config.GENERATE_FIELDS`). `inputs` is taken as
        transformers' name for `input_ids`.
        """
        # 1. configuration
        if "mask_token_id" in kwargs:
            raise TypeError(
                f"generate() does not take mask_token_id: the mask id is fixed when the model is built (now "
                f"{self.adapter.mask_token_id}); pass it to MRPModel.from_backbone(...) or from_backbone_pretrained(...)."
            )
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        config = resolve_generate_config(self.generation_config, generation_config, kwargs)
        # 2. the mode's block decoder (generation/modes.py) and 3. the block loop (the engine validates the prompt
        # and moves it to the model's device)
        engine = DecodingEngine(self.adapter, config, head=self.head, logits_processor=logits_processor,
                                stopping_criteria=stopping_criteria)
        output = engine.run(input_ids, attention_mask, streamer=streamer)
        # 4. output
        return output if config.return_dict_in_generate else output.sequences


def model_generation_config(backbone: nn.Module, head: nn.Module | None) -> MRPGenerationConfig:
    """A wrapped model's decoding defaults: the backbone's generation config (all of an MRP one; the token ids and
    max_new_tokens of another), then the head's `decoding_defaults` (its repo's generation_config.json)."""
    config = build_generation_config(getattr(backbone, "generation_config", None))
    decoding = getattr(head, "decoding_defaults", None)
    return build_generation_config(config, **decoding) if decoding else config


def _headless_config(adapter: BackboneAdapter) -> MRPConfig:
    """The config of an MRPModel without a head: the backbone's identity, no head layers to speak of."""
    return MRPConfig(
        hidden_size=adapter.hidden_size, num_attention_heads=1, vocab_size=adapter.vocab_size,
        mask_token_id=adapter.mask_token_id, backbone_family=adapter.family,
        base_model_name_or_path=getattr(adapter.config, "_name_or_path", None) or None,
    )


def _saved_decoding_defaults(name_or_path: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The decoding defaults of a head's generation_config.json (the fields it sets among `HEAD_DEFAULT_FIELDS`,
    validated), or {} when it has none."""
    location = {k: kwargs[k] for k in (*_HUB_KWARGS, "revision", "subfolder") if kwargs.get(k) is not None}
    try:
        saved = MRPGenerationConfig.from_pretrained(name_or_path, **location)
    except OSError:
        return {}
    return {k: getattr(saved, k) for k in HEAD_DEFAULT_FIELDS if getattr(saved, k) != _DEFAULTS[k]}


def _base_model_location(base: str, head_name_or_path: str) -> str:
    """Where to load the base model a head names, refusing places a head must not send the loader.

    A base model recorded as a relative path ("../backbone") is relative to a local head folder, so a head
    saved next to its backbone (the bundled reference head) keeps pointing at it wherever the pair is copied;
    it must stay inside the folder that holds the head folder (a head must not make the loader, and maybe its
    remote code, run from elsewhere on the machine). A head from the Hub must name a Hub id, not a local path.
    """
    import os

    local_head = os.path.isdir(head_name_or_path)
    relative = base.startswith(("./", "../")) or base in (".", "..")
    if os.path.isabs(base) or relative or ".." in base.replace("\\", "/").split("/"):
        if not local_head:
            raise ValueError(
                f"The head {head_name_or_path!r} comes from the Hub but names a local base model path {base!r}; "
                f"a published head must name its base model by Hub id. Pass backbone=<loaded model> to use it anyway."
            )
        if not os.path.isabs(base):
            holder = os.path.dirname(os.path.realpath(head_name_or_path))
            location = os.path.realpath(os.path.join(head_name_or_path, base))
            if os.path.commonpath([holder, location]) != holder:
                raise ValueError(
                    f"The head at {head_name_or_path!r} names its base model as {base!r}, which resolves to "
                    f"{location}, outside {holder} (the folder holding the head). Refusing to load a model from "
                    f"there; pass backbone=<loaded model> or fix base_model_name_or_path in the head's config.json."
                )
            return location
    return base


def _backbone_identity(backbone: nn.Module, head_config: MRPConfig, family: str | None, mask_token_id: int | None):
    """The backbone's family and mask id, derived from the backbone (and explicit arguments) alone."""
    adapter_cls = resolve_adapter_class(backbone.config, family)
    claimed = head_config.backbone_family
    if claimed and claimed != adapter_cls.family:
        how = f"was given backbone_family={family!r}" if family else f"is detected as {adapter_cls.family!r} from its config"
        hint = (
            f"; if it really is a {claimed!r} model, pass backbone_family={claimed!r}"
            if adapter_cls.family == "generic" and not family else ""
        )
        raise ValueError(
            f"This MRP head was trained on a {claimed!r} backbone, but this backbone ({type(backbone).__name__}) "
            f"{how}{hint}."
        )
    if mask_token_id is None:
        mask_token_id = adapter_cls.own_mask_token_id(backbone)
    if mask_token_id is None and head_config.mask_token_id is not None:
        logger.info("The backbone declares no mask token id; using the head's recorded %d.", head_config.mask_token_id)
        mask_token_id = head_config.mask_token_id
    return adapter_cls.family, mask_token_id


def _check_head_weights(cls: type[MRPHead], name_or_path: str, kwargs: dict[str, Any]) -> None:
    """Before `from_pretrained` allocates anything: the config's sizes are sane (MRPConfig checks them) and the
    safetensors file(s) hold exactly the tensors, with the shapes, that this config builds."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    location = {k: kwargs[k] for k in (*_HUB_KWARGS, "revision", "subfolder") if kwargs.get(k) is not None}
    config = kwargs.get("config")
    if not isinstance(config, MRPConfig):
        config = MRPConfig.from_pretrained(name_or_path, **location)
    files = []
    index = cached_file(name_or_path, "model.safetensors.index.json", _raise_exceptions_for_missing_entries=False,
                        **location)
    if index is not None:
        import json

        with open(index, encoding="utf-8") as handle:
            shards = sorted(set(json.load(handle)["weight_map"].values()))
        files = [cached_file(name_or_path, shard, **location) for shard in shards]
    else:
        single = cached_file(name_or_path, "model.safetensors", _raise_exceptions_for_missing_entries=False, **location)
        if single is None:
            raise OSError(
                f"{name_or_path!r} has no model.safetensors: MRP heads are loaded from safetensors only (a pickle "
                f"can run code when loaded)."
            )
        files = [single]
    found: dict[str, tuple[int, ...]] = {}
    for path in files:
        with safe_open(path, framework="pt") as weights:
            for key in weights.keys():
                found[key] = tuple(weights.get_slice(key).get_shape())
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in cls(config).state_dict().items()}
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if wrong:
            parts.append(", ".join(f"{k} has shape {list(found[k])}, the config builds {list(expected[k])}" for k in wrong[:5]))
        raise ValueError(
            f"The weights of the MRP head at {name_or_path!r} do not match its config.json: {'; '.join(parts)}. "
            f"Refusing to load (missing tensors would be initialised at random); re-save the head with "
            f"MRPHead.save_pretrained."
        )


def check_head_matches_backbone(config: MRPConfig, adapter: BackboneAdapter, strict: bool = True) -> None:
    """Refuse a backbone the head was not trained for; each message names both values."""
    from .configuration_mrp import backbone_fingerprint, fingerprints_match

    checks = [
        ("vocab size", config.vocab_size, adapter.vocab_size),
        ("hidden size", config.hidden_size, adapter.hidden_size),
        ("mask token id", config.mask_token_id, adapter.mask_token_id),
    ]
    for what, trained, found in checks:
        if trained is not None and trained != found:
            raise ValueError(
                f"This MRP head was trained for {what} {trained}, but the backbone has {found}: load the base "
                f"model it names ({config.base_model_name_or_path!r}) or train a head for this backbone."
            )
    if config.backbone_family and config.backbone_family != adapter.family:
        raise ValueError(
            f"This MRP head was trained on a {config.backbone_family!r} backbone, but this one is {adapter.family!r}."
        )
    if not config.backbone_fingerprint:
        message = (
            "This MRP head records no fingerprint of its backbone's embedding/lm_head weights, so nothing shows it "
            "was trained on this backbone; re-save it with MRPConfig.for_backbone (mrp-hf train does), or pass "
            "strict=False to attach it anyway."
        )
        if strict:
            raise ValueError(message)
        logger.warning(message)
    else:
        found = backbone_fingerprint(adapter)
        if not fingerprints_match(config.backbone_fingerprint, found):
            message = (
                f"The backbone's embedding/lm_head weights do not match the fingerprint recorded with this head "
                f"(trained on {config.base_model_name_or_path!r} revision {config.base_model_revision!r}): "
                f"expected {config.backbone_fingerprint[:4]}..., found {found[:4]}.... Use the recorded base model, "
                f"or pass strict=False to attach it anyway."
            )
            if strict:
                raise ValueError(message)
            logger.warning(message)


def attach(backbone: nn.Module, head: MRPHead | None = None, strict: bool = True, **kwargs: Any) -> nn.Module:
    """Give a loaded backbone `generate(..., mrp_mode=...)` in place (PEFT-style) and return it.

    The backbone's own `generate` stays reachable as `backbone.mrp.backbone.__class__.generate`; the wrapper
    is `backbone.mrp`.
    """
    model = MRPModel.from_backbone(backbone, head=head, strict=strict, **kwargs)
    object.__setattr__(backbone, "mrp", model)  # not a submodule: saving the backbone must not save the head
    backbone.generate = model.generate
    return backbone

