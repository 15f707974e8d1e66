"""MAX's private API that max-gpt2 uses (`max_gpt2.max_internals`) is still in the installed MAX,
and no other module of max-gpt2 names any.

A MAX upgrade that renames or drops one of these names fails here, naming it and the
installed MAX's version, instead of failing a server at start or one request in.
Imports and source only: no graph is compiled, no server started.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from importlib.metadata import version
from pathlib import Path
from types import FunctionType
from typing import Any

import max_gpt2
from tests.support import requires_serving

MAX_VERSION = version("max")
PACKAGE = Path(max_gpt2.__file__).parent
INTERNALS = PACKAGE / "max_internals.py"
MISSING = object()
METHODS = (FunctionType, staticmethod, classmethod, property)


def lookup(module: str, name: str) -> Any:
    """What `module`'s `name` (dotted for a class's attribute) is in the installed MAX, or `MISSING`."""
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        return MISSING
    for part in name.split("."):
        found = getattr(found, part, MISSING)
        if found is MISSING:
            return MISSING
    return found


def max_subclasses() -> list[type]:
    """Our classes that subclass one of MAX's, from every module of the packages that define them."""
    classes = []
    for package in ("max_gpt2.serving", "max_gpt2.model", "max_gpt2.inference"):
        path = importlib.import_module(package).__path__
        for info in pkgutil.iter_modules(path, f"{package}."):
            module = importlib.import_module(info.name)
            classes += [
                cls
                for cls in vars(module).values()
                if inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and any(base.__module__.startswith("max.") for base in cls.__mro__)
            ]
    return classes


def shadowed(cls: type) -> list[tuple[str, type]]:
    """The private methods `cls` defines that one of its MAX base classes defines too, with that base."""
    found = []
    for name, value in vars(cls).items():
        bases = [
            base for base in cls.__mro__[1:] if base.__module__.startswith("max.") and name in vars(base)
        ]
        if private(name) and isinstance(value, METHODS) and bases:
            found.append((name, bases[0]))
    return found


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


@requires_serving()
def test_every_private_name_we_use_is_in_the_installed_max():
    """Each of `PRIVATE_API` is found where it says, and each hook is overridden with MAX's parameters."""
    from max_gpt2.max_internals import HOOKS, PRIVATE_API, max_command

    problems = [
        f"{use.path} is gone; we need it: {use.why}"
        for use in PRIVATE_API
        if lookup(use.module, use.name) is MISSING
    ]
    ours = max_subclasses()
    for hook in HOOKS:
        class_name, _, method = hook.name.rpartition(".")
        owner, maxs = lookup(hook.module, class_name), lookup(hook.module, hook.name)
        if maxs is MISSING:
            continue  # reported above
        overrides = [cls for cls in ours if issubclass(cls, owner) and method in vars(cls)]
        if not overrides:
            problems.append(f"{hook.path}: declared a hook, but no class of ours overrides it")
        problems += [
            f"{hook.path}: MAX's takes ({', '.join(parameters(maxs))}), "
            f"{cls.__qualname__}.{method} takes ({', '.join(parameters(vars(cls)[method]))})"
            for cls in overrides
            if parameters(vars(cls)[method]) != parameters(maxs)
        ]
    try:
        max_command()
    except (ValueError, ImportError) as error:
        problems.append(f"MAX's `max` console script does not load: {error!r}")
    assert not problems, f"MAX {MAX_VERSION} lacks what max_gpt2/max_internals.py relies on:\n" + "\n".join(
        problems
    )


@requires_serving()
def test_every_private_hook_we_override_is_declared():
    """A private method of ours that shadows one of a MAX base class is one of `HOOKS`, with why."""
    from max_gpt2.max_internals import HOOKS

    hooks = [
        (lookup(hook.module, hook.name.rpartition(".")[0]), hook.name.rpartition(".")[2]) for hook in HOOKS
    ]
    undeclared = [
        f"{cls.__module__}.{cls.__qualname__}.{name} overrides {base.__module__}.{base.__qualname__}.{name}"
        for cls in max_subclasses()
        for name, base in shadowed(cls)
        if not any(
            owner is not MISSING and issubclass(cls, owner) and name == method for owner, method in hooks
        )
    ]
    assert not undeclared, (
        f"MAX {MAX_VERSION}: declare these in max_gpt2/max_internals.py's HOOKS, with why:\n"
        + "\n".join(undeclared)
    )


def test_no_other_module_names_maxs_private_api():
    """Outside `max_internals`, no import of a private MAX module or name, and no private attribute that
    max-gpt2 does not define itself (so MAX's, or another library's)."""
    files = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}
    ours = {name for tree in files.values() for node in ast.walk(tree) for name in defined_names(node)}
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {what}"
        for path, tree in files.items()
        if path != INTERNALS
        for node in ast.walk(tree)
        for what in private_uses(node, ours)
    ]
    assert not found, "MAX's private API belongs in max_gpt2/max_internals.py:\n" + "\n".join(found)


def defined_names(node: ast.AST) -> list[str]:
    """Names `node` defines: a function, class, variable or attribute."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return [node.attr]
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return [node.id]
    return []


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


PUBLIC = {"_exit"}
"""Names with a leading underscore that their library documents: `os._exit`."""


def private_uses(node: ast.AST, ours: set[str]) -> list[str]:
    """What in `node` is someone else's private API: a private MAX module or name imported, or a private
    attribute not in `ours`."""
    if (
        isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.split(".")[0] == "max"
        and (any(map(private, node.module.split("."))) or any(private(alias.name) for alias in node.names))
    ):
        return [f"from {node.module} import {', '.join(alias.name for alias in node.names)}"]
    if isinstance(node, ast.Import):
        return [
            f"import {alias.name}"
            for alias in node.names
            if alias.name.split(".")[0] == "max" and any(map(private, alias.name.split(".")))
        ]
    if isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in ours | PUBLIC:
        return [f".{node.attr}"]
    return []
