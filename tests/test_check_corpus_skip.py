"""`check --backend sglang:V`'s regression corpus skips, and names, a trace the release
cannot run (the other era's design, or a hybrid model its adapter does not drive),
instead of failing the corpus; the impl backend replays it."""
import shutil
from pathlib import Path

from kvcheck.check import check_corpus

REG = Path(__file__).resolve().parents[1] / "stateful_tests" / "regressions"


def test_a_release_skips_what_it_cannot_drive_and_says_why(tmp_path):
    for name in ("borrow_plain_request_overshoot", "borrow_prefill_aware_swa"):
        shutil.copy(REG / f"{name}.json", tmp_path)
    lines = []
    # neither trace reaches the release (both are skipped first), so no sglang venv is needed
    assert check_corpus([tmp_path], "sglang:0.5.15", out=lines.append) == []
    text = "\n".join(lines)
    assert ("borrow_plain_request_overshoot.json: config.era is 'borrow' but sglang 0.5.15 is a "
            "wrapper-era release") in text
    assert "borrow_prefill_aware_swa.json: config.era is 'borrow'" in text
    (tmp_path / "borrow_plain_request_overshoot.json").unlink()
    shutil.copy(REG / "swa_match_over_tombstones.json", tmp_path)
    lines.clear()
    assert check_corpus([tmp_path], "sglang:0.5.23", out=lines.append) == []
    text = "\n".join(lines)
    assert ("swa_match_over_tombstones.json: config.era is 'wrapper' but sglang 0.5.23 is a "
            "borrow-era release") in text
    # 0.5.23 runs the sliding-window tree, not prefill-aware SWA on it (W1)
    assert "borrow_prefill_aware_swa.json: config.prefill_aware_swa" in text
    assert check_corpus([tmp_path], "impl", out=lines.append) == []
