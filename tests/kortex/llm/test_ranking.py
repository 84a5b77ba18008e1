"""Candidate causes rank by timing, then specificity, then how many kinds of evidence agree."""

from __future__ import annotations

from kortex.llm.offline.ranking import Hypothesis, kind_of, rank, shared_names, speaks_of


def test_a_change_before_the_onset_outranks_a_vague_log_line_and_corroboration_breaks_ties() -> None:
    line = Hypothesis("what the dominant line says", "read on", precedes=False, specific=True, sources={"logs"})
    deploy = Hypothesis("deploy v2", "roll back", precedes=True, specific=True, sources={"deploys"})
    flag = Hypothesis("flag flipped", "revert", precedes=True, specific=True, sources={"changes", "logs"})
    assert [h.cause for h in rank([line, deploy, flag])] == ["flag flipped", "deploy v2", "what the dominant line says"]
    assert [h.cause for h in rank([deploy, Hypothesis("other", "x", True, True, {"deploys"})])] == ["deploy v2", "other"]


def test_metric_kinds_and_the_words_that_speak_of_them() -> None:
    assert kind_of("http_requests_rate") == "incoming traffic"
    assert kind_of("open_file_descriptors") == "open file descriptors"
    assert kind_of("process_resident_memory_bytes") == "memory use"
    assert kind_of("widgets") is None
    assert speaks_of("incoming traffic", "marketing campaign sent to 2.1M subscribers")
    assert not speaks_of("memory use", "marketing campaign sent") and not speaks_of(None, "anything")


def test_texts_that_name_the_same_thing() -> None:
    assert "new_ranker" in shared_names("feature flag new_ranker enabled", "ranker model new_ranker took 1.9s")
    assert "invoice" in shared_names("migration 0042_invoice_lines_rework applied",
                                     "slow query: SELECT * FROM invoice_lines")
    assert not shared_names("request failed upstream", "request failed: upstream error")


def test_among_equals_a_cause_the_logs_name_beats_a_deploy_that_only_stands_next_to_the_onset() -> None:
    deploy = Hypothesis("deploy v1.9.3", "read its diff", precedes=True, specific=True, sources={"deploys"},
                        kind="deploy")
    expired = Hypothesis("an expired TLS certificate", "renew it", precedes=True, specific=True, sources={"logs"},
                         kind="logs", classified=True)
    assert deploy.score == expired.score
    assert [h.cause for h in rank([deploy, expired])] == ["an expired TLS certificate", "deploy v1.9.3"]
