"""Conversations: `{"messages": [...]}` rows checked, rendered with the tokenizer's chat template
(`minirope.tokenizer_format.CHAT_TEMPLATE`), and labelled for a loss on the assistant turns only."""

from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

from minirope.data.blocks import IGNORE_INDEX
from minirope.data.formats import records
from minirope.data.supervised import keep_labelled
from minirope.tokenizer_format import GENERATION_TAG, ROLES


def check_conversation(messages, where: str) -> list[dict]:
    """`messages` as `[{"role", "content"}, ...]` with string roles and contents.

    Raises:
        ValueError: not a list of such dicts, an empty list, a role other than system/user/assistant, or no
            assistant turn (nothing to train on), naming `where` (file and row).
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} turns.")
    turns = []
    for turn in messages:
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
            raise ValueError(f"{where}: every turn needs string fields 'role' and 'content', got {turn!r:.80}.")
        if turn["role"] not in ROLES:
            raise ValueError(f"{where}: unknown role {turn['role']!r}: use {', '.join(ROLES)}.")
        turns.append({"role": turn["role"], "content": turn["content"]})
    if not any(turn["role"] == "assistant" for turn in turns):
        raise ValueError(f"{where}: no assistant turn, so nothing to train on: add one or remove the row.")
    return turns


def load_conversations(train_files: list[str], validation_files: list[str]) -> DatasetDict:
    """Records files (`.jsonl`, `.json`, `.parquet`) of `{"messages": [...]}` rows, checked, as a `DatasetDict`.

    Raises:
        FileNotFoundError, ValueError: a missing or unreadable file, or a bad row (`check_conversation`).
    """
    splits = {}
    for split, paths in (("train", train_files), ("validation", validation_files)):
        rows = (
            (where, row.get("messages") if isinstance(row, dict) else None)
            for path in paths
            for where, row in records(path)
        )
        splits[split] = checked(rows)
    return DatasetDict(splits)


def dataset_conversations(dataset: DatasetDict, name: str) -> DatasetDict:
    """The `train` and `validation` splits of a `datasets` dataset with a `messages` column, checked row by row.

    Raises:
        ValueError: a split is missing, or a bad row (`check_conversation`, naming the dataset, split and row).
    """
    for split in ("train", "validation"):
        if split not in dataset:
            raise ValueError(f"--dataset_name {name} has no {split!r} split (splits: {list(dataset)}).")
    return DatasetDict(
        {
            split: checked(
                (f"{name} {split} row {i}", messages) for i, messages in enumerate(dataset[split]["messages"])
            )
            for split in ("train", "validation")
        }
    )


def checked(rows) -> Dataset:
    """A `messages` dataset of `(where, messages)` pairs, each checked by `check_conversation`."""
    return Dataset.from_list([{"messages": check_conversation(messages, where)} for where, messages in rows])


def conversation_features(messages: list[dict], tokenizer: PreTrainedTokenizerBase, block_size: int) -> dict:
    """One conversation as `input_ids`, `attention_mask` and `labels` (-100 outside the assistant turns), cut to
    `block_size` tokens: the chat template's rendering and its assistant mask (`assistant_mask`).

    Raises:
        ValueError: a template without `{% generation %}` markers whose turns cannot be found (`assistant_mask`).
    """
    input_ids, mask = assistant_mask(messages, tokenizer)
    input_ids, mask = input_ids[:block_size], mask[:block_size]
    labels = [token if keep else IGNORE_INDEX for token, keep in zip(input_ids, mask, strict=True)]
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def assistant_mask(messages: list[dict], tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The chat template's token ids of `messages` and a 0/1 mask of the assistant turns' tokens.

    A template with transformers' `{% generation %}` markers (minirope's) gives the mask itself
    (`return_assistant_tokens_mask`). A released model's template rarely has them (SmolLM2's, Llama 3's); then each
    assistant turn is what the conversation up to it adds to the conversation before it with the assistant's turn
    opened (`add_generation_prompt=True`): its content and whatever closes it (`<|im_end|>`, `<|eot_id|>`), as TRL
    masks a conversational prompt-completion row. Tokens are matched to those characters by their offsets (a fast
    tokenizer).

    Raises:
        ValueError: a template that renders a conversation's start differently once more turns follow (so a turn
            cannot be located), or a tokenizer without offsets.
    """
    if GENERATION_TAG.search(tokenizer.chat_template or ""):
        encoded = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        return list(encoded["input_ids"]), list(encoded["assistant_masks"])
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        opened = tokenizer.apply_chat_template(messages[:turn], tokenize=False, add_generation_prompt=True)
        closed = tokenizer.apply_chat_template(messages[: turn + 1], tokenize=False)
        if not (closed.startswith(opened) and text.startswith(closed)):
            raise ValueError(
                "the tokenizer's chat template renders a conversation's start differently once more turns follow, "
                "so its assistant turns cannot be found: add {% generation %} markers around each assistant message "
                "(transformers' chat templating guide)."
            )
        spans.append((len(opened), len(closed)))
    if not tokenizer.is_fast:
        raise ValueError(
            "finding the assistant turns of a template without {% generation %} markers needs a fast tokenizer "
            "(character offsets): add the markers, or save the tokenizer as tokenizer.json."
        )
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(start <= first < end for start, end in spans)) for first, _ in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), mask


def conversation_examples(
    conversations: DatasetDict, tokenizer: PreTrainedTokenizerBase, block_size: int, limits: dict
) -> tuple[Dataset, Dataset]:
    """Training and validation examples of `conversations` (`conversation_features`); conversations left with
    no assistant token within `block_size` are dropped; `limits` caps each split's rows (None: all).

    Raises:
        ValueError: no conversation of a split keeps an assistant token.
    """
    tokenized = conversations.map(
        lambda row: conversation_features(row["messages"], tokenizer, block_size),
        remove_columns=list(conversations["train"].column_names),
        desc="Rendering conversations",
    )
    return keep_labelled(tokenized, "conversation", block_size, limits)
