"""The shop's records."""

from dataclasses import dataclass


@dataclass
class Product:
    id: int
    name: str
    price_cents: int


@dataclass
class Order:
    id: int
    product_id: int
    quantity: int
