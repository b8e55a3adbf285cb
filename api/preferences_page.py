"""The hosted preferences page: one self-contained HTML document.

No external assets (inline CSS and JS; the Content-Security-Policy forbids anything else). The
page is server-rendered, so it shows the saved state and works as plain HTML forms without
JavaScript; with JavaScript it saves through the JSON API and confirms in an aria-live region.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote

HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
    # The subscription id is in the address: never send it on to another site.
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-robots-tag": "noindex",
}

_CSS = """
:root{color-scheme:light dark;--fg:#1b1f24;--muted:#57606a;--bg:#f6f8fa;--card:#fff;
--line:#d0d7de;--accent:#0b5cad;--ok:#116329;--err:#a40e26;--focus:#f0a30a}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--muted:#9da7b3;--bg:#0d1117;
--card:#161b22;--line:#30363d;--accent:#4493f8;--ok:#3fb950;--err:#ff7b72}}
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
color:var(--fg);background:var(--bg)}
main{max-width:36rem;margin:0 auto;padding:1.5rem 1rem 3rem}
h1{font-size:1.5rem;line-height:1.25;margin:.5rem 0 .25rem}
.lead,.hint{color:var(--muted);margin:.25rem 0 1rem}
.card{background:var(--card);border:1px solid var(--line);border-radius:12px;
padding:1rem 1.25rem;margin:1rem 0}
fieldset{border:0;margin:0 0 1rem;padding:0}
legend{font-weight:600;font-size:1.1rem;padding:0}
.opt{display:flex;align-items:center;gap:.75rem;padding:.6rem 0;border-top:1px solid var(--line)}
.opt:first-of-type{border-top:0}
.opt input{width:1.35rem;height:1.35rem;margin:0;accent-color:var(--accent);flex:none}
.opt label{flex:1;cursor:pointer;min-height:1.5rem}
button{font:inherit;font-weight:600;border-radius:8px;padding:.7rem 1.2rem;cursor:pointer;
border:1px solid var(--accent);background:var(--accent);color:#fff;min-height:2.75rem}
button.secondary{background:transparent;color:var(--err);border-color:var(--err)}
button[disabled]{opacity:.6;cursor:progress}
:focus-visible{outline:3px solid var(--focus);outline-offset:2px}
textarea{width:100%;font:inherit;color:inherit;background:transparent;border:1px solid var(--line);
border-radius:8px;padding:.5rem;min-height:4.5rem;margin:.25rem 0 .75rem}
.status{min-height:1.5rem;font-weight:600;margin:.75rem 0}
.status.ok{color:var(--ok)}.status.err{color:var(--err)}
.notice{border-left:4px solid var(--err);padding:.5rem .75rem;background:var(--card)}
[hidden]{display:none!important}
@media (max-width:30rem){main{padding:1rem .75rem 2rem}button{width:100%}}
"""

_JS = """
(function () {
  var data = JSON.parse(document.getElementById('prefs-data').textContent);
  var status = document.getElementById('status');
  var notice = document.getElementById('unsubscribed-notice');
  function say(text, ok) {
    status.textContent = text;
    status.className = 'status ' + (ok ? 'ok' : 'err');
  }
  function apply(res) {
    res.channels.forEach(function (c) {
      var el = document.getElementById('ch-' + c.channel);
      if (el) el.checked = c.subscribed;
    });
    res.categories.forEach(function (c) {
      var el = document.getElementById('cat-' + c.name);
      if (el) el.checked = c.subscribed;
    });
    notice.hidden = !res.unsubscribeAll;
  }
  function send(form, body, done) {
    var buttons = form.querySelectorAll('button');
    buttons.forEach(function (b) { b.disabled = true; });
    say('Saving\\u2026', true);
    var url = data.api + (data.assetId ? '?assetId=' + encodeURIComponent(data.assetId) : '');
    fetch(url, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify(body)
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (j) {
        if (!r.ok) throw new Error((j.error && j.error.message) || ('error ' + r.status));
        apply(j);
        say(done, true);
      });
    }).catch(function (err) {
      say('Sorry, your changes were not saved: ' + err.message, false);
    }).then(function () {
      buttons.forEach(function (b) { b.disabled = false; });
    });
  }
  function picks(form, name, key) {
    return Array.prototype.map.call(
      form.querySelectorAll('input[name="' + name + '"]'),
      function (el) { var o = {subscribed: el.checked}; o[key] = el.value; return o; });
  }
  var prefs = document.getElementById('prefs');
  prefs.addEventListener('submit', function (e) {
    e.preventDefault();
    send(prefs, {
      channels: picks(prefs, 'channel', 'channel'),
      categories: picks(prefs, 'category', 'category'),
      unsubscribeAll: false
    }, 'Your preferences are saved.');
  });
  var unsub = document.getElementById('unsub');
  unsub.addEventListener('submit', function (e) {
    e.preventDefault();
    var body = {categories: [], channels: [], unsubscribeAll: true};
    var reason = document.getElementById('reason').value.trim();
    if (reason) body.unsubscribeReason = reason;
    send(unsub, body, 'You are unsubscribed from everything.');
  });
})();
"""


def _option(kind: str, value: str, label: str, checked: bool) -> str:
    ident = f"{'ch' if kind == 'channel' else 'cat'}-{value}"
    return (
        f'<div class="opt"><input type="checkbox" id="{escape(ident)}" name="{kind}"'
        f' value="{escape(value)}"{" checked" if checked else ""}>'
        f'<label for="{escape(ident)}">{escape(label)}</label></div>'
    )


def render(
    res: dict[str, Any],
    subscription_id: str,
    asset_id: str | None,
    *,
    message: str = "",
    ok: bool = True,
) -> str:
    """The page for one customer's preferences resource."""
    action = f"/content/{quote(subscription_id)}"
    if asset_id:
        action += f"?utm_campaign={quote(asset_id)}"
    data = json.dumps(
        {"api": f"/cdp/marketing-preferences/{subscription_id}", "assetId": asset_id or ""}
    ).replace("<", "\\u003c")
    channels = "".join(
        _option("channel", c["channel"], c["name"], c["subscribed"]) for c in res["channels"]
    )
    categories = "".join(
        _option("category", c["name"], c["category"], c["subscribed"]) for c in res["categories"]
    )
    topics = (
        f"""<fieldset><legend>Topics</legend>
<p class="hint">Untick a topic to stop hearing about it.</p>{categories}</fieldset>"""
        if categories
        else ""
    )
    status_class = "status " + ("ok" if ok else "err") if message else "status"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="robots" content="noindex">
