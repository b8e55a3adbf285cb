"""The FreeMarker subset of campaign assets: every construct, escaping, errors, caps."""

from __future__ import annotations

from typing import Any

import pytest

from mallard import templates
from mallard.templates import RenderError, compile_template, render_template


def text(src: str, data: dict[str, Any] | None = None) -> str:
    return render_template(src, data or {}, "t.txt.ftl")


def html(src: str, data: dict[str, Any] | None = None) -> str:
    return render_template(src, data or {}, "t.html.ftl")


CUSTOMER = {"customer": {"firstName": "Ada", "_subscriptionId": "sub_1", "plan": "pro"}}


def test_interpolation_paths_and_literals() -> None:
    assert text("Hi ${name}!", {"name": "Ada"}) == "Hi Ada!"
    assert text("${customer.firstName}", CUSTOMER) == "Ada"
    assert text("${a.b.c}", {"a": {"b": {"c": 3}}}) == "3"
    assert text("${n} ${f} ${g} ${t}", {"n": 7, "f": 2.0, "g": 2.5, "t": True}) == "7 2 2.5 true"
    assert text("${\"lit\"} ${'single'} ${42}") == "lit single 42"
    assert text('${"a\\"b\\n"}') == 'a"b\n'
    assert text("${a + b} ${s + n}", {"a": 1, "b": 2, "s": "x", "n": 1}) == "3 x1"


def test_defaults() -> None:
    assert text('${customer.firstName!"there"}', {"customer": {}}) == "there"
    assert text('${customer.firstName!"there"}', CUSTOMER) == "Ada"
    assert text('${(customer._subscriptionId)!""}', {"customer": {}}) == ""
    assert text('${(customer._subscriptionId)!""}', {}) == ""
    assert text('${(customer._subscriptionId)!""}', CUSTOMER) == "sub_1"
    assert text("[${x!}]") == "[]"
    assert text("${x!y}", {"y": "fallback"}) == "fallback"
    assert text('${x!"d"}', {"x": None}) == "d"  # null is missing, as in FreeMarker
    # Without parentheses only the last step is protected.
    with pytest.raises(RenderError) as e:
        text('${a.b.c!"d"}', {})
    assert e.value.variable == "a"
    assert "(a.b.c)" in str(e.value)


def test_exists_and_conditions() -> None:
    src = "<#if x??>yes<#else>no</#if>"
    assert text(src, {"x": 0}) == "yes"
    assert text(src, {}) == "no"
    assert text("<#if (a.b)??>y<#else>n</#if>", {}) == "n"
    ladder = (
        '<#if n == 1>one<#elseif n == 2 && s != "x">two<#elseif !(n < 5)>big'
        "<#elseif n gt 3 || false>four<#else>three</#if>"
    )
    assert [text(ladder, {"n": n, "s": "y"}) for n in (1, 2, 3, 4, 9)] == [
        "one",
        "two",
        "three",
        "four",
        "big",
    ]
    assert text("<#if (n > 3)>gt</#if><#if n >= 3>ge</#if><#if n <= 3>le</#if>", {"n": 3}) == (
        "gele"
    )
    assert text("<#if n gte 3 && n lte 3 && !(n lt 3)>eq</#if>", {"n": 3}) == "eq"
    assert text('<#if s == "a">A</#if><#if s != "a">B</#if>', {"s": "a"}) == "A"
    assert text("<#if flag>on<#else>off</#if>", {"flag": False}) == "off"
    assert text("<#if items?has_content>some<#else>none</#if>", {"items": []}) == "none"
    assert text("<#if items?has_content>some<#else>none</#if>", {}) == "none"
    assert text("<#if s?has_content>some</#if>", {"s": "x"}) == "some"


def test_list() -> None:
    data = {"items": [{"t": "a"}, {"t": "b"}, {"t": "c"}]}
    src = "<#list items as i>${i?index}${i.t}<#if i?has_next>,</#if></#list>"
    assert text(src, data) == "0a,1b,2c"
    assert text("<#list items as i>${i?counter}</#list>", data) == "123"
    assert text("<#list xs as x>${x}<#else>empty</#list>", {"xs": []}) == "empty"
    nested = "<#list rows as r><#list r as c>${c}${c?index}</#list>;</#list>"
    assert text(nested, {"rows": [[1, 2], [3]]}) == "1021;30;"
    # The loop variable shadows a root key only inside the loop.
    assert text("${x}<#list xs as x>${x}</#list>${x}", {"x": "r", "xs": ["i"]}) == "rir"


