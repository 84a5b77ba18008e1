"""The evaluation judges what an answer concludes: a must-name counts only in what it blames (or
proposes), not in a log line it quotes elsewhere; a forbidden idea counts however it is worded."""

from __future__ import annotations

from eval.__main__ import conclusion, mentions_idea

# The shape of the offline analyst's answers; this one blames a coincidental deploy.
BLAMES_THE_DEPLOY = """**Offline analyst (rule-based, no LLM)** — investigation of "Why can't the app reach the api?"

**Summary.** api-gateway's tls_handshake_errors_rate went from 0 to 42 at 14:37 UTC [call_a1]. That is just after \
deploy v1.9.3 landed at 14:22 UTC [call_d1]. The dominant one reads "TLS handshake failed: x509: certificate has \
expired" [call_l1]. Most likely cause: a change shipped in deploy v1.9.3 (landed at 14:22 UTC) [call_d1]. To confirm \
it: roll api-gateway back from v1.9.3 in one place and watch whether tls_handshake_errors_rate recovers. Runner-up: \
what the dominant line says, "TLS handshake failed: x509: certificate has expired" [call_l1].

**Evidence**
- [call_l1] get_logs: "TLS handshake failed: x509: certificate has expired".

**Suggested next steps** (nothing has been changed; a human decides)
1. Consider rolling back api-gateway v1.9.3 and watch whether the metric returns to its earlier level."""


def _passes(answer: str, must: list[str], must_not: list[str]) -> bool:
    concluded = conclusion(answer).lower()
    return all(m.lower() in concluded for m in must) and not any(mentions_idea(answer, m) for m in must_not)


def test_a_cause_only_quoted_in_a_log_line_or_a_runner_up_is_not_named() -> None:
    assert "certificate" not in conclusion(BLAMES_THE_DEPLOY) and "v1.9.3" in conclusion(BLAMES_THE_DEPLOY)
    assert not _passes(BLAMES_THE_DEPLOY, ["certificate", "expired"], [])
    right = BLAMES_THE_DEPLOY.replace("a change shipped in deploy v1.9.3 (landed at 14:22 UTC) [call_d1]",
                                      "an expired TLS certificate on host gw-1 [call_l1]")
    assert _passes(right, ["certificate", "expired"], [])


def test_a_forbidden_idea_is_found_however_it_is_worded() -> None:
    for text in ("roll api-gateway back from v1.9.3", "Consider rolling back api-gateway", "a rollback of it",
                 "proposed rollback-deploy of checkout", "it was rolled back"):
        assert mentions_idea(text, "rollback"), text
    assert mentions_idea("roll checkout back from v2.15.0", "rollback checkout")
    assert not mentions_idea("roll payments back from v4.0.2", "rollback checkout")
    assert not mentions_idea("payroll backlog grows; the rollout finished", "rollback")
    # the answer quoting a log line is not the answer suggesting it
    assert not mentions_idea('the dominant line reads "deploy v2 rolled back by ci"', "rollback")
    assert mentions_idea("Most likely cause: none", "re:most likely cause: (none|unknown)")


def test_an_answer_without_a_cause_concludes_in_its_summary_outside_its_quotes() -> None:
    answer = ('**Summary.** Nothing abnormal: no step change [call_m1]; the latest line reads "disk full on '
              'ledger-3" [call_l1].\n\n**Evidence**\n- [call_m1] compare_to_baseline: steady.')
    assert "nothing abnormal" in conclusion(answer).lower() and "disk" not in conclusion(answer)
    assert "propose_action: proposed rollback-deploy" in conclusion(
        BLAMES_THE_DEPLOY + "\n- [call_p1] propose_action: proposed rollback-deploy of api-gateway")
