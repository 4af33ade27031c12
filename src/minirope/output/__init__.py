"""What a run leaves behind, and where it goes:

    folder  an earlier run in the output folder (another model refused, a finished one announced), atomic
            publication (`finish_run`: staged, then moved in), the push of the finished folder
    card    the model card every command writes (`model_card`, `card_name`, `optimizer_description`)
    hub     every Hub rule, through `huggingface_hub`: the repo id, the push checked before any work (token, write
            access to the namespace), the resume from the Hub's `last-checkpoint/`
    plots   the loss-curve plot

It imports the top-level model files only, never `data`, `training` or the commands.
"""
