"""A user's function given as `module:function` or `path/to/file.py:function` (reward functions, tools).

Shared by rewards/registry.py and environment/registry.py, so both resolve specs by the same rules and fail with
the same messages (`kind` names what was asked for: "reward", "tool"). Imports nothing of the package.
"""
import hashlib
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Callable


def load_function(spec: str, kind: str) -> Callable:
    """The callable named by `spec` = `module:function` or `path/to/file.py:function`.

    Errors name the spec and what went wrong: a module or file that failed to import (with the reason), a missing
    file, a missing attribute, an attribute that is not callable."""
    # rsplit: a Windows path like C:\x.py:fn has a colon of its own.
    target, attr = spec.rsplit(":", 1)
    if not target or not attr:
        raise ValueError(f"{kind} spec {spec!r} must look like 'module:function' or 'path/to/file.py:function'")
    module = _load_file(target, spec, kind) if looks_like_file(target) else _import_module(target, spec, kind)
    fn = getattr(module, attr, None)
    if fn is None:
        raise AttributeError(f"{kind} spec {spec!r}: {target} has no attribute {attr!r}")
    if not callable(fn):
        raise TypeError(f"{kind} spec {spec!r}: {attr} is a {type(fn).__name__}, not a function")
    return fn


def looks_like_file(target: str) -> bool:
    """True when the part before the colon is a file path rather than a dotted module name."""
    return target.endswith(".py") or os.sep in target or "/" in target


def _import_module(target: str, spec: str, kind: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as exc:  # ImportError, or any error raised by the module's own top-level code
        raise ImportError(f"{kind} spec {spec!r}: could not import module {target!r}: "
                          f"{type(exc).__name__}: {exc}") from exc


def _load_file(path: str, spec: str, kind: str) -> ModuleType:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{kind} spec {spec!r}: file {path} does not exist")
    # A name derived from the path so two user files called rewards.py do not replace each other.
    digest = hashlib.sha1(path.encode()).hexdigest()[:10]
    module_name = f"paddle_grpo_user_{kind}_{digest}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise ImportError(f"{kind} spec {spec!r}: executing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module
