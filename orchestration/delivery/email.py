"""Email for real: one message over SMTP, signed link tokens, click and open tracking, and the
links each send carried.

- `send_email` speaks SMTP with the stdlib (`MALLARD_SMTP_URL`: `smtp://host:port`,
  `smtps://...`, `user:password@` optional, `?starttls=1`). The caller's `Message-ID` goes on
  the message, so a re-send after a crash carries the same id. A permanent (5xx) refusal of the
  recipient or the message raises `Bounced`; a 4xx answer or a connection failure `TryLater`;
  a 5xx refusal that is about us (the sender, the login) `Rejected`, which suppresses nobody.
  `SmtpSession` sends many messages on one connection with the same answers per message; the
  dispatcher keeps one for a whole run of sends.
- Tokens are `<payload>.<tag>`: the payload JSON, base64url, and 128 bits of HMAC-SHA256 under
  a key derived from the server secret. A changed byte makes `read_token` answer None.
- `track_links` points every link of the HTML at `/cdp/email/c/<token>` and adds an open pixel.
  A click token carries the link's index only: the redirect target is read from the links
  stored for the send (`store_links` before sending, `links_for` when clicked), never from the
  URL, so the route redirects nowhere else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html as html_lib
import json
import quopri
import re
import smtplib
import sqlite3
import ssl
from contextlib import closing
from dataclasses import dataclass
from email.message import EmailMessage, Message
from email.mime.multipart import MIMEMultipart
from email.mime.nonmultipart import MIMENonMultipart
from email.policy import SMTP, compat32
from email.utils import formatdate, parseaddr
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from mallard.paths import DataPaths
from mallard.secret import derived_key

LINK_KEY_PURPOSE = "mallard email links v1"
TAG_BYTES = 16
MAX_TOKEN_CHARS = 4096

# The send's fields a token carries, and the short names they travel under.
SEND_FIELDS = {
    "sendId": "s",
    "assetId": "a",
    "eventId": "e",
    "customerId": "c",
    "clientId": "tc",
    "accountId": "ta",
    "brandId": "tb",
    "userId": "u",
    "anonymousId": "n",
}
_LONG = {short: long for long, short in SEND_FIELDS.items()}

# href="..." | href='...' | href=bare on <a> and <area> tags.
_TAG = re.compile(r"<(?:a|area)\b[^>]*>", re.IGNORECASE)
_HREF = re.compile(r"""(\bhref\s*=\s*)(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE)
_BODY_END = re.compile(r"</body\s*>", re.IGNORECASE)


@dataclass(frozen=True)
class Email:
    to: str
    sender: str
    subject: str
    text: str
    html: str | None
    message_id: str
    headers: dict[str, str]


class SendError(Exception):
    """The server did not take the message: its reply code (None without one) and text."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(f"{code} {message}" if code is not None else message)
        self.code = code
        self.message = message


class Bounced(SendError):
    """A permanent (5xx) refusal of the recipient or the message: suppress the address."""


class TryLater(SendError):
    """A temporary (4xx) answer or no answer at all (connection refused, reset, timed out)."""


class Rejected(SendError):
    """A permanent refusal that is about the sending side (sender address, login): the
    recipient's address is not at fault."""


# --- sending ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmtpTarget:
    host: str
    port: int
    tls: bool  # smtps: TLS from the first byte
    starttls: bool
    user: str | None
    password: str | None


