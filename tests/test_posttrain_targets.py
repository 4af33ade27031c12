"""The post-training targets of docs/post_training.md, end to end with the defaults (marked slow: `make test-slow`; not
marked `client`, which the default run includes)."""

import pytest

pytest.importorskip("trl")

from minirope.commands import posttrain, pretrain  # noqa: E402


@pytest.mark.slow
def test_defaults_reach_the_targets_from_the_default_model(tmp_path):
    """docs/post_training.md's runs (about 20 minutes on 2 cores): from the `make demo` model, GRPO's defaults make at
    least 60 % of sampled lines scan and DPO's at least 40 % (the base: about 20 %), with at least 90 % of lines
    distinct and whole-text validation bits per byte at most 0.05 above the base's."""
    base = tmp_path / "base"
    pretrain.run(["--output_dir", str(base), "--sample_max_new_tokens", "0"])
    for method, target in (("grpo", 0.60), ("dpo", 0.40)):
        result = posttrain.run(["--method", method, "--model_name_or_path", str(base), "--output_dir",
                                str(tmp_path / method)])  # fmt: skip
        before, after = result["before"], result["after"]
        assert after["lines"] >= 200 and after["scan_share"] >= target, (method, after)
        assert after["distinct_share"] >= 0.9, (method, after)
        assert after["validation_bits_per_byte"] <= before["validation_bits_per_byte"] + 0.05, (method, after)
