"""`check --backend sglang:V`'s regression corpus skips, and names, a trace the release
cannot run (the other era's design, or a hybrid model its adapter does not drive),
instead of failing the corpus; the impl backend replays it."""
import shutil
from pathlib import Path

import pytest

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


def test_a_release_excuses_a_failure_past_one_of_its_recorded_findings():
    """On a release, a trace of the spec's expectations that fails at or after a step
    triggering one of the release's recorded findings (U1: a turn submitted while its
    session has one in flight) is reported as known, naming that step, not as a corpus
    failure; not before the step, not on a release without recorded findings or for a
    trace that accepts findings, and never for a finding's own trace."""
    from dataclasses import replace

    from kvcheck.check import _recorded_trigger
    from kvcheck.trace import load
    trace = load(REG / "drain_refused_alone_match_lock.json")
    for version in ("0.5.15", "0.5.23"):
        assert _recorded_trigger(trace, f"sglang:{version}", 5) == (
            "step 2 (submit_turn) is the trigger of U1, recorded for this release "
            "(stateful_tests/upstream/ holds its traces)")
    assert _recorded_trigger(trace, "sglang:0.5.15", 1) is None    # failed before it
    assert _recorded_trigger(trace, "sglang:0.5.99", 5) is None    # no recorded findings
    assert _recorded_trigger(trace, "impl", 5) is None
    accepted = replace(trace, config=replace(trace.config, accept=("U1", "U3")))
    assert _recorded_trigger(accepted, "sglang:0.5.15", 5) is None
    about_it = replace(trace, expect=replace(trace.expect, backend="sglang-0.5.15"))
    assert _recorded_trigger(about_it, "sglang:0.5.15", 5) is None


@pytest.mark.skipif(not (REG.parents[1] / ".venv-sglang-0.5.15/bin/python").exists(),
                    reason="no .venv-sglang-0.5.15 (adapters/sglang/make_env.sh 0.5.15)")
def test_a_known_failure_on_a_release_is_named_not_counted(tmp_path):
    shutil.copy(REG / "drain_refused_alone_match_lock.json", tmp_path)
    lines = []
    assert check_corpus([tmp_path], "sglang:0.5.15", out=lines.append) == []
    assert ("drain_refused_alone_match_lock.json: I20 at step 5, past step 2 (submit_turn) "
            "is the trigger of U1") in "\n".join(lines)
