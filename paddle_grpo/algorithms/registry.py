"""Name -> function registries shared by the advantage estimators and the policy losses.

An unknown name raises `UnknownNameError`, a `ValueError` (and `KeyError`) whose message lists the valid names, so a
typo in a config fails at the first lookup with the fix in the message.
"""
from typing import Callable, Dict, Iterable, Tuple


class UnknownNameError(ValueError, KeyError):
    """Lookup of a name that is not registered; the message lists the valid names."""

    # KeyError.__str__ would print the message repr()-quoted; keep it readable.
    __str__ = ValueError.__str__


def unknown_name(kind: str, name, valid: Iterable[str]) -> UnknownNameError:
    return UnknownNameError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")


class Registry:
    """A name -> callable table. `register(name)` is a decorator; `get(name)` looks a callable up."""

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: Dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def decorator(fn: Callable) -> Callable:
            # Re-registering the same function (module reload) is harmless; a different one would silently replace
            # a built-in, which is never what a user meant.
            if name in self._fns and self._fns[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._fns[name].__qualname__})")
            self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> Callable:
        try:
            return self._fns[name]
        except (KeyError, TypeError):
            raise unknown_name(self.kind, name, self._fns) from None

    def names(self) -> Tuple[str, ...]:
        return tuple(self._fns)

    def __contains__(self, name) -> bool:
        return name in self._fns
