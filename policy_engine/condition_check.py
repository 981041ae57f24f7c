"""What a CEL condition may be before the engine compiles it: bounded nesting depth and
evaluation cost, only names from the feature catalogue (or the policy's parameters), and
only functions of the policy function set.

The checks walk celpy's parse tree with an explicit stack, so a condition too deep for the
compilers (which recurse) is measured and refused instead of exhausting the Python stack.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from celpy import celparser, evaluation
from lark import Token, Tree

from dsec.policy_engine.conditions import ConditionError

# Macros bind a variable and loop over a list, so their cost is the product of the list
# and the body; ``matches`` runs a regular expression, whose backtracking is unbounded.
UNBOUNDED_FUNCTIONS = frozenset({"all", "exists", "exists_one", "filter", "has", "map",
                                 "matches"})
POLICY_FUNCTIONS = frozenset(
    name for name in evaluation.base_functions
    if name.isidentifier() and not name.startswith("_")
) - UNBOUNDED_FUNCTIONS
_RESERVED = frozenset({"true", "false", "null"})
# One nesting level: a node that combines operands, groups, calls or builds a literal.
_GROUPS = frozenset({"paren_expr", "list_lit", "map_lit", "ident_arg", "member_dot_arg"})


@dataclass(frozen=True)
class ConditionShape:
    """``depth``: the deepest nesting of operators, parentheses and calls; ``cost``: the
    operators, calls and operands evaluated per target (no CEL loop is allowed, so each
    is evaluated at most once)."""

    depth: int
    cost: int
    names: frozenset[str]
    functions: frozenset[str]


def parse_condition(expression: str) -> Tree:
    try:
        return celparser.CELParser().parse(expression)
    except Exception as exc:  # lark and celpy raise several parse error types
        raise ConditionError(f"cannot compile {expression!r}: {exc}") from None


def condition_shape(tree: Tree) -> ConditionShape:
    depth = cost = 0
    names: set[str] = set()
    functions: set[str] = set()
    stack: list[tuple[Tree | Token, int]] = [(tree, 0)]
    while stack:
        node, level = stack.pop()
        if not isinstance(node, Tree):
            continue
        if node.data in ("ident", "literal"):
            cost += 1
            depth = max(depth, level)
            if node.data == "ident" and str(node.children[0]) not in _RESERVED:
                names.add(str(node.children[0]))
            continue
        if node.data == "ident_arg":
            functions.add(str(node.children[0]))
        elif node.data == "member_dot_arg":
            functions.add(str(node.children[1]))
        if len(node.children) > 1 or node.data in _GROUPS:
            level += 1
            cost += 1
            depth = max(depth, level)
        stack.extend((child, level) for child in node.children)
    return ConditionShape(depth, cost, frozenset(names), frozenset(functions))


@dataclass(frozen=True)
class ConditionLimits:
    max_depth: int
    max_cost: int


def check_condition(
    expression: str, limits: ConditionLimits, known_names: Iterable[str]
) -> ConditionShape:
    """The condition's shape, or ``ConditionError`` naming what is out of bounds."""
    shape = condition_shape(parse_condition(expression))
    if shape.depth > limits.max_depth:
        raise ConditionError(f"condition nested {shape.depth} deep, more than "
                             f"{limits.max_depth}: {expression[:80]!r}")
    if shape.cost > limits.max_cost:
        raise ConditionError(f"condition costs {shape.cost} operations, more than "
                             f"{limits.max_cost}: {expression[:80]!r}")
    functions = sorted(shape.functions - POLICY_FUNCTIONS)
    if functions:
        raise ConditionError(f"unknown or unbounded CEL functions {', '.join(functions)} "
                             f"in {expression[:80]!r}")
    unknown = sorted(shape.names - frozenset(known_names))
    if unknown:
        raise ConditionError(f"unknown features {', '.join(unknown)} (not in the feature "
                             f"catalogue nor the policy's parameters) in {expression[:80]!r}")
    return shape
