"""The shop app's checkout (place_order); the cart and products are table tools (tables.py)."""
from __future__ import annotations

from typing import Any

from mpa_jax.envs.catalog import ENTITY_BY_NAME
from mpa_jax.envs.contract import ErrorCode
from mpa_jax.envs.tools.base import NETWORK, ToolError, handler
from mpa_jax.envs.world import CONVERTERS, World, parse_id


@handler("place_order", "shop", "shopping_food", "write", "Check out: order everything in the shopping cart.", {}, [],
         pre=NETWORK, errors=("PRECONDITION_FAILED",))
def place_order(world: World, a: dict[str, Any]) -> Any:
    cart_e, prod_e = ENTITY_BY_NAME["cart_item"], ENTITY_BY_NAME["product"]
    items = [CONVERTERS["cart_item"](r) for r in world.conn.execute("SELECT * FROM shop_cart_items ORDER BY n")]
    if not items:
        raise ToolError(ErrorCode.PRECONDITION_FAILED, "the cart is empty", hint="add products with create_cart_item first")
    total = 0.0
    for it in items:
        total += world.get(prod_e, parse_id(prod_e, it["product_id"]))["price"] * it["quantity"]
        world.delete(cart_e, parse_id(cart_e, it["id"]))
    desc = ", ".join(f"{it['product_name']} x{it['quantity']}" for it in items)
    rid = world.insert(ENTITY_BY_NAME["order"], {"items": desc, "total": round(total, 2), "status": "processing",
                                                 "placed_on": world.device["now"][:10]})
    return {"id": rid, "items": desc, "total": round(total, 2), "status": "processing"}
