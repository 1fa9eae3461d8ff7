"""The Python package's ctypes declarations against ccl-capi/include/ccl.h.

ctypes trusts whatever argtypes and restype it is given: a size_t declared as c_int, a missing
argument or a struct field out of place is not an error anywhere, it silently truncates values or
corrupts memory at run time. So every prototype, struct and mirrored constant of
python/oxccl/_lib.py (and the enum values of python/oxccl/__init__.py) is compared with the header
here, with the standard library only: no libccl.so, numpy or torch is needed.
"""

import ast
import ctypes
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "ccl-capi" / "include" / "ccl.h"
PACKAGE = ROOT / "python" / "oxccl"
LIB_PY = PACKAGE / "_lib.py"
INIT_PY = PACKAGE / "__init__.py"


# ---- a small C header parser ----------------------------------------------------------------
#
# It understands what a C ABI header of this shape uses (defines, #ifdef guards, typedefs of
# structs, enums and pointers, prototypes over several lines, const, pointer stars, arrays,
# attribute macros such as CCL_API) and raises ParseError on anything else, so that a header
# growing a construct it cannot read fails here instead of being compared half-understood.


class ParseError(Exception):
    pass


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<id>[A-Za-z_]\w*)
    | (?P<num>0[xX][0-9a-fA-F]+[uUlL]*|\d+[uUlL]*)
    | (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')
    | (?P<punct>\.\.\.|<<|>>|\#\#|->|==|!=|<=|>=|&&|\|\||[{}()\[\];,*=<>+\-~|&/%^!?:.\#])
    )""",
    re.X,
)


def tokenize(text):
    out, pos = [], 0
    while True:
        m = _TOKEN.match(text, pos)
        if not m:
            rest = text[pos:].strip()
            if rest:
                raise ParseError(f"cannot tokenize {rest[:40]!r}")
            return out
        out.append(m.group(m.lastgroup))
        pos = m.end()


@dataclass(frozen=True)
class CType:
    # kind: "scalar" (name is the canonical C spelling; enums are "int"), "void", "struct" (name
    # is its tag, or its typedef name when anonymous), "pointer", "array", "function".
    kind: str
    name: str = ""
    target: Optional["CType"] = None
    length: Optional[int] = None
    # How the header spelled it (a typedef name), for messages only.
    spelling: str = field(default="", compare=False)

    def __str__(self):
        if self.spelling:
            return self.spelling
        if self.kind == "pointer":
            return f"{self.target}*"
        if self.kind == "array":
            return f"{self.target}[{self.length}]"
        if self.kind == "struct":
            return f"struct {self.name}"
        return self.name or self.kind


def _spelled(t, spelling):
    return CType(t.kind, t.name, t.target, t.length, spelling)


QUALIFIERS = {"const", "volatile", "restrict", "__restrict", "__restrict__"}
STORAGE = {"extern", "static", "inline", "__inline", "__inline__", "register"}
BUILTIN_WORDS = {"void", "char", "short", "int", "long", "signed", "unsigned", "float", "double",
                 "_Bool"}
# Typedefs of the standard headers a C ABI header may include.
STD_TYPEDEFS = {
    "size_t", "ssize_t", "ptrdiff_t", "intptr_t", "uintptr_t", "bool",
    "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t",
}


def _canonical_builtin(words):
    w = sorted(words)
    table = {
        ("void",): "void",
        ("char",): "char",
        ("char", "signed"): "signed char",
        ("char", "unsigned"): "unsigned char",
        ("short",): "short", ("int", "short"): "short", ("short", "signed"): "short",
        ("int", "short", "signed"): "short",
        ("short", "unsigned"): "unsigned short", ("int", "short", "unsigned"): "unsigned short",
        ("int",): "int", ("signed",): "int", ("int", "signed"): "int",
        ("unsigned",): "unsigned int", ("int", "unsigned"): "unsigned int",
        ("long",): "long", ("int", "long"): "long", ("long", "signed"): "long",
        ("int", "long", "signed"): "long",
        ("long", "unsigned"): "unsigned long", ("int", "long", "unsigned"): "unsigned long",
        ("long", "long"): "long long", ("int", "long", "long"): "long long",
        ("long", "long", "signed"): "long long", ("int", "long", "long", "signed"): "long long",
        ("long", "long", "unsigned"): "unsigned long long",
        ("int", "long", "long", "unsigned"): "unsigned long long",
        ("float",): "float", ("double",): "double", ("double", "long"): "long double",
        ("_Bool",): "_Bool",
    }
    key = tuple(w)
    if key not in table:
        raise ParseError(f"unknown type {' '.join(words)!r}")
    return table[key]


def _limits():
    """limits.h as this platform's ctypes sizes it (the header uses INT_MIN)."""
    bits = {n: 8 * ctypes.sizeof(t) for n, t in
            [("INT", ctypes.c_int), ("LONG", ctypes.c_long), ("SHRT", ctypes.c_short),
             ("LLONG", ctypes.c_longlong)]}
    out = {"CHAR_BIT": 8, "SIZE_MAX": 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1}
    for n, b in bits.items():
        out[f"{n}_MAX"] = 2 ** (b - 1) - 1
        out[f"{n}_MIN"] = -(2 ** (b - 1))
        out[f"U{n}_MAX"] = 2 ** b - 1
    return {k: (None, tokenize(str(v)) if v >= 0 else ["-", str(-v)]) for k, v in out.items()}


class Header:
    def __init__(self, text):
        self.macros = _limits()  # name -> (params or None, body tokens)
        self.defined_here = []  # macro names the header itself defines, in order
        self.typedefs = {}  # name -> CType
        self.structs = {}  # struct key -> [(field name, CType)], or None when opaque
        self.enumerators = {}  # name -> int
        self.functions = {}  # name -> (return CType, [param CType])
        self._parse(self._preprocess(text))

    # -- preprocessing

    def _preprocess(self, text):
        # Comments become a space (keeping their newlines) so that they still separate tokens.
        text = re.sub(r"/\*.*?\*/|//[^\n]*",
                      lambda m: " " + "\n" * m.group().count("\n"), text, flags=re.S)
        text = text.replace("\\\n", " ")
        code, active = [], [True]
        for line in text.split("\n"):
            s = line.strip()
            if not s.startswith("#"):
                if all(active):
                    code.append(line)
                continue
            directive, _, rest = s[1:].strip().partition(" ")
            rest = rest.strip()
            if directive in ("ifdef", "ifndef"):
                on = rest in self.macros
                active.append(on if directive == "ifdef" else not on)
            elif directive == "else":
                active[-1] = not active[-1]
            elif directive == "endif":
                active.pop()
            elif directive in ("if", "elif"):
                raise ParseError(f"#{directive} {rest} is not supported")
            elif not all(active):
                continue
            elif directive == "define":
                self._define(rest)
            elif directive == "undef":
                self.macros.pop(rest, None)
            elif directive in ("include", "pragma"):
                pass
            else:
                raise ParseError(f"#{directive} is not supported")
        if len(active) != 1:
            raise ParseError("unbalanced #if/#endif")
        return tokenize("\n".join(code))

    def _define(self, rest):
        m = re.match(r"([A-Za-z_]\w*)(\(([^)]*)\))?\s*(.*)$", rest, re.S)
        if not m:
            raise ParseError(f"cannot read #define {rest!r}")
        name, params = m.group(1), None
        if m.group(2) is not None:
            params = [p.strip() for p in m.group(3).split(",") if p.strip()]
        self.macros[name] = (params, tokenize(m.group(4)))
        self.defined_here.append(name)

    def expand(self, tokens, hide=frozenset()):
        out, i = [], 0
        while i < len(tokens):
            t = tokens[i]
            m = self.macros.get(t) if t not in hide else None
            if m is None:
                out.append(t)
                i += 1
                continue
            params, body = m
            if "#" in body or "##" in body:
                raise ParseError(f"macro {t} uses # or ##, which is not supported")
            if params is None:
                out.extend(self.expand(body, hide | {t}))
                i += 1
                continue
            if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                out.append(t)
                i += 1
                continue
            args, i = _call_args(tokens, i + 1)
            if params == [] and args == [[]]:
                args = []
            if len(args) != len(params):
                raise ParseError(f"macro {t} takes {len(params)} arguments, got {len(args)}")
            args = [self.expand(a, hide) for a in args]
            sub = []
            for b in body:
                sub.extend(args[params.index(b)] if b in params else [b])
            out.extend(self.expand(sub, hide | {t}))
        return out

    # -- declarations

    def _parse(self, tokens):
        tokens = self.expand(tokens)
        tokens = _drop_attributes(tokens)
        stmt, depth, i = [], 0, 0
        while i < len(tokens):
            t = tokens[i]
            i += 1
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                # A function body (a static inline helper) ends its statement without a ';'.
                if depth == 0 and stmt and stmt[0] not in ("typedef", "struct", "union", "enum") \
                        and "(" in stmt:
                    stmt = []
                    continue
            if t == ";" and depth == 0:
                if stmt:
                    self._statement(stmt)
                stmt = []
                continue
            stmt.append(t)
        if stmt or depth:
            raise ParseError(f"unterminated declaration {' '.join(stmt)[:60]!r}")

    def _statement(self, s):
        if s[0] == "typedef":
            self._typedef(s[1:])
        elif s[0] in ("struct", "union", "enum") and "{" in s and "(" not in s:
            self._tagged_definition(s)
        elif "(" in s:
            self._prototype(s)
        # Anything else declares a variable, which the Python side cannot bind by ctypes
        # prototypes anyway.

    def _tagged_definition(self, s, typedef_name=None):
        """struct/union/enum with a body; returns its CType and the tokens after the body."""
        kw = s[0]
        tag = s[1] if s[1] != "{" else None
        start = s.index("{")
        end = _matching(s, start, "{", "}")
        body, after = s[start + 1:end], s[end + 1:]
        if kw == "enum":
            self._enum(body)
            return CType("scalar", "int"), after
        if kw == "union":
            raise ParseError("unions are not supported")
        key = tag or typedef_name
        if key is None:
            raise ParseError("an anonymous struct outside a typedef")
        fields = []
        for decl in _split(body, ";"):
            if not decl:
                continue
            if "{" in decl or ":" in decl:
                raise ParseError(f"nested struct or bitfield in struct {key}")
            base, declarators = self._split_base(decl)
            for d in _split(declarators, ","):
                ct, name = self._declarator(base, d)
                if name is None:
                    raise ParseError(f"unnamed field in struct {key}")
                fields.append((name, ct))
        self.structs[key] = fields
        return CType("struct", key), after

    def _enum(self, body):
        value = -1
        for item in _split(body, ","):
            if not item:
                continue
            name = item[0]
            if len(item) > 1:
                if item[1] != "=":
                    raise ParseError(f"cannot read enumerator {' '.join(item)}")
                value = self.evaluate(item[2:])
                if value is None:
                    raise ParseError(f"cannot evaluate enumerator {name}")
            else:
                value += 1
            self.enumerators[name] = value

    def _typedef(self, s):
        if s[0] in ("struct", "union", "enum") and "{" in s:
            # The typedef name is the first plain identifier after the body.
            end = _matching(s, s.index("{"), "{", "}")
            names = [t for t in s[end + 1:] if re.match(r"[A-Za-z_]\w*$", t)]
            base, after = self._tagged_definition(s, names[0] if names else None)
        else:
            base, after = self._split_base(s)
        for d in _split(after, ","):
            ct, name = self._declarator(base, d)
            if name is None:
                raise ParseError(f"typedef without a name: {' '.join(s)}")
            self.typedefs[name] = _spelled(ct, name)

    def _prototype(self, s):
        base, rest = self._split_base(s)
        ct, name = self._declarator(base, rest)
        if ct.kind != "function" or name is None:
            raise ParseError(f"cannot read prototype {' '.join(s)}")
        ret, params = ct.target, list(ct.length)
        if name in self.functions and self.functions[name] != (ret, params):
            raise ParseError(f"{name} is declared twice, differently")
        self.functions[name] = (ret, params)

    def _split_base(self, s):
        """The type specifiers at the start of a declaration, and the declarator tokens after."""
        words, tagged, named, i = [], None, None, 0
        while i < len(s):
            t = s[i]
            if t in QUALIFIERS or t in STORAGE:
                i += 1
            elif t in BUILTIN_WORDS and tagged is None and named is None:
                words.append(t)
                i += 1
            elif t in ("struct", "union", "enum") and not words and tagged is None \
                    and named is None:
                tagged = (t, s[i + 1])
                i += 2
            elif not words and tagged is None and named is None \
                    and (t in self.typedefs or t in STD_TYPEDEFS):
                named = t
                i += 1
            else:
                break
        if named is not None:
            base = self.typedefs.get(named) or CType("scalar", named, spelling=named)
        elif tagged is not None:
            kw, tag = tagged
            if kw == "enum":
                base = CType("scalar", "int", spelling=f"enum {tag}")
            elif kw == "union":
                raise ParseError("unions are not supported")
            else:
                self.structs.setdefault(tag, None)
                base = CType("struct", tag)
        elif words:
            name = _canonical_builtin(words)
            base = CType("void") if name == "void" else CType("scalar", name)
        else:
            raise ParseError(f"no type at the start of {' '.join(s)!r}")
        return base, s[i:]

    def _declarator(self, base, d):
        """Applies a declarator (stars, name, arrays, parameter list) to base."""
        t, i = base, 0
        while i < len(d) and (d[i] == "*" or d[i] in QUALIFIERS):
            if d[i] == "*":
                t = CType("pointer", target=t)
            i += 1
        # A pointer to a function: ( * name ) ( params ).
        if i < len(d) and d[i] == "(" and i + 1 < len(d) and d[i + 1] == "*":
            end = _matching(d, i, "(", ")")
            inner = d[i + 2:end]
            name = inner[-1] if inner and re.match(r"[A-Za-z_]\w*$", inner[-1]) else None
            fn, rest = self._parameters(t, d[end + 1:])
            if rest:
                raise ParseError(f"cannot read declarator {' '.join(d)}")
            return CType("pointer", target=fn), name
        name = None
        if i < len(d) and re.match(r"[A-Za-z_]\w*$", d[i]):
            name = d[i]
            i += 1
        rest = d[i:]
        if rest and rest[0] == "(":
            t, rest = self._parameters(t, rest)
        dims = []
        while rest and rest[0] == "[":
            end = _matching(rest, 0, "[", "]")
            n = self.evaluate(rest[1:end])
            if n is None:
                raise ParseError(f"cannot evaluate array size {' '.join(rest[1:end])}")
            dims.append(n)
            rest = rest[end + 1:]
        for n in reversed(dims):
            t = CType("array", target=t, length=n)
        if rest:
            raise ParseError(f"cannot read declarator {' '.join(d)}")
        return t, name

    def _parameters(self, ret, d):
        end = _matching(d, 0, "(", ")")
        inner = d[1:end]
        params = []
        if inner and inner != ["void"]:
            for p in _split(inner, ","):
                if p == ["..."]:
                    raise ParseError("variadic functions are not supported")
                base, rest = self._split_base(p)
                ct, _ = self._declarator(base, rest)
                # Arrays and functions as parameters are pointers (C 6.7.6.3).
                if ct.kind == "array":
                    ct = CType("pointer", target=ct.target)
                params.append(ct)
        # A tuple keeps CType hashable; "length" holds the parameters of a function type.
        return CType("function", target=ret, length=tuple(params)), d[end + 1:]

    # -- constant expressions

    def evaluate(self, tokens):
        """The value of an integer constant expression, or None if it is not one."""
        tokens = self.expand(list(tokens))
        py = []
        i = 0
        while i < len(tokens):
            t = tokens[i]
            if t == "sizeof":
                if tokens[i + 1: i + 2] != ["("]:
                    return None
                end = _matching(tokens, i + 1, "(", ")")
                try:
                    base, rest = self._split_base(tokens[i + 2:end])
                    ct, _ = self._declarator(base, rest)
                    py.append(str(ctypes.sizeof(self.reference(ct))))
                except (ParseError, KeyError, TypeError):
                    return None
                i = end + 1
                continue
            if re.match(r"\d", t):
                digits = t.rstrip("uUlL")
                if digits.startswith(("0x", "0X")):
                    py.append(str(int(digits, 16)))
                elif len(digits) > 1 and digits.startswith("0"):
                    py.append(str(int(digits, 8)))
                else:
                    py.append(digits)
            elif t in self.enumerators:
                py.append(str(self.enumerators[t]))
            elif t in ("+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "~", "(", ")"):
                py.append(t)
            else:
                return None
            i += 1
        try:
            return _eval_int(ast.parse(" ".join(py), mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError):
            return None

    def constant(self, name):
        if name in self.enumerators:
            return self.enumerators[name]
        if name in self.macros and self.macros[name][0] is None:
            return self.evaluate([name])
        return None

    # -- C types as ctypes

    def reference(self, ct):
        """The ctypes type with ct's size and alignment, built from the header alone."""
        if ct.kind == "scalar":
            return SCALARS[ct.name]
        if ct.kind == "pointer":
            return ctypes.c_void_p
        if ct.kind == "array":
            return self.reference(ct.target) * ct.length
        if ct.kind == "struct":
            fields = self.structs.get(ct.name)
            if fields is None:
                raise KeyError(f"struct {ct.name} is opaque")
            return type(f"ref_{ct.name}", (ctypes.Structure,),
                        {"_fields_": [(n, self.reference(t)) for n, t in fields]})
        raise TypeError(f"{ct} has no size")


SCALARS = {
    "char": ctypes.c_char, "signed char": ctypes.c_byte, "unsigned char": ctypes.c_ubyte,
    "short": ctypes.c_short, "unsigned short": ctypes.c_ushort,
    "int": ctypes.c_int, "unsigned int": ctypes.c_uint,
    "long": ctypes.c_long, "unsigned long": ctypes.c_ulong,
    "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong,
    "float": ctypes.c_float, "double": ctypes.c_double, "long double": ctypes.c_longdouble,
    "_Bool": ctypes.c_bool, "bool": ctypes.c_bool,
    "size_t": ctypes.c_size_t, "ssize_t": ctypes.c_ssize_t,
    "ptrdiff_t": ctypes.c_ssize_t, "intptr_t": ctypes.c_ssize_t, "uintptr_t": ctypes.c_size_t,
    "int8_t": ctypes.c_int8, "int16_t": ctypes.c_int16, "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64, "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
}


def _eval_int(node):
    """C integer arithmetic on a parsed expression (division truncates toward zero)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp):
        v = _eval_int(node.operand)
        ops = {ast.USub: lambda: -v, ast.UAdd: lambda: v, ast.Invert: lambda: ~v}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    if isinstance(node, ast.BinOp):
        a, b = _eval_int(node.left), _eval_int(node.right)
        ops = {
            ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
            ast.Div: lambda: int(a / b) if abs(a) < 2**52 and abs(b) < 2**52 else _cdiv(a, b),
            ast.Mod: lambda: a - b * _cdiv(a, b),
            ast.LShift: lambda: a << b, ast.RShift: lambda: a >> b,
            ast.BitAnd: lambda: a & b, ast.BitOr: lambda: a | b, ast.BitXor: lambda: a ^ b,
        }
        if type(node.op) in ops:
            return ops[type(node.op)]()
    raise ValueError("not an integer constant expression")


def _cdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _matching(tokens, start, open_, close):
    depth = 0
    for j in range(start, len(tokens)):
        if tokens[j] == open_:
            depth += 1
        elif tokens[j] == close:
            depth -= 1
            if depth == 0:
                return j
    raise ParseError(f"unbalanced {open_}{close}")


def _split(tokens, sep):
    """tokens split at sep outside parentheses, brackets and braces."""
    parts, cur, depth = [], [], 0
    for t in tokens:
        if t in ("(", "[", "{"):
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
        if t == sep and depth == 0:
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
    parts.append(cur)
    return parts


def _call_args(tokens, open_at):
    end = _matching(tokens, open_at, "(", ")")
    return _split(tokens[open_at + 1:end], ","), end + 1


def _drop_attributes(tokens):
    """Removes __attribute__((...)) and __declspec(...), which export macros expand to."""
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] in ("__attribute__", "__declspec") and tokens[i + 1: i + 2] == ["("]:
            i = _matching(tokens, i + 1, "(", ")") + 1
            continue
        out.append(tokens[i])
        i += 1
    return out


# ---- comparing ctypes types with C types ------------------------------------------------------


def tname(t):
    if t is None:
        return "None"
    # On LP64 c_size_t is c_ulong itself; size_t is what declarations here mean by it.
    if t is ctypes.c_size_t:
        return "c_size_t"
    if t is ctypes.c_ssize_t:
        return "c_ssize_t"
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return f"POINTER({tname(t._type_)})"
    if isinstance(t, type) and issubclass(t, ctypes.Array):
        return f"{tname(t._type_)} * {t._length_}"
    return getattr(t, "__name__", repr(t))


# The signedness of a plain char is the platform's choice, and a char array in this ABI is opaque
# bytes (the unique id), so any one-byte integer type carries it faithfully; elsewhere a char is
# a char.
ONE_BYTE = (ctypes.c_char, ctypes.c_byte, ctypes.c_ubyte)


class Matcher:
    def __init__(self, header):
        self.h = header
        self.pairs = {}  # Python Structure -> C struct key it was matched with
        self._struct_result = {}

    def problems(self, py, c, where, in_array=False):
        """Why the ctypes type py does not stand for the C type c ([] if it does)."""
        bad = [f"{where}: C {c}, Python {tname(py)}"]
        if c.kind == "void":
            return [] if py is None else bad
        if c.kind == "scalar":
            if c.name not in SCALARS:
                return [f"{where}: C type {c} is not known to the test"]
            if py is SCALARS[c.name]:
                return []
            if in_array and c.name == "char" and py in ONE_BYTE:
                return []
            return bad
        if c.kind == "pointer":
            # c_void_p passes any pointer unchecked, which is how opaque handles and optional
            # struct pointers are declared; a typed POINTER must point to the right thing.
            if py is ctypes.c_void_p:
                return []
            if py is ctypes.c_char_p and c.target.kind == "scalar" and c.target.name == "char":
                return []
            if c.target.kind == "function" and isinstance(py, type) \
                    and issubclass(py, ctypes._CFuncPtr):
                return []
            if isinstance(py, type) and issubclass(py, ctypes._Pointer):
                return self.problems(py._type_, c.target, f"{where} (pointee)")
            return bad
        if c.kind == "array":
            if not (isinstance(py, type) and issubclass(py, ctypes.Array)):
                return bad
            if py._length_ != c.length:
                return [f"{where}: C array of {c.length}, Python array of {py._length_}"]
            return self.problems(py._type_, c.target, f"{where}[]", in_array=True)
        if c.kind == "struct":
            if not (isinstance(py, type) and issubclass(py, ctypes.Structure)):
                return bad
            return self.struct_problems(py, c, where)
        return [f"{where}: C {c} cannot be passed through ctypes by value"]

    def struct_problems(self, py, c, where):
        key = c.name
        if py in self.pairs and self.pairs[py] != key:
            return [f"{where}: Python {py.__name__} stands for struct {self.pairs[py]} "
                    f"elsewhere, but for {c} here"]
        self.pairs[py] = key
        if (py, key) in self._struct_result:
            return self._struct_result[(py, key)]
        self._struct_result[(py, key)] = []  # a struct containing a pointer to itself
        fields = self.h.structs.get(key)
        if fields is None:
            out = [f"{where}: {c} is opaque in the header, but Python passes it by value"]
        else:
            out = self._fields(py, c, fields)
        self._struct_result[(py, key)] = out
        return out

    def _fields(self, py, c, fields):
        label = f"{py.__name__} ({c})"
        pf = list(getattr(py, "_fields_", []))
        pnames = [f[0] for f in pf]
        cnames = [n for n, _ in fields]
        if pnames != cnames:
            return [f"{label}: fields {pnames}, header has {cnames}"]
        out = []
        for (name, ptype, *bits), (_, ctype_) in zip(pf, fields):
            if bits:
                out.append(f"{label}.{name}: a bitfield in Python only")
            out += self.problems(ptype, ctype_, f"{label}.{name}")
        if out:
            return out
        # Equal field types give an equal layout unless the Python side packs or pads
        # differently; the layout is what the library reads, so it is compared too.
        ref = self.h.reference(c)
        if ctypes.sizeof(py) != ctypes.sizeof(ref):
            out.append(f"{label}: sizeof {ctypes.sizeof(py)}, header {ctypes.sizeof(ref)}")
        if ctypes.alignment(py) != ctypes.alignment(ref):
            out.append(f"{label}: alignment {ctypes.alignment(py)}, "
                       f"header {ctypes.alignment(ref)}")
        for name in cnames:
            po, co = getattr(py, name).offset, getattr(ref, name).offset
            if po != co:
                out.append(f"{label}.{name}: offset {po}, header {co}")
        return out


# ---- the two sides -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def header():
    return Header(HEADER.read_text())


@pytest.fixture(scope="module")
def lib():
    # By path, not `import oxccl._lib`: the package's __init__ loads libccl.so and numpy, and the
    # declarations themselves need neither.
    spec = importlib.util.spec_from_file_location("ccl_lib_declarations", LIB_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _python_constants(mod):
    return {n: v for n, v in vars(mod).items()
            if re.match(r"[A-Z][A-Z0-9_]*$", n) and type(v) is int}


def _normal(name):
    return name.replace("_", "").upper()


def _header_constants(header):
    """Header constants by normalized name (CCL_SPLIT_NOCOLOR and cclSplitNoColor both give
    SPLITNOCOLOR), each with every header name that normalizes to it."""
    out = {}
    for name in header.defined_here:
        if name.startswith("CCL_") and header.macros[name][0] is None:
            out.setdefault(_normal(name[4:]), []).append(name)
    for name in header.enumerators:
        if name.startswith("ccl"):
            out.setdefault(_normal(name[3:]), []).append(name)
    return out


def _compare_constant(header, table, key, value, label):
    """Problems with the Python constant label (named key) against the header, or None when
    the header has nothing named like it."""
    names = table.get(_normal(key))
    if not names:
        return None
    values = {n: header.constant(n) for n in names}
    if None in values.values():
        return [f"{label}: header {names} cannot be evaluated"]
    if len(set(values.values())) > 1:
        return [f"{label}: ambiguous, header has {values}"]
    hv = next(iter(values.values()))
    if hv != value:
        return [f"{label} = {value:#x} ({value}), header {names[0]} = {hv:#x} ({hv})"]
    return []


# ---- the tests ----------------------------------------------------------------------------------


def test_header_is_understood(header):
    # Guards against a parser that silently reads nothing and so compares nothing.
    assert len(header.functions) >= 40, sorted(header.functions)
    assert header.functions["cclGetErrorString"][0].kind == "pointer"
    assert "cclConfig_t" in header.typedefs and header.structs.get("cclUniqueId")


def test_declared_functions_are_in_the_header(lib, header):
    missing = sorted(set(lib.PROTOTYPES) - set(header.functions))
    assert not missing, f"declared in _lib.py but not in ccl.h: {missing}"


def test_prototypes_match(lib, header):
    m = Matcher(header)
    problems = []
    for name, (res, args) in lib.PROTOTYPES.items():
        if name not in header.functions:
            continue
        cret, cparams = header.functions[name]
        problems += m.problems(res, cret, f"{name} return")
        if len(args) != len(cparams):
            problems.append(f"{name}: {len(args)} arguments in Python, {len(cparams)} in C "
                            f"({', '.join(map(str, cparams))})")
            continue
        for i, (py, c) in enumerate(zip(args, cparams)):
            problems += m.problems(py, c, f"{name} argument {i + 1}")
    # A struct's own problems come back for every prototype that uses it; once is enough.
    problems = list(dict.fromkeys(problems))
    assert not problems, "\n".join(problems)


def test_every_struct_is_checked(lib, header):
    m = Matcher(header)
    # Pairing comes from the prototypes: a struct no prototype uses has no header counterpart
    # the test could name, so it would go unchecked.
    for name, (res, args) in lib.PROTOTYPES.items():
        if name in header.functions:
            cret, cparams = header.functions[name]
            m.problems(res, cret, name)
            for py, c in zip(args, cparams):
                m.problems(py, c, name)
    structs = {v for v in vars(lib).values()
               if isinstance(v, type) and issubclass(v, ctypes.Structure)
               and v.__module__ == lib.__name__}
    unpaired = sorted(s.__name__ for s in structs - set(m.pairs))
    assert not unpaired, f"Structures no prototype ties to a header struct: {unpaired}"


def test_lib_constants_match(lib, header):
    table = _header_constants(header)
    problems = []
    for name, value in sorted(_python_constants(lib).items()):
        got = _compare_constant(header, table, name, value, f"_lib.{name}")
        # Every upper-case integer of _lib.py mirrors a CCL_* macro; one without a counterpart
        # means the header renamed or dropped it, and the comparison would quietly stop.
        problems += got if got is not None else [f"_lib.{name}: no CCL_{name} in the header"]
    assert not problems, "\n".join(problems)


def _package_enum_values(tree):
    """Integer constants of __init__.py, read from its AST (importing it loads libccl.so):
    module-level NAME = int, members of IntEnum classes, and str -> int dict entries.
    The second item says whether a header counterpart is required."""
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
                v = _eval_int(node.value)
            except ValueError:
                continue
            if re.match(r"[A-Z][A-Z0-9_]*$", name):
                out.append((name, name, v, False))
        elif isinstance(node, ast.ClassDef) and any(
                getattr(b, "id", getattr(b, "attr", "")) == "IntEnum" for b in node.bases):
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                    try:
                        v = _eval_int(item.value)
                    except ValueError:
                        continue
                    out.append((f"{node.name}.{item.targets[0].id}", item.targets[0].id, v,
                                True))
    return out


def test_package_enum_values_match(header):
    table = _header_constants(header)
    problems, compared = [], 0
    for label, key, value, required in _package_enum_values(ast.parse(INIT_PY.read_text())):
        got = _compare_constant(header, table, key, value, f"__init__.{label}")
        if got is None:
            # Enum classes and code tables mirror C enums member by member; a stray module
            # constant of __init__ need not (it may be the package's own).
            if required:
                problems.append(f"__init__.{label}: no header enumerator or macro named like it")
            continue
        compared += 1
        problems += got
    assert not problems, "\n".join(problems)
    assert compared > 0, "no constant of __init__.py was compared"


def test_config_initializer(lib, header):
    """_lib.config() builds what CCL_CONFIG_INITIALIZER does, field by field."""
    params, body = header.macros["CCL_CONFIG_INITIALIZER"]
    tokens = header.expand(body)
    assert params is None and tokens[0] == "{" and tokens[-1] == "}"
    values = [header.evaluate(e) for e in _split(tokens[1:-1], ",")]
    assert None not in values, values
    version = header.constant("CCL_VERSION_CODE")
    cfg = lib.config(version)
    got = [getattr(cfg, n) for n, *_ in cfg._fields_]
    # ctypes hands back unsigned fields as non-negative ints, which the C values already are.
    assert got == values, f"config() gives {got}, CCL_CONFIG_INITIALIZER {values}"


def test_package_calls_only_declared_functions(lib):
    # ctypes lets Python call an undeclared export with default conversions (every argument an
    # int, the result an int), which truncates pointers and size_t; so a cclXxx the package
    # names must be in PROTOTYPES. Names built at run time (name + "Async") escape this scan.
    used = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and re.match(r"ccl[A-Z]\w*$", node.attr):
                used.add((node.attr, path.name))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.match(r"ccl[A-Z]\w*$", node.value):
                used.add((node.value, path.name))
    undeclared = sorted(f"{n} ({p})" for n, p in used if n not in lib.PROTOTYPES)
    assert not undeclared, f"called without a prototype: {undeclared}"


def test_every_header_function_is_declared_for_python(lib, header):
    # A function of ccl.h without a ctypes declaration cannot be called from the package (the
    # test above keeps it from calling undeclared ones): the C API and the Python one have
    # drifted apart. Every function is declared today; one added to the header must be declared
    # in _lib.py in the same change.
    unbound = sorted(set(header.functions) - set(lib.PROTOTYPES))
    assert not unbound, "ccl.h functions without a Python declaration: " + ", ".join(unbound)
