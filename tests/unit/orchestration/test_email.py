"""Email pieces without a server: tokens and tampering, link tracking (several links, only
http(s), no open redirect), the stored links, the headers and the message's shape."""

from __future__ import annotations

import email
import re
from email import policy
from pathlib import Path
from typing import Any

import pytest

from mallard.paths import DataPaths
from orchestration.delivery.email import (
    Email,
    build_message,
    links_for,
    parse_smtp_url,
    read_send,
    read_token,
    send_token,
    sign_token,
    store_links,
    track_links,
    unsubscribe_headers,
    unsubscribe_token,
)

SEND: dict[str, Any] = {
    "sendId": "send-1",
    "assetId": "welcome",
    "eventId": "evt-1",
    "customerId": "cust-1",
    "clientId": "c",
    "accountId": "a",
    "brandId": "b",
    "userId": "u-1",
}
BASE = "https://cdp.example.com/"


@pytest.fixture
def paths(tmp_path: Path) -> DataPaths:
    return DataPaths(tmp_path / "data")


def test_a_token_round_trips_and_a_changed_byte_is_refused(paths: DataPaths) -> None:
    payload = {"s": "send-1", "i": 3, "name": "Zoë"}
    token = sign_token(paths, payload)
    assert re.fullmatch(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+", token)
    assert read_token(paths, token) == payload
    body, tag = token.split(".")
    for i in range(len(body)):
        flipped = body[:i] + ("A" if body[i] != "A" else "B") + body[i + 1 :]
        assert read_token(paths, f"{flipped}.{tag}") is None
    assert read_token(paths, f"{body}.{tag[:-1]}") is None
    assert read_token(paths, body) is None
    assert read_token(paths, "") is None
    assert read_token(paths, "a.b.c") is None
    # Another server's secret signs other tokens.
    other = DataPaths(paths.root.parent / "other")
    assert read_token(other, token) is None


def test_a_token_of_one_kind_is_not_another(paths: DataPaths) -> None:
    unsub = unsubscribe_token(paths, SEND)
    assert read_send(paths, unsub, "u") == SEND
    assert read_send(paths, unsub, "c") is None
    assert read_send(paths, unsub, "o") is None
    click = send_token(paths, SEND, "c", i=2)
    assert read_send(paths, click, "c") == {**SEND, "link": 2}
    # A click token without an index is refused.
    assert read_send(paths, send_token(paths, SEND, "c"), "c") is None


def test_track_links_rewrites_every_link_and_adds_the_pixel(paths: DataPaths) -> None:
    html = (
        "<html><body><p>Hi</p>"
        '<a href="https://shop.example/a?x=1&amp;y=2">one</a>'
        "<A class='btn' HREF='http://shop.example/b'>two</A>"
        "<a href=https://shop.example/c>three</a>"
        '<a href="https://shop.example/a?x=1&amp;y=2">one again</a>'
        '<a href="mailto:help@example.com">mail</a><a href="#top">top</a>'
        '<link href="https://cdn.example/style.css" rel="stylesheet">'
        "</BODY></html>"
    )
    out, links = track_links(html, BASE, paths, SEND)
    assert links == [
        "https://shop.example/a?x=1&y=2",
        "http://shop.example/b",
        "https://shop.example/c",
        "https://shop.example/a?x=1&y=2",
    ]
    tokens = re.findall(r'href="https://cdp\.example\.com/cdp/email/c/([^"]+)"', out, re.I)
    assert [read_send(paths, t, "c")["link"] for t in tokens] == [0, 1, 2, 3]  # type: ignore[index]
    assert "shop.example" not in out
    assert 'href="mailto:help@example.com"' in out and 'href="#top"' in out
    assert 'href="https://cdn.example/style.css"' in out
    assert ">one</a>" in out and "class='btn'" in out
    pixel = re.search(r'<img src="https://cdp\.example\.com/cdp/email/o/([^"]+)\.gif"[^>]*>', out)
    assert pixel and out.index(pixel.group(0)) < out.index("</BODY>")
    assert read_send(paths, pixel.group(1), "o") == SEND


def test_html_without_body_gets_the_pixel_at_the_end(paths: DataPaths) -> None:
    out, links = track_links("<p>no links</p>", BASE, paths, SEND)
    assert links == []
    assert out.startswith("<p>no links</p><img src=")


def test_a_click_goes_only_to_a_stored_link(paths: DataPaths) -> None:
    assert links_for(paths, "send-1") is None
    store_links(paths, "send-1", ["https://a.example/", "https://b.example/"])
    store_links(paths, "send-2", ["https://c.example/"])
    assert links_for(paths, "send-1") == ["https://a.example/", "https://b.example/"]
    # A re-render replaces the send's links.
    store_links(paths, "send-1", ["https://d.example/"])
    assert links_for(paths, "send-1") == ["https://d.example/"]
    assert links_for(paths, "send-3") is None
    # The token names an index, never a URL: a forged URL has nowhere to go.
    forged = sign_token(paths, {"s": "send-1", "k": "c", "i": 0, "url": "https://evil.example"})
    send = read_send(paths, forged, "c")
    assert send is not None and "url" not in send
    assert links_for(paths, send["sendId"])[send["link"]] == "https://d.example/"  # type: ignore[index]


def test_unsubscribe_headers_are_rfc_8058() -> None:
    assert unsubscribe_headers("https://cdp.example.com/", "tok") == {
        "List-Unsubscribe": "<https://cdp.example.com/cdp/email/unsubscribe/tok>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }


def test_the_message_is_multipart_alternative_with_the_given_id() -> None:
    mail = Email(
        to="Ann <ann@example.com>",
        sender="Shop <shop@example.com>",
        subject="Hello Zoë",
        text="Hi Ann",
        html="<p>Hi Ann</p>",
        message_id="<send-1@mallard>",
        headers={"List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
    )
    parsed = email.message_from_bytes(build_message(mail).as_bytes(), policy=policy.default)
    assert parsed.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]
    assert parsed["Message-ID"] == "<send-1@mallard>"
    assert parsed["Subject"] == "Hello Zoë"
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    text_only = build_message(Email(**{**mail.__dict__, "html": None}))
    assert text_only.get_content_type() == "text/plain"


def test_smtp_urls() -> None:
    t = parse_smtp_url("smtp://127.0.0.1:1025")
    assert (t.host, t.port, t.tls, t.starttls, t.user) == ("127.0.0.1", 1025, False, False, None)
    t = parse_smtp_url("smtps://me%40x.com:p%3Aw@mail.example.com")
    assert (t.port, t.tls, t.user, t.password) == (465, True, "me@x.com", "p:w")
    assert parse_smtp_url("smtp://mail.example.com:587?starttls=1").starttls
    with pytest.raises(ValueError):
        parse_smtp_url("http://mail.example.com")
