"""Demo traffic for `make run`: a few customers identified, browsing and buying, over real HTTP."""

from __future__ import annotations

import httpx

CUSTOMERS = [
    ("u-1001", "ada@example.com", "Ada", "Lovelace", "pro"),
    ("u-1002", "grace@example.com", "Grace", "Hopper", "free"),
    ("u-1003", "alan@example.com", "Alan", "Turing", "pro"),
]


def send_demo_traffic(url: str, creds: dict[str, str]) -> int:
    base = f"{url}/track/{creds['clientId']}/{creds['accountId']}/{creds['brandId']}/v1"
    headers = {"auth-token": creds["token"]}
    batch: list[dict[str, object]] = []
    for i, (user_id, email, first, last, plan) in enumerate(CUSTOMERS):
        anon = f"anon-demo-{i}"
        batch += [
            {
                "type": "page",
                "event": "page",
                "anonymousId": anon,
                "properties": {"path": "/pricing", "title": "Pricing"},
                "context": {
                    "campaign": {"name": "autumn", "source": "newsletter", "medium": "email"}
                },
            },
            {
                "type": "identify",
                "event": "identify",
                "userId": user_id,
                "anonymousId": anon,
                "traits": {"email": email, "firstName": first, "lastName": last, "plan": plan},
            },
            {"type": "track", "event": "Logged In", "userId": user_id},
            {
                "type": "track",
                "event": "Order Completed",
                "userId": user_id,
                "properties": {"orderId": f"o-{i}", "total": 42.5 + i, "currency": "EUR"},
            },
        ]
    batch.append(
        {
            "type": "page",
            "event": "page",
            "anonymousId": "anon-demo-visitor",
            "properties": {"path": "/"},
        }
    )
    with httpx.Client(timeout=30) as client:
        resp = client.post(f"{base}/batch", json={"batch": batch}, headers=headers)
        resp.raise_for_status()
    return len(batch)
