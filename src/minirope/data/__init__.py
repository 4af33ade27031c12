"""The data's path, files -> documents -> tokens -> blocks, for every command that trains:

    documents   documents and shards: `.txt` files read in chunks, in-memory texts, `datasets` streams; file checks
    formats     `.jsonl`/`.json`/`.parquet` record files: a file's shard by its suffix, its records and fields
    bundled     the bundled corpus: the 38 plays, the split by play, one play for fine-tuning, dialogue as chats
    sources     which shards a run reads, training and validation (files of one kind, a dataset split, the plays)
    tokenizer   the byte-level BPE trained on the training shards' first bytes; exact `TextPieces`; byte lengths
    blocks      framing, tokens in exact pieces, packing, repeats, validation windows; `IGNORE_INDEX`
    stream      `BlockStream`: the training blocks epoch after epoch, shuffled in a window, resumable
    supervised  prompt/completion records with the loss on the completion
    chat        `{"messages"}` rows checked, rendered with the chat template, labelled on the assistant turns
    pipeline    the data flags (`TextDataArguments`) and the datasets a run trains and validates on

It imports the top-level model files only (`tokenizer_format`, `folders`), never `training`, `output` or the
commands.
"""
