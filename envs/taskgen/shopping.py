"""Shopping scenarios: the buy-now skill (cart, then checkout)."""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.taskgen.common import done, search_step, tc
from mpa_jax.envs.taskgen.registry import Ctx, template


@template("shop.buy_now", "shopping_food", "skills", 2, weight=2, family="buy_now")
def shop_buy(ctx: Ctx) -> dict[str, Any]:
    e = ENTITY_BY_NAME["product"]
    p = ctx.choice([r for r in ctx.rows(e) if sum(1 for x in ctx.rows(e) if x["name"] == r["name"]) == 1])
    q = ctx.choice([1, 2, 3])
    cart = ctx.rows("cart_item")
    return {"initial_state": {"delete": {"cart_item": [c["id"] for c in cart]}},
            "instruction": f"Order {q} x {p['name']} for me right now.",
            "gold": [search_step(ctx, e, p["name"]), tc("create_cart_item", {"product_id": p["id"], "quantity": q}),
                     tc("place_order", {}), done(ctx, f"your order of {q} x {p['name']} is placed")],
            "verifier": {"goals": [{"kind": "new_row", "entity": "order", "name": "ordered",
                                    "match": {"items": f"{p['name']} x{q}", "status": "processing"}}],
                         "allow": ["shop_cart_items"],
                         "milestones": [{"tool": "create_cart_item"}, {"tool": "place_order"}]}}
