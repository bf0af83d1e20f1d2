"""Fixtures for the tests of tools/: the scripts are not a package, so they are loaded from their files."""
import importlib.util
import sys

import pytest


@pytest.fixture(scope="session")
def load_tool(repo_root):
    """load_tool("data/gen_kk") -> the module tools/data/gen_kk.py (loaded once per session)."""
    def load(name):
        module_name = "_tool_" + name.replace("/", "_")
        if module_name not in sys.modules:
            spec = importlib.util.spec_from_file_location(module_name, repo_root / "tools" / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        return sys.modules[module_name]
    return load
