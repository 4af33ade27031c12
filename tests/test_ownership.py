"""A command owns only what it wrote, every write survives a kill, and no secret or private row leaves the machine
unasked: each case as a new user meets it (a folder of their notes, `.`, a project with a `config.json`, a second run,
a kill while publishing, a full disk, a token on the command line, a `.env` beside a run), each asserting the user's
files byte-identical or one line refusing before anything is touched.
"""

import errno
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_RUN
from hub_server import LoopbackHub
from test_bad_input import cli_error
from transformers import AutoModelForCausalLM

from minirope import owned
from minirope.commands import export, import_model, pretrain
from minirope.output import folder as run_folder
from minirope.training.checkpoints import checkpoint_problem, last_complete_checkpoint, safetensors_problem

CANARY = "hf_canary_5f3a9c1e7b"
REPLACE = os.replace  # the real one, for the patched renames below
FSYNC_TREE = owned.fsync_tree
QUICK = [*TINY_RUN[: TINY_RUN.index("--max_steps")], "--max_steps", "2", "--eval_steps", "2", "--save_steps", "2",
         "--logging_steps", "1", "--per_device_train_batch_size", "4", "--max_train_samples", "16",
         "--max_eval_samples", "4", "--sample_max_new_tokens", "0", "--warmup_steps", "0",
         "--torch_compile", "False"]  # fmt: skip


def no_space(*args, **kwargs):
    """A write on a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device")


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its sha256 (symlinks as their targets' text)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            files[str(path.relative_to(folder))] = f"-> {os.readlink(path)}"
        elif path.is_file():
            files[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def notes(folder: Path, files: dict[str, str]) -> Path:
    """A folder of the user's own files (relative path -> text)."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_export_overwrite_never_empties_the_working_directory_or_a_folder_of_notes(
    tiny_pretrained, tmp_path, monkeypatch, capsys
):
    work = notes(tmp_path / "work", {"draft.txt": "my draft", "notes/draft.txt": "more notes"})
    monkeypatch.chdir(work)
    before = tree(tmp_path)
    for output, expected in ((".", "is the working directory"), ("..", "is a parent of the working directory"),
                             ("notes", "holds files minirope did not write (draft.txt)")):  # fmt: skip
        argv = ["--model", str(tiny_pretrained), "--format", "llama", "--output", output, "--overwrite", "True"]
        err = cli_error(export.main, argv, monkeypatch, capsys)
        assert expected in err, err
        assert tree(tmp_path) == before
    # Its own export is replaced whole (marked, then swapped in); a file the user added to it stops the next one.
    argv = ["--model", str(tiny_pretrained), "--format", "llama", "--output", "llama", "--overwrite", "True"]
    export.run(argv)
    first = json.loads((work / "llama" / owned.MARKER).read_text())
    assert first["command"] == "minirope-export" and "model.safetensors" in first["files"]
    export.run(argv)
    AutoModelForCausalLM.from_pretrained(work / "llama")
    (work / "llama" / "mine.txt").write_text("keep me")
    err = cli_error(export.main, argv, monkeypatch, capsys)
    assert "holds files minirope did not write beside its own (mine.txt)" in err
    assert (work / "llama" / "mine.txt").read_text() == "keep me"
    assert not [path for path in work.iterdir() if path.name.startswith(".llama.")]  # no scratch left


def test_import_overwrite_never_deletes_a_project_with_a_config_json(tiny_pretrained, tmp_path, monkeypatch, capsys):
    source = export.export_llama(tiny_pretrained, tmp_path / "llama")
    project = notes(tmp_path / "proj", {"config.json": "{}", "main.py": "print('hello')"})
    before = tree(project)
    argv = [str(source), "--output_dir", str(project), "--overwrite", "True"]
    err = cli_error(import_model.main, argv, monkeypatch, capsys)
    assert "holds files minirope did not write" in err and "main.py" in err
    assert tree(project) == before


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"runs/events.txt": "tensorboard", "README.md": "# mine"}, "holds README.md, which minirope did not write"),
        ({"config.json": "{}", "README.md": "# mine"}, "holds README.md, config.json, which minirope did not write"),
        ({"checkpoint-5/trainer_state.json": "{}"}, "holds checkpoint-5, which minirope did not write"),
    ],
)
def test_a_folder_is_a_run_only_by_its_marker(tmp_path, monkeypatch, capsys, files, expected):
    """`runs/`, a `config.json`, a `README.md`, another tool's `checkpoint-N` do not make a folder minirope's: the run
    refuses before any work, with `--overwrite_output_dir` too, and every file is as it was."""
    mine = notes(tmp_path / "mine", files)
    before = tree(mine)
    for overwrite in ("False", "True"):
        argv = [*QUICK, "--output_dir", str(mine), "--overwrite_output_dir", overwrite]
        err = cli_error(pretrain.main, argv, monkeypatch, capsys)
        assert expected in err, err
        assert tree(mine) == before


