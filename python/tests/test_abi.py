"""The Python package against the C ABI's declarations (python/oxccl/_abi.py).

_abi.py is generated from the library's exports, as ccl-capi/include/ccl.h is (ccl-capi's unit
test `abi::tests::generated_files_are_current` fails when either is stale), so its prototypes and
structs are the library's by construction. What is written by hand is checked here: the package
calls only declared functions (ctypes calls an undeclared one with every argument an int, which
truncates pointers and size_t), and the package's own constants and enums carry the C values.
Standard library only: no libccl.so, numpy or torch is needed.
"""

import ast
import ctypes
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "oxccl"
ABI_PY = PACKAGE / "_abi.py"
INIT_PY = PACKAGE / "__init__.py"


@pytest.fixture(scope="module")
def abi():
    # By path, not `import oxccl._abi`: the package's __init__ loads libccl.so and numpy.
    spec = importlib.util.spec_from_file_location("ccl_abi_declarations", ABI_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _normal(name):
    return name.replace("_", "").upper()


def _c_constants(abi):
    """Every enum value and integer #define of the ABI by normalized name (CCL_SPLIT_NOCOLOR's
    SPLIT_NOCOLOR and cclSplitNoColor both give SPLITNOCOLOR), each with its C names and values."""
    out = {}
    for values in abi.ENUMS.values():
        for name, v in values.items():
            out.setdefault(_normal(name[3:]), {})[name] = v
    for name, v in vars(abi).items():
        if re.match(r"[A-Z][A-Z0-9_]*$", name) and type(v) is int:
            out.setdefault(_normal(name), {})["CCL_" + name] = v
    return out


def _int(node):
    """A literal integer, possibly negated."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_int(node.operand)
    raise ValueError("not an integer literal")


def _package_values(tree):
    """Integer constants of __init__.py, read from its AST (importing it loads libccl.so):
    module-level NAME = int, members of IntEnum classes, and str -> int dict entries.
    The last item says whether a C counterpart is required."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if isinstance(node.value, ast.Dict):
                try:
                    d = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if d and all(type(k) is str and type(v) is int for k, v in d.items()):
                    out += [(f"{name}[{k!r}]", k, v, True) for k, v in d.items()]
                continue
            try:
                v = _int(node.value)
            except ValueError:
                continue
            if re.match(r"[A-Z][A-Z0-9_]*$", name):
                out.append((name, name, v, False))
        elif isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", "")) == "IntEnum" for b in node.bases):
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                    try:
                        v = _int(item.value)
                    except ValueError:
                        continue
                    out.append((f"{node.name}.{item.targets[0].id}", item.targets[0].id, v,
                                True))
    return out


def test_the_declarations_are_complete(abi):
    # Guards against a generator that wrote nothing and so left nothing to compare.
    assert len(abi.PROTOTYPES) >= 50, sorted(abi.PROTOTYPES)
    assert {"cclResult_t", "cclDataType_t", "cclRedOp_t"} <= set(abi.ENUMS)
    assert ctypes.sizeof(abi.UniqueIdStruct) == abi.UNIQUE_ID_BYTES


def test_package_values_match(abi):
    table = _c_constants(abi)
    problems, compared = [], 0
    for label, key, value, required in _package_values(ast.parse(INIT_PY.read_text())):
        named = table.get(_normal(key))
        if not named:
            # Enum classes and code tables mirror C enums member by member; a stray module
            # constant of __init__ need not (it may be the package's own).
            if required:
                problems.append(f"__init__.{label}: no C enum value or #define named like it")
            continue
        compared += 1
        if set(named.values()) != {value}:
            problems.append(f"__init__.{label} = {value}, C has {named}")
    assert not problems, "\n".join(problems)
    assert compared >= 20, f"only {compared} constants of __init__.py were compared"


def test_package_calls_only_declared_functions(abi):
    # ctypes lets Python call an undeclared export with default conversions (every argument an
    # int, the result an int), which truncates pointers and size_t; so a cclXxx the package
    # names must be in PROTOTYPES. Names built at run time (name + "Async") escape this scan.
    used = set()
    for path in PACKAGE.glob("*.py"):
        if path == ABI_PY:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and re.match(r"ccl[A-Z]\w*$", node.attr):
                used.add((node.attr, path.name))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.match(r"ccl[A-Z]\w*$", node.value):
                used.add((node.value, path.name))
    undeclared = sorted(f"{n} ({p})" for n, p in used if n not in abi.PROTOTYPES)
    assert not undeclared, f"called without a prototype: {undeclared}"
    assert len(used) >= 20, "the scan found almost no calls"
