"""The built-in investigation tools. Adding one is a module plus one line here."""

from __future__ import annotations

from kortex.tools.builtin import (
    compare_to_baseline,
    get_active_incidents,
    get_admin_info,
    get_deployment_status,
    get_incident_history,
    get_latency_trends,
    get_logs,
    get_metrics,
    get_quality_summary,
    get_recent_deploys,
    get_recent_requests,
    get_request_detail,
    get_request_volume,
    get_traces,
    get_user_context,
    list_products,
    propose_action,
    submit_postmortem,
)
from kortex.tools.spec import ToolSpec

BUILTIN_TOOLS: tuple[ToolSpec, ...] = (
    # rfc-005 §6.2
    get_logs.SPEC,
    get_metrics.SPEC,
    get_traces.SPEC,
    compare_to_baseline.SPEC,
    get_recent_deploys.SPEC,
    get_incident_history.SPEC,
    get_admin_info.SPEC,
    list_products.SPEC,
    propose_action.SPEC,
    # kortex/postmortems/: the post-mortem profile's structured output
    submit_postmortem.SPEC,
    # llm-ops-agent-tools.md
    get_deployment_status.SPEC,
    get_active_incidents.SPEC,
    get_recent_requests.SPEC,
    get_request_detail.SPEC,
    get_user_context.SPEC,
    get_latency_trends.SPEC,
    get_quality_summary.SPEC,
    get_request_volume.SPEC,
)
