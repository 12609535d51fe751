"""Reading the Tofino P4 program's text (p4/tofino/*.p4) without a compiler: comments
stripped, #defines and consts evaluated, structs and headers with their field widths, brace
blocks. Shared by tests/unit/test_p4_program.py (the program against p4/SPEC.md) and
tests/unit/test_tofino_contract.py (the program against the exporter)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from functools import cache

from p4bs import paths

TOFINO = paths.home() / "p4" / "tofino"
NAME = r"[A-Za-z_]\w*"
TYPE = rf"(?:bit<\w+>|{NAME})"


def strip_comments(text: str) -> str:
    """Removes /* */ and // comments, keeping line breaks (P4 here has no string literals
    that contain comment markers)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


@cache
def sources() -> dict[str, str]:
    """Each P4 file's text without comments, by file name."""
    files = sorted(TOFINO.glob("*.p4"))
    assert files, f"no P4 sources in {TOFINO}"
    return {f.name: strip_comments(f.read_text()) for f in files}


@cache
def source() -> str:
    return "\n".join(sources().values())


def p4_int(literal: str) -> int:
    """An integer literal, with or without a P4 width prefix (32w0xFF, 8s5, 0x1F, 1000)."""
    m = re.fullmatch(r"(?:\d+[ws])?(0[xX][0-9a-fA-F_]+|0[bB][01_]+|\d[\d_]*)", literal)
    assert m, f"not an integer literal: {literal}"
    return int(m.group(1).replace("_", ""), 0)


@cache
def definitions() -> dict[str, str]:
    """Object-like #defines and `const` declarations: name -> unevaluated expression."""
    found: dict[str, str] = {}
    for m in re.finditer(rf"^\s*#define\s+({NAME})(?!\()[ \t]+([^\n]+)$", source(), re.M):
        found[m.group(1)] = m.group(2).strip()
    for m in re.finditer(rf"\bconst\s+{TYPE}\s+({NAME})\s*=\s*([^;]+);", source()):
        found[m.group(1)] = m.group(2).strip()
    return found


_BINOPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
}


def value(expression: str, _depth: int = 0) -> int:
    """Evaluates an integer constant expression of the P4 source, following names through
    #defines and consts. Only + - * << >> and parentheses: nothing else is used for sizes."""
    assert _depth < 20, f"constant definitions loop at {expression}"
    literals = re.sub(
        r"\b(?:\d+[ws])?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|\d[\d_]*)\b",
        lambda m: str(p4_int(m.group(0))),
        expression,
    )

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Name):
            assert node.id in definitions(), f"{node.id} is not defined in the P4 sources"
            return value(definitions()[node.id], _depth + 1)
        raise AssertionError(f"unsupported constant expression in the P4: {expression}")

    return walk(ast.parse(literals, mode="eval"))


def const(name: str) -> int:
    assert name in definitions(), f"{name} is not defined in the P4 sources"
    return value(definitions()[name])


@cache
def typedefs() -> dict[str, str]:
    return {
        m.group(2): m.group(1)
        for m in re.finditer(rf"\btypedef\s+(bit<\w+>)\s+({NAME})\s*;", source())
    }


def width(p4_type: str) -> int:
    """Bits of a bit<N> type or a typedef of one."""
    resolved = typedefs().get(p4_type, p4_type)
    m = re.fullmatch(r"bit<(\w+)>", resolved)
    assert m, f"{p4_type} is not a bit<N> type"
    return value(m.group(1))


@cache
def structs() -> dict[str, list[tuple[str, str]]]:
    """struct/header name -> [(type, field)] in declaration order (preprocessor lines
    dropped: both sides of an #ifdef are listed)."""
    found = {}
    for m in re.finditer(rf"\b(?:struct|header)\s+({NAME})\s*\{{([^}}]*)\}}", source()):
        body = re.sub(r"^\s*#[^\n]*$", "", m.group(2), flags=re.M)
        fields = []
        for declaration in body.split(";"):
            parts = declaration.split()
            if len(parts) == 2:
                fields.append((parts[0], parts[1]))
        found[m.group(1)] = fields
    return found


def layout(struct: str) -> list[tuple[str, int]]:
    """(field, width) of a struct, in order."""
    assert struct in structs(), f"struct {struct} is not declared in the P4"
    return [(field, width(t)) for t, field in structs()[struct]]


def block(text: str, open_brace: int) -> str:
    """The text between the brace at `open_brace` and its match."""
    depth = 0
    for i in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_brace + 1 : i]
    raise AssertionError(f"unbalanced braces after {text[open_brace : open_brace + 40]!r}")
