"""Lock-key derivation: which arguments identify the work, and how they become a key.

A locked task runs at most once at a time per *lock key*. The key is built on the
worker from the arguments the task received::

    <lock_name>:{<digest>}

``lock_name`` is the task's lock name, shown as is. ``digest`` is the first 32 hex
characters (128 bits) of the SHA-256 of the canonical form of the selected
arguments. The braces make the digest a Redis Cluster hash tag, so the lock key
and its fence key always land on the same slot. Argument values never appear in
Redis, because they may be personal data.

Choosing the arguments (``lock_on``):

* ``None`` (default): every parameter of ``run``, with defaults filled in.
  ``*args`` and ``**kwargs`` count as one parameter each, holding their values.
* a parameter name, or a list of them: only those parameters. A *selector* may be
  a dotted path into mapping arguments, with integer steps into lists:
  ``"order.customer.id"`` is ``order["customer"]["id"]``, and ``"items.0.sku"`` is
  ``items[0]["sku"]``. If ``run`` takes ``**kwargs``, a selector may also name a
  key of it.
* a mapping from selectors to functions: those parameters, each value passed
  through its function before hashing. ``lock_on={"order_id": int}`` makes
  ``"7"`` and ``7`` one key (the key of ``lock_on="order_id"`` with ``7``).
* ``[]``: no arguments, so there is one lock per lock name. The task never runs
  twice at the same time, whatever its arguments.
* a callable: it gets the task's arguments and returns the value to lock on,
  e.g. ``lock_on=lambda order_id, **_: int(order_id)``. A callable whose
  parameters are all parameters of ``run`` (and takes no ``*args``) gets them
  **by name**, however the caller passed them: the arguments the call gave,
  and, for a parameter it needs without a default of its own, ``run``'s
  default; without ``**kwargs`` it gets only the parameters it names. Any
  other callable (``*args``, or a parameter ``run`` does not have) is called
  as ``f(*args, **kwargs)``, with the arguments as the caller passed them.

Rules:

* A call gives the same key whether arguments are passed by position or keyword,
  and whether defaults are omitted or passed explicitly.
* The fencing-token parameter (``lock_token_arg``, default ``fencing_token``) is
  never part of the key, and cannot be selected.
* The key is that of the arguments *after a JSON round trip through Celery*: a
  tuple and a list with the same items give the same key, and so do ``{1: "a"}``
  and ``{"1": "a"}``, since JSON turns them into one another anyway. ``1`` and
  ``1.0`` differ; Celery's JSON keeps them apart too. Sets are sorted, so they
  work even with the pickle serializer.
* Values are encoded with kombu's JSON encoder: ``datetime``, ``date``, ``time``,
  ``Decimal``, ``UUID`` and ``bytes`` work, and so do types registered with
  ``kombu.utils.json.register_type`` or with a ``__json__`` method. Anything
  else is a :class:`~celery_redlock.exceptions.LockKeyError` naming the task, the
  argument and its type. Choose identifying arguments with ``lock_on`` to avoid
  that.
* Types count: ``7``, ``7.0``, ``Decimal("7")`` and ``"7"`` are four keys. Where
  callers disagree on a type (a web request gives strings), convert it in
  ``lock_on``: ``{"order_id": int}`` or ``lambda order_id, **_: int(order_id)``.
* A selector whose first step is not a parameter of ``run``, or a mapping value
  that is not callable, fails when the task binds, with
  :class:`~celery_redlock.conf.ImproperlyConfigured`. A path that
  is missing at run time (absent key, short list, a ``None`` in the way) is a
  ``LockKeyError``. When a path may be absent, use a callable.
* With ``lock_on=None``, adding a parameter to ``run`` changes every key, so old
  and new workers do not exclude each other during a rolling deploy. Name the
  identifying arguments when that matters.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from kombu.utils.json import JSONEncoder as _KombuJSONEncoder

from .conf import ImproperlyConfigured
from .exceptions import LockKeyError

__all__ = ["DIGEST_LENGTH", "KeyBuilder", "LockOn", "digest"]

#: Hex characters of SHA-256 kept in a key: 128 bits. Birthday collisions need
#: about 2**64 distinct keys, and halving the length saves memory on every lock
#: and fence key.
DIGEST_LENGTH = 32

LockOn = None | str | Sequence[str] | Mapping[str, Callable[[Any], Any]] | Callable[..., Any]

# How a callable takes the arguments by name: the names it takes (None: all, it
# has **kwargs), and (name, run's default) for the parameters it needs run's default of.
_ByName = tuple[frozenset | None, tuple[tuple[str, Any], ...]]

_UNSTEPPABLE = (str, bytes, bytearray)
_INDEX = re.compile(r"\d+")


class _Encoder(_KombuJSONEncoder):
    """kombu's encoder, plus sets in an order that does not depend on PYTHONHASHSEED."""

    def default(self, o: Any) -> Any:
        if isinstance(o, (set, frozenset)):
            return sorted(o, key=_canonical)
        return super().default(o)


