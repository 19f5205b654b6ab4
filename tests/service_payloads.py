"""Every payload checked as Slack, PagerDuty and an Alertmanager webhook check it, for the tests' receiver.

What each service documents (Slack's Block Kit limits, the Events API v2 fields, the webhook_configs shape),
so a sender that posts what the real service would refuse fails here: the demo's receiver answers any readable
notification, as a person watching the demo needs; the senders are held to the services' rules by these tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from gpumond.demo.receiver import (
    SLACK_OK,
    WEBHOOK_OK,
    Kind,
    Verdict,
    alertmanager_refusal,
    pagerduty_accepted,
    pagerduty_refusal,
    parse_object,
    slack_refusal,
)

# Slack's documented limits (Block Kit reference, incoming-webhook docs).
SLACK_TEXT_MAX = 40_000
SLACK_BLOCKS_MAX = 50
SLACK_ATTACHMENTS_MAX = 100
SLACK_SECTION_TEXT_MAX = 3000
SLACK_SECTION_FIELDS_MAX = 10
SLACK_FIELD_TEXT_MAX = 2000
SLACK_HEADER_TEXT_MAX = 150
SLACK_CONTEXT_ELEMENTS_MAX = 10
SLACK_BLOCK_ID_MAX = 255
SLACK_BLOCK_TYPES = frozenset({
    "actions", "context", "divider", "file", "header", "image", "input", "markdown", "rich_text", "section",
    "table", "video",
})
SLACK_TEXT_TYPES = frozenset({"plain_text", "mrkdwn"})

# PagerDuty Events API v2 (developer docs: "Send an Alert Event", "Events API v2 Overview").
PD_ROUTING_KEY_LEN = 32
PD_DEDUP_KEY_MAX = 255
PD_SUMMARY_MAX = 1024
PD_ACTIONS = ("trigger", "acknowledge", "resolve")
PD_SEVERITIES = ("critical", "error", "warning", "info")

AM_STATUSES = ("firing", "resolved")


def _is_iso8601(value: Any) -> bool:
    if not isinstance(value, str) or "T" not in value:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


# --- Slack incoming webhook -------------------------------------------------------------------------------

def _slack_text_object(obj: Any, where: str, max_len: int, types: frozenset[str] = SLACK_TEXT_TYPES) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where} must be a text object"]
    errs = []
    if obj.get("type") not in types:
        errs.append(f"{where}.type must be one of {', '.join(sorted(types))} (got {obj.get('type')!r})")
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        errs.append(f"{where}.text must be a non-empty string")
    elif len(text) > max_len:
        errs.append(f"{where}.text is {len(text)} characters (max {max_len})")
    return errs


def _slack_block(block: Any, where: str) -> list[str]:
    if not isinstance(block, dict):
        return [f"{where} must be an object"]
    btype = block.get("type")
    if btype not in SLACK_BLOCK_TYPES:
        return [f"{where}.type {btype!r} is not a known block type"]
    errs = []
    block_id = block.get("block_id")
    if block_id is not None and (not isinstance(block_id, str) or len(block_id) > SLACK_BLOCK_ID_MAX):
        errs.append(f"{where}.block_id must be a string of at most {SLACK_BLOCK_ID_MAX} characters")
    if btype == "section":
        if "text" not in block and "fields" not in block:
            errs.append(f"{where} (section) needs text or fields")
        if "text" in block:
            errs += _slack_text_object(block["text"], f"{where}.text", SLACK_SECTION_TEXT_MAX)
        if "fields" in block:
            fields = block["fields"]
            if not isinstance(fields, list) or not fields or len(fields) > SLACK_SECTION_FIELDS_MAX:
                errs.append(f"{where}.fields must be a list of 1-{SLACK_SECTION_FIELDS_MAX} text objects")
            else:
                for i, f in enumerate(fields):
                    errs += _slack_text_object(f, f"{where}.fields[{i}]", SLACK_FIELD_TEXT_MAX)
    elif btype == "header":
        errs += _slack_text_object(block.get("text"), f"{where}.text", SLACK_HEADER_TEXT_MAX,
                                   frozenset({"plain_text"}))
    elif btype == "context":
        elements = block.get("elements")
        if not isinstance(elements, list) or not elements or len(elements) > SLACK_CONTEXT_ELEMENTS_MAX:
            errs.append(f"{where}.elements must be a list of 1-{SLACK_CONTEXT_ELEMENTS_MAX} elements")
        else:
            for i, el in enumerate(elements):
                if not isinstance(el, dict):
                    errs.append(f"{where}.elements[{i}] must be an object")
                elif el.get("type") in SLACK_TEXT_TYPES:
                    errs += _slack_text_object(el, f"{where}.elements[{i}]", SLACK_SECTION_TEXT_MAX)
                elif el.get("type") != "image":
                    errs.append(f"{where}.elements[{i}].type must be plain_text, mrkdwn or image")
    elif btype in ("actions", "rich_text"):
        elements = block.get("elements")
        if not isinstance(elements, list) or not elements or not all(isinstance(e, dict) for e in elements):
            errs.append(f"{where}.elements must be a non-empty list of objects")
    elif btype == "image":
        if not isinstance(block.get("image_url"), str) and not isinstance(block.get("slack_file"), dict):
            errs.append(f"{where} (image) needs image_url or slack_file")
        if not isinstance(block.get("alt_text"), str) or not block.get("alt_text"):
            errs.append(f"{where}.alt_text must be a non-empty string")
    return errs


def _slack(raw: bytes, content_type: str) -> Verdict:
    bad = slack_refusal
    obj, why = parse_object(raw, content_type)
    if obj is None:
        return bad("invalid_payload", why or "")
    text, blocks, attachments = obj.get("text"), obj.get("blocks"), obj.get("attachments")
    if text is not None and not isinstance(text, str):
        return bad("invalid_payload", f"text must be a string (got {type(text).__name__})")
    if not text and not blocks and not attachments:
        return bad("no_text", "needs a non-empty text, blocks or attachments")
    if text is not None and len(text) > SLACK_TEXT_MAX:
        # Slack itself truncates past this; refusing makes a sender that would lose text fail loudly here.
        return bad("msg_too_long", f"text is {len(text)} characters (max {SLACK_TEXT_MAX})")
    if blocks is not None:
        if not isinstance(blocks, list):
            return bad("invalid_blocks_format", f"blocks must be a list (got {type(blocks).__name__})")
        if len(blocks) > SLACK_BLOCKS_MAX:
            return bad("invalid_blocks", f"{len(blocks)} blocks (max {SLACK_BLOCKS_MAX})")
        errs = [e for i, b in enumerate(blocks) for e in _slack_block(b, f"blocks[{i}]")]
        if errs:
            return bad("invalid_blocks", *errs)
    if attachments is not None:
        if not isinstance(attachments, list) or not all(isinstance(a, dict) for a in attachments):
            return bad("invalid_attachments", "attachments must be a list of objects")
        if len(attachments) > SLACK_ATTACHMENTS_MAX:
            return bad("too_many_attachments", f"{len(attachments)} attachments (max {SLACK_ATTACHMENTS_MAX})")
        errs = [e for i, a in enumerate(attachments) if "blocks" in a
                for j, b in enumerate(a["blocks"] if isinstance(a["blocks"], list) else [None])
                for e in _slack_block(b, f"attachments[{i}].blocks[{j}]")]
        if errs:
            return bad("invalid_attachments", *errs)
    return SLACK_OK


# --- PagerDuty Events API v2 ------------------------------------------------------------------------------

def _pd_string(obj: Mapping[str, Any], key: str, where: str, *, required: bool, max_len: int | None = None,
               ) -> list[str]:
    value = obj.get(key)
    if value is None or value == "":
        return [f"'{where}' is missing or blank"] if required else []
    if not isinstance(value, str):
        return [f"'{where}' must be a string"]
    if max_len is not None and len(value) > max_len:
        return [f"Length of '{where}' is too long (maximum is {max_len} characters)"]
    return []


def _pd_context(obj: Mapping[str, Any], key: str, required_field: str) -> list[str]:
    items = obj.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        return [f"'{key}' must be an array"]
    errs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            errs.append(f"'{key}[{i}]' must be an object")
        elif not isinstance(item.get(required_field), str) or not item[required_field]:
            errs.append(f"'{key}[{i}].{required_field}' is missing or blank")
    return errs


def _pagerduty_errors(ev: Mapping[str, Any]) -> list[str]:
    errs = []
    key = ev.get("routing_key")
    if key is None or key == "":
        errs.append("'routing_key' is missing or blank")
    elif not isinstance(key, str):
        errs.append("'routing_key' must be a string")
    elif len(key) != PD_ROUTING_KEY_LEN:
        errs.append(f"Length of 'routing_key' is incorrect (should be {PD_ROUTING_KEY_LEN} characters)")
    action = ev.get("event_action")
    if action is None or action == "":
        errs.append("'event_action' is missing or blank")
    elif action not in PD_ACTIONS:
        errs.append(f"'event_action' is invalid (must be one of: {', '.join(PD_ACTIONS)})")
    errs += _pd_string(ev, "dedup_key", "dedup_key", required=action in ("acknowledge", "resolve"),
                       max_len=PD_DEDUP_KEY_MAX)
    if action == "trigger":
        payload = ev.get("payload")
        if not isinstance(payload, dict):
            errs.append("'payload' is missing or not an object")
        else:
            errs += _pd_string(payload, "summary", "payload.summary", required=True, max_len=PD_SUMMARY_MAX)
            errs += _pd_string(payload, "source", "payload.source", required=True)
            severity = payload.get("severity")
            if severity is None or severity == "":
                errs.append("'payload.severity' is missing or blank")
            elif severity not in PD_SEVERITIES:
                errs.append(f"'payload.severity' is invalid (must be one of: {', '.join(PD_SEVERITIES)})")
            if "timestamp" in payload and not _is_iso8601(payload["timestamp"]):
                errs.append("'payload.timestamp' is not a valid ISO 8601 timestamp")
            for opt in ("component", "group", "class"):
                errs += _pd_string(payload, opt, f"payload.{opt}", required=False)
            if "custom_details" in payload and not isinstance(payload["custom_details"], dict):
                errs.append("'payload.custom_details' must be an object")
        errs += _pd_context(ev, "links", "href")
        errs += _pd_context(ev, "images", "src")
        for opt in ("client", "client_url"):
            errs += _pd_string(ev, opt, opt, required=False)
    return errs


def _pagerduty(raw: bytes, content_type: str, new_key: Callable[[], str]) -> Verdict:
    ev, why = parse_object(raw, content_type)
    errs = _pagerduty_errors(ev) if ev is not None else [why or "unreadable body"]
    if ev is None or errs:
        return pagerduty_refusal(errs)
    return pagerduty_accepted(ev.get("dedup_key") or new_key())


# --- Alertmanager webhook_configs payload -----------------------------------------------------------------

def _string_map(value: Any, where: str) -> list[str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return [f"{where} must be an object of string values"]
    return []


def _alertmanager_errors(msg: Mapping[str, Any]) -> list[str]:
    errs = []
    if msg.get("version") != "4":
        errs.append(f"version must be \"4\" (got {msg.get('version')!r})")
    if msg.get("status") not in AM_STATUSES:
        errs.append(f"status must be firing or resolved (got {msg.get('status')!r})")
    if not isinstance(msg.get("receiver"), str) or not msg.get("receiver"):
        errs.append("receiver must be a non-empty string")
    for key in ("groupLabels", "commonLabels"):
        errs += _string_map(msg.get(key), key)
    if "commonAnnotations" in msg:
        errs += _string_map(msg["commonAnnotations"], "commonAnnotations")
    for key in ("externalURL", "groupKey"):
        if key in msg and not isinstance(msg[key], str):
            errs.append(f"{key} must be a string")
    if "truncatedAlerts" in msg and (not isinstance(msg["truncatedAlerts"], int) or msg["truncatedAlerts"] < 0):
        errs.append("truncatedAlerts must be a non-negative integer")
    alerts = msg.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        return errs + ["alerts must be a non-empty list"]
    for i, alert in enumerate(alerts):
        where = f"alerts[{i}]"
        if not isinstance(alert, dict):
            errs.append(f"{where} must be an object")
            continue
        if alert.get("status") not in AM_STATUSES:
            errs.append(f"{where}.status must be firing or resolved (got {alert.get('status')!r})")
        errs += _string_map(alert.get("labels"), f"{where}.labels")
        errs += _string_map(alert.get("annotations"), f"{where}.annotations")
        for key in ("startsAt", "endsAt"):
            if not _is_iso8601(alert.get(key)):
                errs.append(f"{where}.{key} must be an RFC 3339 timestamp (got {alert.get(key)!r})")
        if not isinstance(alert.get("fingerprint"), str) or not alert.get("fingerprint"):
            errs.append(f"{where}.fingerprint must be a non-empty string")
        if "generatorURL" in alert and not isinstance(alert["generatorURL"], str):
            errs.append(f"{where}.generatorURL must be a string")
    return errs


def _alertmanager(raw: bytes, content_type: str) -> Verdict:
    msg, why = parse_object(raw, content_type)
    errs = _alertmanager_errors(msg) if msg is not None else [why or "unreadable body"]
    if msg is None or errs:
        return alertmanager_refusal(errs)
    return WEBHOOK_OK


def strict_answer(kind: Kind, raw: bytes, content_type: str, new_key: Callable[[], str]) -> Verdict:
    """What the real service answers this request, every rule it documents applied."""
    if kind == "slack":
        return _slack(raw, content_type)
    if kind == "pagerduty":
        return _pagerduty(raw, content_type, new_key)
    return _alertmanager(raw, content_type)
