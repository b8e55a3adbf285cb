"""A FreeMarker subset for campaign assets, rendered over markupsafe.

Supported: `${expr}`, `<#if>`/`<#elseif>`/`<#else>`/`</#if>`, `<#list seq as x>` (with an
optional `<#else>` for an empty sequence) and `</#list>`, comments `<#-- ... -->`.

Expressions: variables and paths (`a.b.c`), string literals ("..." or '...'), numbers, `true`,
`false`, parentheses, `x!default` (`x!` alone defaults to ""), `x??`, `!`, `&&`, `||`, `==`,
`!=`, `<`, `<=`, `>`, `>=` (a bare `>` ends a tag, as in FreeMarker: write `gt`, `gte`, `lt`,
`lte`, or put the comparison in parentheses), `+` (numbers add, anything else concatenates) and
the built-ins `?html`, `?url`, `?upper_case`, `?lower_case`, `?cap_first`, `?trim`, `?size`,
`?length`, `?has_content`, `?string`, `?no_esc`, `?first`, `?last`, and on a loop variable
`?index`, `?counter`, `?has_next`, `?is_first`, `?is_last`.

As in FreeMarker, `a.b!"x"` protects only the last step (`b`); `(a.b)!"x"` protects the whole
path. A missing (or null) value without a default fails naming the variable, the template and
the line. In HTML templates every interpolation is escaped unless it is already markup
(`?html`, `?no_esc`); text templates escape nothing. Loops and the output size are capped.

Templates are parsed once into an AST (cached per source); nothing of a template is evaluated
as Python source (the fast path below makes closures of the AST's nodes).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from markupsafe import Markup, escape

MAX_LOOP_ITEMS = 1000
MAX_TOTAL_ITERATIONS = 100_000
MAX_OUTPUT_CHARS = 512 * 1024


class RenderError(Exception):
    """A template that does not parse or render: what, which template, which line."""

    def __init__(
        self,
        message: str,
        *,
        variable: str | None = None,
        line: int | None = None,
        template: str | None = None,
    ) -> None:
        self.reason = message
        self.variable = variable
        self.line = line
        self.template = template
        super().__init__(self._text())

    def _text(self) -> str:
        where = self.template or "template"
        if self.line is not None:
            where += f" line {self.line}"
        return f"{where}: {self.reason}"

    def located(self, template: str) -> RenderError:
        if self.template is None:
            self.template = template
            self.args = (self._text(),)
        return self


# ---------------------------------------------------------------------------------- AST


@dataclass(frozen=True, slots=True)
class Lit:
    value: Any


@dataclass(frozen=True, slots=True)
class Path:
    parts: tuple[str, ...]
    line: int

    @property
    def name(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True, slots=True)
class Paren:
    expr: Any


@dataclass(frozen=True, slots=True)
class Default:
    expr: Any
    default: Any  # an expression, or None for ""


@dataclass(frozen=True, slots=True)
class Exists:
    expr: Any


@dataclass(frozen=True, slots=True)
class Builtin:
    expr: Any
    name: str
    args: tuple[Any, ...]
    line: int


@dataclass(frozen=True, slots=True)
class Not:
    expr: Any


@dataclass(frozen=True, slots=True)
class BinOp:
    op: str
    left: Any
    right: Any
    line: int


@dataclass(slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Interp:
    expr: Any
    line: int


@dataclass(slots=True)
class If:
    branches: list[tuple[Any, list[Any]]]
    otherwise: list[Any] | None = None


@dataclass(slots=True)
class Loop:
    seq: Any
    var: str
    line: int
    body: list[Any] = field(default_factory=list)
    otherwise: list[Any] | None = None


# -------------------------------------------------------------------------------- lexing

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<num>\d+(?:\.\d+)?)
  | (?P<name>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op>\?\?|&&|\|\||==|!=|<=|>=|[!?.()<>+,=])
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}
_WORD_OPS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), s[1:-1], flags=re.S)


class _Expr:
    """A recursive-descent parser of one expression's text."""

    def __init__(self, text: str, line: int) -> None:
        self.line = line
        self.toks: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise RenderError(f"unexpected {text[pos : pos + 10]!r} in {text!r}", line=line)
            pos = m.end()
            kind = m.lastgroup or ""
            if kind != "ws":
                self.toks.append((kind, m.group()))
        self.i = 0
        self.text = text

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            want = repr(value) if value else "more"
            raise RenderError(f"expected {want} in {self.text!r}", line=self.line)
        self.i += 1
        return tok

    def at(self, *values: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] in ("op", "name") and tok[1] in values

    def parse_all(self) -> Any:
        expr = self.parse_or()
        if self.peek() is not None:
            raise RenderError(
                f"unexpected {self.peek()[1]!r} in {self.text!r}",  # type: ignore[index]
                line=self.line,
            )
        return expr

    def parse_or(self) -> Any:
        left = self.parse_and()
        while self.at("||"):
            self.take()
            left = BinOp("||", left, self.parse_and(), self.line)
        return left

    def parse_and(self) -> Any:
        left = self.parse_cmp()
        while self.at("&&"):
            self.take()
            left = BinOp("&&", left, self.parse_cmp(), self.line)
        return left

    def parse_cmp(self) -> Any:
        left = self.parse_add()
        while self.at("==", "!=", "<", "<=", ">", ">=", "=", *_WORD_OPS):
            op = self.take()[1]
            op = _WORD_OPS.get(op, "==" if op == "=" else op)
            left = BinOp(op, left, self.parse_add(), self.line)
        return left

    def parse_add(self) -> Any:
        left = self.parse_unary()
        while self.at("+"):
            self.take()
            left = BinOp("+", left, self.parse_unary(), self.line)
        return left

    def parse_unary(self) -> Any:
        if self.at("!"):
            self.take()
            return Not(self.parse_unary())
        return self.parse_postfix()

    def parse_postfix(self) -> Any:
        expr = self.parse_primary()
        while True:
            if self.at("?"):
                self.take()
                name = self.take()
                if name[0] != "name":
                    raise RenderError(
                        f"expected a built-in after '?' in {self.text!r}", line=self.line
                    )
                args: tuple[Any, ...] = ()
                if self.at("("):
                    self.take()
                    items = []
                    while not self.at(")"):
                        items.append(self.parse_or())
                        if not self.at(")"):
                            self.take(",")
                    self.take(")")
                    args = tuple(items)
                if name[1] not in _BUILTINS:
                    raise RenderError(f"unknown built-in ?{name[1]}", line=self.line)
                expr = Builtin(expr, name[1], args, self.line)
            elif self.at("??"):
                self.take()
                expr = Exists(expr)
            elif self.at("!"):
                self.take()
                # `a!=b` is lexed as `!=`; a lone `!` after an operand is a default.
                default = None if self._ends_operand() else self.parse_primary()
                expr = Default(expr, default)
            else:
                return expr

    def _ends_operand(self) -> bool:
        tok = self.peek()
        return tok is None or (
            tok[0] == "op" and tok[1] in (")", "&&", "||", "==", "!=", ",", "?", "??", "+")
        )

    def parse_primary(self) -> Any:
        kind, value = self.take()
        if kind == "str":
            return Lit(_unquote(value))
        if kind == "num":
            return Lit(float(value) if "." in value else int(value))
        if kind == "name":
            if value in ("true", "false"):
                return Lit(value == "true")
            parts = [value]
            while self.at("."):
                self.take()
                nxt = self.take()
                if nxt[0] != "name":
                    raise RenderError(f"expected a name after '.' in {self.text!r}", line=self.line)
                parts.append(nxt[1])
            return Path(tuple(parts), self.line)
        if value == "(":
            inner = self.parse_or()
            self.take(")")
            return Paren(inner)
        raise RenderError(f"unexpected {value!r} in {self.text!r}", line=self.line)