# First pass: kombu's types and sets become plain JSON. The second pass sorts keys
# once every dict key is a string, as it is after Celery's round trip (sorting int
# keys numerically would put 10 before 2 only on one side of that trip).
_FIRST = _Encoder(separators=(",", ":"), ensure_ascii=False)
_FINAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)
_ENCODE_ERRORS = (TypeError, ValueError, RecursionError)


def _canonical(value: Any) -> str:
    return _FINAL.encode(json.loads(_FIRST.encode(value)))


# Values the JSON round trip gives back unchanged, so their canonical form is
# just _FINAL's. Exact types only: subclasses (IntEnum, str enums...) take the
# general path.
_PLAIN: dict[type, Callable[[Any], str]] = {
    str: encode_basestring_ascii,  # what _FINAL writes for a string
    int: int.__repr__,  # and for an int
    float: _FINAL.encode,
    bool: _FINAL.encode,
    type(None): _FINAL.encode,
}


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:DIGEST_LENGTH]


def digest(value: Any) -> str:
    """Return the digest of ``value``'s canonical form, as used in lock keys.

    A key hashes the mapping ``{selector: value}``: with ``lock_on=["a"]`` and
    ``a=1`` its digest is ``digest({"a": 1})``. A ``lock_on`` callable's result
    ``v`` is hashed as ``digest({"": v})``.

    Raises:
        LockKeyError: ``value`` has no canonical form.
    """
    try:
        return _hash(_canonical(value))
    except _ENCODE_ERRORS as exc:
        raise LockKeyError(f"no canonical form for a {type(value).__name__}: {exc}") from exc


