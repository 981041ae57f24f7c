"""Hostile wire inputs as hypothesis strategies: what a clumsy client or an attacker sends.

Each strategy gives the bytes of one message. Most are a valid message (a batch, a policy,
a command) with a defect or two put in (a field dropped, added, or given a near miss: the
right value as a string, an edge of the number line, a list where a number goes), so that
a decoder is driven past its first checks to the one that must refuse. The rest are the
bytes of arbitrary JSON, or any bytes. Numbers include what JSON should not carry (NaN,
Infinity, integers past 64 bits, doubles that overflow in arithmetic), strings what storage
should not keep (a trailing newline, NUL).
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import yaml
from hypothesis import strategies as st

from dsec.bench.fuzz_targets import NOW_MS
from dsec.schemas.actuations import ACTION_PARAM_MODELS
from dsec.schemas.fast_decode import RULES
from dsec.schemas.features import FLEET_FEATURES, WORKER_FEATURES
from dsec.schemas.metrics import SAMPLE_MODELS

INT64_MAX = 2**63 - 1
DAY_MS = 86_400_000
EDGE_INTS = (0, 1, -1, 2**31, 2**32, 2**53 + 1, INT64_MAX, 2**63, -(2**63), -(2**63) - 1,
             2**64, 10**30)
EDGE_FLOATS = (0.0, -0.0, 0.5, 5e-324, 1e-308, 1e154, 1e308, -1e308, 1.7976931348623157e308,
               float("inf"), float("-inf"), float("nan"))
EDGE_STRINGS = ("", "5", "1.5", "true", "NaN", "Infinity", "\x00", "GPU-1\n", " 1", "a" * 300,
                "\u202e", "é", "snapshot")
KINDS = tuple(sorted(SAMPLE_MODELS))
FEATURE_NAMES = tuple(sorted(WORKER_FEATURES.keys() | FLEET_FEATURES.keys()))


@functools.cache
def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(EDGE_INTS), st.sampled_from(EDGE_FLOATS), st.sampled_from(EDGE_STRINGS),
        st.integers(), st.floats(), st.text(max_size=8), st.booleans(), st.none(),
    )


@functools.cache
def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars(),
        lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6), inner, max_size=4),
        max_leaves=max_leaves,
    )


def to_json(document: Any, ascii_only: bool = True) -> bytes:
    """JSON text as a careless encoder writes it: NaN and Infinity as bare words, integers
    of any size."""
    return json.dumps(document, allow_nan=True, ensure_ascii=ascii_only).encode(
        "utf-8", "surrogatepass")


# --- defects ---------------------------------------------------------------------------------


def _slots(value: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key) of a JSON document, outermost first."""
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for key, child in list(items):
        yield value, key
        yield from _slots(child)


def _near_misses(value: Any) -> tuple[Any, ...]:
    """What a clumsy client sends instead of ``value``."""
    if isinstance(value, bool):
        return (0, 1, 2, 0.5, "true", "1", None, [value])
    if isinstance(value, int):
        return (str(value), value + 0.5, -value - 1, [value], None, True, *EDGE_INTS)
    if isinstance(value, float):
        return (str(value), [value], None, value * 1e300, *EDGE_FLOATS)
    if isinstance(value, str):
        return (value + "\n", "", value * 40, 5, None, [value], *EDGE_STRINGS)
    if isinstance(value, list):
        return ([], value + value, [value], {}, "x", None)
    if isinstance(value, dict):
        return ({}, [value], "x", None, 0)
    return (*EDGE_STRINGS[:4], 0, [])


