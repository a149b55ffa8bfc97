"""Lock keys must not change between releases: old and new workers share locks.

Two checks of :meth:`KeyBuilder.build`:

* ``GOLDEN``: keys (and errors) recorded from the original implementation,
  which bound every call with ``inspect`` and hashed the JSON round trip.
* ``reference_key``: that original algorithm, written out plainly, against
  many generated argument shapes and values.
"""

from __future__ import annotations

import datetime
import enum
import functools
import hashlib
import inspect
import json
import random
import sys
import uuid
from collections.abc import Mapping
from decimal import Decimal

import pytest
from kombu.utils.json import JSONEncoder

from celery_redlock.exceptions import LockKeyError
from celery_redlock.keys import DIGEST_LENGTH, KeyBuilder
from tests.support.signatures import charge, flexible, process, spread


def positional_only(a, b=2, /, c=3):
    pass


def required(a, b, c):
    pass


def keyword_only(*, a, b=1, fencing_token=None):
    pass


def no_params():
    pass


class Bound:
    def run(self, account_id, amount=10, fencing_token=None):
        pass


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


class Jsonable:
    def __json__(self):
        return {"z": 1, "a": [1, 2]}


FUNCS = {
    "charge": charge,
    "process": process,
    "flexible": flexible,
    "spread": spread,
    "positional_only": positional_only,
    "required": required,
    "keyword_only": keyword_only,
    "no_params": no_params,
    "bound": Bound().run,
    "partial": functools.partial(Bound.run, None),  # how a bind=True task's run is read
}

SCALARS = [
    0,
    1,
    -7,
    2**70,
    1.0,
    -0.0,
    0.1,
    1e300,
    float("nan"),
    float("inf"),
    float("-inf"),
    True,
    False,
    None,
    "",
    "acct-42",
    "héllo wörld",
    "日本語",
    "emoji \U0001f600",
    'quote " backslash \\ slash /',
    "\x00\x1f\n\t\r\x7f",
    "\ud800 lone surrogate",
]

OTHERS = [
    (1, 2),
    [1, [2, (3,)]],
    {"b": 1, "a": 2},
    {1: "a", 2: "b", 10: "c"},
    {"1": "a", 2: "b"},
    {"x", "y", "z"},
    frozenset({3, 1, 2}),
    Decimal("12.50"),
    datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.timezone.utc),
    datetime.date(2024, 5, 1),
    uuid.UUID(int=7),
    b"\x00\xffraw",
    b"text",
    Colour.RED,
    Name("subclass"),
    Jsonable(),
    {"customer": {"id": 7, "tags": ["é", None]}, "total": 3.5},
]

