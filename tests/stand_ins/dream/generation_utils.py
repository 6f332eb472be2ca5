"""Tiny stand-in for Dream's ``generation_utils.DreamGenerationConfig`` (Hub Dream and Fast-dLLM's copy).

Written for the mrp-hf tests; only the interface that matters to a loader follows the Hub file:

* ``DreamGenerationConfig`` subclasses ``transformers.GenerationConfig`` but does not call its
  ``__init__``: it sets its own fields (Dream's diffusion settings ``eps``, ``steps``, ``alg``, ``alg_temp``
  and the token ids, the mask id included) and then calls ``self.validate(is_init=True)``;
* ``validate(self, is_init=False)`` has that exact signature and checks nothing. transformers 5.x's
  ``GenerationConfig.update`` (called by ``from_dict`` inside ``from_pretrained``) calls
  ``self.validate(user_set_attributes=...)``, so on 5.x loading a Dream model fails with
  ``TypeError: DreamGenerationConfig.validate() got an unexpected keyword argument 'user_set_attributes'``,
  as it does with the Hub files; 4.x calls ``validate()`` without arguments and loads.

The Hub file also holds ``DreamGenerationMixin.diffusion_generate``; the library never calls it, so the
stand-in leaves it out.
"""

from transformers import GenerationConfig, __version__


class DreamGenerationConfig(GenerationConfig):
    def __init__(self, **kwargs):
        # sampling (Dream's own defaults, not GenerationConfig's)
        self.temperature = kwargs.pop("temperature", 0.0)
        self.top_p = kwargs.pop("top_p", None)
        self.top_k = kwargs.pop("top_k", None)
        self.max_length = kwargs.pop("max_length", 20)
        self.max_new_tokens = kwargs.pop("max_new_tokens", None)
        # diffusion schedule: timesteps linspace(1, eps, steps + 1); alg names the confidence rule
        self.eps = kwargs.pop("eps", 1e-3)
        self.steps = kwargs.pop("steps", 512)
        self.alg = kwargs.pop("alg", "origin")
        self.alg_temp = kwargs.pop("alg_temp", None)
        # outputs
        self.num_return_sequences = kwargs.pop("num_return_sequences", 1)
        self.return_dict_in_generate = kwargs.pop("return_dict_in_generate", False)
        self.output_history = kwargs.pop("output_history", False)
        # special tokens
        self.mask_token_id = kwargs.pop("mask_token_id", None)
        self.pad_token_id = kwargs.pop("pad_token_id", None)
        self.bos_token_id = kwargs.pop("bos_token_id", None)
        self.eos_token_id = kwargs.pop("eos_token_id", None)
        self.generation_kwargs = kwargs.pop("generation_kwargs", {})
        # bookkeeping fields of GenerationConfig
        self._from_model_config = kwargs.pop("_from_model_config", False)
        self._commit_hash = kwargs.pop("_commit_hash", None)
        self.transformers_version = kwargs.pop("transformers_version", __version__)
        if not self._from_model_config:  # any other saved field becomes an attribute
            for key, value in kwargs.items():
                setattr(self, key, value)
        self.validate(is_init=True)

    def validate(self, is_init=False):
        pass
