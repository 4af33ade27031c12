"""Plain words: the README, the docs, every command's `--help` and the model cards' text use no word a reader cannot
look up: no issue numbers, nothing about the machines measurements were lent on or the sessions they came from, no
commit hash as an explanation, no path outside the repository, "matmuls" rather than "products", layers rather than
"rooms"; and no record name in the guide (the studies cite their record files' keys)."""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
INTERNAL = {
    "an issue number": r"\bissues? #?\d+\b|\b\d+'s done-when\b|\bthe (?:performance )?issue's\b",
    "a machine lent or leased": r"\blent\b|\bleases?\b",
    "a session": r"\bsessions?\b",
    "today (a date says when)": r"\btoday(?:'s)?\b",
    "the lab (a script outside the repository)": r"\bthe lab\b|\blab's\b",
    "rooms (layers)": r"\brooms?\b",
    "products (matmuls)": r"\bproducts\b|\b(?:matrix|square|one|small) product\b",
    "a path outside the repository": r"\.\./shared\b",
    "a commit hash": r"(?<![\w/.#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w/-])",
}
GUIDE_ONLY = {"a record name": r"\bsweep-\d+|\bb30-\w+|\bt-llama3-\w+|\bl3-h96\b|\bbs8\b"}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CARD_SOURCES = ["src/minirope/output/card.py", "src/minirope/posttraining/report.py", "src/minirope/commands/export.py"]
HELPS = [("pretrain", []), ("finetune", []), ("extend", []), ("generate", []), ("export", []), ("import_model", []),
         ("posttrain", ["--method", "grpo"]), ("posttrain", ["--method", "dpo"]),
         ("posttrain", ["--method", "distill"])]  # fmt: skip


def internal_words(text: str, guide: bool = True) -> list[str]:
    """Each internal word of `text` as `kind: the line`."""
    kinds = {**INTERNAL, **(GUIDE_ONLY if guide else {})}
    return [f"{kind}: {line.strip()[:160]}" for line in text.splitlines() for kind, pattern in kinds.items()
            if re.search(pattern, line, flags=re.IGNORECASE)]  # fmt: skip


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_a_page_has_no_internal_words(page):
    found = internal_words(page.read_text(), guide="studies" not in page.parts)
    assert not found, "\n".join(found)


@pytest.mark.parametrize(("command", "argv"), HELPS, ids=[" ".join([c, *a]) for c, a in HELPS])
def test_a_commands_help_has_no_internal_words(command, argv, capsys):
    if command == "posttrain":
        pytest.importorskip("trl")
    with pytest.raises(SystemExit):
        importlib.import_module(f"minirope.commands.{command}").run([*argv, "--help"])
    text = capsys.readouterr().out
    assert "--" in text  # the help itself was printed
    found = internal_words(text)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source", CARD_SOURCES)
def test_the_cards_text_has_no_internal_words(source):
    strings = [node.value for node in ast.walk(ast.parse((ROOT / source).read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]  # fmt: skip
    found = internal_words("\n".join(strings))
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind():
    text = "As issue 46 found on a lent H100 in this session (commit 557a368), the rooms' products, ../shared/x"
    kinds = {found.split(":")[0] for found in internal_words(text)}
    assert kinds == {"an issue number", "a machine lent or leased", "a session", "a commit hash", "rooms (layers)",
                     "products (matmuls)", "a path outside the repository"}  # fmt: skip
    assert internal_words("1,200 steps in 59 s; 2457600 tokens; ggml-org/llama.cpp#20824; sha256") == []


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda page: page.name)
def test_a_guide_page_keeps_its_dated_history_to_three_lines(page):
    """The guide says what holds; the dated runs behind it are the studies' (docs/studies/) and the results' rows.
    Table rows and code blocks do not count: a table names each row's machine and date."""
    prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    lines = [line for line in prose.splitlines() if not line.startswith("|")]
    dated = [line for line in lines if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert len(dated) <= 3, "\n".join(dated)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda page: page.name)
def test_a_guide_page_is_at_most_250_lines(page):
    """A guide page is a reference or a how-to a reader finishes; what is longer belongs to a study or a new page."""
    assert len(page.read_text().splitlines()) <= 250
