"""Money apps: bank (transfer_money, capped at TRANSFER_LIMIT) and wallet (pay_bill).

Both debit an account and record a transaction; insufficient funds is PRECONDITION_FAILED, a transfer
over the limit PERMISSION_DENIED.
"""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME, Entity
from mpa_jax.envs.contract import ErrorCode
from mpa_jax.envs.tools.base import NETWORK, ToolError, handler, id_schema, not_found
from mpa_jax.envs.world import World, parse_id

TRANSFER_LIMIT = 2000.0


def _account(world: World, rid: str) -> tuple[Entity, int, dict[str, Any]]:
    e = ENTITY_BY_NAME["account"]
    n = parse_id(e, rid)
    row = world.get(e, n)
    if row is None:
        raise not_found(e, rid)
    return e, n, row


def _debit(world: World, account_id: str, amount: float, description: str, category: str) -> float:
    e, n, acct = _account(world, account_id)
    if acct["balance"] < amount:
        raise ToolError(ErrorCode.PRECONDITION_FAILED, f"insufficient funds: balance is {acct['balance']:.2f} USD",
                        hint="choose another account or a smaller amount")
    new = round(acct["balance"] - amount, 2)
    world.update(e, n, {"balance": new})
    world.insert(ENTITY_BY_NAME["transaction"], {"description": description, "amount": -round(amount, 2),
                                                 "date": world.device["now"][:10], "category": category})
    return new


@handler("transfer_money", "bank", "payments_banking", "write",
         f"Transfer money from one of the user's accounts to a saved payee (at most {TRANSFER_LIMIT:.0f} USD per transfer).",
         {"from_account_id": id_schema(ENTITY_BY_NAME["account"]), "payee_id": id_schema(ENTITY_BY_NAME["payee"]),
          "amount": {"type": "number", "minimum": 0.01, "maximum": 1000000}, "memo": {"type": "string", "maxLength": 140}},
         ["from_account_id", "payee_id", "amount"], pre=NETWORK, errors=("NOT_FOUND", "PRECONDITION_FAILED", "PERMISSION_DENIED"))
def transfer_money(world: World, a: dict[str, Any]) -> Any:
    pe = ENTITY_BY_NAME["payee"]
    payee = world.get(pe, parse_id(pe, a["payee_id"]))
    if payee is None:
        raise not_found(pe, a["payee_id"])
    if a["amount"] > TRANSFER_LIMIT:
        raise ToolError(ErrorCode.PERMISSION_DENIED, f"transfers above {TRANSFER_LIMIT:.0f} USD are not allowed from the phone",
                        hint="tell the user to use online banking for large transfers")
    new = _debit(world, a["from_account_id"], a["amount"], f"Transfer to {payee['name']}", "bills")
    return {"status": "sent", "amount": round(a["amount"], 2), "payee": payee["name"], "new_balance": new}


@handler("pay_bill", "wallet", "payments_banking", "write", "Pay an unpaid bill from one of the user's accounts.",
         {"bill_id": id_schema(ENTITY_BY_NAME["bill"]), "from_account_id": id_schema(ENTITY_BY_NAME["account"])},
         ["bill_id", "from_account_id"], pre=NETWORK, errors=("NOT_FOUND", "PRECONDITION_FAILED"))
def pay_bill(world: World, a: dict[str, Any]) -> Any:
    be = ENTITY_BY_NAME["bill"]
    n = parse_id(be, a["bill_id"])
    bill = world.get(be, n)
    if bill is None:
        raise not_found(be, a["bill_id"])
    if bill["paid"]:
        raise ToolError(ErrorCode.PRECONDITION_FAILED, f"bill {a['bill_id']} is already paid")
    new = _debit(world, a["from_account_id"], bill["amount"], f"{bill['name']} bill", "bills")
    world.update(be, n, {"paid": True})
    return {"status": "paid", "bill": bill["name"], "amount": bill["amount"], "new_balance": new}
