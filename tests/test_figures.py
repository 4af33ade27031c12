"""One truth per figure: the figures the README and the guide quote are read here from the rows they come from
(`benchmarks/results/`, `constraints/floor.txt`), so a row that changes without its pages, or a page that drifts
from its row, fails. (docs/clusters.md's table is what `benchmarks/scaling_plan.py` prints: tests/test_scripts.py.)"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def text(page: str) -> str:
    """The page with its line breaks and runs of spaces as single spaces, as a reader sees the prose."""
    return " ".join((ROOT / page).read_text().split())


def clock(seconds: int) -> str:
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def make_demo_rows() -> list[dict]:
    return [json.loads(line) for line in (RESULTS / "make_demo.jsonl").read_text().splitlines()]


def test_the_readmes_make_demo_times_span_the_recorded_clones():
    readme = text("README.md")
    for isa, words in (("avx512_bf16", "where the CPU has AVX512_BF16"), ("avx2", "with AVX2 only")):
        walls = [wall for row in make_demo_rows() if row["isa"] == isa for wall in row["wall_seconds"]]
        quoted = f"{clock(min(walls))} to {clock(max(walls))}"
        assert f"{quoted} {words}" in readme or f"{quoted} {words.replace('where the CPU has', 'with')}" in readme, (
            f"README should say {quoted} {words} (benchmarks/results/make_demo.jsonl)"
        )


def test_the_recipe_study_tabulates_each_recorded_clone():
    lines = [line for line in (ROOT / "docs/studies/recipe.md").read_text().splitlines() if line.startswith("| ")]
    for row in make_demo_rows():
        low, high = row["wall_seconds"]
        wall = ("about " if row.get("approximate") else "") + (
            clock(low) if low == high else f"{clock(low)} - {clock(high)}"
        )
        bits = [f"{value:.4f}" for value in row["bits_per_byte"]]
        bits = bits[0] if bits[0] == bits[1] else "-".join(bits)
        matches = [line for line in lines if row["date"] in line and f"| {wall} |" in line and bits in line]
        assert len(matches) == 1, f"docs/studies/recipe.md has no row {row['cpu']}, {row['date']}: {wall}, {bits}"


def test_the_gpu_figures_are_the_h200_runs():
    recipe = json.loads((RESULTS / "history" / "gpu-2026-11-26-transcribed.json").read_text())["recipe"]
    seconds, bits, rate = recipe["seconds"], f"{recipe['bits_per_byte']:.4f}", f"{recipe['tokens_per_s']:,}"
    assert f"the 1,200 training steps take {seconds} s" in text("README.md")
    assert f"| {seconds} s, {bits} bits/byte |" in text("docs/gpu.md")
    assert f"1,200 steps in {seconds} s, {bits} bits/byte" in text("docs/scaling.md")
    assert f"{rate} ({seconds} s for 1,200 steps)" in text("docs/clusters.md")


def test_the_readmes_floor_versions_are_the_constraints():
    pins = dict(re.findall(r"^([\w-]+)==([\w.]+)$", (ROOT / "constraints" / "floor.txt").read_text(), flags=re.M))
    readme = (ROOT / "README.md").read_text()
    header = next(line for line in readme.splitlines() if line.startswith("| | transformers"))
    floor = next(line for line in readme.splitlines() if line.startswith("| oldest `pyproject.toml` admits"))
    names = [cell.strip() for cell in header.strip("|").split("|")][1:]
    values = [cell.strip() for cell in floor.strip("|").split("|")][1:]
    assert dict(zip(names, values, strict=True)) == {name: pins[name] for name in names}