def test_builtins() -> None:
    d = {"s": "  hello World  ", "w": "élan", "xs": [1, 2], "h": {"a": 1}, "u": "a b&c/d"}
    assert text("[${s?trim}]", d) == "[hello World]"
    assert text("${s?trim?upper_case} ${s?trim?lower_case}", d) == "HELLO WORLD hello world"
    assert text("${w?cap_first}", d) == "Élan"
    assert text("${xs?size} ${h?size} ${w?length}", d) == "2 1 4"
    assert text("${u?url}", d) == "a%20b%26c%2Fd"
    assert text("${u?html}", d) == "a b&amp;c/d"
    assert text("${n?string} ${b?string('yes', 'no')}", {"n": 5, "b": False}) == "5 no"
    assert text("${xs?first}${xs?last}", d) == "12"
    with pytest.raises(RenderError, match="unknown built-in"):
        text("${s?nope}", d)


def test_comments_and_standalone_directive_lines() -> None:
    assert text("a<#-- gone ${x} -->b") == "ab"
    src = "Items:\n  <#list xs as x>\n  - ${x}\n  </#list>\n<#-- note -->\nend\n"
    assert text(src, {"xs": [1, 2]}) == "Items:\n  - 1\n  - 2\nend\n"
    src = "<#if a>\nA\n<#elseif b>\nB\n<#else>\nC\n</#if>\n"
    assert text(src, {"a": False, "b": True}) == "B\n"


def test_html_escaping() -> None:
    d = {"x": "<b>\"Tom\" & 'Jerry'</b>"}
    assert html("<p>${x}</p>", d) == "<p>&lt;b&gt;&#34;Tom&#34; &amp; &#39;Jerry&#39;&lt;/b&gt;</p>"
    assert html("${x?no_esc}", d) == d["x"]
    assert html("${x?html}", d) == text("${x?html}", d)  # escaped once, not twice
    assert text("${x}", d) == d["x"]  # text templates escape nothing
    assert html('<a href="?q=${q?url}">', {"q": "a&b"}) == '<a href="?q=a%26b">'
    assert html("${x + '<'}", {"x": "&"}) == "&amp;&lt;"


def test_missing_value_names_variable_template_and_line() -> None:
    with pytest.raises(RenderError) as e:
        render_template("line one\nline two ${customer.firstName}\n", {"customer": {}}, "w.txt")
    err = e.value
    assert (err.variable, err.line, err.template) == ("customer.firstName", 2, "w.txt")
    assert "customer.firstName" in str(err) and "line 2" in str(err) and "w.txt" in str(err)
    with pytest.raises(RenderError) as e:
        text("\n\n<#list items as i>${i}</#list>")
    assert (e.value.variable, e.value.line) == ("items", 3)
    with pytest.raises(RenderError) as e:
        text("\n<#if missing>x</#if>")
    assert (e.value.variable, e.value.line) == ("missing", 2)


def test_type_errors() -> None:
    with pytest.raises(RenderError, match="cannot be printed") as e:
        text("${h}", {"h": {"a": 1}})
    assert e.value.variable == "h"
    with pytest.raises(RenderError, match="compares numbers"):
        text("<#if (s > 1)>x</#if>", {"s": "a"})
    with pytest.raises(RenderError, match="boolean"):
        text("<#if s>x</#if>", {"s": "a"})
    with pytest.raises(RenderError, match="not a hash"):
        text("${s.x}", {"s": "a"})
    with pytest.raises(RenderError, match="sequence"):
        text("<#list s as x></#list>", {"s": "a"})


@pytest.mark.parametrize(
    ("src", "message", "line"),
    [
        ("a\n${x", "unclosed", 2),
        ("<#if x>", "not closed", 1),
        ("\n</#if>", "without an open", 2),
        ("<#list xs>x</#list>", "as name", 1),
        ("<#include 'x'>", "unsupported directive", 1),
        ("${}", "empty expression", 1),
        ("${a b}", "unexpected", 1),
        ("<#else>", "outside", 1),
        ("x <#-- open", "unclosed comment", 1),
        ("${a ^ b}", "unexpected", 1),
    ],
)
def test_syntax_errors(src: str, message: str, line: int) -> None:
    with pytest.raises(RenderError, match=message) as e:
        compile_template(src, "bad.txt.ftl")
    assert e.value.line == line
    assert e.value.template == "bad.txt.ftl"