def test_a_run_among_the_users_files_leaves_them_and_its_pushes_carry_none(tmp_path, monkeypatch, capsys):
    """With `--overwrite_output_dir` a run writes among the user's files (their `runs/`, notes, a `.env`) and leaves
    them byte-identical; the marker lists only what the run wrote."""
    mine = notes(tmp_path / "mine", {"runs/events.txt": "tensorboard", "notes.txt": "mine", ".env": "SECRET=1"})
    before = tree(mine)
    pretrain.run([*QUICK, "--output_dir", str(mine), "--overwrite_output_dir", "True"])
    after = tree(mine)
    assert {name: after[name] for name in before} == before
    listed = set(owned.read_marker(mine)["files"])
    assert "model.safetensors" in listed and not listed & {"runs", "notes.txt", ".env"}
    AutoModelForCausalLM.from_pretrained(mine)


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_dead_ones_is_not(tiny_pretrained, tmp_path, monkeypatch,
                                                                            capsys):  # fmt: skip
    out = tmp_path / "run"
    shutil.copytree(tiny_pretrained, out)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from minirope import owned; "
         "owned.lock(sys.argv[1], 'minirope-pretrain'); print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = tree(out)
        err = cli_error(pretrain.main, [*QUICK, "--output_dir", str(out)], monkeypatch, capsys)
        assert f"is in use by process {holder.pid}" in err and "(minirope-pretrain)" in err
        assert tree(out) == before  # its checkpoints intact
    finally:
        holder.kill()
        holder.wait()
    pretrain.run([*QUICK, "--output_dir", str(out)])  # the kernel released the dead process's lock