def _expr(text: str, line: int) -> Any:
    if not text.strip():
        raise RenderError("empty expression", line=line)
    return _Expr(text, line).parse_all()


def _scan_expr_end(src: str, pos: int, closer: str, line: int) -> int:
    """The index of the `closer` ending an expression that starts at pos (strings and
    parentheses skipped; a `>` followed by `=` does not close a tag)."""
    depth = 0
    i, n = pos, len(src)
    while i < n:
        c = src[i]
        if c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            i = j + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == closer and depth <= 0 and not (closer == ">" and src[i + 1 : i + 2] == "="):
            return i
        elif closer == "}" and c == "{":
            depth += 1
        i += 1
    raise RenderError(f"unclosed {'${' if closer == '}' else 'directive'}", line=line)


_START = re.compile(r"\$\{|<#--|<#|</#")
_DIRECTIVE = re.compile(r"(if|elseif|else|list)\b")
_END_DIRECTIVE = re.compile(r"(if|list)\s*>")
_LIST = re.compile(r"^(.*)\s+as\s+([A-Za-z_][A-Za-z0-9_]*)\s*$", re.S)


def parse(src: str, name: str = "template") -> list[Any]:
    """The AST of a template; RenderError (with template and line) on a syntax error."""
    try:
        return _parse(src)
    except RenderError as e:
        raise e.located(name) from None


