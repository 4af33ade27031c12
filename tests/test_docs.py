"""The README and every page of docs/ as a user follows them: each Python block runs, each command runs and exits 0.

A page is followed top to bottom in a fresh folder, as a user would in a clone after `make demo`: its blocks, Python
and shell, run in order in one workspace where `runs/minirope-shakespeare` is a small folder written by
`minirope-pretrain` (`tiny_pretrained`) and the files the page names (`train.txt`, `data/chat-train.jsonl`, ...)
exist. Python blocks share one namespace per page. Commands run with flags appended that make them small (the last
value of a flag wins); `minirope-*` commands run in this process, servers in the background until the page ends.
Placeholders (upper-case `NAME`, `DIR`, a quoted `"your-name/..."` in Python, say so on their page) are replaced by
local files; commands that push to or load from the Hub (`--push_to_hub`, `your-name/...` ids) run in a child process
against a Hub on 127.0.0.1 (`hub_server.LoopbackHub`, where the token's user is `your-name`).
Commands that need what a CPU test cannot have (GPUs, a cluster, the suite itself) are listed in NOT_RUN with the
test that covers what they do.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_RUN, smollm2_gguf_path
from hub_server import LoopbackHub
from test_chat import free_port, server

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # the guide and the studies
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

SMALL = {
    "pretrain": TINY_RUN,
    "finetune": ["--max_steps", "2", "--per_device_train_batch_size", "2", "--max_train_samples", "8",
                 "--max_eval_samples", "4", "--block_size", "32", "--torch_compile", "False"],
    "extend": ["--max_steps", "1", "--per_device_train_batch_size", "1", "--max_train_samples", "4",
               "--eval_document_tokens", "64", "--repeat_distances", "8", "--repeat_samples", "1",
               "--torch_compile", "False"],
    "generate": ["--max_new_tokens", "8"],
    "export": [],
    "import": [],
    "posttrain": ["--max_steps", "2", "--num_prompts", "8", "--eval_prompts", "2", "--num_generations_eval", "2",
                  "--eval_max_new_tokens", "8", "--per_device_train_batch_size", "4",
                  "--lm_validation_file", "valid.txt"],  # bits per byte of 20 kB, not of the 4 validation plays
}  # fmt: skip
MODULES = {"import": "import_model"}  # a command whose module is not named as it is (`import` is a keyword)
# minirope-posttrain's flags that only one method's TRL config has; dpo's own pairs are ranked by length, as the tiny
# model's lines never scan (no pair would differ).
SMALL_POSTTRAIN = {
    "grpo": ["--num_generations", "2", "--max_completion_length", "8"],
    "dpo": ["--max_length", "32", "--samples_per_prompt", "4", "--reward_funcs", "test_docs.length_reward"],
    "distill": ["--max_completion_length", "8"],
}
PLACEHOLDERS = {
    "DIR": "runs/minirope-shakespeare",
    "NAME": "local-dataset",
    '"your-name/minirope-shakespeare"': '"runs/minirope-shakespeare"',
    "max_steps=100": "max_steps=2",
    "my-text.txt": "train.txt",
    "my-chat.jsonl": "data/chat-train.jsonl",
}
# Commands not run here: what they start with, and why / which test covers what they do.
NOT_RUN = {
    "make demo": "minirope-pretrain with its defaults (run here at a small size); its quality: make test-slow",
    "make test": "the test suite itself",
    "torchrun": "tests/test_distributed.py runs torchrun and accelerate launch with 2 CPU processes",
    "accelerate launch": "tests/test_distributed.py (the GPU configs need GPUs)",
    "lm_eval": "tests/test_lm_eval.py runs the lm_eval CLI on a trained folder",
    "trl grpo": "tests/test_posttrain.py runs TRL's grpo command with minirope's reward on a trained folder",
    "pip install": "installing: make test-wheel installs the built wheel in a new venv and runs its commands",
    "hf auth login": "logging in: the commands here get the token as HF_TOKEN, from a Hub on 127.0.0.1",
}
# Commands with these flags are not run here either: what they need that a page's workspace cannot give.
NOT_RUN_FLAGS = {
    "--resume_from_checkpoint": "a run stopped part-way: tests/test_resume.py (a local checkpoint) and "
    "tests/test_hub.py (a killed run resumed from the Hub's last-checkpoint on a clean folder)",
}
SCRIPTS = ("python benchmarks/", "python examples/")


def length_reward(completions: list, **kwargs) -> list[float]:
    """A reward with spread on a tiny model's text: the completion's length."""
    return [float(len(completion)) for completion in completions]


def blocks(page: Path | str) -> list[tuple[str, str]]:
    """`(language, code)` of each fenced block of a page (a path, or its text)."""
    text = page.read_text() if isinstance(page, Path) else page
    return [(match.group(1), match.group(2)) for match in BLOCK.finditer(text)]


def commands(script: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = script.replace("\\\n", " ")
    words = (shlex.split(line, comments=True) for line in joined.splitlines())
    return [shlex.join(command) for command in words if command]


def substitute(text: str) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        text = re.sub(rf"(?<![\w/-]){re.escape(placeholder)}(?![\w-])", value, text)
    return text


@pytest.fixture
def workspace(tmp_path, tiny_pretrained, monkeypatch):
    """A folder holding what the pages expect: the trained folder, text files, a dataset, conversations."""
    import datasets

    from minirope.data.bundled import shakespeare_plays

    shutil.copytree(tiny_pretrained, tmp_path / "runs" / "minirope-shakespeare")
    plays = list(shakespeare_plays().values())
    text = plays[0][:20_000]
    for name in ("train.txt", "valid.txt", "held_out.txt", "a.txt", "b.txt"):
        (tmp_path / name).write_text(text)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "shard-0.jsonl").write_text(
        "".join(json.dumps({"text": t[:5000]}) + "\n" for t in plays[:4])
    )
    datasets.Dataset.from_dict({"text": [t[:5000] for t in plays[4:8]]}).to_parquet(tmp_path / "more" / "0.parquet")
    splits = {"train": plays[8:12], "validation": plays[12:14]}
    dataset = datasets.DatasetDict({split: datasets.Dataset.from_dict({"text": [t[:5000] for t in texts]})
                                    for split, texts in splits.items()})  # fmt: skip
    dataset.save_to_disk(tmp_path / "local-dataset")
    shutil.copytree(tiny_pretrained, tmp_path / "my-tokenizer", ignore=shutil.ignore_patterns("*.safetensors"))
    conversation = {"messages": [{"role": "system", "content": "HAMLET"}, {"role": "user", "content": "Who's there?"},
                                 {"role": "assistant", "content": "Nay, answer me."}]}  # fmt: skip
    (tmp_path / "data").mkdir()
    for name in ("chat-train.jsonl", "chat-validation.jsonl"):
        (tmp_path / "data" / name).write_text((json.dumps(conversation) + "\n") * 16)
    gguf = smollm2_gguf_path()
    if gguf is not None:  # the released model docs/pretrained.md imports
        (tmp_path / gguf.name).symlink_to(gguf)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_command(command: str, servers: contextlib.ExitStack, workspace: Path) -> None:
    """Run one documented command at a small size (see the module doc)."""
    words = shlex.split(substitute(command))
    program = Path(words[0]).name
    if program.startswith("minirope-"):
        import importlib

        name = program.removeprefix("minirope-")
        small = SMALL[name]
        if name == "posttrain":
            from minirope.posttraining.parsing import preparse

            small = [*small, *SMALL_POSTTRAIN[preparse(words[1:], {}).method]]
            if not {"--dataset_name", "--train_file"} & set(words):  # the verse task: a short warm start
                small = [*small, "--sft_steps", "2"]
        if "--push_to_hub" in words or any(word.startswith(f"{HUB_USER}/") for word in words):
            env = hub_env(servers, workspace)
            module = f"minirope.commands.{MODULES.get(name, name)}"
            result = subprocess.run([sys.executable, "-m", module, *words[1:], *small],
                                    capture_output=True, text=True, env=env, cwd=workspace, timeout=600)  # fmt: skip
            assert result.returncode == 0, result.stderr[-3000:]
            return
        importlib.import_module(f"minirope.commands.{MODULES.get(name, name)}").run([*words[1:], *small])
    elif command.startswith(SCRIPTS):
        script = words[1]
        helped = subprocess.run([sys.executable, ROOT / script, "--help"], capture_output=True, text=True, cwd=ROOT)
        assert helped.returncode == 0, helped.stderr
        for flag in (word for word in words[2:] if word.startswith("--")):
            assert flag in helped.stdout, f"{script} has no {flag} (tests/test_scripts.py runs it at a small size)"
    elif program == "transformers" and words[1] == "serve":
        pytest.importorskip("fastapi")  # transformers[serving], as tests/test_chat.py
        port = words[words.index("--port") + 1]
        ready = f"http://127.0.0.1:{port}/health"
        log = workspace / f"serve-{port}.log"
        servers.enter_context(server([sys.executable, "-m", "transformers.cli.transformers", *words[1:]], ready, log))
    elif words[1:3] == ["-m", "llama_cpp.server"]:
        pytest.importorskip("llama_cpp.server")
        port = words[words.index("--port") + 1]
        log = workspace / f"llama-{port}.log"
        servers.enter_context(server([sys.executable, *words[1:]], f"http://127.0.0.1:{port}/v1/models", log))
    else:
        raise AssertionError(f"a documented command this test does not know how to run: {command}")


HUB_USER = "your-name"  # the pages' placeholder user, the loopback Hub's user here


def hub_env(servers: contextlib.ExitStack, workspace: Path) -> dict:
    """The environment of a command that talks to the Hub: a loopback Hub started for the page (once), a token, a
    cache in the workspace."""
    hub = getattr(servers, "hub", None)
    if hub is None:
        hub = servers.hub = servers.enter_context(LoopbackHub(user=HUB_USER))
    return {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_test",
            "HF_HOME": str(workspace / "hf-home"), "HF_HUB_OFFLINE": "0"}  # fmt: skip


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


WITH_CODE = [page for page in PAGES if any(kind in ("python", "bash") for kind, _ in blocks(page))]
# Pages whose commands the default run covers elsewhere, followed in `make test-slow` only (about 110 s together):
# exports (tests/test_export.py, test_hub.py), long context (test_extend.py), training (test_pretrain_e2e.py,
# test_stream.py, test_finetune.py, test_extend.py, and test_hub.py for its Hub pushes and resume).
# And the pretrained-model page (tests/test_import.py imports the same GGUF and checks its chat against Llama's).
SLOW_PAGES = {"docs/exports.md", "docs/hub.md", "docs/long_context.md", "docs/training.md", "docs/pretrained.md"}


def follow(page: Path | str, workspace: Path, name: str = "page") -> None:
    """Run the page's Python blocks (one namespace) and commands in order, its servers until the end."""
    namespace: dict = {"__name__": "__docs__"}
    ports = {}  # documented port -> a free one, the same for the server and its client
    with contextlib.ExitStack() as servers:
        for kind, code in blocks(page):
            for port in re.findall(r"(?:--port |127\.0\.0\.1:)(\d{4})", code):
                ports.setdefault(port, str(free_port()))
            for documented, free in ports.items():
                code = re.sub(rf"(?<=--port ){documented}\b|(?<=127\.0\.0\.1:){documented}\b", free, code)
            if kind == "python":
                exec(compile(substitute(code), f"{name} block", "exec"), namespace)
            elif kind == "bash":
                for command in commands(code):
                    bare = command.removeprefix(".venv/bin/")  # `.venv/bin/pip install ...` is `pip install ...`
                    if not bare.startswith(tuple(NOT_RUN)) and not any(flag in command for flag in NOT_RUN_FLAGS):
                        run_command(command, servers, workspace)


