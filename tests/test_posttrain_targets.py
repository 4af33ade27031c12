"""The post-training defaults of docs/post_training.md, end to end (marked slow: `make test-slow`; not marked
`client`, which the default run includes)."""

import pytest

pytest.importorskip("trl")

from minirope.commands import posttrain, pretrain  # noqa: E402


@pytest.mark.slow
def test_defaults_reach_what_the_docs_measured_from_the_default_model(tmp_path):
    """docs/post_training.md's runs (about 15 minutes on 2 cores): from the `make demo` model, each method's defaults
    (a warm start, then `meter_reward` and `word_variety_reward`) write at least twice the base's iambic lines, at
    least 90 % of lines distinct, with whole-text validation bits per byte near the base's; GRPO without the gaming
    issue 52 saw (at most a quarter of scanning lines monosyllables only, 0.8x the base's words per word), DPO with
    looser limits (it narrows the vocabulary: the docs say how far). The thresholds leave room for the spread between
    runs: the docs measured GRPO's defaults at 39.8 % iambic, and 54.7 % with another seed."""
    base = tmp_path / "base"
    pretrain.run(["--output_dir", str(base), "--sample_max_new_tokens", "0"])
    # method: iambic share at least, monosyllables-only share at most, words per word at least x the base's, drift
    limits = {"grpo": (0.35, 0.25, 0.8, 0.045), "dpo": (0.30, 0.45, 0.65, 0.05)}
    for method, (iambic, monosyllabic, words, drift) in limits.items():
        result = posttrain.run(["--method", method, "--model_name_or_path", str(base), "--output_dir",
                                str(tmp_path / method)])  # fmt: skip
        before, after = result["before"], result["after"]
        assert after["lines"] >= 700 and after["iambic_share"] >= iambic, (method, after)
        assert after["iambic_share"] >= 2 * before["iambic_share"], (method, before, after)
        assert after["monosyllabic_scan_share"] <= monosyllabic, (method, after)
        assert after["distinct_words_per_word"] >= words * before["distinct_words_per_word"], (method, before, after)
        assert after["distinct_share"] >= 0.9, (method, after)
        assert after["validation_bits_per_byte"] <= before["validation_bits_per_byte"] + drift, (method, after)