def parse_smtp_url(url: str) -> SmtpTarget:
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise ValueError(f"not an SMTP URL (smtp://host:port or smtps://host:port): {url!r}")
    tls = parts.scheme == "smtps"
    flag = parse_qs(parts.query).get("starttls", ["0"])[-1].lower()
    return SmtpTarget(
        host=parts.hostname,
        port=parts.port or (465 if tls else 25),
        tls=tls,
        starttls=flag in ("1", "true", "yes"),
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


def build_message(email: Email) -> EmailMessage:
    """multipart/alternative (text, then HTML) or text alone, with the given Message-ID."""
    msg = EmailMessage(policy=SMTP)
    msg["From"] = email.sender
    msg["To"] = email.to
    msg["Subject"] = email.subject
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg["Message-ID"] = email.message_id
    msg["MIME-Version"] = "1.0"
    for name, value in email.headers.items():
        del msg[name]
        msg[name] = value
    msg.set_content(email.text)
    if email.html is not None:
        msg.add_alternative(email.html, subtype="html")
    return msg


# The fast build's policy: compat32 keeps header values as the strings given (no parse per
# header), with SMTP's line ends; headers are folded only past SMTP's 998 characters.
_WIRE = compat32.clone(linesep="\r\n", max_line_length=998)


def _plain_header(value: str) -> bool:
    return value.isascii() and "\r" not in value and "\n" not in value


def _text_part(body: str, subtype: str) -> Message:
    """A text part in UTF-8, its lines ended as set_content ends them: 7bit when ASCII with
    lines of at most 78 characters, else quoted-printable."""
    lines = body.encode().splitlines()
    data = b"\n".join(lines) + b"\n"
    part = MIMENonMultipart("text", subtype, policy=_WIRE, charset="utf-8")
    del part["MIME-Version"]
    if data.isascii() and all(len(line) <= 78 for line in lines):
        part["Content-Transfer-Encoding"] = "7bit"
        part.set_payload(data.decode())
    else:
        part["Content-Transfer-Encoding"] = "quoted-printable"
        part.set_payload(quopri.encodestring(data).decode())
    return part


def message_bytes(email: Email) -> bytes:
    """The message as it goes over SMTP: `build_message(email).as_bytes()`, built with the
    legacy MIME classes when every header value is plain ASCII on one line (a few times less
    CPU: no header is parsed back): the same parts, Content-Types, header values and decoded
    text, with text that is not short-lined ASCII quoted-printable. Otherwise by
    `build_message`, which encodes other headers and refuses line breaks in them."""
    values = [email.sender, email.to, email.subject, email.message_id, *email.headers.values()]
    if not all(_plain_header(v) for v in values):
        return build_message(email).as_bytes()
    msg: Message
    if email.html is None:
        msg = _text_part(email.text, "plain")
    else:
        msg = MIMEMultipart("alternative", policy=_WIRE)
        msg.attach(_text_part(email.text, "plain"))
        msg.attach(_text_part(email.html, "html"))
    del msg["MIME-Version"]
    msg["From"] = email.sender
    msg["To"] = email.to
    msg["Subject"] = email.subject
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg["Message-ID"] = email.message_id
    msg["MIME-Version"] = "1.0"
    for name, value in email.headers.items():
        del msg[name]
        msg[name] = value
    return msg.as_bytes(policy=_WIRE)


def _refusal(code: int, message: bytes | str, permanent: type[SendError]) -> SendError:
    text = message.decode(errors="replace") if isinstance(message, bytes) else message
    return permanent(code, text) if code >= 500 else TryLater(code, text)


class SmtpSession:
    """One SMTP connection kept open across sends (as listmonk's pool keeps its connections):
    a dispatch batch pays the connect, greeting, EHLO, STARTTLS and login once, not per send.
    Each send is its own transaction (MAIL, RCPT, DATA) and raises as `send_email` does. A
    refused transaction is reset (RSET) before the next one; a connection that failed is
    dropped and the next send opens another. A send whose reused connection turns out closed
    (a disconnect or 421 before DATA was sent: the server has not taken the message) is tried
    once more on a new connection; a failure once DATA is under way is TryLater, as for a
    single send, since the message may have arrived (a re-send carries the same Message-ID).
    """

    def __init__(self, smtp_url: str, timeout: float = 30) -> None:
        self.target = parse_smtp_url(smtp_url)
        self.timeout = timeout
        self._smtp: smtplib.SMTP | None = None

    def __enter__(self) -> SmtpSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        smtp, self._smtp = self._smtp, None
        if smtp is not None:
            try:
                smtp.quit()
            except (smtplib.SMTPException, OSError):
                smtp.close()

    def _drop(self) -> None:
        smtp, self._smtp = self._smtp, None
        if smtp is not None:
            smtp.close()

    def _open(self) -> smtplib.SMTP:
        target = self.target
        smtp: smtplib.SMTP
        if target.tls:
            smtp = smtplib.SMTP_SSL(
                target.host,
                target.port,
                timeout=self.timeout,
                context=ssl.create_default_context(),
            )
        else:
            smtp = smtplib.SMTP(target.host, target.port, timeout=self.timeout)
        try:
            smtp.ehlo_or_helo_if_needed()
            if target.starttls:
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if target.user is not None:
                try:
                    smtp.login(target.user, target.password or "")
                except smtplib.SMTPAuthenticationError as e:
                    raise _refusal(e.smtp_code, e.smtp_error, Rejected) from e
        except BaseException:
            smtp.close()
            raise
        return smtp

    def send(self, email: Email) -> str:
        """Send one message; the server's answer to it (e.g. `250 OK queued as ...`)."""
        sender = parseaddr(email.sender)[1] or email.sender
        recipient = parseaddr(email.to)[1] or email.to
        data = message_bytes(email)
        for fresh in (self._smtp is None, True):
            try:
                if self._smtp is None:
                    self._smtp = self._open()
                return self._transaction(self._smtp, sender, recipient, data)
            except _Stale as e:
                self._drop()
                if fresh:
                    raise TryLater(e.code, e.message) from e
            except SendError:
                self._reset()
                raise
            except smtplib.SMTPResponseException as e:
                self._drop()
                raise _refusal(e.smtp_code, e.smtp_error, Rejected) from e
            except (smtplib.SMTPException, OSError) as e:
                self._drop()
                raise TryLater(None, f"{type(e).__name__}: {e}") from e
        raise AssertionError("unreachable")  # the second round runs on a fresh connection

    def _reset(self) -> None:
        """After a refused transaction: RSET, or drop the connection when that fails."""
        if self._smtp is None:
            return
        try:
            code, _ = self._smtp.rset()
        except (smtplib.SMTPException, OSError):
            code = 0
        if code != 250:
            self._drop()

    @staticmethod
    def _transaction(smtp: smtplib.SMTP, sender: str, recipient: str, data: bytes) -> str:
        try:
            code, answer = smtp.mail(sender)
        except (smtplib.SMTPServerDisconnected, ConnectionError) as e:
            raise _Stale(None, f"{type(e).__name__}: {e}") from e
        if code == 421:  # the server closes this connection: nothing of the message was sent
            raise _Stale(code, answer.decode(errors="replace"))
        if code != 250:
            raise _refusal(code, answer, Rejected)
        code, answer = smtp.rcpt(recipient)
        if code not in (250, 251):
            raise _refusal(code, answer, Bounced)
        try:
            code, answer = smtp.data(data)
        except smtplib.SMTPDataError as e:
            raise _refusal(e.smtp_code, e.smtp_error, Bounced) from e
        if code != 250:
            raise _refusal(code, answer, Bounced)
        return f"{code} {answer.decode(errors='replace')}"


class _Stale(SendError):
    """The connection was closed before the message's transaction began."""


def send_email(smtp_url: str, email: Email, timeout: float = 30) -> str:
    """Send one message on a connection of its own; the server's answer to the message (e.g.
    `250 OK queued as ...`)."""
    with SmtpSession(smtp_url, timeout) as session:
        return session.send(email)


def compose(
    paths: DataPaths,
    base_url: str,
    send: dict[str, Any],
    to: str,
    content: dict[str, Any],
    marketing: bool,
) -> tuple[Email, list[str] | None]:
    """A send's message from its rendered content: links tracked and the open pixel added
    (`track_links`), one-click unsubscribe headers on marketing mail, Message-ID
    `<sendId@mallard>`. Also the links to store before it is sent (None without HTML)."""
    html = content.get("html")
    links = None
    if html:
        html, links = track_links(html, base_url, paths, send)
    headers = unsubscribe_headers(base_url, unsubscribe_token(paths, send)) if marketing else {}
    email = Email(
        to=to,
        sender=content.get("sender") or "mallard@localhost",
        subject=content.get("subject") or "",
        text=content.get("text") or "",
        html=html,
        message_id=f"<{send['sendId']}@mallard>",
        headers=headers,
    )
    return email, links


def unsubscribe_headers(base_url: str, token: str) -> dict[str, str]:
    """RFC 8058 one-click unsubscribe: the mail client POSTs `List-Unsubscribe=One-Click`."""
    return {
        "List-Unsubscribe": f"<{base_url.rstrip('/')}/cdp/email/unsubscribe/{token}>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }


# --- tokens -----------------------------------------------------------------------------------


@lru_cache(maxsize=16)
def _key(paths: DataPaths) -> bytes:
    return bytes.fromhex(derived_key(paths, LINK_KEY_PURPOSE))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _tag(paths: DataPaths, payload: str) -> str:
    return _b64(hmac.new(_key(paths), payload.encode(), hashlib.sha256).digest()[:TAG_BYTES])


def sign_token(paths: DataPaths, payload: dict[str, Any]) -> str:
    """A URL-safe token that carries `payload` and proves the server made it."""
    body = _b64(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
    return f"{body}.{_tag(paths, body)}"


def read_token(paths: DataPaths, token: str) -> dict[str, Any] | None:
    """The payload of a token this server signed; None for anything else."""
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        return None
    body, tag = token.split(".")
    if not hmac.compare_digest(tag.encode(), _tag(paths, body).encode()):
        return None
    try:
        payload = json.loads(_unb64(body))
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def send_token(paths: DataPaths, send: dict[str, Any], kind: str, **extra: Any) -> str:
    """A token of one kind (`o` open, `c` click, `u` unsubscribe) for a send: the send's fields
    of SEND_FIELDS that are set, under their short names, plus `extra`."""
    payload = {short: send[long] for long, short in SEND_FIELDS.items() if send.get(long)}
    return sign_token(paths, {**payload, "k": kind, **extra})


def unsubscribe_token(paths: DataPaths, send: dict[str, Any]) -> str:
    """The token of `unsubscribe_headers` for a send (it needs `customerId`)."""
    return send_token(paths, send, "u")


def read_send(paths: DataPaths, token: str, kind: str) -> dict[str, Any] | None:
    """The send fields of a valid token of that kind (`link` added for a click), else None."""
    payload = read_token(paths, token)
    if payload is None or payload.get("k") != kind:
        return None
    send = {_LONG[k]: v for k, v in payload.items() if k in _LONG}
    if kind == "c":
        if not isinstance(payload.get("i"), int):
            return None
        send["link"] = payload["i"]
    return send


# --- tracking ---------------------------------------------------------------------------------


def _trackable(url: str) -> bool:
    return urlsplit(url.strip()).scheme.lower() in ("http", "https")


def track_links(
    html: str, base_url: str, paths: DataPaths, send: dict[str, Any]
) -> tuple[str, list[str]]:
    """The HTML with each http(s) link of an `<a>` or `<area>` pointing at the click route, and
    an open pixel before `</body>`; and the original links (HTML entities decoded) in order,
    which the caller stores with `store_links(paths, send["sendId"], links)`.

    `send` holds the fields events need: sendId, assetId, eventId (the command's), customerId,
    clientId, accountId, brandId and userId or anonymousId. Links like mailto: and #anchors
    stay as they are.
    """
    base = base_url.rstrip("/")
    links: list[str] = []

    def rewrite_href(m: re.Match[str]) -> str:
        raw = next(g for g in m.groups()[1:] if g is not None)
        url = html_lib.unescape(raw).strip()
        if not _trackable(url):
            return m.group(0)
        token = send_token(paths, send, "c", i=len(links))
        links.append(url)
        return f'{m.group(1)}"{base}/cdp/email/c/{token}"'

    def rewrite_tag(m: re.Match[str]) -> str:
        return _HREF.sub(rewrite_href, m.group(0), count=1)

    out = _TAG.sub(rewrite_tag, html)
    pixel = (
        f'<img src="{base}/cdp/email/o/{send_token(paths, send, "o")}.gif" width="1" height="1"'
        ' alt="" style="display:block;border:0;width:1px;height:1px">'
    )
    ends = list(_BODY_END.finditer(out))
    if ends:
        at = ends[-1].start()
        out = f"{out[:at]}{pixel}{out[at:]}"
    else:
        out += pixel
    return out, links


# --- the links each send carried -------------------------------------------------------------


def _connect(paths: DataPaths) -> sqlite3.Connection:
    paths.root.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(paths.outbox_db, timeout=30, isolation_level=None)
    db.execute("pragma busy_timeout = 30000")
    db.execute(
        "create table if not exists email_links ("
        " send_id text not null, idx integer not null, url text not null,"
        " primary key (send_id, idx))"
    )
    return db


def store_links(paths: DataPaths, send_id: str, links: list[str]) -> None:
    """Keep the links of a send (before it is sent): a re-render replaces them."""
    store_links_many(paths, {send_id: links})


def store_links_many(paths: DataPaths, links: dict[str, list[str]]) -> None:
    """Keep the links of several sends (before any of them is sent) in one transaction."""
    if not links:
        return
    with closing(_connect(paths)) as db:
        db.execute("begin immediate")
        try:
            db.executemany("delete from email_links where send_id = ?", [(sid,) for sid in links])
            db.executemany(
                "insert into email_links (send_id, idx, url) values (?, ?, ?)",
                [(sid, i, url) for sid, urls in links.items() for i, url in enumerate(urls)],
            )
            db.execute("commit")
        except BaseException:
            db.execute("rollback")
            raise


def links_for(paths: DataPaths, send_id: str) -> list[str] | None:
    """The links stored for a send, in order; None when none are."""
    if not paths.outbox_db.exists():
        return None
    with closing(_connect(paths)) as db:
        rows = db.execute(
            "select url from email_links where send_id = ? order by idx", [send_id]
        ).fetchall()
    return [r[0] for r in rows] or None
