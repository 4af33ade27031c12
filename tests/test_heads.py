"""Task heads: equal to Llama's heads on the same weights, and built, trained and loaded as transformers expects.

Oracle: transformers' `LlamaFor{SequenceClassification,TokenClassification,QuestionAnswering}` with the same
config fields and the same state dict, loaded strictly.
"""

import pytest
import torch
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    LlamaConfig,
    LlamaForQuestionAnswering,
    LlamaForSequenceClassification,
    LlamaForTokenClassification,
)

from minirope import MiniRopeForQuestionAnswering, MiniRopeForSequenceClassification, MiniRopeForTokenClassification
from tests.conftest import left_padded_batch, random_model, tiny_config

PAIRS = {
    "sequence": (AutoModelForSequenceClassification, MiniRopeForSequenceClassification, LlamaForSequenceClassification),
    "token": (AutoModelForTokenClassification, MiniRopeForTokenClassification, LlamaForTokenClassification),
    "qa": (AutoModelForQuestionAnswering, MiniRopeForQuestionAnswering, LlamaForQuestionAnswering),
}


def twins(kind: str, **overrides):
    """A minirope head with random weights (from_config through the Auto class) and its Llama twin."""
    auto_class, minirope_class, llama_class = PAIRS[kind]
    config = tiny_config("gqa", num_labels=3, **overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = auto_class.from_config(config).eval()
    assert type(model) is minirope_class
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.1)
    fields = config.to_dict()
    for key in ("model_type", "auto_map", "architectures", "transformers_version"):
        fields.pop(key, None)
    llama_config = LlamaConfig(**fields)
    llama_config._attn_implementation = "eager"
    llama = llama_class(llama_config).eval()
    llama.load_state_dict(model.state_dict(), strict=True)  # same parameter names, same shapes
    return model, llama


def assert_same_outputs(ours, theirs, names):
    for name in names:
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize(
    ("problem_type", "labels"),
    [
        ("single_label_classification", torch.tensor([0, 2, 1])),
        ("multi_label_classification", torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])),
        ("regression", torch.randn(3, 3)),
    ],
)
def test_sequence_classification_matches_llama(problem_type, labels):
    model, llama = twins("sequence", problem_type=problem_type)
    input_ids, attention_mask, _ = left_padded_batch(model.config.vocab_size)
    pads = (attention_mask == 0).sum(-1).tolist()
    right_padded = torch.stack([row.roll(-pad) for row, pad in zip(input_ids, pads, strict=True)])
    for ids in (input_ids, right_padded):  # the last non-pad token, with left or right padding
        with torch.no_grad():
            ours, theirs = model(ids, labels=labels), llama(ids, labels=labels)
        assert ours.logits.shape == (3, 3)
        assert_same_outputs(ours, theirs, ("logits", "loss"))


def test_sequence_classification_reads_the_last_non_pad_token():
    model, _ = twins("sequence")
    input_ids, attention_mask, _ = left_padded_batch(model.config.vocab_size, lengths=(5, 3))
    with torch.no_grad():
        pooled = model(input_ids).logits
        every_token = model.score(model.model(input_ids).last_hidden_state)
    torch.testing.assert_close(pooled, every_token[:, -1])  # left padding: the last position
    model.config.pad_token_id = None
    with pytest.raises(ValueError, match="no padding token"):
        model(input_ids)


def test_token_classification_matches_llama():
    model, llama = twins("token")
    input_ids, attention_mask, _ = left_padded_batch(model.config.vocab_size)
    labels = torch.randint(0, 3, input_ids.shape).masked_fill(attention_mask == 0, -100)
    with torch.no_grad():
        ours = model(input_ids, attention_mask=attention_mask, labels=labels)
        theirs = llama(input_ids, attention_mask=attention_mask, labels=labels)
    assert ours.logits.shape == (*input_ids.shape, 3)
    assert_same_outputs(ours, theirs, ("logits", "loss"))


def test_question_answering_matches_llama():
    model, llama = twins("qa")
    assert model.base_model_prefix == "transformer" and hasattr(model, "transformer")
    input_ids, attention_mask, _ = left_padded_batch(model.config.vocab_size)
    starts, ends = torch.tensor([2, 5, 9]), torch.tensor([4, 8, 11])
    with torch.no_grad():
        ours = model(input_ids, attention_mask=attention_mask, start_positions=starts, end_positions=ends)
        theirs = llama(input_ids, attention_mask=attention_mask, start_positions=starts, end_positions=ends)
    assert_same_outputs(ours, theirs, ("start_logits", "end_logits", "loss"))


def test_heads_load_from_a_causal_lm_folder_and_with_mismatched_sizes(tmp_path):
    lm = random_model(tiny_config("gqa"))
    lm.save_pretrained(tmp_path / "lm")
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=4)
    assert type(classifier) is MiniRopeForSequenceClassification
    for name, param in lm.model.state_dict().items():  # the decoder comes over, the head is new
        assert torch.equal(classifier.model.state_dict()[name], param), name
    assert classifier.score.weight.shape == (4, lm.config.hidden_size)

    classifier.save_pretrained(tmp_path / "classifier")
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path / "classifier", num_labels=2)
    resized = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "classifier", num_labels=2, ignore_mismatched_sizes=True
    )
    assert resized.score.weight.shape == (2, lm.config.hidden_size)
    assert torch.equal(resized.model.embed_tokens.weight, lm.model.embed_tokens.weight)


def test_sequence_classifier_trains_with_the_trainer(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    model, _ = twins("sequence")
    model.train()
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 97, (64, 12), generator=generator)
    labels = (rows[:, -1] % 3).tolist()  # learnable: the label is a function of the last token
    data = Dataset.from_dict({"input_ids": rows.tolist(), "labels": labels})
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=60,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < 0.5 * losses[0]