@pytest.fixture
def finished(tiny_pretrained, tmp_path) -> Path:
    """A copy of a finished run, beside a user's file, and a second publication staged in it."""
    out = tmp_path / "run"
    shutil.copytree(tiny_pretrained, out)
    (out / "mine.txt").write_text("the user's")
    staging = run_folder.staging_dir(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    model.model.norm.weight.data.fill_(2.0)
    model.save_pretrained(staging)
    for name in ("README.md", "run_summary.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / name, staging / name)
    return out


@pytest.mark.parametrize("killed_at", range(12))
def test_a_kill_at_any_point_of_a_publish_leaves_a_model_that_loads(finished, monkeypatch, killed_at):
    """A kill at the `killed_at`-th rename of a publication (the marker, the journal, each staged file, the marker
    again): the folder loads as one model (the old or the new), the user's file is untouched, and the next command on
    the folder completes the publication once its journal was written (the new model, whole), else keeps the old."""
    renames = []

    def replace(source, target):
        if len(renames) == killed_at:
            raise KeyboardInterrupt("killed")
        renames.append(target)
        REPLACE(source, target)

    monkeypatch.setattr(run_folder.os, "replace", replace)
    try:
        run_folder.publish(finished / ".staging", finished, "minirope-pretrain")
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    norm = AutoModelForCausalLM.from_pretrained(finished).model.norm.weight
    assert bool((norm == 2.0).all()) or not bool((norm == 2.0).any())  # one model's weights, loadable
    assert (finished / "mine.txt").read_text() == "the user's"
    journaled = (finished / run_folder.JOURNAL).is_file() or not (finished / ".staging").exists()
    run_folder.complete_publish(finished)  # what `begin_writing` does first on the next command
    assert bool((AutoModelForCausalLM.from_pretrained(finished).model.norm.weight == 2.0).all()) == journaled
    assert not (finished / run_folder.JOURNAL).exists()


def test_a_full_disk_while_staging_leaves_the_previous_model(finished, monkeypatch):
    before = tree(finished)
    shutil.rmtree(finished / ".staging")
    staging = run_folder.staging_dir(finished)
    (staging / "config.json").write_text("{}")

    monkeypatch.setattr(owned, "write_atomic", no_space)
    with pytest.raises(OSError, match="No space left"):
        run_folder.publish(staging, finished, "minirope-pretrain")
    monkeypatch.undo()
    assert {name: digest for name, digest in tree(finished).items() if not name.startswith(".")} == {
        name: digest for name, digest in before.items() if not name.startswith(".")
    }
    AutoModelForCausalLM.from_pretrained(finished)


def test_a_run_killed_after_its_last_checkpoint_finishes_on_resume(tmp_path, monkeypatch):
    """Killed while publishing (after the journal), the same command with `--resume_from_checkpoint last` completes
    the publication and finishes: the checkpoint at --max_steps is measured and written, not refused."""
    out = tmp_path / "run"
    moved = []

    def replace(source, target):
        if "/.staging/" in str(source):  # the second staged file moved in: after the journal
            moved.append(target)
            if len(moved) == 2:
                raise KeyboardInterrupt("killed")
        REPLACE(source, target)

    monkeypatch.setattr(run_folder.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        pretrain.run([*QUICK, "--output_dir", str(out)])
    monkeypatch.undo()
    assert (out / run_folder.JOURNAL).is_file()
    pretrain.run([*QUICK, "--output_dir", str(out), "--resume_from_checkpoint", "last"])
    AutoModelForCausalLM.from_pretrained(out)
    assert not (out / run_folder.JOURNAL).exists() and not (out / ".staging").exists()
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] >= 2


def test_the_rotation_removes_only_the_runs_own_checkpoints(tmp_path):
    out = tmp_path / "run"
    pretrain.run([*QUICK, "--output_dir", str(out), "--save_steps", "1"])
    shutil.copytree(out / "checkpoint-2", out / "checkpoint-600-keep")  # the user's copy, kept by hand
    pretrain.run([*QUICK, "--output_dir", str(out), "--save_steps", "1", "--save_total_limit", "1",
                  "--max_steps", "3"])  # fmt: skip
    assert sorted(path.name for path in out.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-600-keep"]


def test_a_torn_or_corrupt_checkpoint_is_passed_over_whatever_the_damage(tmp_path):
    out = tmp_path / "run"
    pretrain.run([*QUICK, "--output_dir", str(out)])
    last = out / "checkpoint-2"
    assert last_complete_checkpoint(out) == str(last)
    shutil.copytree(last, out / "checkpoint-1")
    state = json.loads((last / "trainer_state.json").read_text())
    (out / "checkpoint-1" / "trainer_state.json").write_text(json.dumps({**state, "global_step": "1/../../x"}))
    assert "gives no step" in checkpoint_problem(out / "checkpoint-1")
    with open(last / "model.safetensors", "r+b") as file:
        file.write(struct.pack("<Q", 0x0FFFFFFFFFFFFFFF))  # a length prefix far past the file: no MemoryError
    assert "runs past the file" in safetensors_problem(last / "model.safetensors")
    assert last_complete_checkpoint(out) is None


def minirope(command: str, *argv: str) -> list[str]:
    return [sys.executable, "-m", f"minirope.commands.{command}", *argv]


def test_no_token_on_disk_or_hub_and_only_the_model_is_pushed(tmp_path):
    """A canary `--hub_token` is in no file written and none pushed (`training_args.bin` included); a `.env` and the
    user's notes beside the run stay local; `--hub_private_repo True` creates the repository private and says so."""
    out = notes(tmp_path / "run", {"notes.txt": "mine", ".env": "HF_TOKEN=hf_private"})
    with LoopbackHub() as server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}  # fmt: skip
        env.pop("HF_TOKEN", None)
        argv = [*QUICK, "--output_dir", str(out), "--overwrite_output_dir", "True", "--push_to_hub", "True",
                "--hub_model_id", "me/canary", "--hub_token", CANARY, "--hub_private_repo", "True"]  # fmt: skip
        result = subprocess.run(minirope("pretrain", *argv), capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "pushed to me/canary (private)" in result.stdout
        pushed = server.files("me/canary")
        assert server.repos["me/canary"].private is True
    on_disk = [path for path in out.rglob("*") if path.is_file() and CANARY.encode() in path.read_bytes()]
    assert on_disk == []
    assert not [path for path, data in pushed.items() if CANARY.encode() in data]
    assert "model.safetensors" in pushed and "training_args.bin" in pushed
    assert not {".env", "notes.txt"} & set(pushed) and not any(path.startswith(".") for path in pushed)


def test_a_repo_id_the_hub_refuses_is_one_line_before_any_work(tiny_pretrained, tmp_path, monkeypatch, capsys):
    argv = ["--model", str(tiny_pretrained), "--format", "llama", "--output", str(tmp_path / "x"),
            "--push_to_hub", "me/bad name"]  # fmt: skip
    err = cli_error(export.main, argv, monkeypatch, capsys)
    assert "'me/bad name' is not a Hub repository id" in err
    assert not (tmp_path / "x").exists()


def test_the_pushed_summary_leaves_out_the_held_out_prompts():
    summary = {"steps": 3, "samples": [{"before": {"prompt": "secret"}}], "before": {"samples": ["x"], "prompts": 2},
               "output_dir": "/home/me/private/run"}  # fmt: skip
    assert run_folder.public(summary) == {"steps": 3, "before": {"prompts": 2}}


def test_hub_credentials_in_hf_endpoint_are_never_printed(monkeypatch):
    from huggingface_hub import constants

    from minirope.output.hub import hub_address

    monkeypatch.setattr(constants, "ENDPOINT", "https://me:s3cret@hub.example.org:8443/base")
    assert hub_address() == "https://hub.example.org:8443/base"
    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    assert hub_address() == "https://huggingface.co"


def test_a_config_file_that_redirects_the_hub_is_refused(tmp_path, monkeypatch, capsys):
    """TRL's parser copies a YAML `env:` block into the environment: a shared config could send the token and the
    pushes elsewhere. minirope-posttrain refuses Hub variables there, in one line."""
    from minirope.commands import posttrain

    (tmp_path / "grpo.yaml").write_text("learning_rate: 1.0e-5\nenv:\n  HF_ENDPOINT: https://elsewhere.example\n")
    err = cli_error(posttrain.main, ["--config", str(tmp_path / "grpo.yaml")], monkeypatch, capsys)
    assert "sets HF_ENDPOINT in its env: block" in err


def test_a_document_without_a_cut_point_is_held_in_bounded_pieces():
    """CJK text without spaces, base64 and NULs have no single space or newline to cut at exactly: they are cut
    anyway once `max_uncut_chars` are held, so no piece outgrows that, and the text is kept whole."""
    from minirope.data.tokenizer import TextPieces

    cjk, base64 = "天地玄黄宇宙洪荒日月盈昃辰宿列张" * 4000, "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=" * 2000
    for text in (cjk, base64, "\0" * 64000):
        pieces = TextPieces(None, piece_chars=1000, max_uncut_chars=6000)
        chunks = (text[at : at + 500] for at in range(0, len(text), 500))
        cut = list(pieces.pieces(chunks))
        assert "".join(cut) == text and max(map(len, cut)) <= 6000 + 500 and pieces.forced >= len(text) // 7000


def test_a_config_that_cannot_fit_the_machine_is_refused_before_anything_is_allocated(
    tiny_pretrained, tmp_path, monkeypatch, capsys
):
    folder = tmp_path / "huge"
    shutil.copytree(tiny_pretrained, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=65536, intermediate_size=262144, num_hidden_layers=512, num_attention_heads=512,
                  num_key_value_heads=512, head_dim=128)  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    argv = ["--model", str(folder), "--format", "llama", "--output", str(tmp_path / "llama")]
    err = cli_error(export.main, argv, monkeypatch, capsys)
    assert "declares" in err and "B parameters" in err and "more than this machine's" in err, err
    assert not (tmp_path / "llama").exists()


def training_command(name: str, model: Path, root: Path, monkeypatch) -> tuple:
    """A command that trains, with tiny flags (its `run` and its argv less `--output_dir`)."""
    from test_bad_input_table import TINY_EXTEND
    from test_finetune import FAST
    from test_posttrain import user_task

    from minirope.commands import extend, finetune, posttrain

    flags = {
        "finetune": (finetune.run, ["--model_name_or_path", str(model), "--play", "the-tempest", *FAST]),
        "extend": (extend.run, ["--model_name_or_path", str(model), "--rope_type", "yarn", *TINY_EXTEND]),
        "posttrain": (posttrain.run, [*user_task(root, monkeypatch), "--model_name_or_path", str(model)]),
    }
    return flags[name]


# posttrain's (~60 s) in `make test-slow`: it publishes through the same journal as finetune's and extend's
@pytest.mark.parametrize("command", ["finetune", "extend", pytest.param("posttrain", marks=pytest.mark.slow)])
def test_a_kill_or_a_full_disk_while_a_command_publishes_leaves_a_model_and_the_users_files(
    tiny_pretrained, tmp_path, monkeypatch, command
):
    """Each command that trains, run again into its folder beside a file of the user's: a full disk while it
    publishes leaves the previous model and says so (an OSError); a kill in the middle of its moves leaves a folder
    that loads; the same command then completes and publishes; the user's file is byte-identical throughout."""
    run, argv = training_command(command, tiny_pretrained, tmp_path, monkeypatch)
    out = tmp_path / "out"
    run([*argv, "--output_dir", str(out)])
    (out / "mine.txt").write_text("the user's")
    before = (out / "model.safetensors").read_bytes()

    monkeypatch.setattr(owned, "fsync_tree", no_space)
    with pytest.raises(OSError, match="No space left"):
        run([*argv, "--output_dir", str(out)])
    monkeypatch.setattr(owned, "fsync_tree", FSYNC_TREE)
    assert (out / "model.safetensors").read_bytes() == before
    AutoModelForCausalLM.from_pretrained(out)

    def killed(source, target):
        if "/.staging/" in str(source) and str(target).endswith("model.safetensors"):
            raise KeyboardInterrupt("killed")
        REPLACE(source, target)

    monkeypatch.setattr(run_folder.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        run([*argv, "--output_dir", str(out)])
    monkeypatch.setattr(run_folder.os, "replace", REPLACE)
    AutoModelForCausalLM.from_pretrained(out)  # the old weights beside the new run's other files: one architecture
    assert (out / run_folder.JOURNAL).is_file()
    run([*argv, "--output_dir", str(out)])
    AutoModelForCausalLM.from_pretrained(out)
    assert not (out / run_folder.JOURNAL).exists() and (out / "mine.txt").read_text() == "the user's"


@pytest.mark.parametrize("command", ["export", "import"])
def test_a_kill_or_a_full_disk_while_exporting_or_importing_leaves_the_previous_output(
    tiny_pretrained, tmp_path, monkeypatch, capsys, command
):
    """An export or import over its previous output: a full disk while the new one is fsynced, or a kill at the swap,
    leaves the previous output whole at its path and no scratch folder behind a failure."""
    from minirope import export as export_library

    source = export.export_llama(tiny_pretrained, tmp_path / "llama") if command == "import" else tiny_pretrained
    main = {"export": export.run, "import": import_model.run}[command]
    output = tmp_path / "out"
    argv = {"export": ["--model", str(source), "--format", "llama", "--output", str(output)],
            "import": [str(source), "--output_dir", str(output)]}[command]  # fmt: skip
    main(argv)
    before = tree(output)

    monkeypatch.setattr(owned, "fsync_tree", no_space)
    with pytest.raises(OSError, match="No space left"):
        main([*argv, "--overwrite", "True"])
    monkeypatch.setattr(owned, "fsync_tree", FSYNC_TREE)

    def killed(new, target):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(export_library, "swap", killed)
    with pytest.raises(KeyboardInterrupt):
        main([*argv, "--overwrite", "True"])
    monkeypatch.undo()
    assert tree(output) == before
    AutoModelForCausalLM.from_pretrained(output)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


def test_pushes_during_training_never_write_the_published_folder_or_through_a_symlink(tiny_pretrained, tmp_path):
    """`--hub_strategy every_save` over a finished run whose `config.json` is a symlink to a file outside: each
    checkpoint is pushed from its own folder, the outside file is byte-identical, and the Hub ends with the new run."""
    out = tmp_path / "run"
    shutil.copytree(tiny_pretrained, out)
    outside = tmp_path / "elsewhere.json"
    shutil.move(out / "config.json", outside)
    (out / "config.json").symlink_to(outside)
    before = outside.read_bytes()
    with LoopbackHub() as server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", "HF_TOKEN": "hf_test"}  # fmt: skip
        argv = [*QUICK, "--output_dir", str(out), "--save_steps", "1", "--push_to_hub", "True", "--hub_model_id",
                "me/every-save", "--hub_strategy", "every_save"]  # fmt: skip
        result = subprocess.run(minirope("pretrain", *argv), capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        messages = server.commits("me/every-save")
        pushed = server.files("me/every-save")
    assert outside.read_bytes() == before and not (out / "config.json").is_symlink()
    assert any(message.startswith("Training in progress") for message in messages)
    assert messages[-1] == "minirope: end of training"
    assert pushed["model.safetensors"] == (out / "model.safetensors").read_bytes()
    assert not any(path.startswith((".", "optimizer", "rng_state")) for path in pushed)