@pytest.mark.client
@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=[pytest.mark.slow] if page_id(page) in SLOW_PAGES else []) for page in WITH_CODE],
    ids=page_id,
)
def test_every_block_of_the_page_runs(page, workspace):
    follow(page, workspace, page_id(page))


@pytest.mark.parametrize(
    "broken, error",
    [
        ("```python\nmodel.generate(**inputs, assistant_model=small_minirope)\n```", NameError),  # the old README's
        ("```bash\nminirope-generate --model runs/minirope-shakespeare --max_new_token 5\n```", SystemExit),
        ("```bash\npython examples/classify_plays.py --modle runs/minirope-shakespeare\n```", AssertionError),
        (
            "```bash\nminirope-finetune --model_name_or_path runs/minirope-shakespeare --play no-such-play\n```",
            ValueError,
        ),
    ],
)
def test_a_page_broken_on_purpose_fails(workspace, broken, error):
    with pytest.raises(error):
        follow(f"# A page\n\nSome text.\n\n{broken}\n", workspace)


def test_the_readme_names_the_pages_only_make_test_slow_follows():
    development = (ROOT / "README.md").read_text().split("## Development")[1]
    named = set(re.findall(r"`(docs/[\w/]+\.md)`", " ".join(development.split())))
    assert named == SLOW_PAGES, f"README's Development section names {sorted(named)}, the suite {sorted(SLOW_PAGES)}"


