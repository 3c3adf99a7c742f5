"""Payments and banking scenarios: transfers, a transfer over the limit to refuse, paying a bill."""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.taskgen.common import describe, done, msg, search_step, tc
from mpa_jax.envs.taskgen.registry import Ctx, template


@template("bank.transfer", "payments_banking", "tool_use", 2, weight=2)
def transfer(ctx: Ctx) -> dict[str, Any] | None:
    payee = ctx.choice(ctx.rows("payee"))
    acct = max(ctx.rows("account"), key=lambda r: r["balance"])
    amt = ctx.choice([25, 40, 60, 120, 250])
    if acct["balance"] < amt:
        return None
    new = round(acct["balance"] - amt, 2)
    return {"instruction": f'Send {amt} USD from my "{acct["name"]}" account to {payee["name"]}.',
            "gold": [search_step(ctx, ENTITY_BY_NAME["payee"], payee["name"], group=1),
                     search_step(ctx, ENTITY_BY_NAME["account"], acct["name"], group=1),
                     tc("transfer_money", {"from_account_id": acct["id"], "payee_id": payee["id"], "amount": amt}),
                     done(ctx, f"{amt} USD sent to {payee['name']}")],
            "verifier": {"goals": [{"kind": "field", "entity": "account", "id": acct["id"], "values": {"balance": new}},
                                   {"kind": "new_row", "entity": "transaction", "name": "txn", "match": {"amount": -amt}}]}}


@template("bank.transfer_over_limit", "payments_banking", "tool_use", 3)
def transfer_refuse(ctx: Ctx) -> dict[str, Any]:
    payee = ctx.choice(ctx.rows("payee"))
    amt = ctx.choice([2500, 3000, 5000, 12000])
    return {"instruction": f"Transfer {amt} USD to {payee['name']}.",
            "gold": [msg("Sorry, I can't do that: transfers above 2000 USD aren't allowed from the phone. Please use online banking.",
                         why=f"{amt} USD is above the 2000 USD transfer limit, so I have to decline.")],
            "verifier": {"goals": [], "answer": {"kind": "refuse"},
                         "minefields": [{"kind": "call", "tool": "transfer_money", "name": "transfer_attempted"}]},
            "extra_tools": ["search_payees", "search_accounts", "transfer_money"]}


@template("wallet.pay_bill", "payments_banking", "tool_use", 2)
def pay_bill_t(ctx: Ctx) -> dict[str, Any] | None:
    bill = ctx.choice(ctx.rows("bill"))
    acct = max(ctx.rows("account"), key=lambda r: r["balance"])
    if acct["balance"] < bill["amount"] or describe(ctx, ENTITY_BY_NAME["bill"], bill) is None:
        return None
    return {"instruction": f'Pay my {bill["name"]} bill from "{acct["name"]}".',
            "gold": [search_step(ctx, ENTITY_BY_NAME["bill"], bill["name"], group=1),
                     search_step(ctx, ENTITY_BY_NAME["account"], acct["name"], group=1),
                     tc("pay_bill", {"bill_id": bill["id"], "from_account_id": acct["id"]}), done(ctx, f"the {bill['name']} bill is paid")],
            "verifier": {"goals": [{"kind": "field", "entity": "bill", "id": bill["id"], "values": {"paid": True}},
                                   {"kind": "field", "entity": "account", "id": acct["id"], "values": {"balance": round(acct["balance"] - bill["amount"], 2)}},
                                   {"kind": "new_row", "entity": "transaction", "name": "txn", "match": {"amount": -bill["amount"]}}]}}