# (id, func, lock_on, builder options, args, kwargs)
CASES = [
    ("none-pos", "charge", None, {}, (1,), {}),
    ("none-pos2", "charge", None, {}, (1, 20), {}),
    ("none-kw", "charge", None, {}, (), {"account_id": 1, "amount": 20}),
    ("none-kwonly", "charge", None, {}, (1,), {"currency": "USD"}),
    ("none-token", "charge", None, {}, (1,), {"fencing_token": 99}),
    ("none-str", "charge", None, {}, ("acct-héllo",), {}),
    ("none-float", "charge", None, {}, (1.5, 2.5), {}),
    ("none-nested", "process", None, {}, ({"id": 1, "x": [1, 2]},), {}),
    ("none-tuple-default", "process", None, {}, ("o",), {}),
    ("none-varkw", "flexible", None, {}, ("t",), {"b": 2, "a": 1}),
    ("none-varargs", "spread", None, {}, (1, 2, 3), {"x": 1}),
    ("none-posonly", "positional_only", None, {}, (1,), {"c": 9}),
    ("none-required", "required", None, {}, (1, "2"), {"c": None}),
    ("none-kwonly-required", "keyword_only", None, {}, (), {"a": True}),
    ("none-no-params", "no_params", None, {}, (), {}),
    ("none-bound", "bound", None, {}, (5,), {"amount": 1}),
    ("none-token-other", "charge", None, {"token_arg": None}, (1,), {"fencing_token": 3}),
    ("name", "charge", "account_id", {}, (1,), {}),
    ("name-kw", "charge", "account_id", {}, (), {"account_id": 1}),
    ("name-str", "charge", "account_id", {}, ("日本",), {}),
    ("name-big", "charge", "account_id", {}, (2**80,), {}),
    ("name-dict", "charge", "account_id", {}, ({"b": 1, "a": {2: 3}},), {}),
    ("name-default", "charge", ["amount"], {}, (1,), {}),
    ("name-kwonly", "charge", ["currency"], {}, (1,), {"currency": "USD"}),
    ("names", "charge", ["amount", "account_id"], {}, (1, 2), {}),
    ("names-dup", "charge", ["account_id", "account_id"], {}, (1,), {}),
    ("names-mixed", "charge", ["currency", "account_id"], {}, (), {"account_id": [1]}),
    ("empty", "charge", [], {}, (1,), {}),
    (
        "path",
        "process",
        ["order.customer.id", "items.0.sku"],
        {},
        (
            {"customer": {"id": 7}},
            [{"sku": "A"}],
        ),
        {},
    ),
    ("path-int-key", "process", ["order.3"], {}, ({3: "x"},), {}),
    ("path-whole", "process", ["order.customer"], {}, ({"customer": {"b": 1, "a": 2}},), {}),
    (
        "varkw-sel",
        "flexible",
        ["tenant", "region", "scope.id"],
        {},
        ("t1",),
        {
            "region": "eu",
            "scope": {"id": 1},
        },
    ),
    ("varargs-sel", "spread", ["rest.1"], {}, (0, "a", "b"), {}),
    ("posonly-sel", "positional_only", ["b", "c"], {}, (1, 5), {}),
    ("callable", "charge", lambda account_id, **_: account_id, {}, (3,), {}),
    ("callable-str", "charge", lambda account_id, **_: f"acct-{account_id}", {}, (3,), {}),
    ("callable-dict", "charge", lambda account_id, **_: {"id": account_id}, {}, (3,), {}),
    ("callable-token", "charge", lambda *a, **k: sorted(k), {}, (3,), {"fencing_token": 1}),
    ("lock-name", "charge", "account_id", {"lock_name": "tâche.ü:x"}, (1,), {}),
    ("err-missing", "charge", None, {}, (), {}),
    ("err-unexpected", "charge", None, {}, (1,), {"colour": "red"}),
    ("err-twice", "charge", None, {}, (1,), {"account_id": 1}),
    ("err-too-many", "charge", None, {}, (1, 2, 3), {}),
    ("err-posonly-kw", "positional_only", None, {}, (), {"a": 1}),
    ("err-sel-missing", "required", ["a"], {}, (1,), {}),
    ("err-path", "process", ["order.customer.id"], {}, ({"customer": {}},), {}),
    ("err-unencodable", "process", None, {}, ({"id": 1},), {"note": object()}),
    ("err-unencodable-sel", "process", ["order.id"], {}, ({"id": object()},), {}),
]