def _parse(src: str) -> list[Any]:
    newlines = [i for i, c in enumerate(src) if c == "\n"]

    def line_of(pos: int) -> int:
        return bisect.bisect_right(newlines, pos - 1) + 1

    root: list[Any] = []
    # The open blocks: (node, the list being filled, the directive's line).
    stack: list[tuple[Any, list[Any], int]] = []
    out = root
    pos = 0

    def standalone(start: int, end: int) -> tuple[bool, int]:
        """Whether the tag is alone on its line; if so, where the text after it resumes."""
        line_start = src.rfind("\n", 0, start) + 1
        if src[line_start:start].strip(" \t"):
            return False, end
        j = end
        while j < len(src) and src[j] in " \t\r":
            j += 1
        if j < len(src) and src[j] != "\n":
            return False, end
        return True, min(j + 1, len(src))

    def emit_text(text: str) -> None:
        if text:
            out.append(Text(text))

    def tag_done(start: int, end: int) -> int:
        alone, resume = standalone(start, end)
        if alone and out and isinstance(out[-1], Text):
            last = out[-1]
            cut = last.text.rfind("\n") + 1
            last.text = last.text[:cut] + last.text[cut:].rstrip(" \t")
        return resume

    while True:
        m = _START.search(src, pos)
        if m is None:
            emit_text(src[pos:])
            break
        start = m.start()
        emit_text(src[pos:start])
        line = line_of(start)
        tok = m.group()
        if tok == "${":
            end = _scan_expr_end(src, m.end(), "}", line)
            out.append(Interp(_expr(src[m.end() : end], line), line))
            pos = end + 1
            continue
        if tok == "<#--":
            end = src.find("-->", m.end())
            if end < 0:
                raise RenderError("unclosed comment <#--", line=line)
            pos = tag_done(start, end + 3)
            continue
        if tok == "</#":
            em = _END_DIRECTIVE.match(src, m.end())
            if em is None:
                raise RenderError("unknown closing directive", line=line)
            kind = em.group(1)
            if not stack or not isinstance(stack[-1][0], If if kind == "if" else Loop):
                raise RenderError(f"</#{kind}> without an open <#{kind}>", line=line)
            pos = tag_done(start, em.end())
            stack.pop()
            out = stack[-1][1] if stack else root
            continue
        dm = _DIRECTIVE.match(src, m.end())
        if dm is None:
            word = re.match(r"[A-Za-z_]*", src[m.end() :])
            raise RenderError(f"unsupported directive <#{word.group() if word else ''}>", line=line)
        kind = dm.group(1)
        end = _scan_expr_end(src, dm.end(), ">", line)
        arg = src[dm.end() : end]
        if kind == "if":
            node = If([(_expr(arg, line), [])])
            out.append(node)
            stack.append((node, node.branches[0][1], line))
            out = node.branches[0][1]
        elif kind == "list":
            lm = _LIST.match(arg)
            if lm is None:
                raise RenderError("expected <#list sequence as name>", line=line)
            loop = Loop(_expr(lm.group(1), line), lm.group(2), line)
            out.append(loop)
            stack.append((loop, loop.body, line))
            out = loop.body
        elif kind == "elseif":
            if not stack or not isinstance(stack[-1][0], If) or stack[-1][0].otherwise is not None:
                raise RenderError("<#elseif> outside <#if>", line=line)
            ifnode = stack[-1][0]
            pos = tag_done(start, end + 1)
            body: list[Any] = []
            ifnode.branches.append((_expr(arg, line), body))
            stack[-1] = (ifnode, body, stack[-1][2])
            out = body
            continue
        else:  # else
            if arg.strip():
                raise RenderError("<#else> takes no expression", line=line)
            if not stack or getattr(stack[-1][0], "otherwise", 1) is not None:
                raise RenderError("<#else> outside <#if> or <#list>", line=line)
            node = stack[-1][0]
            pos = tag_done(start, end + 1)
            node.otherwise = []
            stack[-1] = (node, node.otherwise, stack[-1][2])
            out = node.otherwise
            continue
        # The tag was emitted into its parent; trim its line there before descending.
        parent = stack[-2][1] if len(stack) > 1 else root
        alone, resume = standalone(start, end + 1)
        if alone and len(parent) > 1 and isinstance(parent[-2], Text):
            last = parent[-2]
            cut = last.text.rfind("\n") + 1
            last.text = last.text[:cut] + last.text[cut:].rstrip(" \t")
        pos = resume
    if stack:
        node, _, line = stack[-1]
        raise RenderError(f"<#{'if' if isinstance(node, If) else 'list'}> is not closed", line=line)
    return root