<title>Your communication preferences</title><style>{_CSS}</style></head>
<body><main>
<h1>Your communication preferences</h1>
<p class="lead">Choose how we may contact you and what about. Changes apply right away.</p>
<p id="unsubscribed-notice" class="notice"{"" if res["unsubscribeAll"] else " hidden"}>You are
unsubscribed from everything. Saving your choices below subscribes you to what you tick.</p>
<form id="prefs" class="card" method="post" action="{escape(action)}">
<input type="hidden" name="action" value="save">
<fieldset><legend>Channels</legend>
<p class="hint">We contact you only on the channels you tick.</p>{channels}</fieldset>
{topics}
<button type="submit">Save preferences</button>
</form>
<div id="status" class="{status_class}" role="status" aria-live="polite">{escape(message)}</div>
<form id="unsub" class="card" method="post" action="{escape(action)}">
<input type="hidden" name="action" value="unsubscribe_all">
<fieldset><legend>Unsubscribe from everything</legend>
<p class="hint">Stop all marketing messages on every channel.</p>
<label for="reason">Why are you leaving? (optional)</label>
<textarea id="reason" name="reason" maxlength="2000"></textarea>
<button type="submit" class="secondary">Unsubscribe from everything</button>
</fieldset></form>
</main>
<script type="application/json" id="prefs-data">{data}</script>
<script>{_JS}</script>
</body></html>"""


def not_found() -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="robots" content="noindex"><title>Link not valid</title><style>{_CSS}</style></head>
<body><main><h1>This link is not valid</h1>
<p class="lead">Open the preferences link from one of our recent messages again.</p>
</main></body></html>"""