def test_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RenderError, match="limit is 1000") as e:
        text("<#list xs as x>${x}</#list>", {"xs": list(range(1001))})
    assert e.value.variable == "xs"
    assert len(text("<#list xs as x>.</#list>", {"xs": list(range(1000))})) == 1000
    with pytest.raises(RenderError, match="loop iterations"):
        text(
            "<#list xs as a><#list xs as b><#list xs as c></#list></#list></#list>",
            {"xs": list(range(100))},
        )
    big = "x" * 1000
    with pytest.raises(RenderError, match="output exceeds"):
        text("<#list xs as i>${big}</#list>", {"xs": list(range(600)), "big": big})
    monkeypatch.setattr(templates, "MAX_OUTPUT_CHARS", 10)
    with pytest.raises(RenderError, match="output exceeds 10"):
        text("01234567890")


def test_compiled_once_per_source() -> None:
    src = "${cached_once}"
    assert compile_template(src, "c.txt.ftl") is compile_template(src, "c.txt.ftl")
    assert compile_template(src, "c.txt.ftl").render({"cached_once": 1}) == "1"


def test_no_python_evaluation() -> None:
    # Names resolve only in the data: nothing of Python is reachable from a template.
    with pytest.raises(RenderError, match="missing"):
        text("${__import__}")
    with pytest.raises(RenderError):
        text("${x.__class__}", {"x": "a"})


FAST_CASES = [
    ('Hi ${customer.firstName!"there"}, ${(customer._subscriptionId)!""}.', CUSTOMER),
    ('Hi ${customer.firstName!"there"}', {"customer": {}}),
    ('Hi ${customer.firstName!"there"}', {}),  # customer missing: not protected
    ("${(a.b.c)!'none'} ${(a.b)!}", {"a": {"b": None}}),
    ("${a.b}", {"a": "text"}),  # not a hash
    ("${x}", {}),
    ("${n} ${f} ${g} ${t} ${u}", {"n": 7, "f": 2.0, "g": 2.5, "t": True, "u": False}),
    ("${v}", {"v": [1]}),  # cannot be printed
    ("${v}", {"v": {"k": 1}}),
    ('${v!"d"}', {"v": {"k": 1}}),
    ("${s}", {"s": "<b>&'\""}),
    ("${s?html} ${s?url} ${s?upper_case} ${s?lower_case} ${s?cap_first} ${s?trim}", {"s": " a<B "}),
    ("${n?html}", {"n": 3}),
    ("<#if plan??>on ${plan?cap_first}<#elseif other??>other<#else>none</#if>.", {"plan": "pro"}),
    ("<#if plan??>on ${plan?cap_first}<#elseif other??>other<#else>none</#if>.", {"other": 1}),
    ("<#if plan??>on ${plan?cap_first}<#elseif other??>other<#else>none</#if>.", {}),
    ("<#if flag>yes</#if>", {"flag": True}),
    ("<#if flag>yes</#if>", {"flag": "true"}),  # not a boolean
    ("<#if flag>yes</#if>", {}),
    ("<#if (a.b)??>${a.b}</#if>", {"a": None}),
    ("${'lit'} ${42} ${x!1.5}", {}),
]


@pytest.mark.parametrize(("source", "data"), FAST_CASES)
@pytest.mark.parametrize("is_html", [False, True])
def test_fast_path_renders_as_the_interpreter(
    source: str, data: dict[str, Any], is_html: bool
) -> None:
    """The closures give the interpreter's output, and leave its errors to it."""
    template = compile_template(source, "t", is_html)
    assert template.fast is not None
    slow = templates.Template(template.name, template.html, template.nodes)
    try:
        expected: str | RenderError = slow.render(data)
    except RenderError as e:
        expected = e
    if isinstance(expected, RenderError):
        with pytest.raises(RenderError) as got:
            template.render(data)
        assert str(got.value) == str(expected)
    else:
        assert template.render(data) == expected
        assert type(template.fast(data)) is str
