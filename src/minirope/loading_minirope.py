"""How minirope models load and save: safetensors only, clear errors for corrupt files, every head in `auto_map`;
and what being registered as custom code would otherwise cost at every generated token.

`MiniRopeLoadingMixin` goes before `PreTrainedModel` among `MiniRopePreTrainedModel`'s bases. It is shipped with
`modeling_minirope.py` as remote code (it imports only transformers), so a folder loaded with
`trust_remote_code=True` where minirope is not installed follows the same rules.
"""

import inspect
from pathlib import Path

# The Auto class that builds each model from a `minirope` config (registered by `import minirope`).
AUTO_CLASSES = {
    "AutoModel": "MiniRopeModel",
    "AutoModelForCausalLM": "MiniRopeForCausalLM",
    "AutoModelForSequenceClassification": "MiniRopeForSequenceClassification",
    "AutoModelForTokenClassification": "MiniRopeForTokenClassification",
    "AutoModelForQuestionAnswering": "MiniRopeForQuestionAnswering",
}


class MiniRopeLoadingMixin:
    """`from_pretrained` and `save_pretrained` of `PreTrainedModel`, with minirope's loading and packaging rules."""

    def __init_subclass__(cls, **kwargs):
        """Give each model's `forward` its signature, computed once.

        A model registered for an Auto class (as `import minirope` registers these, so that `save_pretrained`
        ships the code) is custom code to transformers, and `generate()` then reads `inspect.signature(forward)`
        at every step (transformers 5's `cache_position` check for custom models); with `__signature__` set it
        reads this one (the saving, measured: docs/performance.md, "Constants and their measurements").
        """
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:
            cls.forward.__signature__ = inspect.signature(cls.forward)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with safetensors as the only weight format by default.

        A folder holding only a pickle (`pytorch_model.bin`) is refused unless `use_safetensors=False` is
        passed explicitly (unpickling runs code from the file).

        Raises:
            OSError: no safetensors weights, or a truncated/corrupt `model.safetensors`.
        """
        kwargs.setdefault("use_safetensors", True)
        folder = Path(str(pretrained_model_name_or_path))
        if kwargs["use_safetensors"] and folder.is_dir() and not any(folder.glob("*.safetensors")):
            if any(folder.glob("pytorch_model*.bin")):
                raise OSError(
                    f"{folder} holds only pickle weights (pytorch_model.bin), which are not loaded by default: "
                    f"convert them with `model.save_pretrained()` (writes model.safetensors), or pass "
                    f"use_safetensors=False if you trust the file."
                )
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except Exception as error:
            if type(error).__name__ != "SafetensorError":
                raise
            raise OSError(
                f"The weights in {pretrained_model_name_or_path} are truncated or corrupt ({error}): "
                f"copy or download model.safetensors again, or re-save the model."
            ) from error

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`; a folder that ships remote code lists every head in `auto_map`.

        So that `AutoModelFor{CausalLM,SequenceClassification,TokenClassification,QuestionAnswering}` and
        `AutoModel` all load it with `trust_remote_code=True` where minirope is not installed.
        """
        if self._auto_class is not None:
            heads = {auto_class: f"modeling_minirope.{name}" for auto_class, name in AUTO_CLASSES.items()}
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **heads}
        super().save_pretrained(save_directory, *args, **kwargs)
