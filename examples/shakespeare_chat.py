"""Chat with a Shakespeare model: the bundled plays' dialogue as conversations, a conversational fine-tune of a
pretrained minirope folder, and the result behind `transformers serve`, asked through the `openai` client.

Each reply by another speaker becomes one conversation: the replying speaker's name as the system turn,
the speech before it as the user turn, the reply as the assistant turn
(`minirope.data.bundled.shakespeare_conversations`).

    make demo                                              # runs/minirope-shakespeare
    python examples/shakespeare_chat.py                    # fine-tune, export, serve, ask; a few minutes on 2 cores
    python examples/shakespeare_chat.py --max_steps 50     # a quicker look

Steps it runs (each one a command you can run alone):
    minirope-finetune --model_name_or_path runs/minirope-shakespeare --train_file data/chat-train.jsonl \\
        --validation_file data/chat-validation.jsonl --output_dir runs/minirope-chat
    minirope-export --model runs/minirope-chat --format llama --output runs/minirope-chat-llama
    transformers serve runs/minirope-chat-llama --host 127.0.0.1 --port 8000
"""

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from minirope.commands import finetune
from minirope.data.bundled import shakespeare_conversations
from minirope.export import export_llama

QUESTIONS = [
    ("HAMLET", "Who's there?"),
    ("JULIET", "Romeo, where art thou?"),
    ("KING HENRY", "What news, my lord?"),
]


def write_conversations(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for split in ("train", "validation"):
        path = folder / f"chat-{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in shakespeare_conversations(split)))
        paths.append(path)
    return tuple(paths)


def ask(port: int, model: str) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    answers = []
    for speaker, question in QUESTIONS:
        messages = [{"role": "system", "content": speaker}, {"role": "user", "content": question}]
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=60, temperature=0.0)
        answers.append(reply.choices[0].message.content)
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/minirope-shakespeare", help="a pretrained minirope folder")
    parser.add_argument("--output_dir", default="runs/minirope-chat")
    parser.add_argument("--data_dir", default="data")
    parser.add_argument("--max_steps", default="400", help="fine-tuning steps (batch 16)")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()

    train, validation = write_conversations(Path(args.data_dir))
    result = finetune.run([
        "--model_name_or_path", args.model, "--output_dir", args.output_dir, "--train_file", str(train),
        "--validation_file", str(validation), "--max_steps", args.max_steps, "--learning_rate", "1e-3",
        "--max_eval_samples", "512", "--eval_strategy", "no", "--save_strategy", "no", "--overwrite_output_dir", "True",
    ])  # fmt: skip
    llama = export_llama(args.output_dir, f"{args.output_dir}-llama", overwrite=True)
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(llama)]
    command += ["--host", "127.0.0.1", "--port", str(args.port), "--device", "cpu"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        answers = ask(args.port, str(llama))
    finally:
        server.terminate()
        server.wait()
    before, after = result["before"]["eval_nats_per_token"], result["after"]["eval_nats_per_token"]
    print(f"assistant-turn loss on held-out plays: {before:.3f} -> {after:.3f} nats/token")
    for (speaker, question), answer in zip(QUESTIONS, answers, strict=True):
        print(f"\n[system] {speaker}\n[user] {question}\n[assistant] {answer}")


if __name__ == "__main__":
    main()
