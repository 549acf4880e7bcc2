"""The JSON API: one function per route, returning (status, body)."""

from app.db import connect


def list_products() -> tuple[int, list[dict]]:
    rows = connect().execute("SELECT id, name, price_cents FROM products").fetchall()
    return 200, [{"id": i, "name": n, "price_cents": p} for i, n, p in rows]


def place_order(product_id: int, quantity: int) -> tuple[int, dict]:
    if quantity < 1:
        return 400, {"error": "quantity must be at least 1"}
    cursor = connect().execute(
        "INSERT INTO orders (product_id, quantity) VALUES (?, ?)", (product_id, quantity)
    )
    return 201, {"id": cursor.lastrowid}
