"""Every public function of paddle_grpo carries full type hints (issue 13).

A static scan with ``ast`` (nothing is imported): every module-level function whose name does not start with ``_``,
every such method of a class whose name does not start with ``_`` (classes nested in public classes included), and
``__init__`` of a public class must annotate every parameter (``self``/``cls`` excepted) and the return
(``__init__`` excepted). Functions defined inside another function are exempt, and so is everything inside them.
"""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "paddle_grpo")


def _is_public(name):
    return not name.startswith("_")


def _is_staticmethod(fn):
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _missing(fn, is_method):
    """The names lacking an annotation in ``fn`` ("return" for the return)."""
    a = fn.args
    positional = a.posonlyargs + a.args
    if is_method and not _is_staticmethod(fn) and positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    params = positional + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
    missing = [p.arg for p in params if p.annotation is None]
    if fn.returns is None and not (is_method and fn.name == "__init__"):
        missing.append("return")
    return missing


def _public_functions(tree):
    """(function node, is_method) for the public functions and methods of a module (nested functions skipped)."""

    def walk(body, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _is_public(node.name) or (in_class and node.name == "__init__"):
                    yield node, in_class
            elif isinstance(node, ast.ClassDef):
                if _is_public(node.name):
                    yield from walk(node.body, True)
            elif isinstance(node, (ast.If, ast.Try)):  # e.g. `if TYPE_CHECKING:` / `try: import ...` blocks
                blocks = [node.body, node.orelse] + [h.body for h in getattr(node, "handlers", [])]
                if isinstance(node, ast.Try):
                    blocks.append(node.finalbody)
                for block in blocks:
                    yield from walk(block, in_class)

    yield from walk(tree.body, False)


def unannotated(source, filename="<source>"):
    """``file:line name (missing: ...)`` for every public function of ``source`` lacking full annotations."""
    tree = ast.parse(source, filename=filename)
    return [
        f"{filename}:{fn.lineno} {fn.name} (missing: {', '.join(missing)})"
        for fn, is_method in _public_functions(tree)
        for missing in [_missing(fn, is_method)]
        if missing
    ]


def _package_modules():
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(root, name)


def test_every_public_function_is_annotated():
    problems = []
    modules = list(_package_modules())
    assert len(modules) > 20, modules
    for path in modules:
        with open(path, encoding="utf-8") as f:
            problems += unannotated(f.read(), os.path.relpath(path, os.path.dirname(PACKAGE)))
    assert not problems, "public functions without full type hints:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f(x): return x\n", ["m.py:1 f (missing: x, return)"]),
        ("def f(x: int, *a, k: int = 1, **kw) -> int: ...\n", ["m.py:1 f (missing: a, kw)"]),
        ("def f(x: int) -> int:\n    def g(y): ...\n    return x\n", []),
        ("def _f(x): ...\n", []),
        ("class A:\n    def __init__(self, n): ...\n", ["m.py:2 __init__ (missing: n)"]),
        ("class A:\n    def __init__(self, n: int): ...\n    def m(self): ...\n", ["m.py:3 m (missing: return)"]),
        ("class A:\n    @classmethod\n    def m(cls) -> 'A': ...\n    @staticmethod\n    def s(self): ...\n",
         ["m.py:5 s (missing: self, return)"]),
        ("class _A:\n    def m(self, x): ...\n", []),
        ("class A:\n    def _m(self, x): ...\n    def __repr__(self): ...\n", []),
        ("class A:\n    class B:\n        def m(self, x) -> None: ...\n", ["m.py:3 m (missing: x)"]),
        ("if True:\n    def f(x) -> None: ...\n", ["m.py:2 f (missing: x)"]),
    ],
)
def test_the_scan_finds_unannotated_functions(source, expected):
    assert unannotated(source, "m.py") == expected
