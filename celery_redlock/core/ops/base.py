"""The value classes of the operations and results crossing the node seam."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Any:
        return lambda decorator: decorator


_T = TypeVar("_T")


@dataclass_transform(frozen_default=True)
def value(cls: type[_T]) -> type[_T]:
    """A value class: a frozen dataclass to the type checker, which refuses any
    assignment to a field. At run time a slotted dataclass with equality and a hash,
    not frozen: a frozen one pays an ``object.__setattr__`` per field in
    ``__init__`` (3.6 times the cost), and these are built on every lock call."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