@st.composite
def with_defects(draw: st.DrawFn, documents: st.SearchStrategy[Any]) -> Any:
    """A document from ``documents`` with mostly one defect, sometimes none or two. The
    defects go into a copy: a strategy may hand out the same object again (``just``,
    ``sampled_from``), and a draw must not change what a later one sees."""
    document = copy.deepcopy(draw(documents))
    for _ in range(draw(st.sampled_from((0, 1, 1, 1, 2)))):
        slots = list(_slots(document))
        if not slots:
            break
        container, key = draw(st.sampled_from(slots))
        how = draw(st.integers(0, 9))
        if how == 0 and isinstance(container, dict):
            del container[key]
        elif how == 1 and isinstance(container, dict):
            container[draw(st.text(max_size=8))] = draw(json_values(3))
        elif how == 2:
            container[key] = draw(json_values(4))
        else:
            container[key] = draw(st.sampled_from(_near_misses(container[key])))
    return document


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` cut short, with a byte changed, or with bytes put in."""
    if not data:
        return draw(st.binary(max_size=16))
    at = draw(st.integers(0, len(data) - 1))
    how = draw(st.sampled_from(("truncate", "flip", "insert", "repeat")))
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if how == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    end = draw(st.integers(at, len(data)))
    return data[:end] + data[at:end] + data[end:]


def wire(documents: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Valid documents with defects, as JSON bytes: mostly whole, some mangled, and some
    bytes that are no such document."""
    encoded = st.builds(to_json, with_defects(documents), st.booleans())
    return st.one_of(
        encoded, encoded, encoded, encoded, encoded, encoded,
        encoded.flatmap(mutated),
        st.builds(to_json, json_values()),
        st.binary(max_size=64),
    )


# --- identities, times, ids ----------------------------------------------------------------------

IDENTIFIER = st.from_regex(r"[A-Za-z0-9_.:\-/]{1,16}", fullmatch=True)
EVENT_IDS = st.from_regex(r"[0-9a-f]{8,32}", fullmatch=True)
IDENTITIES = st.fixed_dictionaries(
    {"job_id": IDENTIFIER, "worker_id": IDENTIFIER, "node_id": IDENTIFIER})
# Mostly inside the store's window at NOW_MS; the rest anywhere the model allows.
EVENT_TIMES = st.one_of(st.integers(NOW_MS - 40 * DAY_MS, NOW_MS + 600_000),
                        st.integers(0, 32503680000000))


# --- metric batches: rows, columns, packed columns ------------------------------------------


@functools.cache
def _valid(name: str, rule: Any) -> st.SearchStrategy[Any]:
    """A value of one sample field that the models take."""
    if name == "event_time_ms":
        return st.integers(NOW_MS - 40 * DAY_MS, NOW_MS + 600_000)
    if rule.dtype is object:
        if rule.choices is not None:
            text = st.sampled_from(sorted(rule.choices))
        elif rule.pattern is not None:
            text = IDENTIFIER
        else:
            text = st.text(max_size=min(rule.max_length or 16, 16))
        return st.one_of(text, st.none()) if rule.nullable else text
    if rule.dtype is np.bool_:
        return st.booleans()
    low = -1e300 if rule.lower is None else rule.lower[0]
    high = 1e300 if rule.upper is None else rule.upper[0]
    if rule.dtype is np.int64:
        return st.one_of(st.integers(int(max(low, 0)), int(min(high, 10**6))),
                         st.integers(int(max(low, -(2**63))), int(min(high, INT64_MAX))))
    number = st.floats(min_value=float(low), max_value=float(high),
                       allow_nan=False, allow_infinity=False,
                       exclude_min=bool(rule.lower and not rule.lower[1]),
                       exclude_max=bool(rule.upper and not rule.upper[1]))
    return st.one_of(number, st.none()) if rule.nullable else number


_PACKED_DTYPES = {np.float64: ("<f8", "<f4"), np.int64: ("<i8",), np.bool_: ("|b1",)}


@st.composite
def _packed(draw: st.DrawFn, rule: Any, values: list) -> dict[str, Any]:
    """``values`` as a packed column: mostly in a dtype the column takes, sometimes not;
    sometimes bytes that are no such column, or text that is not base64."""
    dtype = draw(st.sampled_from((*_PACKED_DTYPES[rule.dtype],) * 3 + ("<f8", "<i4", ">f8")))
    if draw(st.integers(0, 5)) == 0:
        data = draw(st.one_of(
            st.binary(max_size=40).map(lambda raw: base64.b64encode(raw).decode()),
            st.sampled_from(("", "=", "AAAA=", "AAAAAAAAAAA=", "!!!!", "AAAA\nAAAA", "é")),
        ))
        return {"dtype": dtype, "data": data}
    numbers = [np.nan if v is None else v for v in values]
    if rule.dtype is np.float64 and numbers and draw(st.booleans()):
        numbers[draw(st.integers(0, len(numbers) - 1))] = draw(st.sampled_from(EDGE_FLOATS))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a value the packing dtype cannot hold wraps
        raw = np.array(numbers, dtype=np.float64).astype(dtype).tobytes()
    return {"dtype": dtype, "data": base64.b64encode(raw).decode()}


@st.composite
def _columns_of_kind(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    n = draw(st.integers(0, 4))
    out: dict[str, Any] = {}
    for name, rule in RULES[kind].items():
        if not rule.required and draw(st.booleans()):
            continue
        values = draw(st.lists(_valid(name, rule), min_size=n, max_size=n))
        packed = rule.dtype is not object and draw(st.integers(0, 2)) == 0
        out[name] = draw(_packed(rule, values)) if packed else values
    return out


@st.composite
def _row(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": kind}
    for name, rule in RULES[kind].items():
        if rule.required or draw(st.booleans()):
            row[name] = draw(_valid(name, rule))
    return row


ROWS = st.sampled_from(KINDS).flatmap(_row)


@st.composite
def metric_batch_documents(draw: st.DrawFn) -> dict[str, Any]:
    document: dict[str, Any] = {"identity": draw(IDENTITIES)}
    for field, strategy in (("event_id", EVENT_IDS), ("event_time_ms", EVENT_TIMES),
                            ("gpu_uuid", IDENTIFIER)):
        if draw(st.booleans()):
            document[field] = draw(strategy)
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3, unique=True))
    form = draw(st.sampled_from(("columns", "columns", "columns", "rows", "both")))
    if form != "rows":
        document["columns"] = {kind: draw(_columns_of_kind(kind)) for kind in kinds}
    if form != "columns":
        document["samples"] = draw(st.lists(ROWS, min_size=1, max_size=4))
    return document


def metric_batches() -> st.SearchStrategy[bytes]:
    return wire(metric_batch_documents())


# --- feature events ----------------------------------------------------------------------------


def feature_event_documents() -> st.SearchStrategy[dict[str, Any]]:
    values = st.floats(allow_nan=False, allow_infinity=False)
    return st.fixed_dictionaries(
        {"identity": IDENTITIES,
         "features": st.dictionaries(st.sampled_from(FEATURE_NAMES), values, max_size=6)},
        optional={"event_time_ms": EVENT_TIMES, "window": st.just("rolling"),
                  "gpu_uuid": IDENTIFIER, "event_id": EVENT_IDS,
                  "tags": st.dictionaries(st.sampled_from(("pool", "gpu_model",
                                                           "episode_end_reason")),
                                          st.text(max_size=8), max_size=3)})


# --- policies: YAML or JSON, with CEL conditions ------------------------------------------------

CEL_FUNCTIONS = ("size", "int", "double", "string", "matches", "has", "exists", "undefined_fn",
                 "timestamp", "duration", "contains", "startsWith", "getHours", "uint", "all")
_CEL_NAMES = st.sampled_from((*FEATURE_NAMES[:8], "not_a_feature", "threshold", "x"))
_CEL_LITERALS = st.one_of(
    st.sampled_from(("1", "0", "-1", "1.5", "1e308", "1e400", "9223372036854775808",
                     "0x7fffffffffffffff", "true", "false", "null", "'a'", '"b"', "b'c'",
                     "1u", "[]", "{}")),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
_CEL_BINARY = ("+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||", "in")


def _cel_combine(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(_CEL_BINARY), inner).map(" ".join),
        st.tuples(st.sampled_from(("-", "!")), inner).map("".join),
        inner.map(lambda e: f"({e})"),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        st.tuples(st.sampled_from(CEL_FUNCTIONS), inner).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(inner, st.sampled_from(CEL_FUNCTIONS), inner).map(
            lambda t: f"{t[0]}.{t[1]}({t[2]})"),
        st.tuples(inner, inner).map(lambda t: f"[{t[0]}, {t[1]}]"),
        st.tuples(inner, _CEL_NAMES).map(lambda t: f"{t[0]}.{t[1]}"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
    )


@functools.cache
def cel_expressions() -> st.SearchStrategy[str]:
    """CEL conditions: well-formed over catalogue features, parameters and unknown names,
    with functions in and out of the policy set; nested or chained past the bounds; and
    text from CEL's alphabet."""
    deep = st.tuples(st.integers(20, 400), st.sampled_from(FEATURE_NAMES[:4])).map(
        lambda t: "(" * t[0] + f"{t[1]} > 1.0" + ")" * t[0])
    chained = st.tuples(st.integers(20, 600), st.sampled_from(("+", "&&", "||"))).map(
        lambda t: f" {t[1]} ".join(["reward_mean" if t[1] == "+" else "reward_mean > 1.0"]
                                   * t[0]))
    return st.one_of(
        st.recursive(st.one_of(_CEL_NAMES, _CEL_NAMES, _CEL_LITERALS), _cel_combine,
                     max_leaves=10),
        deep, chained,
        st.text(alphabet="()!&|<>=+-*/?:.,[]{}'\" 0123456789abcxyz_", max_size=40))


_ACTIONS = st.one_of(
    st.just({"kind": "snapshot"}),
    st.builds(lambda b: {"kind": "memory_cap", "limit_bytes": b}, st.integers(1 << 28, 1 << 40)),
    st.builds(lambda d: {"kind": "precision", "dtype": d}, st.sampled_from(("bf16", "fp16"))),
    st.builds(lambda b: {"kind": "grad_compression", "bits": b}, st.sampled_from((4, 8))),
    st.builds(lambda s: {"kind": "grad_accumulation", "steps": s}, st.integers(1, 64)),
    st.builds(lambda p: {"kind": "sampler", "paused": p}, st.booleans()),
    st.builds(lambda v: {"kind": "sync_priority", "level": v}, st.integers(-3, 3)),
)
_SECONDS = st.floats(0, 3600)


@st.composite
def policy_documents(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.integers(0, 9)) == 0:
        return {"deletes": draw(IDENTIFIER), "up_to_version": draw(st.integers(0, 9)),
                "signature": "hmac-sha256:00"}
    document: dict[str, Any] = {
        "name": draw(st.sampled_from(("custom", "fuzz"))), "version": draw(st.integers(1, 9)),
        "condition": draw(cel_expressions()),
        "params": draw(st.dictionaries(st.sampled_from(("threshold", "x")),
                                       st.floats(-1e6, 1e6), max_size=2)),
    }
    for key, strategy in (("for_s", _SECONDS), ("cooldown_s", _SECONDS), ("jitter_s", _SECONDS),
                          ("hold_s", _SECONDS),
                          ("exit_condition", cel_expressions()),
                          ("priority", st.integers(0, 1000)), ("dry_run", st.booleans()),
                          ("alert", st.text(max_size=40)),
                          ("selector", st.fixed_dictionaries({"job_ids": st.lists(
                              IDENTIFIER, max_size=2)}))):
        if draw(st.integers(0, 3)) == 0:
            document[key] = draw(strategy)
    how = draw(st.sampled_from(("action", "action", "stages", "tune")))
    if how == "action":
        document["action"] = {"params": draw(_ACTIONS), "ttl_s": draw(st.floats(1, 3600))}
    elif how == "stages":
        document["stages"] = draw(st.lists(st.fixed_dictionaries(
            {"actions": st.lists(_ACTIONS, min_size=1, max_size=2)},
            optional={"condition": cel_expressions(), "undo": st.lists(_ACTIONS, max_size=2),
                      "bind": st.just({"memory_cap.limit_bytes": "threshold"})}),
            min_size=1, max_size=3))
    else:
        document["tune"] = {"policy": draw(IDENTIFIER), "param": "threshold",
                            "delta": draw(st.floats(-10, 10)), "min_value": 0,
                            "max_value": draw(st.floats(0, 100))}
    return document


_YAML_ODDITIES = (
    b"a: &a [1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b]\n"
    b"name: x\ncondition: reward_mean > 1.0\nparams: {p: 1}\naction: {params: *c}\n",
    b"!!python/object/apply:os.system ['true']",
    b"name: !!binary AAAA\ncondition: 'true'\n",
    b"- " * 3000,
    b"[" * 3000,
    b"{" * 3000,
    b"{a: " * 900 + b"1" + b"}" * 900,
    b"name: x\ncondition: 1\naction: {params: {kind: snapshot}}\n" + b"\t" * 10,
    b"%YAML 1.1\n---\nname: x\n...\n---\nname: y\n",
    b"name: x\ncondition: reward_mean > 1.0\naction: {params: {kind: snapshot}}\n"
    b"cooldown_s: .inf\n",
)


def _to_yaml(document: Any) -> bytes:
    try:
        return yaml.safe_dump(document, allow_unicode=True).encode()
    except (yaml.YAMLError, UnicodeEncodeError):
        return b""


def policies() -> st.SearchStrategy[bytes]:
    """Policy records as JSON (as ``dsec policy publish`` writes them) or YAML."""
    yaml_text = with_defects(policy_documents()).map(_to_yaml)
    return st.one_of(wire(policy_documents()), yaml_text, yaml_text.flatmap(mutated),
                     st.sampled_from(_YAML_ODDITIES))


# --- actuation commands and results, worker-channel frames ------------------------------------

ACTUATION_IDS = st.from_regex(r"[0-9a-f]{8,32}", fullmatch=True)


@st.composite
def command_documents(draw: st.DrawFn) -> dict[str, Any]:
    at = draw(EVENT_TIMES)
    return {"actuation_id": draw(ACTUATION_IDS), "target": draw(IDENTITIES),
            "event_time_ms": at, "expires_at_ms": at + draw(st.integers(1, 3_600_000)),
            "policy_name": draw(IDENTIFIER), "policy_version": draw(st.integers(0, 9)),
            "action": draw(_ACTIONS), "reason": draw(st.text(max_size=20)),
            "signature": draw(st.sampled_from(("hmac-sha256:00", "hmac-sha256:" + "0" * 64)))}


STATUSES = st.sampled_from(("applied", "failed", "rejected", "stale", "superseded"))


def result_documents() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"actuation_id": ACTUATION_IDS, "identity": IDENTITIES,
         "action_kind": st.sampled_from(sorted(ACTION_PARAM_MODELS)), "status": STATUSES},
        optional={"detail": st.text(max_size=30), "command_time_ms": EVENT_TIMES,
                  "event_time_ms": EVENT_TIMES})


def frame_documents() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("register"), "identity": IDENTITIES,
                               "pid": st.integers(1, 1 << 22)}),
        st.fixed_dictionaries({"type": st.just("apply"), "actuation_id": ACTUATION_IDS,
                               "action": _ACTIONS, "command_time_ms": EVENT_TIMES},
                              optional={"replay": st.booleans()}),
        st.fixed_dictionaries({"type": st.just("result"), "actuation_id": ACTUATION_IDS,
                               "status": STATUSES},
                              optional={"detail": st.text(max_size=30),
                                        "replay": st.booleans()}),
    )


# --- the smaller topics the sink stores -------------------------------------------------------


def gpu_profile_documents() -> st.SearchStrategy[dict[str, Any]]:
    growth = st.fixed_dictionaries({"delta_bytes": st.floats(-1e12, 1e12),
                                    "delta_s": st.floats(0, 1e6)})
    return st.fixed_dictionaries(
        {"gpu_uuid": IDENTIFIER, "identity": IDENTITIES,
         "regimes": st.dictionaries(st.sampled_from(("short", "medium", "long")), growth,
                                    max_size=3)},
        optional={"thermal_throttle_events": st.integers(0, 1000),
                  "bandwidth_jitter": st.floats(0, 10), "samples": st.integers(0, 10**6),
                  "gpu_model": st.text(max_size=10), "event_time_ms": EVENT_TIMES})


def decision_documents() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"policy_name": IDENTIFIER, "policy_version": st.integers(0, 9),
         "decision": st.sampled_from(("fired", "policy_rejected", "suppressed_rate_limit"))},
        optional={"identity": IDENTITIES, "stage": st.integers(0, 8),
                  "actuation_id": ACTUATION_IDS, "detail": st.text(max_size=20)})


def dead_letter_documents() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"source_topic": IDENTIFIER, "partition": st.integers(0, 64),
         "offset": st.integers(0, 10**9), "reason": st.text(max_size=20),
         "payload": st.text(max_size=20)},
        optional={"payload_encoding": st.sampled_from(("utf-8", "base64")),
                  "payload_truncated": st.booleans()})


# --- the ingest gateway's bodies --------------------------------------------------------------


def registration_documents() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"runtime_id": IDENTIFIER, "runtime_type": st.text(min_size=1, max_size=10),
         "concurrency": st.integers(1, 1_000_000),
         "mean_call_latency_ms": st.floats(0, 1e6), "function_calling": st.booleans()},
        optional={"webhook_url": st.sampled_from((
            "http://127.0.0.1:9/x", "http://169.254.169.254/latest", "https://93.184.216.34/h",
            "http://[::1]/", "http://10.0.0.1/h")),
            "job_id": IDENTIFIER, "node_id": IDENTIFIER})


@st.composite
def metrics_post_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A runtime's post: rows, columns (lists or packed), or both, sometimes named."""
    document: dict[str, Any] = {}
    form = draw(st.sampled_from(("rows", "columns", "both")))
    if form != "columns":
        document["samples"] = draw(st.lists(ROWS, min_size=1, max_size=4))
    if form != "rows":
        kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=2, unique=True))
        document["columns"] = {kind: draw(_columns_of_kind(kind)) for kind in kinds}
    if draw(st.booleans()):
        document["batch_id"] = draw(EVENT_IDS)
    return document


def gateway_bodies() -> st.SearchStrategy[bytes]:
    deep = st.tuples(st.integers(20, 3000), st.sampled_from(("[", '{"a":'))).map(
        lambda t: (t[1] * t[0]).encode())
    return st.one_of(wire(registration_documents()), wire(metrics_post_documents()), deep)


def metric_streams() -> st.SearchStrategy[list[bytes]]:
    """A worker's messages in order, for the features a state carries from one to the next."""
    return st.lists(metric_batches(), min_size=2, max_size=5)
