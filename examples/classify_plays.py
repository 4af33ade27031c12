"""Fine-tune a pretrained minirope model as a classifier: which of the four validation plays a speech comes from.

    python examples/classify_plays.py --model runs/minirope-shakespeare --output_dir runs/play-classifier

The four validation plays were held out from pretraining. Each speech (a blank-line-separated block) loses its
speaker line, so the play must be told from the words alone; speeches are split 80/20 at random (seed 0) into
training and held-out sets. `AutoModelForSequenceClassification` puts a fresh `score` head on the pretrained
decoder (`MiniRopeForSequenceClassification`, Llama's head), the stock `Trainer` fine-tunes everything, and the
held-out accuracy is printed against the majority-class baseline and written to `classify_results.json`.
"""

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)

import minirope  # noqa: F401  (registers the minirope classes with the Auto factories)
from minirope.data.bundled import shakespeare_dataset


@dataclass
class ClassifyArguments:
    model: str = field(default="runs/minirope-shakespeare", metadata={"help": "A pretrained minirope folder."})
    max_length: int = field(default=128, metadata={"help": "Tokens kept per speech."})


def speeches_by_play() -> list[tuple[str, str]]:
    """`(speech without its speaker line, play)` for every speech of the four validation plays."""
    rows = []
    for play in shakespeare_dataset()["validation"]:
        for block in play["text"].split("\n\n"):
            _, _, speech = block.strip().partition("\n")
            if speech.strip():
                rows.append((speech.strip(), play["source"]))
    return rows


def main() -> None:
    parser = HfArgumentParser((ClassifyArguments, TrainingArguments))
    args, training_args = parser.parse_args_into_dataclasses()
    rows = speeches_by_play()
    random.Random(0).shuffle(rows)
    labels = sorted({play for _, play in rows})
    label_id = {play: index for index, play in enumerate(labels)}
    cut = int(0.8 * len(rows))
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def dataset(part: list[tuple[str, str]]) -> Dataset:
        data = Dataset.from_dict({"text": [text for text, _ in part], "label": [label_id[p] for _, p in part]})
        return data.map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=args.max_length),
                        batched=True, remove_columns=["text"])  # fmt: skip

    train, held_out = dataset(rows[:cut]), dataset(rows[cut:])
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_id
    )

    def accuracy(prediction) -> dict:
        return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=held_out,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
    )
    trainer.train()
    result = trainer.evaluate()
    majority = max(np.bincount(held_out["label"])) / len(held_out)
    summary = {
        "held_out_accuracy": result["eval_accuracy"],
        "majority_class_accuracy": float(majority),
        "train_speeches": len(train),
        "held_out_speeches": len(held_out),
        "labels": labels,
        "steps": trainer.state.global_step,
    }
    trainer.save_model()
    Path(training_args.output_dir, "classify_results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"held-out accuracy {summary['held_out_accuracy']:.3f} on {len(held_out)} speeches of 4 plays "
        f"(majority class: {majority:.3f})"
    )


if __name__ == "__main__":
    main()