# Recorded from the implementation before the fast paths.
GOLDEN = {
    "none-pos": "charge:{f66f8b1964de510e368a836be0bd45ac}",
    "none-pos2": "charge:{a44a12a4b69b4999c634feb84cba2234}",
    "none-kw": "charge:{a44a12a4b69b4999c634feb84cba2234}",
    "none-kwonly": "charge:{0115e81be5a21a38fb6e0433394a5989}",
    "none-token": "charge:{f66f8b1964de510e368a836be0bd45ac}",
    "none-str": "charge:{4219b54e0e2c3fe021589f3c0f10d23b}",
    "none-float": "charge:{d9815c334850b454da190f1af8fed211}",
    "none-nested": "charge:{8a3ae47ae2de517e31b67125e491ad13}",
    "none-tuple-default": "charge:{c5ad91dfeed30ee6b0453df5ce766307}",
    "none-varkw": "charge:{791707601e29176299ad6e3aea458008}",
    "none-varargs": "charge:{fc48bcbff34436f15aa908e714e86b6e}",
    "none-posonly": "charge:{453f2e3ccc0e44bbfc706dbeed4f196c}",
    "none-required": "charge:{3fde99ef78f4ed0387c8dedc29439b2c}",
    "none-kwonly-required": "charge:{a3f44886ecd0b8667b0c6a4652d41e1f}",
    "none-no-params": "charge:{44136fa355b3678a1146ad16f7e8649e}",
    "none-bound": "charge:{5a93967b924906bbb75bda4a7e8fb74b}",
    "none-token-other": "charge:{4051e9c78f0cd0b2400d20ad73d1735c}",
    "name": "charge:{b90328b0d37424b73929b6e84961ddc6}",
    "name-kw": "charge:{b90328b0d37424b73929b6e84961ddc6}",
    "name-str": "charge:{bec713eae7f0f6384eced64a9522a17e}",
    "name-big": "charge:{11748ba6055dcf43278d6aa054869ad9}",
    "name-dict": "charge:{cbba81079cb11b41c130c207f32562b0}",
    "name-default": "charge:{a8b88b82fe90a16048eb8851fe382405}",
    "name-kwonly": "charge:{ea14a2ae6724a06e110bd27e56efaf1c}",
    "names": "charge:{c9f1d7e087961550b0c2162f58786cfc}",
    "names-dup": "charge:{b90328b0d37424b73929b6e84961ddc6}",
    "names-mixed": "charge:{8cdb9cee54aab872fccba5d37c68b5d0}",
    "empty": "charge:{44136fa355b3678a1146ad16f7e8649e}",
    "path": "charge:{90338da37536f8fea5404e520932aa5d}",
    "path-int-key": "charge:{a4a58bd4857556e037a9d7d11935565d}",
    "path-whole": "charge:{06ddda273d0d4b57caf75dd9d58bdceb}",
    "varkw-sel": "charge:{1fa34bf4625529d7e81e7ed849cdb68f}",
    "varargs-sel": "charge:{bc7d60c847e9879e1cf2d7bf03eb5f3d}",
    "posonly-sel": "charge:{3148e9451fcef739c278e570a12a4ccd}",
    "callable": "charge:{1cd50c7ccc7c8e92c9857393cdc2226c}",
    "callable-str": "charge:{4b54726a65cd33e7cfe31ef4dad03728}",
    "callable-dict": "charge:{7c1fec4bb74895ddac0b5310bd14a718}",
    "callable-token": "charge:{a09965b15006242738caffc7669714bf}",
    "lock-name": "tâche.ü:x:{b90328b0d37424b73929b6e84961ddc6}",
    "err-missing": (
        "LockKeyError: task 'charge': arguments do not match run: missing a required "
        "argument: 'account_id'"
    ),
    "err-unexpected": (
        "LockKeyError: task 'charge': arguments do not match run: got an unexpected "
        "keyword argument 'colour'"
    ),
    "err-twice": (
        "LockKeyError: task 'charge': arguments do not match run: multiple values for "
        "argument 'account_id'"
    ),
    "err-too-many": (
        "LockKeyError: task 'charge': arguments do not match run: too many positional arguments"
    ),
    # inspect's own words, which Python 3.13 changed
    "err-posonly-kw": "LockKeyError: task 'charge': arguments do not match run: "
    + (
        "got some positional-only arguments passed as keyword arguments: 'a'"
        if sys.version_info >= (3, 13)
        else "'a' parameter is positional only, but was passed as a keyword"
    ),
    "err-sel-missing": (
        "LockKeyError: task 'charge': arguments do not match run: missing a required argument: 'b'"
    ),
    "err-path": (
        "LockKeyError: task 'charge': lock_on selector 'order.customer.id' is missing at 'id'"
    ),
    "err-unencodable": (
        "LockKeyError: task 'charge': argument 'note' (object) has no canonical form: "
        "Object of type object is not JSON serializable; use lock_on to choose the "
        "arguments that identify the work"
    ),
    "err-unencodable-sel": (
        "LockKeyError: task 'charge': selector 'order.id' (object) has no canonical "
        "form: Object of type object is not JSON serializable; use lock_on to choose the "
        "arguments that identify the work"
    ),
    "every-value": "32712f684fcb4bd80b58eaf8af96e60001bbbec2a645ed550d0d53a5f3ed98dc",
}


def builder(func, lock_on, options):
    return KeyBuilder(FUNCS[func], lock_on, **{"lock_name": "charge", **options})


def outcome(func, lock_on, options, args, kwargs):
    try:
        return builder(func, lock_on, options).build(args, kwargs)
    except LockKeyError as exc:
        return f"LockKeyError: {exc}"


def every_value_digest():
    """One digest over the keys of every value in SCALARS and OTHERS, by position and keyword."""
    keys = []
    for value in SCALARS + OTHERS:
        for lock_on in (None, "account_id"):
            b = KeyBuilder(charge, lock_on, lock_name="charge")
            keys += [b.build((value,), {}), b.build((), {"account_id": value, "amount": value})]
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


@pytest.mark.parametrize(
    "case_id, func, lock_on, options, args, kwargs", CASES, ids=[c[0] for c in CASES]
)
def test_golden(case_id, func, lock_on, options, args, kwargs):
    assert outcome(func, lock_on, options, args, kwargs) == GOLDEN[case_id]


def test_golden_every_value():
    assert every_value_digest() == GOLDEN["every-value"]


# -- the original algorithm, written out plainly


class _Encoder(JSONEncoder):
    def default(self, o):
        if isinstance(o, (set, frozenset)):
            return sorted(o, key=_reference_canonical)
        return super().default(o)


