"""CEL conditions compiled to numpy: one pass over every target's feature columns at once.

The compiler covers a checked subset of CEL (numbers, feature and parameter names,
arithmetic, comparisons, ``!``, ``&&``, ``||``, ``?:``). It follows CEL's error rules
column-wise: a missing feature is an error, ``true || error`` is true, ``false && error``
is false, and a row whose result is an error does not hold. Anything outside the subset,
or whose typing it cannot settle, is evaluated row by row by cel-python instead, so both
paths give the same answers (the property tests hold them to it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from celpy import celparser
from lark import Token, Tree

from dsec.policy_engine.conditions import CompiledCondition, ConditionError

Columns = Mapping[str, np.ndarray]
_INT = re.compile(r"-?(0x[0-9a-fA-F]+|[0-9]+)")
_FLOAT = re.compile(r"-?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?")
_MAX_EXACT_INT = 2**53


class NotCovered(Exception):
    """The expression leaves the compiled subset; cel-python evaluates it."""


@dataclass(frozen=True)
class _Value:
    """A column of results: values, the rows in error, and the CEL type of the column."""

    values: np.ndarray
    errors: np.ndarray
    kind: str  # "double", "int" (a literal only) or "bool"


_Node = Callable[[Columns, int], _Value]
_ORDER = {
    "relation_lt": np.less, "relation_le": np.less_equal,
    "relation_gt": np.greater, "relation_ge": np.greater_equal,
}
_EQUALITY = {"relation_eq": np.equal, "relation_ne": np.not_equal}

_ARITH = {
    "addition_add": np.add, "addition_sub": np.subtract,
    "multiplication_mul": np.multiply, "multiplication_div": np.divide,
}


def _constant(value: float | bool, kind: str) -> _Node:
    dtype = bool if kind == "bool" else float

    def node(_columns: Columns, rows: int) -> _Value:
        return _Value(np.full(rows, value, dtype=dtype), np.zeros(rows, dtype=bool), kind)

    node.constant = value  # type: ignore[attr-defined]
    return node


def _ident(name: str) -> _Node:
    def node(columns: Columns, rows: int) -> _Value:
        column = columns.get(name)
        if column is None:
            return _Value(np.zeros(rows), np.ones(rows, dtype=bool), "double")
        # Features are finite on the wire, so NaN marks a target that lacks one.
        return _Value(column, np.isnan(column), "double")

    return node


class _Compiler:
    """Lark tree (celpy's parser) → closure over numpy; also records the names it reads."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def compile(self, tree: Tree | Token) -> tuple[_Node, str]:
        if isinstance(tree, Token):
            raise NotCovered(f"token {tree.type}")
        handler = getattr(self, f"_{tree.data}", None)
        if handler is None:
            raise NotCovered(str(tree.data))
        return handler(tree.children)

    def _passthrough(self, children: list) -> tuple[_Node, str]:
        if len(children) != 1:
            raise NotCovered("unexpected arity")
        return self.compile(children[0])

    _member = _passthrough
    _primary = _passthrough
    _paren_expr = _passthrough

    def _expr(self, children: list) -> tuple[_Node, str]:
        if len(children) == 1:
            return self.compile(children[0])
        (cond, cond_kind), (yes, yes_kind), (no, no_kind) = map(self.compile, children)
        if cond_kind != "bool" or yes_kind != no_kind or yes_kind == "int":
            raise NotCovered("ternary typing")

        def node(columns: Columns, rows: int) -> _Value:
            c, a, b = cond(columns, rows), yes(columns, rows), no(columns, rows)
            chosen = np.where(c.values, a.errors, b.errors)
            return _Value(np.where(c.values, a.values, b.values), c.errors | chosen, yes_kind)

        return node, yes_kind

    def _logical(self, children: list, is_or: bool) -> tuple[_Node, str]:
        if len(children) == 1:
            return self.compile(children[0])
        (left, left_kind), (right, right_kind) = map(self.compile, children)
        if left_kind != "bool" or right_kind != "bool":
            raise NotCovered("logical operand is not bool")

        def node(columns: Columns, rows: int) -> _Value:
            a, b = left(columns, rows), right(columns, rows)
            if is_or:
                decided = (a.values & ~a.errors) | (b.values & ~b.errors)
                return _Value(decided, ~decided & (a.errors | b.errors), "bool")
            decided = (~a.values & ~a.errors) | (~b.values & ~b.errors)
            return _Value(~decided, ~decided & (a.errors | b.errors), "bool")

        return node, "bool"

    def _conditionalor(self, children: list) -> tuple[_Node, str]:
        return self._logical(children, is_or=True)

    def _conditionaland(self, children: list) -> tuple[_Node, str]:
        return self._logical(children, is_or=False)

    def _binary(self, children: list, operators: Mapping) -> tuple[str, _Node, str, _Node, str]:
        # celpy's tree: ``rule(op_rule(left), right)``
        operator, right_tree = children
        if not isinstance(operator, Tree) or operator.data not in operators:
            raise NotCovered(f"operator {getattr(operator, 'data', operator)}")
        (left_tree,) = operator.children
        left, left_kind = self.compile(left_tree)
        right, right_kind = self.compile(right_tree)
        return operator.data, left, left_kind, right, right_kind

    def _relation(self, children: list) -> tuple[_Node, str]:
        if len(children) == 1:
            return self.compile(children[0])
        op_name, left, left_kind, right, right_kind = self._binary(children, _ORDER | _EQUALITY)
        if op_name in _ORDER:
            # cel-python orders a double against an int literal only with the double on
            # the left; the other forms go to it row by row.
            if "bool" in (left_kind, right_kind) or left_kind == "int":
                raise NotCovered("ordering typing")
        elif left_kind != right_kind or left_kind == "int":
            raise NotCovered("equality across types")  # CEL has no double == int overload
        op = {**_ORDER, **_EQUALITY}[op_name]

        def node(columns: Columns, rows: int) -> _Value:
            a, b = left(columns, rows), right(columns, rows)
            return _Value(op(a.values, b.values), a.errors | b.errors, "bool")

        return node, "bool"

    def _arith(self, children: list) -> tuple[_Node, str]:
        if len(children) == 1:
            return self.compile(children[0])
        op_name, left, left_kind, right, right_kind = self._binary(children, _ARITH)
        if left_kind != "double" or right_kind != "double":
            raise NotCovered("arithmetic on non-double")
        # cel-python answers a zero divisor with +inf or with an error depending on how
        # the operands were produced; only a non-zero constant divisor is unambiguous.
        if op_name == "multiplication_div" and not getattr(right, "constant", 0.0):
            raise NotCovered("division by a non-constant")
        op = _ARITH[op_name]

        def node(columns: Columns, rows: int) -> _Value:
            a, b = left(columns, rows), right(columns, rows)
            with np.errstate(all="ignore"):
                return _Value(op(a.values, b.values), a.errors | b.errors, "double")

        return node, "double"

    _addition = _arith
    _multiplication = _arith

    def _unary(self, children: list) -> tuple[_Node, str]:
        if len(children) == 1:
            return self.compile(children[0])
        operator, operand = children
        inner, kind = self.compile(operand)
        if isinstance(operator, Tree) and operator.data == "unary_not" and kind == "bool":
            def negate(columns: Columns, rows: int) -> _Value:
                value = inner(columns, rows)
                return _Value(~value.values, value.errors, "bool")

            return negate, "bool"
        if isinstance(operator, Tree) and operator.data == "unary_neg" and kind == "double":
            def minus(columns: Columns, rows: int) -> _Value:
                value = inner(columns, rows)
                return _Value(-value.values, value.errors, "double")

            return minus, "double"
        raise NotCovered("unary operator")

    def _ident(self, children: list) -> tuple[_Node, str]:
        (token,) = children
        name = str(token)
        if name in ("true", "false", "null"):
            raise NotCovered("reserved word")
        self.names.add(name)
        return _ident(name), "double"

    def _literal(self, children: list) -> tuple[_Node, str]:
        (token,) = children
        text = str(token)
        if text in ("true", "false"):
            return _constant(text == "true", "bool"), "bool"
        if _INT.fullmatch(text):
            value = int(text, 0) if "x" not in text else int(text.replace("-", ""), 16) * (
                -1 if text.startswith("-") else 1)
            if abs(value) >= _MAX_EXACT_INT:
                raise NotCovered("integer beyond exact double range")
            return _constant(float(value), "int"), "int"
        if _FLOAT.fullmatch(text):
            return _constant(float(text), "double"), "double"
        raise NotCovered(f"literal {text!r}")


def _parse(expression: str) -> Tree:
    try:
        return celparser.CELParser().parse(expression)
    except Exception as exc:  # lark and celpy raise several parse error types
        raise ConditionError(f"cannot compile {expression!r}: {exc}") from None


class VectorCondition:
    """A CEL condition evaluated over columns: ``holds(columns, rows) -> bool array``.

    ``columns`` maps a name to a float64 array of length ``rows`` (NaN: target lacks it).
    """

    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.last_error: str | None = None
        tree = _parse(expression)
        self._scalar = CompiledCondition(expression)
        compiler = _Compiler()
        try:
            node, kind = compiler.compile(tree)
        except NotCovered as reason:
            self._node: _Node | None = None
            self.not_covered: str | None = str(reason)
            self.names = frozenset(_identifiers(tree))
            return
        if kind != "bool":
            raise ConditionError(f"{expression!r} gives {kind}, not bool")
        self._node = node
        self.not_covered = None
        self.names = frozenset(compiler.names)

    @property
    def vectorised(self) -> bool:
        return self._node is not None

    def holds(self, columns: Columns, rows: int) -> np.ndarray:
        return self.evaluate(columns, rows)[0]

    def evaluate(self, columns: Columns, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(holds, known): ``known`` is False on rows whose answer cannot be told for want
        of a feature (CEL's error), and ``holds`` is False there too."""
        if self._node is not None:
            result = self._node(columns, rows)
            return result.values & ~result.errors, ~result.errors
        return self.evaluate_scalar(columns, rows)

    def holds_scalar(self, columns: Columns, rows: int) -> np.ndarray:
        """cel-python, one row at a time: the reference the compiled path must match."""
        return self.evaluate_scalar(columns, rows)[0]

    def evaluate_scalar(self, columns: Columns, rows: int) -> tuple[np.ndarray, np.ndarray]:
        names = [name for name in self.names if name in columns]
        out = np.zeros(rows, dtype=bool)
        known = np.zeros(rows, dtype=bool)
        for row in range(rows):
            activation = {}
            for name in names:
                value = float(columns[name][row])
                if value == value:  # NaN: the target lacks this feature
                    activation[name] = value
            try:
                outcome = self._scalar.outcome(activation)
            except ConditionError as exc:
                # Not a boolean for this row (only an uncovered expression can get here):
                # it does not hold, and the engine reports it.
                self.last_error = str(exc)
                known[row] = True
                continue
            out[row] = outcome is True
            known[row] = outcome is not None
        return out, known


def _identifiers(tree: Tree) -> set[str]:
    return {str(sub.children[0]) for sub in tree.iter_subtrees() if sub.data == "ident"}