# ------------------------------------------------------------------------------- render


class _Missing(Exception):
    def __init__(self, variable: str, line: int, last_step: bool, path: str = "") -> None:
        self.variable = variable
        self.path = path or variable
        self.line = line
        self.last_step = last_step


@dataclass
class _LoopState:
    index: int
    size: int


class _Run:
    def __init__(self, data: dict[str, Any], html: bool) -> None:
        self.scopes: list[dict[str, Any]] = [data]
        self.loops: dict[str, _LoopState] = {}
        self.html = html
        self.parts: list[str] = []
        self.size = 0
        self.iterations = 0

    # -- values

    def lookup(self, path: Path) -> Any:
        parts = path.parts
        head = parts[0]
        value: Any = None
        if len(self.scopes) == 1:  # outside loops (most lookups of a send's render)
            value = self.scopes[0].get(head)
        else:
            for scope in reversed(self.scopes):
                if head in scope:
                    value = scope[head]
                    break
        for i in range(1, len(parts)):
            part = parts[i]
            if value is None:
                raise _Missing(".".join(path.parts[:i]), path.line, False, path.name)
            if not isinstance(value, dict):
                raise RenderError(
                    f"{'.'.join(path.parts[:i])} is not a hash, so .{part} cannot be read",
                    variable=path.name,
                    line=path.line,
                )
            value = value.get(part)
        if value is None:
            raise _Missing(path.name, path.line, True)
        return value

    def protected(self, expr: Any) -> tuple[bool, Any]:
        """(found, value) of the operand of `!` or `??`: a parenthesised operand is protected
        throughout, a path only at its last step."""
        try:
            return True, self.eval(expr)
        except _Missing as e:
            if isinstance(expr, Paren) or e.last_step:
                return False, None
            raise

    def eval(self, node: Any) -> Any:
        t = type(node)
        if t is Path:
            return self.lookup(node)
        if t is Default:
            found, value = self.protected(node.expr)
            if found:
                return value
            return "" if node.default is None else self.eval(node.default)
        if t is Lit:
            return node.value
        if t is Paren:
            return self.eval(node.expr)
        if t is Exists:
            return self.protected(node.expr)[0]
        if t is Builtin:
            return self.builtin(node)
        if t is Not:
            return not self.truth(node.expr)
        if t is BinOp:
            return self.binop(node)
        raise AssertionError(node)

    def truth(self, node: Any) -> bool:
        value = self.eval(node)
        if not isinstance(value, bool):
            raise RenderError(
                f"a condition must be a boolean, got {_kind(value)}",
                variable=_name(node),
                line=_line(node),
            )
        return value

    def binop(self, node: BinOp) -> Any:
        op = node.op
        if op == "&&":
            return self.truth(node.left) and self.truth(node.right)
        if op == "||":
            return self.truth(node.left) or self.truth(node.right)
        left, right = self.eval(node.left), self.eval(node.right)
        if op == "+":
            if _is_number(left) and _is_number(right):
                return left + right
            if isinstance(left, dict | list) or isinstance(right, dict | list):
                raise RenderError("+ joins strings or adds numbers", line=node.line)
            return self.text(left, node.left) + self.text(right, node.right)
        if op in ("==", "!="):
            equal = left == right and (type(left) is bool) == (type(right) is bool)
            return equal if op == "==" else not equal
        if not (_is_number(left) and _is_number(right)):
            raise RenderError(
                f"{op} compares numbers, got {_kind(left)} and {_kind(right)}",
                variable=_name(node.left) or _name(node.right),
                line=node.line,
            )
        if op == "<":
            return left < right
        if op == "<=":
            return left <= right
        if op == ">":
            return left > right
        return left >= right

    def builtin(self, node: Builtin) -> Any:
        name = node.name
        if name in _LOOP_BUILTINS:
            target = node.expr
            state = (
                self.loops.get(target.parts[0])
                if isinstance(target, Path) and len(target.parts) == 1
                else None
            )
            if state is None:
                raise RenderError(
                    f"?{name} applies to a loop variable", variable=_name(target), line=node.line
                )
            return {
                "index": state.index,
                "counter": state.index + 1,
                "has_next": state.index + 1 < state.size,
                "is_first": state.index == 0,
                "is_last": state.index + 1 == state.size,
            }[name]
        if name == "has_content":
            found, value = self.protected(node.expr)
            return found and value not in ("", [], {})
        value = self.eval(node.expr)
        if name in ("size", "length"):
            if isinstance(value, list | dict | str) and (name == "size") != isinstance(value, str):
                return len(value)
            if name == "size" and isinstance(value, str):
                raise RenderError(
                    "?size applies to sequences and hashes (use ?length on strings)",
                    variable=_name(node.expr),
                    line=node.line,
                )
            raise RenderError(
                f"?{name} cannot apply to {_kind(value)}", variable=_name(node.expr), line=node.line
            )
        if name in ("first", "last"):
            if not isinstance(value, list) or not value:
                raise RenderError(
                    f"?{name} needs a non-empty sequence", variable=_name(node.expr), line=node.line
                )
            return value[0] if name == "first" else value[-1]
        if name == "string":
            if node.args and isinstance(value, bool):
                if len(node.args) != 2:
                    raise RenderError('?string("yes", "no") takes two values', line=node.line)
                return self.text(self.eval(node.args[0 if value else 1]), node)
            return self.text(value, node.expr)
        text = self.text(value, node.expr)
        if name == "html":
            return Markup(escape(text)) if self.html else str(escape(text))
        if name == "no_esc":
            return Markup(text) if self.html else text
        if name == "url":
            return quote(str(text), safe="")
        if name == "upper_case":
            return text.upper()
        if name == "lower_case":
            return text.lower()
        if name == "cap_first":
            return text[:1].upper() + text[1:]
        if name == "trim":
            return text.strip()
        raise AssertionError(name)

    def text(self, value: Any, node: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() else repr(value)
        raise RenderError(
            f"{_name(node) or 'the value'} is {_kind(value)}, which cannot be printed",
            variable=_name(node),
            line=_line(node),
        )

    # -- output

    def write(self, s: str) -> None:
        self.size += len(s)
        if self.size > MAX_OUTPUT_CHARS:
            raise RenderError(f"the output exceeds {MAX_OUTPUT_CHARS} characters")
        self.parts.append(s)

    def run(self, nodes: list[Any]) -> None:
        for node in nodes:
            t = type(node)
            if t is Text:
                self.write(node.text)
            elif t is Interp:
                value = self.eval(node.expr)
                if self.html:
                    if not isinstance(value, Markup):
                        value = escape(value if type(value) is str else self.text(value, node.expr))
                elif type(value) is not str:
                    value = self.text(value, node.expr)
                self.write(value)
            elif t is If:
                for cond, body in node.branches:
                    if self.truth(cond):
                        self.run(body)
                        break
                else:
                    if node.otherwise is not None:
                        self.run(node.otherwise)
            else:
                self.loop(node)

    def loop(self, node: Loop) -> None:
        seq = self.eval(node.seq)
        if isinstance(seq, dict):
            seq = list(seq)
        if not isinstance(seq, list):
            raise RenderError(
                f"<#list> needs a sequence, got {_kind(seq)}",
                variable=_name(node.seq),
                line=node.line,
            )
        if len(seq) > MAX_LOOP_ITEMS:
            raise RenderError(
                f"<#list> over {len(seq)} items; the limit is {MAX_LOOP_ITEMS}",
                variable=_name(node.seq),
                line=node.line,
            )
        if not seq:
            if node.otherwise is not None:
                self.run(node.otherwise)
            return
        scope: dict[str, Any] = {}
        self.scopes.append(scope)
        outer = self.loops.get(node.var)
        try:
            for i, item in enumerate(seq):
                self.iterations += 1
                if self.iterations > MAX_TOTAL_ITERATIONS:
                    raise RenderError(
                        f"more than {MAX_TOTAL_ITERATIONS} loop iterations", line=node.line
                    )
                scope[node.var] = item
                self.loops[node.var] = _LoopState(i, len(seq))
                self.run(node.body)
        finally:
            self.scopes.pop()
            if outer is None:
                self.loops.pop(node.var, None)
            else:
                self.loops[node.var] = outer


_LOOP_BUILTINS = frozenset({"index", "counter", "has_next", "is_first", "is_last"})
_BUILTINS = _LOOP_BUILTINS | {
    "html",
    "url",
    "upper_case",
    "lower_case",
    "cap_first",
    "trim",
    "size",
    "length",
    "has_content",
    "string",
    "no_esc",
    "first",
    "last",
}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if _is_number(v):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a sequence"
    if isinstance(v, dict):
        return "a hash"
    return type(v).__name__


def _name(node: Any) -> str | None:
    while isinstance(node, Paren | Builtin | Default):
        node = node.expr
    return node.name if isinstance(node, Path) else None


def _line(node: Any) -> int | None:
    while isinstance(node, Paren | Default | Exists | Not):
        node = node.expr
    return getattr(node, "line", None)


# ----------------------------------------------------------------------------- fast path
# A template of text, interpolations and <#if>s over paths, defaults, `??`, literals and the
# string built-ins is also made into closures, which render a send's data several times faster
# than _Run walks the AST. They give up (_Slow) wherever _Run would fail or do more (a missing
# value without a default, a value that cannot be printed, a non-boolean condition, output over
# the cap): Template.render then runs _Run, whose output and errors are the definition.


class _Slow(Exception):
    pass


_ABSENT = object()  # a value missing at a protected step
_STRING_BUILTINS = frozenset({"html", "url", "upper_case", "lower_case", "cap_first", "trim"})


def _fast_text(value: Any) -> str:
    """_Run.text for the values it prints; _Slow for the others."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    raise _Slow


def _fast_path(parts: tuple[str, ...], protect_all: bool) -> Any:
    """A path's value (_Run.lookup with only the data's scope); _ABSENT when missing at the
    last step, or at any step with `protect_all` (a parenthesised path)."""
    head, rest = parts[0], parts[1:]

    def get(data: dict[str, Any]) -> Any:
        value = data.get(head)
        for part in rest:
            if value is None and protect_all:
                return _ABSENT
            if not isinstance(value, dict):
                raise _Slow
            value = value.get(part)
        return _ABSENT if value is None else value

    return get


def _fast_protected(expr: Any) -> Any:
    """The operand of `!` or `??` (see _Run.protected), or None when not a (parenthesised)
    path."""
    if type(expr) is Path:
        return _fast_path(expr.parts, False)
    if type(expr) is Paren and type(expr.expr) is Path:
        return _fast_path(expr.expr.parts, True)
    return None


def _fast_expr(node: Any, html: bool) -> Any:
    """The expression as a function of the data, or None when the fast path has no form of it."""
    t = type(node)
    if t is Lit:
        value = node.value
        return lambda data: value
    if t is Paren:
        return _fast_expr(node.expr, html)
    if t is Path:
        get = _fast_path(node.parts, False)

        def path(data: dict[str, Any]) -> Any:
            value = get(data)
            if value is _ABSENT:
                raise _Slow
            return value

        return path
    if t is Default:
        get = _fast_protected(node.expr)
        other = "" if node.default is None else _fast_expr(node.default, html)
        if get is None or other is None:
            return None
        if isinstance(other, str):

            def default_text(data: dict[str, Any]) -> Any:
                value = get(data)
                return other if value is _ABSENT else value

            return default_text

        def default(data: dict[str, Any]) -> Any:
            value = get(data)
            return other(data) if value is _ABSENT else value

        return default
    if t is Exists:
        get = _fast_protected(node.expr)
        if get is None:
            return None
        return lambda data: get(data) is not _ABSENT
    if t is Builtin and node.name in _STRING_BUILTINS and not node.args:
        inner = _fast_expr(node.expr, html)
        if inner is None:
            return None
        name = node.name

        def builtin(data: dict[str, Any]) -> Any:
            text = _fast_text(inner(data))
            if name == "html":
                return Markup(escape(text)) if html else str(escape(text))
            if name == "url":
                return quote(str(text), safe="")
            if name == "upper_case":
                return text.upper()
            if name == "lower_case":
                return text.lower()
            if name == "cap_first":
                return text[:1].upper() + text[1:]
            return text.strip()

        return builtin
    return None


def _fast_nodes(nodes: list[Any], html: bool) -> Any:
    """The nodes as a function of the data giving their output, or None."""
    parts: list[Any] = []
    for node in nodes:
        t = type(node)
        if t is Text:
            text = node.text
            parts.append(lambda data, text=text: text)
        elif t is Interp:
            get = _fast_expr(node.expr, html)
            if get is None:
                return None

            def interp(data: dict[str, Any], get: Any = get) -> Any:
                value = get(data)
                if html:
                    if not isinstance(value, Markup):
                        value = escape(value if type(value) is str else _fast_text(value))
                elif type(value) is not str:
                    value = _fast_text(value)
                return value

            parts.append(interp)
        elif t is If:
            branches = []
            for cond, body in node.branches:
                test, then = _fast_expr(cond, html), _fast_nodes(body, html)
                if test is None or then is None:
                    return None
                branches.append((test, then))
            otherwise = None if node.otherwise is None else _fast_nodes(node.otherwise, html)
            if node.otherwise is not None and otherwise is None:
                return None

            def choose(
                data: dict[str, Any], branches: Any = branches, otherwise: Any = otherwise
            ) -> Any:
                for test, then in branches:
                    value = test(data)
                    if type(value) is not bool:
                        raise _Slow
                    if value:
                        return then(data)
                return "" if otherwise is None else otherwise(data)

            parts.append(choose)
        else:
            return None
    return lambda data: "".join([part(data) for part in parts])


# -------------------------------------------------------------------------------- public


@dataclass(frozen=True)
class Template:
    name: str
    html: bool
    nodes: list[Any]
    fast: Any = field(default=None, compare=False, repr=False)  # see the fast path above

    def render(self, data: dict[str, Any]) -> str:
        """The output (HTML-escaped where the template is HTML); RenderError naming the
        variable, the template and the line when a value is missing or wrong."""
        if self.fast is not None:
            try:
                out: str = self.fast(data)
                if len(out) <= MAX_OUTPUT_CHARS:
                    return out
            except Exception:  # _Slow, or anything _Run is to answer
                pass
        run = _Run(data, self.html)
        try:
            run.run(self.nodes)
        except _Missing as e:
            path = e.path if e.last_step else f"({e.path})"
            raise RenderError(
                f'{e.variable} is missing; give a default: ${{{path}!"..."}} '
                f"or test it: <#if {path}??>",
                variable=e.variable,
                line=e.line,
                template=self.name,
            ) from None
        except RenderError as e:
            raise e.located(self.name) from None
        except RecursionError:
            raise RenderError("the template nests too deeply", template=self.name) from None
        return "".join(run.parts)


@lru_cache(maxsize=512)
def compile_template(source: str, name: str = "template", html: bool | None = None) -> Template:
    """The parsed template (cached per source); `html` defaults to the name ending .html.ftl."""
    is_html = name.endswith(".html.ftl") if html is None else html
    nodes = parse(source, name)
    return Template(name, is_html, nodes, _fast_nodes(nodes, is_html))


def render_template(
    source: str, data: dict[str, Any], name: str = "template", html: bool | None = None
) -> str:
    return compile_template(source, name, html).render(data)