class KeyBuilder:
    """Builds the lock keys of one task; made once, when the task binds.

    Args:
        func: the task's ``run`` (a function or bound method; ``self`` of a bound
            method is not an argument).
        lock_on: which arguments identify the work; see the module docstring.
        lock_name: the readable part of every key; no ``{`` or ``}``.
        token_arg: the parameter that receives the fencing token, left out of keys.
        task_name: used in error messages; defaults to ``lock_name``.

    Raises:
        ImproperlyConfigured: invalid ``lock_name`` or ``lock_on``, or a selector that
            does not start with a parameter of ``func``.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        lock_on: LockOn = None,
        *,
        lock_name: str,
        token_arg: str | None = "fencing_token",
        task_name: str | None = None,
    ) -> None:
        self.task_name = task_name or lock_name
        if not isinstance(lock_name, str) or not lock_name or "{" in lock_name or "}" in lock_name:
            raise ImproperlyConfigured(
                f"task {self.task_name!r}: lock name must be a non-empty string without "
                f"'{{' or '}}' (Redis hash-tag characters), got {lock_name!r}"
            )
        try:
            self.signature = inspect.signature(func)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(
                f"task {self.task_name!r}: cannot read run's signature: {exc}"
            ) from exc
        self.lock_name = lock_name
        self.lock_on = lock_on
        params = self.signature.parameters
        self._token = token_arg if token_arg in params else None
        self._varkw = next(
            (p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None
        )
        self._pick = lock_on if callable(lock_on) else None
        self._by_name = None if self._pick is None else self._by_name_of(self._pick, params)
        self._selectors: tuple | None = None
        self._convert: dict[str, Callable[[Any], Any]] = {}
        if self._pick is not None:
            fields: Sequence[str] = [""]
        elif lock_on is None:
            fields = [name for name in params if name != self._token]
        else:
            if isinstance(lock_on, Mapping):
                self._convert = self._converters(lock_on)
                names: Any = list(lock_on)
            else:
                names = [lock_on] if isinstance(lock_on, str) else lock_on
            if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
                raise ImproperlyConfigured(
                    f"task {self.task_name!r}: lock_on must be None, a parameter name, a "
                    f"list of them, a mapping of them to functions or a callable, got "
                    f"{type(lock_on).__name__}"
                )
            self._selectors = tuple(self._parse(name, params) for name in names)
            fields = names
        # The keys of every payload hashed, as the canonical form sorts them,
        # with their JSON labels: plain values are then written directly.
        self._fields = tuple((f, encode_basestring_ascii(f) + ":") for f in sorted(set(fields)))
        # Fast binding for the common signature: named parameters only.
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self._simple = all(p.kind in kinds for p in params.values())
        self._positional = tuple(
            name for name, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        self._params = tuple((name, p.default) for name, p in params.items())

    def _parse(self, selector: str, params: Mapping[str, inspect.Parameter]) -> tuple:
        head, *rest = selector.split(".")
        if not all([head, *rest]):
            raise ImproperlyConfigured(
                f"task {self.task_name!r}: lock_on selector {selector!r} has an empty step"
            )
        if head == self._token:
            raise ImproperlyConfigured(
                f"task {self.task_name!r}: lock_on selector {selector!r} selects the "
                f"fencing-token parameter, which is never part of the key"
            )
        if head not in params and self._varkw is None:
            available = ", ".join(n for n in params if n != self._token) or "none"
            raise ImproperlyConfigured(
                f"task {self.task_name!r}: lock_on selector {selector!r} does not start "
                f"with a parameter of run (parameters: {available})"
            )
        steps = tuple((s, int(s) if _INDEX.fullmatch(s) else None) for s in rest)
        return selector, head, steps, head not in params

    def _converters(self, lock_on: Mapping) -> dict[str, Callable[[Any], Any]]:
        for name, convert in lock_on.items():
            if not isinstance(name, str):
                raise ImproperlyConfigured(
                    f"task {self.task_name!r}: lock_on maps {name!r}, which is not a "
                    f"parameter name: map names to functions, e.g. {{'order_id': int}}"
                )
            if not callable(convert):
                raise ImproperlyConfigured(
                    f"task {self.task_name!r}: lock_on maps {name!r} to {convert!r}, which "
                    f"is not callable: map it to the function applied to its value, e.g. "
                    f"{{{name!r}: int}}"
                )
        return dict(lock_on)

    def _by_name_of(
        self, pick: Callable[..., Any], params: Mapping[str, inspect.Parameter]
    ) -> _ByName | None:
        """(names it takes, or None for all; run's defaults it needs) when ``pick`` takes
        run's arguments by name; None when it is called as ``pick(*args, **kwargs)``."""
        try:
            own = inspect.signature(pick).parameters.values()
        except (TypeError, ValueError):
            return None
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        named = {
            n: p
            for n, p in params.items()
            if n != self._token and (p.kind in kinds or p.kind is inspect.Parameter.POSITIONAL_ONLY)
        }
        takes_all = False
        for p in own:
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                takes_all = True
            elif p.kind not in kinds or p.name not in named:
                return None
        fill = tuple(
            (p.name, named[p.name].default)
            for p in own
            if p.kind in kinds
            and p.default is inspect.Parameter.empty
            and named[p.name].default is not inspect.Parameter.empty
        )
        return None if takes_all else frozenset(p.name for p in own), fill

    def build(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """Return the lock key for one call: ``f"{lock_name}:{{{digest}}}"``.

        Raises:
            LockKeyError: the arguments do not fit ``run``, a selected path is
                missing, or a selected value has no canonical form.
        """
        if self._pick is not None:
            if self._by_name is not None:
                return self._picked((), self._named(args, kwargs))
            return self._picked(args, kwargs)
        arguments = self._bind(args, kwargs)  # a fresh dict: safe to change
        if self._selectors is None:
            if self._token is not None:
                arguments.pop(self._token, None)
            return self._finish(arguments, "argument")
        values = {s[0]: self._resolve(arguments, *s) for s in self._selectors}
        return self._finish(self._converted(values) if self._convert else values, "selector")

    def build_selected(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """Return the lock key from the ``lock_on`` arguments alone, for the tools.

        ``args`` are the selectors' values in ``lock_on`` order and ``kwargs`` name
        selectors (``{"order.customer.id": 7}``); a mapping's functions apply to
        them. A callable gets ``f(*args, **kwargs)``: its own parameters. With
        ``lock_on=None`` this is :meth:`build`: every parameter is selected.

        Raises:
            LockKeyError: the values do not fit the selectors, a function raised, or
                a value has no canonical form.
        """
        if self._pick is not None:
            return self._picked(args, kwargs)
        if self._selectors is None:
            return self.build(args, kwargs)
        names = list(dict.fromkeys(s[0] for s in self._selectors))
        listed = ", ".join(names) or "none"
        if len(args) > len(names):
            raise LockKeyError(
                f"task {self.task_name!r}: {len(args)} values given, lock_on selects "
                f"{len(names)}: {listed}"
            )
        values = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names or name in values:
                what = "given twice" if name in values else "not a lock_on selector"
                raise LockKeyError(
                    f"task {self.task_name!r}: {name!r} is {what} (lock_on: {listed})"
                )
            values[name] = value
        missing = [name for name in names if name not in values]
        if missing:
            raise LockKeyError(
                f"task {self.task_name!r}: no value for lock_on {', '.join(map(repr, missing))}"
            )
        return self._finish(self._converted(values), "selector")

    def _converted(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with the mapping's functions applied (in place)."""
        for name, convert in self._convert.items():
            try:
                values[name] = convert(values[name])
            except Exception as exc:
                raise LockKeyError(
                    f"task {self.task_name!r}: lock_on[{name!r}] raised "
                    f"{type(exc).__name__} on a {type(values[name]).__name__}: {exc}"
                ) from exc
        return values

    def _picked(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The key of the callable's value for ``f(*args, **kwargs)``, the token left out."""
        assert self._pick is not None
        if self._token is not None and self._token in kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k != self._token}
        try:
            value = self._pick(*args, **kwargs)
        except Exception as exc:
            raise LockKeyError(
                f"task {self.task_name!r}: lock_on callable raised {type(exc).__name__}: {exc}"
            ) from exc
        return self._finish({"": value}, "the value returned by lock_on")

    def _named(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, for a callable that takes them so (no token)."""
        assert self._by_name is not None
        takes, fill = self._by_name
        named = self._bind(args, kwargs, defaults=False)
        if self._token is not None:
            named.pop(self._token, None)
        if self._varkw is not None and self._varkw in named:
            named.update(named.pop(self._varkw))
        if takes is not None:
            named = {k: v for k, v in named.items() if k in takes}
        for name, default in fill:
            named.setdefault(name, default)
        return named

    def _bind(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], defaults: bool = True
    ) -> dict[str, Any]:
        """``signature.bind(*args, **kwargs)``, with defaults applied unless told not:
        ``{name: value}`` in order."""
        if self._simple and len(args) <= len(self._positional):
            # Named parameters only: bind by hand, several times faster than inspect.
            arguments = dict(zip(self._positional, args))
            used = 0
            for name, default in self._params[len(args) :]:
                if name in kwargs:
                    arguments[name] = kwargs[name]
                    used += 1
                elif default is inspect.Parameter.empty:
                    break  # missing: let inspect word the error
                elif defaults:
                    arguments[name] = default
            else:
                if used == len(kwargs):  # else unknown, or given twice
                    return arguments
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise LockKeyError(
                f"task {self.task_name!r}: arguments do not match run: {exc}"
            ) from exc
        if defaults:
            bound.apply_defaults()
        return bound.arguments

    def _resolve(
        self, arguments: dict, selector: str, head: str, steps: tuple, in_varkw: bool
    ) -> Any:
        # Only a missing key or index is "missing"; errors from odd containers propagate.
        try:
            value = arguments[self._varkw][head] if in_varkw else arguments[head]
        except KeyError:
            raise self._missing(selector, head) from None
        for key, index in steps:
            if isinstance(value, Mapping):
                if key in value:
                    value = value[key]
                elif index is not None and index in value:  # int keys (pickle serializer)
                    value = value[index]
                else:
                    raise self._missing(selector, key)
            elif isinstance(value, Sequence) and not isinstance(value, _UNSTEPPABLE):
                if index is None or index >= len(value):
                    raise self._missing(selector, key)
                value = value[index]
            else:
                raise LockKeyError(
                    f"task {self.task_name!r}: lock_on selector {selector!r} cannot step "
                    f"into a {type(value).__name__} at {key!r}"
                )
        return value

    def _missing(self, selector: str, step: str) -> LockKeyError:
        return LockKeyError(
            f"task {self.task_name!r}: lock_on selector {selector!r} is missing at {step!r}"
        )

    def _finish(self, payload: dict, what: str) -> str:
        try:
            text = _plain(self._fields, payload) or _canonical(payload)
        except _ENCODE_ERRORS as whole:
            # Errors only: encode one entry at a time so the message can name the culprit.
            label, error = what, whole
            for name, value in payload.items():
                try:
                    _canonical(value)
                except _ENCODE_ERRORS as exc:
                    named = what if what.startswith("the ") else f"{what} {name!r}"
                    label, error = f"{named} ({type(value).__name__})", exc
                    break
            raise LockKeyError(
                f"task {self.task_name!r}: {label} has no canonical form: {error}; "
                f"use lock_on to choose the arguments that identify the work"
            ) from error
        return f"{self.lock_name}:{{{_hash(text)}}}"

    def __repr__(self) -> str:
        return f"<KeyBuilder {self.lock_name!r} lock_on={self.lock_on!r}>"


def _plain(fields: Sequence[tuple[str, str]], payload: dict) -> str | None:
    """The canonical form of ``payload`` (its ``fields``: name, JSON label) if its
    values are all plain, else None."""
    parts = []
    for name, label in fields:
        value = payload[name]
        encode = _PLAIN.get(type(value))
        if encode is None:
            return None
        parts.append(label + encode(value))
    return "{" + ",".join(parts) + "}"
