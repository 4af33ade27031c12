"""What a run leaves behind, and where it goes:

    folder  the output folder claimed and taken, an earlier run in it (another model refused, a finished one
            announced), publication by journal (`finish_run`), the push of what the run published, the Trainer's
            checkpoints kept to the folder rules (`OwnFolder`)
    card    the model card every command writes (`model_card`, `card_name`, `optimizer_description`)
    hub     every Hub rule, through `huggingface_hub`: the repo id, the push checked before any work (token, write
            access to the namespace), the resume from the Hub's `last-checkpoint/`
    plots   the loss-curve plot

What a command may touch (the marker, the lock, durable writes) is `minirope.owned`'s.

It imports the top-level model files only, never `data`, `training` or the commands.
"""
