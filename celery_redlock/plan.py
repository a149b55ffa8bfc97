"""LockPlan: what a task resolves at bind time to lock its executions.

:class:`~celery_redlock.LockedTask` builds its plan with :func:`build_plan`
when it binds to an app; every part that needs it (the task's ``__call__``,
the contention policies, the signal receivers, the tools) reads it through
:func:`plan_of`. A misconfigured task fails here, at bind, with
:class:`~celery_redlock.conf.ImproperlyConfigured`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import conf, headers, settings
from .core import Redlock, check_together, check_ttl, make_owner, parse_rate
from .keys import KeyBuilder

__all__ = ["LockPlan", "build_plan", "key_of", "plan_of", "set_plan"]

#: The task class attribute the plan is stored in.
_ATTR = "_lock_plan"


@dataclass(frozen=True)
class LockPlan:
    """Everything a task resolved at bind time to lock its executions.

    The lock nodes are resolved at bind too, and a bad node URL fails there.
    Only when the app names no lock node at all (no ``redlock_nodes``, and a
    broker that is not Redis) are they looked up again at first use, and a
    missing one fails then: a shared task is bound to every app of the process,
    including apps that never run it (a test plugin's default app, say).
    """

    lock_name: str
    settings: conf.LockSettings
    keys: KeyBuilder
    #: The keyword the fencing token is passed as, or None if ``run`` doesn't take it.
    token_arg: str | None
    #: The named limits held together with the key (``lock_also``): (name, limit)
    #: pairs, sorted by name (one order for every task).
    also: tuple[tuple[str, int], ...] = ()
    #: The named rates booked together with the key's own (``lock_also`` names
    #: given a rate): (name, windows) pairs, sorted by name.
    also_rates: tuple[tuple[str, Any], ...] = ()
    #: The app the task is bound to.
    app: Any = dataclasses.field(default=None, repr=False, compare=False)

    @functools.cached_property
    def resolved(self) -> conf.LockSettings:
        """:attr:`settings` with the lock nodes, looked up now if the app had none at bind."""
        if self.settings.nodes is not None:
            return self.settings
        with conf.bind_errors():
            nodes = settings.by_name("redlock_nodes").check(self.app.conf.get("redlock_nodes"))
            nodes = nodes or conf.nodes_from_app(self.app, self.lock_name)
        return dataclasses.replace(self.settings, nodes=nodes)

    @functools.cached_property
    def redlock(self) -> Redlock:
        """The Redlock client of the task's nodes (shared by every task on them)."""
        with conf.bind_errors():
            return conf.redlock_for(self.app, self.resolved)

    @functools.cached_property
    def claimed_on(self) -> str:
        """Where this task's claims are written (the ``redlock_claimed_on`` header)."""
        return headers.where(self.redlock)

    def owner(self, request: Any) -> str:
        return make_owner(request.id, request.retries or 0)

    @property
    def coalesce(self) -> str | None:
        """``"debounce"`` or ``"throttle"`` when calls of a key are collapsed, else None."""
        if self.settings.debounce is not None:
            return "debounce"
        return "throttle" if self.settings.throttle is not None else None

    @property
    def queued(self) -> bool:
        """Whether calls of a held key wait in its queue (``queue`` or ``supersede``)."""
        return self.settings.on_duplicate in ("queue", "supersede")

    @property
    def superseding(self) -> bool:
        """Whether the newest call of a key asks the running one to stop (``supersede``)."""
        return self.settings.on_duplicate == "supersede"

    @property
    def claims(self) -> bool:
        """Whether ``apply_async`` claims the key (enqueue claims, debounce or throttle)."""
        return self.settings.enqueue is not None or self.coalesce is not None

    def claim_mode(self, request: Any) -> str | None:
        """How an execution's acquire treats the key's claim (see Redlock.try_acquire).

        Under ``until_started`` the claim is withdrawn when its execution takes
        the lock; a task's own ``self.retry()`` comes after that start, so it
        is not held back by the claim of the task waiting behind it. Debounced
        messages claimed at publish take their claim the same way; a throttled
        message's slot stands for its claim (see Redlock.throttle).
        """
        enqueue = self.settings.enqueue
        if self.queued and headers.header(request, headers.QUEUED):
            return "take"  # handed the key by its queue (see celery_redlock.queues)
        if enqueue == "until_finished":
            return "check"
        if enqueue == "until_started" and not request.retries:
            return "take"
        if self.settings.debounce is not None and headers.header(request, headers.CLAIM):
            return "take"
        return None


def plan_of(task: Any) -> LockPlan | None:
    """The lock plan of a bound :class:`~celery_redlock.LockedTask` (class or instance).

    None for any other task, and for a LockedTask that has not bound yet or has
    no body (an abstract base).
    """
    plan = getattr(task, _ATTR, None)
    return plan if isinstance(plan, LockPlan) else None


def build_plan(task_cls: Any, app: Any) -> LockPlan:
    """Resolve and check the lock options of ``task_cls`` for ``app``.

    Raises:
        ImproperlyConfigured: an option or setting is invalid or misspelt, a
            lock node is invalid, or ``lock_on`` does not fit ``run``.
    """
    name = task_cls.name or task_cls.__name__
    with conf.bind_errors():
        conf.check_task_names(task_cls, name)
        overrides = {s.task_attr: getattr(task_cls, s.task_attr, None) for s in conf.SETTINGS}
        settings = conf.resolve(app, overrides, owner=name, defer_nodes=True)
        lock_name = task_cls.lock_name or name
        run = (
            task_cls.run if _is_plain_function(task_cls) else functools.partial(task_cls.run, None)
        )
        token_arg = task_cls.lock_token_arg
        keys = KeyBuilder(
            run, task_cls.lock_on, lock_name=lock_name, token_arg=token_arg, task_name=name
        )
        plan = LockPlan(
            lock_name=lock_name,
            settings=settings,
            keys=keys,
            token_arg=_token_arg(keys, token_arg, name),
            also=_also(task_cls.lock_also, lock_name, name),
            also_rates=_also_rates(task_cls.lock_also, lock_name, name),
            app=app,
        )
        if settings.nodes is not None:
            redlock = plan.redlock  # bad node URLs fail at bind
            check_ttl(redlock.nodes, settings.ttl, f"lock_ttl of {name}")
            if plan.also or plan.also_rates:  # a Redis Cluster node: one call, one slot
                together = [n for n, _ in plan.also] + [n for n, _ in plan.also_rates]
                check_together(redlock.nodes, together, "lock_also")
        _check_queue(settings, name)
        return plan


#: Options that decide which calls run, which a queued key (every call runs) cannot honour.
_NOT_WITH_QUEUE = ("enqueue", "debounce", "throttle")


def _check_queue(settings: conf.LockSettings, task_name: str) -> None:
    """``lock_queue_max`` needs ``queue``; ``queue`` and ``supersede`` exclude claims,
    debounce and throttle; ``supersede`` asks one holder to stop (``lock_limit`` 1)."""
    policy = settings.on_duplicate
    queued = policy in ("queue", "supersede")
    if policy == "supersede" and settings.limit != 1:
        raise conf.ImproperlyConfigured(
            f"{task_name}: lock_on_duplicate='supersede' replaces the one running call, "
            f"lock_limit = {settings.limit} runs several: use lock_limit = 1 or 'queue'"
        )
    if settings.queue_max and policy != "queue":
        raise conf.ImproperlyConfigured(
            f"{task_name}: lock_queue_max = {settings.queue_max} bounds a key's queue and "
            f"needs lock_on_duplicate='queue' (it is {settings.on_duplicate!r})"
        )
    for option in _NOT_WITH_QUEUE if queued else ():
        if getattr(settings, option) is not None:
            raise conf.ImproperlyConfigured(
                f"{task_name}: lock_on_duplicate={policy!r} decides which calls of a key run, "
                f"and so does lock_{option}: choose one (unset lock_{option})"
            )


def set_plan(task_cls: Any, plan: LockPlan) -> None:
    """Store ``plan`` on the task class (read back with :func:`plan_of`)."""
    setattr(task_cls, _ATTR, plan)


def _is_plain_function(cls: type) -> bool:
    """True when ``run`` takes no ``self`` (a task made from a function without ``bind``)."""
    for klass in cls.__mro__:
        if "run" in klass.__dict__:
            return isinstance(klass.__dict__["run"], staticmethod)
    return False


def _also(option: Any, lock_name: str, task_name: str) -> tuple[tuple[str, int], ...]:
    """``lock_also`` as (name, limit) pairs, each name built as ``lock_on=()`` builds it."""
    if not option:
        return ()
    if isinstance(option, str):
        option = (option,)
    pairs = option.items() if isinstance(option, Mapping) else ((n, 1) for n in option)
    # a rate on a name is a shared rate (_also_rates), not a permit
    limits = [(name, limit) for name, limit in pairs if not _is_rate(limit)]
    return _also_keyed(limits, "limit", settings.check_limit, lock_name, task_name)


def _also_rates(option: Any, lock_name: str, task_name: str) -> tuple[tuple[str, Any], ...]:
    """The ``lock_also`` names given a rate, as (key, windows) pairs."""
    if not isinstance(option, Mapping):
        return ()
    rates = [(name, rate) for name, rate in option.items() if _is_rate(rate)]
    return _also_keyed(rates, "rate", parse_rate, lock_name, task_name)


def _also_keyed(
    pairs: list[tuple[Any, Any]],
    what: str,
    check: Callable[[Any], Any],
    lock_name: str,
    task_name: str,
) -> tuple[tuple[str, Any], ...]:
    """(key, ``check``-ed value) pairs of ``lock_also`` names, sorted; a bad name or
    ``what`` (limit, rate) is refused naming it."""
    out = {}
    for name, value in pairs:
        if not isinstance(name, str) or not name or name == lock_name:
            raise conf.ImproperlyConfigured(
                f"{task_name}: lock_also names must be lock names other than the task's own "
                f"({lock_name!r}), got {name!r}"
            )
        key = KeyBuilder(_no_arguments, (), lock_name=name, task_name=task_name).build((), {})
        try:
            out[key] = check(value)
        except ValueError as exc:
            raise conf.ImproperlyConfigured(
                f"{task_name}: lock_also {what} of {name!r} {exc}, got {value!r}"
            ) from None
    return tuple(sorted(out.items()))


def _is_rate(value: Any) -> bool:
    """A ``lock_also`` value that is a rate: anything but a whole number (a limit)."""
    return not isinstance(value, int) or isinstance(value, bool)


def _no_arguments() -> None:
    """The signature of a named limit's key: no arguments (``lock_on=()``)."""


def _token_arg(keys: KeyBuilder, token_arg: str | None, task_name: str) -> str | None:
    """The token keyword if ``run`` declares it; it must have a default."""
    if not token_arg:
        return None
    param = keys.signature.parameters.get(token_arg)
    if param is None:
        return None
    if param.default is param.empty:
        raise conf.ImproperlyConfigured(
            f"{task_name}: parameter {token_arg!r} receives the fencing token and needs a "
            f"default (e.g. {token_arg}=None), or callers must pass it themselves"
        )
    return token_arg


def key_of(task: Any, *args: Any, **kwargs: Any) -> str:
    """The lock name a call of ``task`` with these arguments takes (``lock_on`` and
    ``lock_name`` applied): what a running call holds, for another client to test
    or take (``Redlock.holder``, ``AsyncRedlock.lock``, ...) on the same nodes.

    Raises:
        TypeError: ``task`` is not a bound :class:`~celery_redlock.LockedTask`.
        LockKeyError: the arguments do not fit ``run`` (see :meth:`KeyBuilder.build`).
    """
    plan = plan_of(task)
    if plan is None:
        error = getattr(task, "_lock_bind_error", None)
        if error is not None:
            raise error
        raise TypeError(
            f"key_of() takes a LockedTask bound to an app, not {task!r}: "
            "only a LockedTask's calls take a lock"
        )
    return plan.keys.build(args, kwargs)