def _reference_canonical(value):
    first = json.dumps(value, cls=_Encoder, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(json.loads(first), sort_keys=True, separators=(",", ":"))


def _walk(value, steps):
    for step in steps:
        if isinstance(value, Mapping):
            value = value[step] if step in value else value[int(step)]
        else:
            value = value[int(step)]
    return value


def reference_key(func, lock_on, args, kwargs, lock_name="charge", token_arg="fencing_token"):
    params = inspect.signature(func).parameters
    token = token_arg if token_arg in params else None
    if callable(lock_on):
        payload = {"": lock_on(*args, **{k: v for k, v in kwargs.items() if k != token})}
    else:
        bound = inspect.signature(func).bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        if lock_on is None:
            arguments.pop(token, None)
            payload = arguments
        else:
            varkw = next((p.name for p in params.values() if p.kind is p.VAR_KEYWORD), None)
            payload = {}
            for selector in [lock_on] if isinstance(lock_on, str) else lock_on:
                head, *steps = selector.split(".")
                top = arguments[head] if head in params else arguments[varkw][head]
                payload[selector] = _walk(top, steps)
    text = _reference_canonical(payload)
    return f"{lock_name}:{{{hashlib.sha256(text.encode('ascii')).hexdigest()[:DIGEST_LENGTH]}}}"


def by_name_key(func, lock_on, args, kwargs):
    """A callable's key where the original call failed (an argument passed by position
    that the callable takes by name only): the call's arguments by name."""
    if not callable(lock_on):
        raise TypeError("selectors bind as before")
    arguments = inspect.signature(func).bind(*args, **kwargs).arguments
    named = {k: v for k, v in arguments.items() if k != "fencing_token"}
    return reference_key(func, lambda: lock_on(**named), (), {})


def _random_value(rng, depth=0):
    if depth < 2 and rng.random() < 0.25:
        items = [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
        kind = rng.randrange(3)
        if kind == 0:
            return items
        if kind == 1:
            return tuple(items)
        return {rng.choice(["a", "b", "é", "10", "2"]): item for item in items}
    return rng.choice(SCALARS + OTHERS)


def _random_call(rng, func):
    """Random values for ``func``, split at random between positional and keyword."""
    params = [p for p in inspect.signature(func).parameters.values() if p.name != "fencing_token"]
    args, kwargs = [], {}
    positional = True
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            if positional:
                args += [_random_value(rng) for _ in range(rng.randrange(3))]
            continue
        if p.kind is p.VAR_KEYWORD:
            kwargs.update({f"extra{i}": _random_value(rng) for i in range(rng.randrange(3))})
            continue
        if p.default is not p.empty and rng.random() < 0.3:
            positional = False  # left to its default
            continue
        value = _random_value(rng)
        if p.kind is p.POSITIONAL_ONLY or (
            positional and p.kind is p.POSITIONAL_OR_KEYWORD and rng.random() < 0.6
        ):
            if not positional:
                continue  # cannot follow a skipped one: keep the default
            args.append(value)
        else:
            positional = False
            kwargs[p.name] = value
    if "fencing_token" in inspect.signature(func).parameters and rng.random() < 0.3:
        kwargs["fencing_token"] = rng.randrange(10**6)
    return tuple(args), kwargs


SHAPES = [
    ("charge", None),
    ("charge", "account_id"),
    ("charge", ["currency", "amount"]),
    ("process", None),
    ("process", ["order", "note"]),
    ("flexible", None),
    ("spread", None),
    ("positional_only", None),
    ("positional_only", ["a", "c"]),
    ("required", ["c", "a"]),
    ("keyword_only", None),
    ("bound", None),
    ("bound", "amount"),
    ("partial", None),
    ("partial", "account_id"),
    ("charge", lambda account_id, amount=10, **_: [account_id, amount]),
    ("charge", lambda account_id, **_: account_id),
]


@pytest.mark.parametrize("func, lock_on", SHAPES)
def test_generated_calls_match_the_original_algorithm(func, lock_on):
    rng = random.Random(f"{func}-{lock_on if not callable(lock_on) else 'callable'}")
    b = KeyBuilder(FUNCS[func], lock_on, lock_name="charge")
    checked = 0
    for _ in range(300):
        args, kwargs = _random_call(rng, FUNCS[func])
        try:
            expected = reference_key(FUNCS[func], lock_on, args, kwargs)
        except (TypeError, ValueError):
            try:
                expected = by_name_key(FUNCS[func], lock_on, args, kwargs)
            except (TypeError, ValueError):
                with pytest.raises(LockKeyError):
                    b.build(args, kwargs)
                continue
        assert b.build(args, kwargs) == expected, (args, kwargs)
        checked += 1
    assert checked > 100


# Ids by position and type: a set's repr and an object's address differ between
# processes, and every process of a parallel run must collect the same ids.
@pytest.mark.parametrize(
    "value",
    SCALARS + OTHERS,
    ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(SCALARS + OTHERS)],
)
@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_every_value_type_matches_the_original_algorithm(value, how):
    args, kwargs = ((value,), {}) if how == "positional" else ((), {"account_id": value})
    for lock_on in (None, "account_id", ["amount", "account_id"]):
        b = KeyBuilder(charge, lock_on, lock_name="charge")
        assert b.build(args, kwargs) == reference_key(charge, lock_on, args, kwargs)