def anchors(page: Path) -> set[str]:
    """The `#anchors` GitHub gives the page's headings: lower case, punctuation but `-` and `_` dropped, spaces to
    `-` (outside code blocks; a repeated heading's `-1`, `-2` forms too)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found |= {slug, *(f"{slug}-{n}" for n in range(1, 4))}
    return found


def links(page: Path) -> list[tuple[str, str]]:
    """The page's relative markdown links as (file, anchor); the file is "" for an anchor on the same page."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found = re.findall(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)", text)
    return [(target, anchor) for target, anchor in found if not target.startswith(("http://", "https://", "mailto:"))]


def test_every_relative_link_resolves_to_a_file_and_a_heading():
    for page in PAGES:
        for target, anchor in links(page):
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page_id(page)} links to {target}, which does not exist"
            assert not target or path != page.resolve(), f"{page_id(page)} links to itself ({target}): say `#section`"
            if anchor and path.suffix == ".md":
                assert anchor in anchors(path), f"{page_id(page)} links to {target}#{anchor}: no such heading"


def test_the_link_check_catches_a_missing_heading_and_a_self_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Bits per byte\n\n[ok](#bits-per-byte) [gone](#bits) [me](page.md)\n")
    assert "bits-per-byte" in anchors(page) and "bits" not in anchors(page)
    assert links(page) == [("", "bits-per-byte"), ("", "bits"), ("page.md", "")]


def test_the_architecture_page_names_every_module():
    """docs/architecture.md is the map of the code: a module added without a line there fails here."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    source = ROOT / "src" / "minirope"
    missing = [
        str(path.relative_to(source))
        for path in sorted(source.rglob("*.py"))
        if path.parent.name != "commands" and f"`{path.name}`" not in page
    ]
    assert not missing, f"docs/architecture.md does not name {missing}"
    for command in (source / "commands").glob("*.py"):
        assert command.name == "__init__.py" or f"`{command.stem}`" in page, command.name
