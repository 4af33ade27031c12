"""The format of minirope's tokenizer: what `minirope.data.tokenizer` writes and the commands, exports and
servers read. Constants only, no dependency: a model folder's reader (`minirope.folders`, `minirope.export`) and the
trainer of tokenizers (`minirope.data.tokenizer`) share them without importing each other.

Pre-tokenization is Llama 3's regex (`PRE_TOKENIZER_PATTERN`, the `Split` then `ByteLevel` of Meta-Llama-3's
`tokenizer.json`, which llama.cpp knows as `llama-bpe`).

The chat template (`CHAT_TEMPLATE`) is Zephyr's format (HuggingFaceH4/zephyr-7b-beta): each turn is its role
marker, a newline, the content and the eos token, then a newline; the generation prompt is the assistant marker
and a newline, so the model answers and closes its turn with eos, where `generate()` and every server stop:

    <|system|>\nYou are Hamlet.</s>\n<|user|>\nWho is there?</s>\n<|assistant|>\nNay, answer me.</s>\n

The three role markers are special tokens (one id each, never produced from text, dropped by
`decode(..., skip_special_tokens=True)`). The assistant's content and its eos sit inside `{% generation %}`
markers, from which `apply_chat_template(..., return_assistant_tokens_mask=True)` (and TRL's
`assistant_only_loss`) find the tokens to train on.
"""

import re

# transformers' Jinja tags around the tokens an assistant-only loss trains on
GENERATION_TAG = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")
# Llama 3's pre-tokenizer regex (Meta-Llama-3-8B's tokenizer.json; llama.cpp's `llama-bpe`): contractions, letters
# with at most one other character before them, digits in threes, punctuation with the newlines after it, white
# space ending in newlines, other white space.
PRE_TOKENIZER_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
ROLES = ("system", "user", "assistant")
CHAT_TOKENS = [f"<|{role}|>" for role in ROLES]
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown role ' + message['role'] + ': use system, user or assistant') }}"
    "{%- endif -%}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{%- else -%}"
    "{{ message['content'] + eos_token }}"
    "{%- endif -%}"
    "{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
RESERVED_TOKENS = len(SPECIAL_TOKENS) + len(CHAT_TOKENS) + 256  # special tokens and bytes: the rest are merges
